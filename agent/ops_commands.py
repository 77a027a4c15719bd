"""cloud-agent reconcile / backup / check / audit: keeping a deployment healthy."""

import os
import sqlite3
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click

from agent.common import Options, command_options, email_of, emit, fail, status_line
from controller.audit import trail as audit_trail
from controller.errors import InvalidInput
from controller.rules import as_decimal
from controller.monitoring.health import run_checks
from controller.hosts.libvirt_uri import host_warnings
from controller.maintenance.reconcile import reconcile as run_reconcile
from controller.store import Store


@click.command("reconcile")
@click.option("--fix", is_flag=True, help="Repair what can be repaired safely.")
@command_options
def reconcile(opts: Options, fix):
    """Compare the database with the host (domains, disks, homes, quotas, groups, accounts).

    Prints every drift; with --fix repairs what it safely can and says what it left.
    Exits 1 when drift remains.

    Example: cloud-agent reconcile --fix
    """
    progress = status_line(opts, "reconcile")
    ctx = opts.context(adapters=True)
    # The sandbox's libvirt test driver keeps domains inside the server process; this
    # process would see none of them (the server reconciles them itself at start).
    with_hypervisor = not ctx.adapters.hypervisor_in_process
    drift = run_reconcile(ctx, fix=fix, progress=progress, hypervisor=with_hypervisor)
    if progress:
        click.echo("\r\033[K", err=True, nl=False)
    remaining = [d for d in drift if not d["fixed"]]
    lines = [
        f"{'FIXED' if d['fixed'] else 'DRIFT'} {d['kind']} {d['target']}: {d['detail']}"
        + (f" (repair failed: {d['error']})" if d["error"] else "")
        + ("" if d["fixed"] or d["fixable"] else " [not repairable automatically]")
        for d in drift
    ]
    lines = lines or ["no drift"]
    if not with_hypervisor:
        lines.append("note: sandbox profile: domains and base disks live in the server process and were not checked")
    emit(opts, {"drift": drift}, "\n".join(lines))
    if remaining:
        sys.exit(1)


@click.command("backup")
@click.argument("dest", type=click.Path(dir_okay=False))
@command_options
def backup(opts: Options, dest):
    """Take a consistent copy of the database while the service runs (SQLite online backup).

    Example: cloud-agent backup /var/backups/cloud-controller/controller-$(date +%F).db
    """
    source = opts.config().database_path
    if not Path(source).is_file():
        raise InvalidInput(f"database {source} does not exist: run `cloud-agent init`")
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    try:
        # Exclusive, and private from the first byte: the copy holds password hashes.
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise InvalidInput(f"{dest} exists; refusing to overwrite a backup") from None
    try:
        store = Store(source)
        try:
            store.backup(dest)
        finally:
            store.close()
        check = sqlite3.connect(dest)
        try:
            result = check.execute("PRAGMA integrity_check").fetchone()[0]
        finally:
            check.close()
        if result != "ok":
            fail(opts, f"backup {dest} failed its integrity check: {result}")
    except BaseException:
        Path(dest).unlink(missing_ok=True)
        raise
    emit(opts, {"backup": str(Path(dest).resolve())}, f"backup written to {dest}")


@click.command("check")
@command_options
def check(opts: Options):
    """Check the database, libvirt (pool, network, virt_type), the directory, the quota backend,
    the system root, and that QEMU starts a guest with [libvirt] virt_type and cpu_mode.

    Example: cloud-agent check
    """
    ctx = opts.context(adapters=True, require_database=False)
    if ctx.config.cloud_auth.url:
        from controller.cloud_auth.client import CloudAuthDown
        from controller.cloud_auth.follower import follower_for

        ctx.cloud_auth = follower_for(ctx)  # a secret file others may read fails here
        try:
            ctx.cloud_auth.poll()
        except CloudAuthDown:
            pass  # the cloud_auth check says so
    checks = run_checks(ctx, thorough=True)
    ok = all(c["ok"] for c in checks)
    lines = [f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}" + (f": {c['detail']}" if c["detail"] else "")
             for c in checks]
    # A host reached over an unencrypted or unverified transport works, so it fails no check,
    # but the admin is told each time (issue 16, finding 15).
    warnings = host_warnings(ctx)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    emit(opts, {"ok": ok, "checks": checks, **({"warnings": warnings} if warnings else {})}, "\n".join(lines))
    if not ok:
        sys.exit(1)


def _since(value: str | None, option: str = "--since") -> str | None:
    """An RFC 3339 time, or a span back from now such as 30m, 12h, 7d."""
    if value is None:
        return None
    units = {"m": "minutes", "h": "hours", "d": "days"}
    wrong = InvalidInput(f"{option} wants a time like 2026-11-21T10:00:00Z or a span like 12h, not {value!r}")
    # ASCII digits of a bounded length (str.isdigit() took "\u00b9", which int() refuses), and
    # a span or zone that leaves the calendar is refused like any other wrong value.
    span = as_decimal(value[:-1]) if value[-1:] in units else None
    try:
        if span is not None and span >= 0:
            at = datetime.now(timezone.utc) - timedelta(**{units[value[-1]]: span})
        else:
            at = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if at.tzinfo is None:
                at = at.replace(tzinfo=timezone.utc)
        return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError):
        raise wrong from None


@click.command("audit")
@click.option("--since", default=None, help="From this time (RFC 3339) or span back (30m, 12h, 7d).")
@click.option("--user", default=None, help="Only this actor: a user id, an email, or cloud-agent:NAME.")
@click.option("--limit", type=int, default=1000, show_default=True, help="At most this many rows, oldest first.")
@click.option("--prune", is_flag=True,
              help="Delete the rows older than --before (default: [audit] retention_days) instead of listing.")
@click.option("--before", default=None, help="With --prune: a time (RFC 3339) or a span back (90d, 12h).")
@command_options
def audit(opts: Options, since, user, limit, prune, before):
    """List audit rows: who did what to which target, the result and the time; or prune old rows.

    \b
    Examples:
      cloud-agent audit --since 24h --user alice@example.org
      cloud-agent audit --prune --before 90d
    """
    if prune:
        if since is not None or user is not None:
            raise click.UsageError("--prune takes --before, not --since or --user")
        _prune(opts, before)
        return
    if before is not None:
        raise click.UsageError("--before goes with --prune (to list, use --since)")
    ctx = opts.context()
    actor = user
    if user and "@" in user:
        found = ctx.store.get_user_by_email(user)
        if found is None:
            raise InvalidInput(f"no user with email {user}")
        actor = found["id"]
    entries = audit_trail.list_entries(ctx.store, since=_since(since), actor=actor, limit=limit)
    emails = email_of(ctx, [e["actor"] for e in entries])  # an API user's rows name it by id
    lines = [f"{e['at_utc']} {emails.get(e['actor'], e['actor'])} {e['action']} {e['target']} -> {e['result']}"
             + (f" ({e['detail']})" if e["detail"] else "") for e in entries]
    emit(opts, {"entries": entries}, "\n".join(lines) if lines else "no audit rows")


def _prune(opts: Options, before: str | None) -> None:
    if before is None:
        days = opts.config().audit.retention_days
        if days <= 0:
            raise click.UsageError("give --before (a time or a span like 90d), or set [audit] retention_days")
        cutoff = audit_trail.cutoff_for_days(days)
    else:
        cutoff = _since(before, "--before")
    pruned = audit_trail.prune_before(opts.context().store, cutoff)
    # This command's own row is written after the prune, so it stays.
    emit(opts, {"pruned": pruned}, f"pruned {pruned} audit rows older than {cutoff}")


def register(cli) -> None:
    for command in (reconcile, backup, check, audit):
        cli.add_command(command)
