"""`cloud server ...`: create, list, show, delete, power, users, ssh, console, actions."""

import os
import shutil
import sys
import time

import inspect

import click

from agent.cloud import names
from agent.cloud.output import Run, cloud_command, fail, fields, members_command, show_command, table
from agent.cloud.tables import console_text
from agent.cloud.waiting import POLL_SECONDS, NoGuestHere, WaitTimeout, on_sandbox, wait_for_guest
from common.client import ApiError, Client, ClientError, Server

WAIT_SECONDS = 900


@click.group("server")
def server():
    """Virtual machines (server-instances).

    Example: cloud server create --image "Debian 12" --flavor small --wait
    """


def _table(client: Client, servers: list[Server]) -> str:
    """A superuser's table also says which host each server is on."""
    label = names.Labels(client)
    host = [("HOST", lambda s: label.host(s.id))] if label.superuser else []
    return table(servers, [("ID", lambda s: s.id), ("HOSTNAME", lambda s: s.hostname),
                           ("STATUS", lambda s: s.status), ("OWNER", lambda s: label.user(s.owner)),
                           ("IMAGE", lambda s: label.image(s.image)), ("FLAVOR", lambda s: label.flavor(s.flavor)),
                           *host, ("PRIVATE-IP", lambda s: s.private_ip), ("PUBLIC-IP", lambda s: s.public_ip),
                           ("CREATED", lambda s: s.created)])


def _details(client: Client, s: Server) -> str:
    usernames = names.usernames_by_account(client)
    label = names.Labels(client)
    host = [("host", label.host(s.id))] if label.superuser else []
    return fields([("id", s.id), ("hostname", s.hostname), ("status", s.status), ("private-ip", s.private_ip),
                   ("public-ip", s.public_ip), ("owner", label.user(s.owner)), ("image", label.image(s.image)),
                   ("flavor", label.flavor(s.flavor)), *host, ("users", [usernames.get(u, u) for u in s.users]),
                   ("created", s.created)])


# ssh gives up connecting after this many seconds (an address unreachable from here, a guest
# that is down): without it a connection to a silent address waits for the system's TCP timeout.
SSH_CONNECT_TIMEOUT = 10


def ssh_argv(client: Client, s: Server, command: tuple[str, ...] = ()) -> list[str]:
    """ssh as the caller's own system account at the server's private address, its connection
    bounded by SSH_CONNECT_TIMEOUT."""
    me = client.me()
    if not me.usernames:
        raise ClientError("you have no system account yet: ask the cluster's administrators")
    if not s.private_ip:
        raise ClientError(f"server {s.id} has no private address yet")
    return ["ssh", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}", f"{me.usernames[0]}@{s.private_ip}", *command]


def ssh_line(argv: list[str]) -> str:
    """The line a person types, of ssh_argv's: ssh USERNAME@PRIVATE-IP (its -o ConnectTimeout left out)."""
    return " ".join([argv[0], *argv[3:]])


def no_guest(s: Server) -> str:
    return f"the sandbox runs no guest: nothing to connect to at {s.private_ip or s.hostname or s.id}"


def _refusal(client: Client, e: ApiError) -> str:
    """A refused create names the limit and, from GET /v1/limits, what is in use."""
    if e.status not in (403, 409) or not e.message.startswith("limit reached"):
        return e.message
    try:
        lim = client.limits()
    except ClientError:
        return e.message
    used = ", ".join(f"{k} {getattr(lim, k).used} of {_limit(getattr(lim, k).limit)}"
                     for k in ("instances", "vcpus", "memory_mb"))
    return f"{e.message}; in use: {used}"


def _limit(value: int) -> str:
    return "no limit" if value == -1 else str(value)


@server.command("create")
@click.option("--image", required=True, help="Image name or id.")
@click.option("--flavor", required=True, help="Flavor name or id.")
@click.option("--user", "users", multiple=True, help="Another user with access: username, email, name or id.")
@click.option("--wait", is_flag=True, help="Wait until the guest takes SSH logins, then print the ssh line.")
@click.option("--ssh", "run_ssh", is_flag=True, help="With --wait: then log in (implies --wait).")
@click.option("--timeout", default=WAIT_SECONDS, show_default=True, type=click.IntRange(1, 3600),
              help="Seconds --wait waits at most.")
@cloud_command
def create(run: Run, image, flavor, users, wait, run_ssh, timeout):
    """Create a server from an image and a flavor.

    Example: cloud server create --image "Debian 12" --flavor small --user bob --wait
    """
    client = run.client
    body_image, body_flavor = names.image(client, image).id, names.flavor(client, flavor).id
    accounts = names.account_ids(client, users)
    try:
        made = client.create_server(image=body_image, flavor=body_flavor, users=accounts)
    except ApiError as e:
        fail(run, _refusal(client, e), status=e.status)
    if wait or run_ssh:
        run.progress(f"created {made.hostname} ({made.id})")
        try:
            made = _waited(run, made, timeout)
        except NoGuestHere as e:
            if run_ssh:
                fail(run, no_guest(e.server), extra={"id": e.server.id, "status": e.server.status})
            run.emit(e.server.raw, lambda: _details(client, e.server))
            return
        argv = ssh_argv(client, made)
        if run_ssh:
            _exec_ssh(argv)
        run.emit(made.raw, lambda: _details(client, made) + "\n\n" + ssh_line(argv))
        return
    run.emit(made.raw, lambda: _details(client, made))


def _waited(run: Run, s: Server, timeout: int) -> Server:
    """wait_for_guest with what a person needs at its ends: the sandbox's note, a timeout's
    id and status under --json, and on Ctrl-C that the server keeps running."""
    name = s.hostname or s.id
    try:
        return wait_for_guest(run.client, s, timeout=timeout, progress=run.progress)
    except NoGuestHere:
        run.progress(f"note: {name} is running on the sandbox, where guests do not boot (libvirt's test "
                     "driver): stopped waiting at `running`")
        raise
    except WaitTimeout as e:
        fail(run, e.message, extra={"id": e.server.id, "status": e.server.status})
    except KeyboardInterrupt:
        run.progress(f"\ninterrupted: stopped waiting; server {name} ({s.id}) keeps running; "
                     f"`cloud server delete {name}` deletes it")
        sys.exit(130)


@server.command("list")
@click.option("--owner", help="Only this user's servers (id, email or name).")
@cloud_command
def list_(run: Run, owner):
    """List the servers you see (yours, and your managed users').

    Example: cloud server list --json
    """
    owner_id = names.user(run.client, owner).id if owner else None
    servers = run.client.list_servers(owner=owner_id)
    run.emit([s.raw for s in servers], lambda: _table(run.client, servers))


show_command(server, resolve=names.server, render=_details, help="""
    Show one server (by id, unique id prefix or hostname).

    Example: cloud server show vm-1a2b3c4d
    """)


@server.command("delete")
@click.argument("name")
@cloud_command
def delete(run: Run, name):
    """Delete a server and its root disk (home volumes stay).

    Example: cloud server delete vm-1a2b3c4d
    """
    s = names.server(run.client, name)
    run.client.delete_server(s.id)
    run.emit({"deleted": s.id}, f"deleted {s.hostname or s.id}")


def _power(what: str, method: str, done: str):
    @server.command(what)
    @click.argument("name")
    @click.option("--wait", is_flag=True, help="Wait until the guest takes SSH logins again.")
    @click.option("--timeout", default=WAIT_SECONDS, show_default=True, type=click.IntRange(1, 3600))
    @cloud_command
    def power(run: Run, name, wait, timeout):
        s = names.server(run.client, name)
        changed = getattr(run.client, method)(s.id)
        if wait:
            try:
                changed = _waited(run, changed, timeout)
            except NoGuestHere as e:
                changed = e.server
        run.emit(changed.raw, f"{done} {changed.hostname or changed.id}: {changed.status}")

    power.help = inspect.cleandoc(f"""{what.capitalize()} a server.

    Example: cloud server {what} vm-1a2b3c4d{' --wait' if what != 'stop' else ''}
    """)
    return power


_power("reboot", "reboot_server", "rebooted")
_power("start", "start_server", "started")
_power("stop", "stop_server", "stopped")


@server.group("users")
def users():
    """Who has access to a server.

    Example: cloud server users add vm-1a2b3c4d bob
    """


def _users(verb: str, how: str, what: str):
    members_command(users, verb, render=_details, help=f"""
    {what} (by username, email, name or id); reaches a running guest at its next reboot or stop/start.

    Example: cloud server users {verb} vm-1a2b3c4d bob carol
    """, apply=lambda c, name, who: c.modify_server_users(names.server(c, name).id, how, names.account_ids(c, who)))


_users("add", "add", "Give users access to a server")
_users("remove", "delete", "Take users' access to a server away")
_users("set", "replace", "Make these the server's only users")


@server.command("ssh", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--print", "print_only", is_flag=True, help="Print the ssh line instead of running it.")
@cloud_command(formats_options=False)
def ssh(run: Run, name, command, print_only):
    """Log in to a server as yourself (ssh USERNAME@PRIVATE-IP), or run a command there; ssh
    gives up connecting after 10 s. In the sandbox, where no guest runs, nothing is sent.

    Example: cloud server ssh vm-1a2b3c4d -- id
    """
    s = names.server(run.client, name)
    argv = ssh_argv(run.client, s, tuple(command))
    # The sandbox (libvirt's test driver) says so in the console: no guest answers there, so
    # nothing is sent to the address and nobody waits for ssh's timeout.
    sandbox = on_sandbox(run.client, s.id)
    if print_only:
        if sandbox:
            run.progress(f"note: {no_guest(s)}")
        run.emit({"argv": argv}, " ".join(argv))
        return
    if sandbox:
        raise ClientError(no_guest(s))
    _exec_ssh(argv)


def _exec_ssh(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        raise ClientError("ssh is not installed here")
    os.execvp(argv[0], argv)


@server.command("console")
@click.argument("name")
@click.option("--bytes", "size", type=click.IntRange(1, 1048576), default=None,
              help="How much of the end to show (default 64 KiB).")
@click.option("--follow", is_flag=True, help="Keep printing new output until interrupted or the server is gone.")
@click.option("--raw", is_flag=True,
              help="Write the guest's text as it is, control sequences too (by default they are shown escaped).")
@cloud_command
def console(run: Run, name, size, follow, raw):
    """Show a server's serial console since its last start, and whether it has finished booting.

    The guest writes this text: control characters and escape sequences in it are shown
    as `\\x1b`-style escapes, so that they cannot drive your terminal; --raw writes them.

    Example: cloud server console vm-1a2b3c4d --follow
    """
    s = names.server(run.client, name)
    got = run.client.console(s.id, size=size)
    shown = (lambda text: text) if raw else console_text
    if raw and not run.as_json and not follow:
        sys.stdout.write(got.text.rstrip("\n") + f"\n-- ready: {'yes' if got.ready else 'no'}\n")
        return
    if run.as_json or not follow:
        run.emit(got.raw, lambda: shown(got.text).rstrip("\n") + f"\n-- ready: {'yes' if got.ready else 'no'}")
        return
    sys.stdout.write(shown(got.text))
    sys.stdout.flush()
    seen = got.text
    try:
        while True:
            time.sleep(POLL_SECONDS)
            try:
                now = run.client.console(s.id, size=size).text
            except ApiError as e:
                if e.status == 404:
                    run.progress(f"server {s.hostname or s.id} is gone")
                    return
                raise
            sys.stdout.write(shown(_new_part(seen, now)))
            sys.stdout.flush()
            seen = now
    except KeyboardInterrupt:
        return


def _new_part(seen: str, now: str) -> str:
    """What `now` (the console's last bytes) adds to `seen`: what follows seen's tail in it."""
    tail = seen[-256:]
    at = now.rfind(tail) if tail else -1
    return now[at + len(tail):] if at >= 0 else now  # no overlap: a restart, or more than the window


@server.command("actions")
@click.argument("name")
@click.option("--limit", type=click.IntRange(min=1),
              help="The most recent N entries: a page (the service's default and largest: 1000).")
@click.option("--marker", metavar="CURSOR", help="The page of entries older than an earlier page, by the cursor "
                                                  "that page named.")
@click.option("--all", "all_pages", is_flag=True, help="Every kept entry: the pages followed to the oldest.")
@cloud_command
def actions(run: Run, name, limit, marker, all_pages):
    """Show what was done to a server, oldest first: by whom, under which request id, with what result.

    A deleted server's history stays readable for the audit retention: name it by its full id.
    The most recent page is shown; when older entries remain, stderr names the --marker of
    the next page (--all shows them all).

    Example: cloud server actions vm-1a2b3c4d --json
    Example: cloud server actions vm-1a2b3c4d --limit 50 --all
    """
    server_id = name.lower() if names.is_uuid(name) else names.server(run.client, name).id
    if all_pages:
        done, older = run.client.server_actions(server_id, limit=limit, before=marker, all_pages=True), None
    else:
        page = run.client.server_actions_page(server_id, limit=limit, before=marker)
        done, older = page.actions, page.next_cursor
    label = names.Labels(run.client)
    run.emit([a.raw for a in done], lambda: table(done, [
        ("TIME", lambda a: a.time), ("ACTION", lambda a: a.action), ("RESULT", lambda a: a.result),
        ("REQUESTER", lambda a: label.user(a.requester) or "(administrator)"), ("REQUEST-ID", lambda a: a.request_id),
        ("MESSAGE", lambda a: a.message)]))
    if older is not None:
        # On stderr: stdout keeps the one document --json promises.
        run.progress(f"older entries remain: cloud server actions {server_id} --marker {older} (or --all)")
