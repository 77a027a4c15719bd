"""Where `cloud` keeps the service URL and the user's token, and the CC_* variables over it.

One file, $XDG_CONFIG_HOME/cloud-controller/client.json (default ~/.config/...),
mode 0600 in a folder of mode 0700: the URL, the user id, the token and its end,
and the API key and secret only when `cloud login --keep` asked for them.
Environment variables override it (CONTRACT.md section 12): CC_URL, and
CC_API_KEY with CC_API_SECRET or CC_EMAIL with CC_PASSWORD; then nothing is
written, each run gets its own token.
"""

import json
import os
from pathlib import Path

from common.client import Client, ClientError, Token

FILE_NAME = "client.json"
_KEPT = ("url", "userid", "token", "expires_at", "api_key", "api_secret")


def folder() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "cloud-controller"


def path() -> Path:
    return folder() / FILE_NAME


def load() -> dict:
    try:
        text = path().read_text()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        raise ClientError(f"{path()} is not JSON: run `cloud login` again") from None
    return {k: data[k] for k in _KEPT if isinstance(data, dict) and isinstance(data.get(k), str)}


def save(data: dict) -> Path:
    """Write the file whole, mode 0600 from its first byte (never readable by others meanwhile)."""
    target = path()
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({k: data[k] for k in _KEPT if data.get(k)}, f, indent=1)
        f.write("\n")
    os.chmod(tmp, 0o600)  # a umask never widens it, but an existing tmp file may have had another mode
    os.replace(tmp, target)
    return target


def forget() -> bool:
    try:
        path().unlink()
    except FileNotFoundError:
        return False
    return True


def env_credentials() -> dict:
    """The CC_* credentials that are set, as Client keyword arguments."""
    env = os.environ
    if env.get("CC_API_KEY") and env.get("CC_API_SECRET"):
        return {"api_key": env["CC_API_KEY"], "api_secret": env["CC_API_SECRET"]}
    if env.get("CC_EMAIL") and env.get("CC_PASSWORD"):
        return {"email": env["CC_EMAIL"], "password": env["CC_PASSWORD"]}
    return {}


def client() -> Client:
    """A Client from the environment, else from the kept file (whose token it keeps renewed)."""
    kept = load()
    url = os.environ.get("CC_URL") or kept.get("url")
    if not url:
        raise ClientError("no service URL: run `cloud login --url URL` or set CC_URL")
    given = env_credentials()
    if given:
        return Client(url, **given)
    if not kept.get("token") and not kept.get("api_key"):
        raise ClientError("not logged in: run `cloud login`")

    def keep(token: Token) -> None:
        save({**load(), "token": token.token, "userid": token.userid, "expires_at": token.expires_at})

    return Client(url, token=kept.get("token"), userid=kept.get("userid"), expires_at=kept.get("expires_at"),
                  api_key=kept.get("api_key"), api_secret=kept.get("api_secret"), on_token=keep)
