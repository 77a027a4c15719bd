"""`cloud login|logout|limits|user ...`: who you are, what you may hold, your managed users."""

import os
import sys

import click

from agent.cloud import names, settings
from agent.cloud.output import Run, cloud_command, fields, list_command, read_new_password, read_secret, table
from common.client import Client, ClientError, Limits, User


@click.command("login")
@click.option("--url", help="The service's base URL (default: $CC_URL, then the one kept).")
@click.option("--api-key", help="Log in with your API key (the secret is prompted, or read from stdin).")
@click.option("--email", help="Log in with your email (the password is prompted, or read from stdin).")
@click.option("--keep", is_flag=True,
              help="Keep the API key and secret (mode 0600) so that an expired token is renewed.")
@cloud_command
def login(run: Run, url, api_key, email, keep):
    """Log in and keep the service URL and a token in ~/.config/cloud-controller/ (mode 0600).

    Example: cloud login --url http://head-node:8080 --api-key KEY --keep
    """
    kept = settings.load()
    url = url or os.environ.get("CC_URL") or kept.get("url")
    if not url:
        url = click.prompt("Service URL", err=True) if sys.stdin.isatty() else None
    if not url:
        raise ClientError("no service URL: give --url or set CC_URL")
    env = settings.env_credentials()
    if api_key is None and email is None:
        if env:
            api_key, email = env.get("api_key"), env.get("email")
        elif sys.stdin.isatty():
            api_key = click.prompt("API key (empty: log in with email and password)", default="",
                                   show_default=False, err=True) or None
            email = None if api_key else click.prompt("Email", err=True)
        else:
            raise ClientError("give --api-key or --email (the secret or password comes on stdin)")
    if api_key:
        secret = os.environ.get("CC_API_SECRET") if env.get("api_key") == api_key else None
        creds = {"api_key": api_key, "api_secret": secret or read_secret("API secret")}
    else:
        password = os.environ.get("CC_PASSWORD") if env.get("email") == email else None
        creds = {"email": email, "password": password or read_secret("Password")}
        if keep:
            raise ClientError("--keep keeps an API key and secret, never a password: log in with --api-key")
    token = Client(url, **creds).login()
    saved = {"url": url, "userid": token.userid, "token": token.token, "expires_at": token.expires_at,
             **(creds if keep else {})}
    where = settings.save(saved)
    doc = {"url": url, "userid": token.userid, "expires_at": token.expires_at, "kept_secret": keep,
           "config": str(where)}
    run.emit(doc, f"logged in to {url} as {token.userid}; token until {token.expires_at}"
                  + ("; the API key and secret are kept to renew it" if keep else ""))


@click.command("logout")
@cloud_command
def logout(run: Run):
    """Forget the kept URL, token and any kept key and secret.

    Example: cloud logout
    """
    gone = settings.forget()
    run.emit({"forgotten": gone, "config": str(settings.path())},
             f"logged out (removed {settings.path()})" if gone else "not logged in")


def _limit(value: int) -> str:
    return "no limit" if value == -1 else str(value)


@click.command("limits")
@click.option("--user", "who", help="A user you see (id, email or name); default yourself.")
@cloud_command
def limits(run: Run, who):
    """Show your limits and what you use now (instances, vCPUs, memory, groups, managed users).

    Example: cloud limits --user bob@example.org
    """
    lim: Limits = run.client.limits(owner=names.user(run.client, who).id if who else None)
    run.emit(lim.raw, lambda: table(Limits.KINDS, [
        ("LIMIT", lambda k: k), ("USED", lambda k: getattr(lim, k).used),
        ("OF", lambda k: _limit(getattr(lim, k).limit))]))


# -- user: an owner's managed users ---------------------------------------------------
@click.group("user")
def user():
    """Users: yourself and the users you own (creating one needs the create_user permission).

    Example: cloud user create --email bob@example.org --name Bob
    """


def _user_fields(u: User) -> str:
    return fields([("id", u.id), ("email", u.email), ("name", u.name), ("active", "yes" if u.active else "no"),
                   ("owner", u.owner), ("usernames", u.usernames),
                   *((k, u.raw[k]) for k in ("roles", "api_key") if k in u.raw)])


@user.command("create")
@click.option("--email", required=True)
@click.option("--name", help="The person's name.")
@cloud_command
def user_create(run: Run, email, name):
    """Create a user you own; its password (14 to 24 characters) is prompted, or read from stdin.

    Example: cloud user create --email bob@example.org --name "Bob Smith"
    """
    u = run.client.create_user(email=email, password=read_new_password("Password for the new user"), name=name)
    run.emit(u.raw, lambda: _user_fields(u))


list_command(user, "list", fetch=lambda c: c.list_users(), columns=[
    ("ID", lambda u: u.id), ("EMAIL", lambda u: u.email), ("NAME", lambda u: u.name),
    ("ACTIVE", lambda u: "yes" if u.active else "no"), ("USERNAME", lambda u: ",".join(u.usernames))], help="""
    List the users you may view.

    Example: cloud user list --json
    """)


@user.command("show")
@click.argument("name", required=False)
@cloud_command
def user_show(run: Run, name):
    """Show a user (id, email or name); by default yourself.

    Example: cloud user show bob@example.org
    """
    u = names.user(run.client, name) if name else run.client.me()
    run.emit(u.raw, lambda: _user_fields(u))


@user.command("update")
@click.argument("name")
@click.option("--email", help="A new email.")
@click.option("--new-name", help="A new name.")
@click.option("--active/--inactive", default=None, help="Activate or deactivate (superuser only).")
@cloud_command
def user_update(run: Run, name, email, new_name, active):
    """Change a user's email or name (yours or a user you own).

    Example: cloud user update bob@example.org --new-name "Bob Smith"
    """
    if email is None and new_name is None and active is None:
        raise ClientError("nothing to change: give --email, --new-name or --active/--inactive")
    u = run.client.update_user(names.user(run.client, name).id, email=email, name=new_name, active=active)
    run.emit(u.raw, lambda: _user_fields(u))
