"""Where `cloud` keeps the service URL and the user's token, and the CC_* variables over it.

One file, $XDG_CONFIG_HOME/cloud-controller/client.json (default ~/.config/...),
mode 0600 in a folder of mode 0700: the URL, the user id, the token, its end and
how it was issued (`source`), the email or API key it was made with (to say
which `cloud login` renews it), and the API secret only when `cloud login
--keep` asked for it. Environment variables override it: CC_URL, and
CC_API_KEY with CC_API_SECRET or CC_EMAIL with CC_PASSWORD; then nothing is
written, each run gets its own token, and the kept login they override is
named on stderr once.

A kept login belongs to the URL it was made for: when CC_URL or `--url` names
another service and the environment gives no credentials, nothing kept is
sent anywhere and the command fails "not logged in to URL".

A token, secret or password sent over plain http:// to a host that is not
loopback is warned about on stderr, once per command and host.
"""

import json
import os
import sys
from pathlib import Path

from agent.cloud.tables import printable
from common.client import Client, ClientError, Token
from common.client.urls import check_url, same_service

FILE_NAME = "client.json"
_KEPT = ("url", "userid", "token", "expires_at", "source", "email", "api_key", "api_secret", "controller_url")


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


def env_source(given: dict) -> str:
    """The variables credentials came from, as a person reads them."""
    return "CC_API_KEY and CC_API_SECRET" if "api_key" in given else "CC_EMAIL and CC_PASSWORD"


def has_login(kept: dict) -> bool:
    return bool(kept.get("url") and (kept.get("token") or (kept.get("api_key") and kept.get("api_secret"))))


def renew_hint(url: str, kept: dict) -> str:
    """The `cloud login` that renews the kept login."""
    if kept.get("api_key") and kept.get("api_secret"):
        return f"cloud login --url {url} --api-key {kept['api_key']} --keep"
    if kept.get("source") == "api_key" and kept.get("api_key"):
        return f"cloud login --url {url} --api-key {kept['api_key']}"
    if kept.get("email"):
        return f"cloud login --url {url} --email {kept['email']}"
    return f"cloud login --url {url}"


_warned: set[str] = set()


def warn_plain_http(host: str) -> None:
    """Once per run and host: credentials are about to cross the network unencrypted."""
    if host in _warned:
        return
    _warned.add(host)
    print(f"warning: sending credentials over plain HTTP to {printable(host)}; use https://", file=sys.stderr)


_noted = False


def _note_override(given: dict, kept: dict) -> None:
    """Once per run: which environment variables win over which kept login."""
    global _noted
    if _noted:
        return
    _noted = True
    who = kept.get("email") or kept.get("api_key") or kept.get("userid") or "a user"
    print(f"note: {env_source(given)} from the environment are used, not the login kept in {path()} "
          f"({who} at {kept['url']})", file=sys.stderr)


def source_of(client: Client) -> str:
    """Where the credentials come from and how the token was issued: env:api_key, env:password,
    kept:api_key, kept:password (kept: the login `cloud login` kept)."""
    return f"{'env' if env_credentials() else 'kept'}:{client.source or 'unknown'}"


def client(url: str | None = None, cluster: str | None = None) -> Client:
    """A Client from the environment, else from the kept login (whose token it keeps renewed).
    `url` (the command's --url) goes before CC_URL, which goes before the kept URL. `cluster`
    (--cluster) goes before CC_CLUSTER, which goes before the default cluster the login kept."""
    cluster = cluster or os.environ.get("CC_CLUSTER") or None
    kept = load()
    wanted = url or os.environ.get("CC_URL")
    target = check_url(wanted) if wanted else kept.get("url")
    if not target:
        raise ClientError("no service URL: run `cloud login --url URL` or set CC_URL")
    given = env_credentials()
    if given:
        if has_login(kept) and same_service(kept["url"], target):
            _note_override(given, kept)
        return Client(target, **given, token_source="api_key" if "api_key" in given else "password",
                      cluster=cluster, on_plain_http=warn_plain_http)
    if not has_login(kept):
        raise ClientError(f"not logged in to {target}: run `cloud login --url {target}`")
    if not same_service(kept["url"], target):
        # Nothing kept goes to another service: not the token, least of all the key and secret.
        raise ClientError(f"not logged in to {target}: the kept login is for {kept['url']}; run "
                          f"`cloud login --url {target}`, or set CC_API_KEY and CC_API_SECRET")

    def keep(token: Token) -> None:
        save({**load(), "token": token.token, "userid": token.userid, "expires_at": token.expires_at,
              "source": made.source})

    made = Client(kept["url"], token=kept.get("token"), userid=kept.get("userid"),
                  expires_at=kept.get("expires_at"), api_key=kept.get("api_key"), api_secret=kept.get("api_secret"),
                  token_source=kept.get("source"), on_token=keep, renew_hint=renew_hint(kept["url"], kept),
                  cluster=cluster, controller_url=kept.get("controller_url"), on_plain_http=warn_plain_http)
    return made
