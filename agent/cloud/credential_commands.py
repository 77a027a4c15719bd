"""`cloud whoami`, `cloud credentials show|rotate`, `cloud password`: who the commands act as, and
your own API key, secret and password (the service's self-service calls act on you only)."""

import sys

import click

from agent.cloud import settings
from agent.cloud.output import Run, cloud_command, fields
from common.client import ClientError

PASSWORD_RULE = ("A password has 14 to 24 characters and mixes at least two of: letters, digits, "
                 "punctuation.")


def _secret(prompt: str) -> str:
    """A secret: prompted without echo on a terminal (on stderr, so stdout keeps --json's one
    document), else the next line of stdin."""
    if sys.stdin.isatty():
        return click.prompt(prompt, hide_input=True, err=True)
    line = sys.stdin.readline().rstrip("\n")
    if not line:
        raise ClientError(f"{prompt.lower()}: none given on stdin")
    return line


def _login_line(url: str, api_key: str) -> str:
    return f"cloud login --url {url} --api-key {api_key} --keep"


@click.command("whoami")
@cloud_command
def whoami(run: Run):
    """Say who the commands act as, at which URL, with which credentials and until when.

    `source` is where the credentials come from (env: CC_* variables; kept: `cloud login`)
    and how the token was issued (api_key or password).

    Example: cloud whoami --json
    """
    client = run.client
    me = client.me()
    doc = {"url": client.url, "userid": me.id, "email": me.email,
           "username": me.usernames[0] if me.usernames else None,
           "source": settings.source_of(client), "expires_at": client.expires_at}
    run.emit(doc, lambda: fields([(k, doc[k]) for k in ("url", "userid", "email", "username", "source",
                                                         "expires_at")]))


@click.group("credentials")
def credentials():
    """Your API key and secret: see the key, make a new secret.

    Example: cloud credentials rotate
    """


@credentials.command("show")
@cloud_command
def credentials_show(run: Run):
    """Show your user id, your API key and whether an API secret is set (never the secret).

    Example: cloud credentials show
    """
    data = run.client.credentials()
    run.emit(data, lambda: fields([("userid", data["userid"]), ("api_key", data["api_key"]),
                                   ("api_secret_set", "yes" if data["api_secret_set"] else "no"),
                                   ("log in with", _login_line(run.client.url, data["api_key"]))]))


@credentials.command("rotate")
@click.option("--with-secret", is_flag=True,
              help="Prove it with the API secret you are logged in with (kept or CC_API_SECRET), not the password.")
@cloud_command
def credentials_rotate(run: Run, with_secret):
    """Make a new API secret and print it once; the previous secret and the tokens issued from it
    stop working. Asks for your password on a terminal (else reads it from stdin).

    A login kept with the API key (`cloud login --api-key KEY --keep`) is updated to the new
    secret.

    Example: cloud credentials rotate
    """
    client = run.client
    from_env = bool(settings.env_credentials())
    if with_secret:
        if not client.api_secret:
            raise ClientError("no API secret to prove it with: you are not logged in with one (use the password)")
        data = client.rotate_api_secret(api_secret=client.api_secret)
    else:
        data = client.rotate_api_secret(password=_secret("Password"))
    kept = settings.load()
    if not from_env and kept.get("api_secret"):
        settings.save({**settings.load(), "api_secret": data["api_secret"]})
    if from_env and settings.env_credentials().get("api_key"):
        run.progress("note: CC_API_SECRET still holds the previous secret: set it to the new one")
    run.emit(data, lambda: fields([("api_key", data["api_key"]), ("api_secret", data["api_secret"])])
             + "\nThe secret is shown this once: store it now. The previous secret no longer works."
             + f"\nLog in with: {_login_line(client.url, data['api_key'])}")


@click.command("password")
@cloud_command
def password(run: Run):
    """Change your password: asks for the current one once and the new one twice on a terminal
    (else reads the current and the new one, a line each, from stdin). Logins and portal sessions
    made with the old password end.

    Example: cloud password
    """
    client = run.client
    from_env = bool(settings.env_credentials())
    click.echo(PASSWORD_RULE, err=True)
    old = _secret("Current password")
    new = _secret("New password")
    if sys.stdin.isatty() and _secret("New password (again)") != new:
        raise ClientError("the two new passwords differ: nothing changed")
    client.change_password(password=old, new_password=new)
    if from_env and settings.env_credentials().get("email"):
        run.progress("note: CC_PASSWORD still holds the previous password: set it to the new one")
    run.emit({"changed": True}, "password changed; logins made with the old password have ended")
