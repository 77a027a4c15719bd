"""`cloud login|logout|limits|user ...`: who you are, what you may hold, your managed users."""

import os
import sys

import click

from agent.cloud import names, settings
from agent.cloud.output import Run, cloud_command, fail, fields, list_command, read_new_password, read_secret, table
from common.client import ApiError, Client, ClientError, Limits, NotTheApi, User
from common.client.urls import check_url, plain_http_host

# A refused login says what the portal's login page says (api/portal/account_pages.py
# LOGIN_FAILED), in the same words: nothing tells which part was wrong.
LOGIN_FAILED = "Log in failed: wrong email or password, or the account cannot use the cloud."
KEY_LOGIN_FAILED = "Log in failed: wrong API key or secret, or the account cannot use the cloud."


@click.command("login")
@click.option("--url", help="The service's base URL (default: $CC_URL, then the one kept).")
@click.option("--api-key", help="Log in with your API key (the secret is prompted, or read from stdin).")
@click.option("--email", help="Log in with your email (the password is prompted, or read from stdin).")
@click.option("--keep", is_flag=True,
              help="Keep the API key and secret (mode 0600) so that an expired token is renewed; "
                   "never a password (with --email it needs --new-secret).")
@click.option("--new-secret", is_flag=True,
              help="With --email and --keep: make a new API secret now and keep it; the current secret "
                   "stops working everywhere.")
@cloud_command
def login(run: Run, url, api_key, email, keep, new_secret):
    """Log in and keep the service URL and a token in ~/.config/cloud-controller/ (mode 0600).

    Without --api-key or --email it asks for the API key; an email typed there (it has an @)
    logs in with the password, asked next. The URL is the API's, not the portal's (/portal).

    The kept login is used only with that URL. With --keep the API key and secret are
    kept too, and every command renews an expired token by itself. A password is never
    kept: --email --keep is refused unless --new-secret asks for a new API secret to keep.

    Example: cloud login --url http://head-node:8080 --api-key KEY --keep
    """
    if new_secret and not keep:
        fail(run, "--new-secret goes with --email and --keep", code=2)
    if api_key is not None and "@" in api_key:
        fail(run, "--api-key was given an email: log in with `cloud login --email EMAIL` (the password is "
                  "asked next)", code=2)
    kept = settings.load()
    url = url or run.url or os.environ.get("CC_URL") or kept.get("url")
    if not url:
        url = click.prompt("Service URL", err=True) if sys.stdin.isatty() else None
    if not url:
        raise ClientError("no service URL: give --url or set CC_URL")
    url = check_url(url)  # a portal's URL is refused here, before anything is asked or sent
    plain = plain_http_host(url)
    if plain:
        settings.warn_plain_http(plain)  # before the secret is typed, not only when it is sent
    env = settings.env_credentials()
    if api_key is None and email is None:
        if env:
            api_key, email = env.get("api_key"), env.get("email")
        elif sys.stdin.isatty():
            typed = click.prompt("API key, or your email to log in with a password", default="",
                                 show_default=False, err=True).strip()
            # An API key never holds an @: what has one is an email, and the password is asked next.
            if "@" in typed:
                api_key, email = None, typed
            else:
                api_key = typed or None
                email = None if api_key else click.prompt("Email", err=True).strip()
        else:
            raise ClientError("give --api-key or --email (the secret or password comes on stdin)")
    if new_secret and api_key:
        fail(run, "--new-secret goes with --email and --keep, not with an API key", code=2)
    if keep and not api_key and not new_secret:
        # Refused before anything is sent: keeping a password login would mean replacing the
        # user's API secret, which breaks every other place it is used; only an explicit ask does.
        fail(run, "--keep keeps an API key and secret, never a password. Either log in with "
                  "`cloud login --api-key KEY --keep` (see `cloud credentials show`; a lost secret: "
                  "`cloud credentials rotate`), or add --new-secret to make a new API secret now and keep "
                  "it (your current secret stops working everywhere).", code=2)
    if api_key:
        secret = os.environ.get("CC_API_SECRET") if env.get("api_key") == api_key else None
        creds = {"api_key": api_key, "api_secret": secret or read_secret("API secret")}
    else:
        password = os.environ.get("CC_PASSWORD") if env.get("email") == email else None
        creds = {"email": email, "password": password or read_secret("Password")}
    session = Client(url, **creds, on_plain_http=settings.warn_plain_http)
    try:
        token = session.login()
    except NotTheApi:
        raise
    except ApiError as e:
        if e.status in (400, 401):
            # The portal's words: whether the email, the password or the account was wrong is not told.
            raise ApiError(e.status, KEY_LOGIN_FAILED if api_key else LOGIN_FAILED,
                           request_id=e.request_id) from None
        raise
    saved = {"url": url, "userid": token.userid, "token": token.token, "expires_at": token.expires_at,
             "source": session.source}
    # At a cloud auth serving several clusters, commands go to its default cluster's
    # controller unless --cluster names another.
    cluster_url = session.default_cluster_url()
    if cluster_url:
        saved["controller_url"] = cluster_url
    if api_key:
        saved.update({"api_key": api_key, **({"api_secret": creds["api_secret"]} if keep else {})})
    else:
        saved["email"] = email
        if keep:
            # Only with --new-secret (checked above). A password is never kept, and the service
            # never shows a secret again: a new one is made with the password as proof, and kept.
            rotated = session.rotate_api_secret(password=creds["password"])
            saved.update(rotated)
            run.progress("note: a new API secret was made to keep; the previous one no longer works "
                         "(`cloud credentials show` names the key)")
    where = settings.save(saved)
    email, username = _who(session)
    doc = {"url": url, "userid": token.userid, "email": email, "username": username,
           "expires_at": token.expires_at, "kept_secret": keep, "config": str(where)}
    known = ", ".join(x for x in (username, f"id {token.userid}") if x)
    who = f"{email} ({known})" if email else token.userid
    run.emit(doc, f"logged in to {url} as {who}; token until {token.expires_at}"
                  + ("; the API key and secret are kept to renew it" if keep else ""))


def _who(session: Client) -> tuple[str | None, str | None]:
    """Your email and first system username, read as `cloud whoami` reads them. The login has
    already succeeded and been kept: a failed look-up leaves the line with the id alone rather
    than failing the login."""
    try:
        me = session.me()
    except ClientError:
        return None, None
    return me.email, (me.usernames[0] if me.usernames else None)


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


def _user_fields(client: Client, u: User) -> str:
    return fields([("id", u.id), ("email", u.email), ("name", u.name), ("active", "yes" if u.active else "no"),
                   ("owner", names.Labels(client).user(u.owner)), ("usernames", u.usernames),
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
    run.emit(u.raw, lambda: _user_fields(run.client, u))


def _user_columns(client: Client) -> list:
    label = names.Labels(client)
    return [("ID", lambda u: u.id), ("EMAIL", lambda u: u.email), ("NAME", lambda u: u.name),
            ("ACTIVE", lambda u: "yes" if u.active else "no"), ("USERNAME", lambda u: ",".join(u.usernames)),
            ("OWNER", lambda u: label.user(u.owner))]


list_command(user, "list", fetch=lambda c: c.list_users(), columns=_user_columns, help="""
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
    run.emit(u.raw, lambda: _user_fields(run.client, u))


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
    run.emit(u.raw, lambda: _user_fields(run.client, u))


@click.group("cluster")
def cluster():
    """The clusters your login reaches (a cloud auth serving several); pick one with
    `cloud --cluster NAME` or CC_CLUSTER.

    Example: cloud cluster list
    """


@cluster.command("list")
@cloud_command
def cluster_list(run: Run):
    """Each cluster: id, name, URL, enabled, and your account there.

    Example: cloud cluster list
    """
    client = run.client
    catalog = client.catalog()
    accounts = {a["cloud_controller_id"]: {"username": a["username"], "uuid": a["uuid"]}
                for a in client.my_accounts()}
    rows = [{"id": c["id"], "name": c["name"], "url": c["url"] or client.url, "enabled": c["enabled"],
             "account": accounts.get(c["id"])} for c in catalog["controllers"]]

    def human() -> str:
        lines = [f"{'ID':<6} {'NAME':<20} {'ACCOUNT':<12} {'STATE':<9} URL"]
        for r in rows:
            mark = " (default)" if r["id"] == catalog.get("default") else ""
            lines.append(f"{r['id']:<6} {r['name'] + mark:<20} {(r['account'] or {}).get('username', '-'):<12} "
                         f"{'enabled' if r['enabled'] else 'disabled':<9} {r['url']}")
        return "\n".join(lines)

    run.emit(rows, human)
