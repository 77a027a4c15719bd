"""`cloud server ...`: create, list, show, renew, delete, power, users, ssh, console, actions."""

import os
import shutil
import sys
import time
from datetime import datetime, timezone

import inspect

import click

from agent.cloud import names
from agent.cloud.output import Run, cloud_command, fail, fields, members_command, show_command, table
from agent.cloud.tables import console_text
from agent.cloud.waiting import POLL_SECONDS, NoGuestHere, WaitTimeout, on_sandbox, wait_for_guest
from common.client import ApiError, Client, ClientError, Server

WAIT_SECONDS = 900
# A lease's length in hours: above 0 (the service bounds it by the cluster's longest lease).
HOURS = click.FloatRange(min=0, min_open=True)


@click.group("server")
def server():
    """Virtual machines (server-instances).

    Example: cloud server create --image "Debian 12" --flavor small --wait
    """


def _moment(text: str) -> datetime | None:
    """An RFC 3339 time of the API ("2026-12-03T10:00:00Z"); None when unreadable."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def expires_in(expires_at: str | None, lease: str | None = None, *, now: datetime | None = None) -> str:
    """When a lease ends, short, for a table: "-" for no lease (expires_at None); "expired"
    when the service says so (lease "expired") or the end has passed; else "in N min" under
    2 hours, "in N h" under 2 days, "in N d" beyond, each rounded to the nearest unit (at
    least 1 min, so a lease just renewed for 36 h reads "in 36 h"). An end the client cannot
    read is shown as it is."""
    if expires_at is None:
        return "-"
    if lease == "expired":
        return "expired"
    end = _moment(expires_at)
    if end is None:
        return expires_at
    left = (end - (now or datetime.now(timezone.utc))).total_seconds()
    if left <= 0:
        return "expired"
    if left < 2 * 3600:
        return f"in {max(1, round(left / 60))} min"
    if left < 2 * 86400:
        return f"in {round(left / 3600)} h"
    return f"in {round(left / 86400)} d"


def _end(s: Server) -> str | None:
    """The exact end of a server's lease, and when that is from now: `2026-12-03T10:00:00Z (in
    36 h)`; None for no lease."""
    if s.expires_at is None:
        return None
    return f"{s.expires_at} ({expires_in(s.expires_at, s.lease)})"


def _table(client: Client, servers: list[Server]) -> str:
    """A superuser's table also says which host each server is on."""
    label = names.Labels(client)
    host = [("HOST", lambda s: label.host(s.id))] if label.superuser else []
    return table(servers, [("ID", lambda s: s.id), ("HOSTNAME", lambda s: s.hostname),
                           ("STATUS", lambda s: s.status), ("OWNER", lambda s: label.user(s.owner)),
                           ("IMAGE", lambda s: label.image(s.image)), ("FLAVOR", lambda s: label.flavor(s.flavor)),
                           *host, ("PRIVATE-IP", lambda s: s.private_ip), ("PUBLIC-IP", lambda s: s.public_ip),
                           ("CREATED", lambda s: s.created), ("EXPIRES", lambda s: expires_in(s.expires_at, s.lease))])


def _details(client: Client, s: Server) -> str:
    usernames = names.usernames_by_account(client)
    label = names.Labels(client)
    host = [("host", label.host(s.id))] if label.superuser else []
    return fields([("id", s.id), ("hostname", s.hostname), ("status", s.status), ("private-ip", s.private_ip),
                   ("public-ip", s.public_ip), ("owner", label.user(s.owner)), ("image", label.image(s.image)),
                   ("flavor", label.flavor(s.flavor)), *host, ("users", [usernames.get(u, u) for u in s.users]),
                   ("created", s.created), ("expires-at", _end(s)), ("lease", s.lease)])


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
@click.option("--lease", "lease_hours", type=HOURS, metavar="HOURS",
              help="Then renew its lease: it ends this many hours from now, not after the default lease "
                   "(at most the cluster's longest lease).")
@cloud_command
def create(run: Run, image, flavor, users, wait, run_ssh, timeout, lease_hours):
    """Create a server from an image and a flavor.

    With --lease the new server's lease is renewed at once (as `cloud server renew
    NAME --hours HOURS` does). When that renewal is refused, the server still
    exists with the default lease: the error says so and names it (exit 1).

    Example: cloud server create --image "Debian 12" --flavor small --user bob --wait

    Example: cloud server create --image "Debian 12" --flavor small --lease 72
    """
    client = run.client
    body_image, body_flavor = names.image(client, image).id, names.flavor(client, flavor).id
    accounts = names.account_ids(client, users)
    try:
        made = client.create_server(image=body_image, flavor=body_flavor, users=accounts)
    except ApiError as e:
        fail(run, _refusal(client, e), status=e.status)
    if lease_hours is not None:
        made = _leased(run, made, lease_hours)
    if wait or run_ssh:
        run.progress(f"created {made.hostname} ({made.id})")
        try:
            made = _waited(run, made, timeout)
        except NoGuestHere as e:
            stopped = e.server
            if run_ssh:
                fail(run, no_guest(stopped), extra={"id": stopped.id, "status": stopped.status})
            run.emit(stopped.raw, lambda: _details(client, stopped))
            return
        argv = ssh_argv(client, made)
        if run_ssh:
            _exec_ssh(argv)
        run.emit(made.raw, lambda: _details(client, made) + "\n\n" + ssh_line(argv))
        return
    run.emit(made.raw, lambda: _details(client, made))


def _leased(run: Run, made: Server, hours: float) -> Server:
    """The new server with its lease renewed for `hours`; when the renewal fails, the server
    exists all the same: the error says so, names it and its end (exit 1, as a --wait that
    ends before the guest is ready)."""
    name = made.hostname or made.id
    try:
        return run.client.renew_server(made.id, hours=_hours(hours))
    except ClientError as e:
        end = f"it ends at {made.expires_at} (the default lease)" if made.expires_at else "it has no end"
        # --json: the server's id, status and end, as a --wait that timed out gives them.
        fail(run, f"server {name} ({made.id}) was created, but its lease was not renewed: {e.message}; {end}",
             extra={"id": made.id, "status": made.status, "expires-at": made.expires_at})


def _hours(hours: float) -> float | int:
    """--hours as the API is sent it: 36, not 36.0."""
    return int(hours) if float(hours).is_integer() else hours


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

    EXPIRES says when each server's lease ends (`cloud server show NAME`
    prints the exact time):

    \b
      in N min   under 2 hours from now (to the nearest minute)
      in N h     under 2 days (to the nearest hour)
      in N d     later (to the nearest day)
      expired    the lease has ended: powered off; renew it to start it again
      -          no lease: the server has no end

    Example: cloud server list --json
    """
    owner_id = names.user(run.client, owner).id if owner else None
    servers = run.client.list_servers(owner=owner_id)
    run.emit([s.raw for s in servers], lambda: _table(run.client, servers))


show_command(server, resolve=names.server, render=_details, help="""
    Show one server (by id, unique id prefix or hostname), with the exact end of its
    lease (`expires-at`, RFC 3339 UTC, `-` for none) and its state (`lease`: none,
    active, expiring, expired).

    Example: cloud server show vm-1a2b3c4d
    """)


@server.command("renew")
@click.argument("name")
@click.option("--hours", type=HOURS, metavar="HOURS",
              help="It ends this many hours from now (default: the cluster's default lease; at most its longest).")
@cloud_command
def renew(run: Run, name, hours):
    """Renew a server's lease, so that it is not powered off and later deleted at its end.

    A server whose lease has ended is powered off and cannot be started until it
    is renewed; some days after its end it is deleted (your files in $HOME stay).
    Without --hours it gets the cluster's default lease again.

    Example: cloud server renew vm-1a2b3c4d --hours 36
    """
    s = names.server(run.client, name)
    renewed = run.client.renew_server(s.id, hours=None if hours is None else _hours(hours))
    shown = renewed.hostname or renewed.id
    run.emit(renewed.raw, f"{shown} now ends at {_end(renewed)}" if renewed.expires_at
             else f"{shown} has no end")


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
        try:
            changed = getattr(run.client, method)(s.id)
        except ApiError as e:
            if e.status == 409 and e.message.startswith("lease expired"):
                # Said with the command that lifts it.
                fail(run, f"{e.message} (`cloud server renew {s.hostname or s.id}`)", status=e.status)
            raise
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
