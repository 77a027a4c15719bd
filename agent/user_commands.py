"""cloud-agent user ...: the first superuser, roles and limits."""

import sys

import click

from agent.common import (Options, command_options, confirm, email_of, emit, fail, require_one_user, table,
                          target_user, user_argument, userid_option, yes_no)
from controller.instances import guests
from controller import limits, lookups
from controller.users import users
from controller.permissions import ROLES, SUPERUSER
from controller.rules import PASSWORD_RULE
from host_adapters import factory


@click.group("user")
def user():
    """Manage cloud auth users."""


@user.command("create-superuser")
@click.option("--email", required=True, help="Email of the new superuser.")
@click.option("--password", default=None,
              help="Password (14-24 characters, two of letters/digits/punctuation); prompted twice when absent.")
@click.option("--password-file", type=click.File("r"), default=None,
              help="Read the password from this file's first line (keeps it out of `ps`); - for stdin.")
@click.option("--name", default="", help="Display name.")
@command_options
def create_superuser(opts: Options, email, password, password_file, name):
    """Create a superuser and print its id, API key and API secret.

    Example: cloud-agent user create-superuser --email admin@example.org
    """
    users.users_live_here(opts.context())
    if password is not None and password_file is not None:
        raise click.UsageError("give --password or --password-file, not both")
    if password_file is not None:
        password = password_file.readline().rstrip("\r\n")
    if password is None:
        if not sys.stdin.isatty():
            raise click.UsageError("--password is required when not on a terminal")
        click.echo(PASSWORD_RULE, err=True)
        password = click.prompt("Password", hide_input=True, confirmation_prompt="Repeat password", err=True)
    ctx = opts.context()
    row, secret = users.insert_user(
        ctx, email=email, password=password, name=name, roles=(SUPERUSER,), registration_source="cloud-agent"
    )
    emit(
        opts,
        {"userid": row["id"], "api_key": row["api_key"], "api_secret": secret},
        f"superuser {email}\n  userid:     {row['id']}\n  api_key:    {row['api_key']}\n  api_secret: {secret}",
    )


def _role_command(grant: bool):
    @click.argument("words", nargs=-1, metavar="[EMAIL] ROLE")
    @userid_option
    @command_options
    def command(opts: Options, words, userid):
        # EMAIL may be left out for --userid, and an optional argument cannot precede a
        # required one in click: both are read here.
        users.users_live_here(opts.context())
        if len(words) != (1 if userid is not None else 2):
            raise click.UsageError("give EMAIL ROLE, or --userid UUID ROLE")
        email, role = (None, words[0]) if userid is not None else words
        if role not in ROLES:
            raise click.UsageError(f"invalid ROLE {role!r}: choose from {', '.join(ROLES)}")
        opts.audit_args = {"email": email, "userid": userid, "role": role}
        with target_user(opts, email, userid) as target:
            ctx = opts.context()
            row, cut = users.change_role(ctx, target["id"], role, grant=grant)
        obj = users.user_object(ctx, row, superuser_view=True)
        notes = [_cut_note(ctx, link, row) for link in cut]
        if opts.as_json:
            # stdout holds exactly the user object; a detachment also shows there as the
            # owner_userid that is gone (or, for a revoke, a smaller num_owned_accounts).
            for note in notes:
                click.echo(f"note: {note}", err=True)
        emit(opts, obj, "\n".join([f"{row['email']}: roles {', '.join(obj['roles']) or '(none)'}",
                                   *(f"note: {n}" for n in notes)]))

    return command


def _cut_note(ctx, link: dict, changed: dict) -> str:
    """One line saying which ownership link a role change cut, and why."""
    def email(user_id: str) -> str:
        return email_of(ctx, [user_id]).get(user_id, user_id)

    if link["user_id"] == changed["id"]:
        return (f"{changed['email']} is detached from its owner {email(link['owner_userid'])}, "
                "which lacks a role it now holds")
    return (f"{email(link['user_id'])} is detached from its owner {changed['email']}, "
            "which no longer holds every role it holds")


user.command("grant", help="""Give a user a role.

A managed user given a role its owner lacks is detached from that owner (the owner
no longer manages it).

\b
Examples:
  cloud-agent user grant alice@example.org create_user
  cloud-agent user grant --userid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 view_user""")(_role_command(True))
user.command("revoke", help="""Take a role from a user.

Users it manages that hold the role are detached from it.

\b
Examples:
  cloud-agent user revoke alice@example.org create_user
  cloud-agent user revoke --userid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 view_user""")(_role_command(False))


_LIMIT_OPTION = click.IntRange(min=-1)


@user.command("limits")
@click.argument("email", required=False)
@click.option("--userid", default=None, help="The user's id (UUID) instead of EMAIL.")
@click.option("--instances", type=_LIMIT_OPTION, default=None, help="Live instances the user may own at once.")
@click.option("--vcpus", type=_LIMIT_OPTION, default=None, help="vCPUs summed over those instances' flavors.")
@click.option("--memory-mb", "memory_mb", type=_LIMIT_OPTION, default=None,
              help="MB of memory summed over those instances' flavors.")
@click.option("--groups", type=_LIMIT_OPTION, default=None, help="Groups the user may own.")
@click.option("--managed-users", "managed_users", type=_LIMIT_OPTION, default=None,
              help="Users the user may own (managed users).")
@click.option("--reset", is_flag=True, help="Drop the user's overrides first (back to the [limits] defaults).")
@command_options
def user_limits(opts: Options, email, userid, instances, vcpus, memory_mb, groups, managed_users, reset):
    """Show a user's limits; with options, first override them for this user (-1: no limit).

    Without options it prints the limits in force ([limits] in the config, or the
    user's overrides). Lowering a limit removes nothing the user holds; it only
    refuses new requests over it.

    Example: cloud-agent user limits alice@example.org --instances 20 --vcpus 40
    """
    if (email is None) == (userid is None):
        raise click.UsageError("give the user's EMAIL or --userid UUID (one of them)")
    ctx = opts.context()
    target = lookups.user_by_email_or_404(ctx, email) if email is not None else lookups.user_or_404(ctx, userid)
    changes = {"instances": instances, "vcpus": vcpus, "memory_mb": memory_mb, "groups": groups,
               "managed_users": managed_users}
    obj = limits.set_limits(ctx, target, changes, reset=reset)
    overrides = ctx.store.limit_overrides(target["id"])
    usage = ctx.store.usage_of(target["id"])
    lines = [f"limits of {target['email']} ({target['id']}):"]
    for kind in limits.KINDS:
        shown = "no limit" if obj[kind] == limits.UNLIMITED else str(obj[kind])
        source = "override" if kind in overrides else "default"
        lines.append(f"  {kind:<14} {shown:>10}  ({source}; holds {usage[kind]})")
    emit(opts, obj, "\n".join(lines))


@user.command("list")
@click.option("--active-only", is_flag=True, help="Leave out deactivated users.")
@command_options
def user_list(opts: Options, active_only):
    """List every user: id, email, name, system username, roles, owner, whether active.

    Example: cloud-agent user list --json
    """
    ctx = opts.context()
    found = users.admin_list_users(ctx, include_inactive=not active_only)
    # Owners by email, an inactive one too (left out of the rows with --active-only).
    emails = email_of(ctx, [u.get("owner_userid") for u in found])
    emit(opts, {"users": found}, table(found, [
        ("ID", lambda u: u["id"]), ("EMAIL", lambda u: u["email"]), ("NAME", lambda u: u.get("name")),
        ("USERNAME", lambda u: ",".join(a["username"] for a in u.get("system_accounts") or [])),
        ("ROLES", lambda u: ",".join(u.get("roles") or [])),
        ("OWNER", lambda u: emails.get(u.get("owner_userid"), u.get("owner_userid"))),
        ("ACTIVE", lambda u: yes_no(u.get("active")))]))


@user.command("password")
@user_argument
@click.option("--password-file", type=click.File("r"), default=None,
              help="Read the password from this file's first line (keeps it out of `ps`); - for stdin.")
@command_options
def user_password(opts: Options, email, userid, password_file):
    """Set a user's password (for one who lost it); the user's password logins end.

    The rule (14 to 24 characters, at least two of letters, digits and punctuation) is
    told before the prompt, which asks twice.

    \b
    Examples:
      cloud-agent user password alice@example.org
      cloud-agent user password alice@example.org --password-file - < password.txt
    """
    users.users_live_here(opts.context())
    require_one_user(email, userid)
    if password_file is not None:
        password = password_file.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        click.echo(PASSWORD_RULE, err=True)
        password = click.prompt("New password", hide_input=True, confirmation_prompt="Repeat the password", err=True)
    else:
        raise click.UsageError("not on a terminal: give --password-file FILE (or - for stdin)")
    with target_user(opts, email, userid) as target:
        users.admin_set_password(opts.context(), target, password)
    emit(opts, {"userid": target["id"], "email": target["email"], "password_set": True},
         f"password of {target['email']} set; its password logins ended")


@user.command("secret")
@user_argument
@click.option("--reset", is_flag=True, help="Make a new API secret (the old one stops working), shown once.")
@command_options
def user_secret(opts: Options, email, userid, reset):
    """Show a user's API key and secret, or with --reset make a new secret and show it once.

    \b
    Examples:
      cloud-agent user secret alice@example.org
      cloud-agent user secret alice@example.org --reset
    """
    users.users_live_here(opts.context())
    with target_user(opts, email, userid) as target:
        secret = users.admin_api_secret(opts.context(), target, reset=reset)
    emit(opts, {"userid": target["id"], "email": target["email"], "api_key": target["api_key"],
                "api_secret": secret},
         f"{target['email']}\n  api_key:    {target['api_key']}\n  api_secret: {secret or '(none)'}"
         + ("\nnote: this secret is shown once; the old one no longer works" if reset else ""))


@user.command("apply")
@user_argument
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@command_options
def user_apply(opts: Options, email, userid, yes):
    """Apply a user's changes to its guests now: power-cycle every running instance its
    system account has access to.

    A deactivated user leaves every guest, groups and a new home reach them, at each
    guest's next boot; this command makes that boot happen now. Each instance gets its
    seed and shares rebuilt, and each one running is powered off and on again (its users
    lose what they have not saved). Asks on a terminal; elsewhere needs --yes. Prints
    which instances it cycled; exits 1 when one could not be updated.

    \b
    Examples:
      cloud-agent user apply alice@example.org
      cloud-agent --json user apply --userid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 --yes
    """
    require_one_user(email, userid)
    ctx = opts.context(adapters=True)
    if factory.is_in_process_test_driver(ctx.config.libvirt.uri):
        # libvirt's test driver in the server process (the sandbox profile) keeps its guests
        # there: this process sees none of them, and would report each as failed. (A test
        # driver served by a libvirtd is shared by every process that connects to it.)
        fail(opts, "sandbox profile: the guests live in the server process, which this command cannot reach; "
                   "a guest takes a user's changes at its next start (`cloud server stop` and `start`)")
    # Listed and asked before the user is reserved, so a prompt left open holds no reservation.
    found = lookups.find_user(ctx, email if email is not None else str(userid))
    to_cycle = [r for r in guests.instances_of_user(ctx, found) if guests.needs_cycle(r)]
    if to_cycle:
        names = ", ".join(f"{r['hostname']} ({r['id']})" for r in to_cycle)
        confirm(opts, yes, f"Power-cycle {len(to_cycle)} running server-instance(s) of {found['email']} "
                           f"now: {names}? Their users lose unsaved work.")
    with target_user(opts, email, userid, adapters=True) as target:
        # Only the instances named in the question are cycled; any other is rebuilt for its next boot.
        results = guests.apply_to_instances(ctx, guests.instances_of_user(ctx, target),
                                            may_cycle={r["id"] for r in to_cycle})
    lines = [f"{target['email']}: {len(results)} server-instance(s)"]
    for r in results:
        done = "power-cycled" if r["cycled"] else "updated for its next boot"
        lines.append(f"  {r['hostname']} ({r['id']}) on {r['host']}: {done}, {r['status']}"
                     + (f"; error: {r['error']}" if "error" in r else ""))
    emit(opts, {"userid": target["id"], "email": target["email"], "instances": results}, "\n".join(lines))
    if any("error" in r for r in results):
        # After the document: --json keeps its one document, the exit status tells.
        if not opts.as_json:
            click.echo("error: some server-instances were not updated; `cloud-agent reconcile` repairs them", err=True)
        sys.exit(1)


def register(cli) -> None:
    cli.add_command(user)
