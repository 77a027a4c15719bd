"""Compare the database with the host and, when asked, repair the drift.

The database is the record of what clients asked for; the host is made to
match it. What cannot be repaired without losing something a user did not ask
to lose (an orphan domain, a disk without its domain, an account whose uid
changed) is reported and left for the admin.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass

from controller.context import Context
from controller.errors import ControllerError, NotFound
from controller.locks import host_changes


@dataclass
class Drift:
    kind: str  # e.g. "domain-missing", "group-members"
    target: str  # the id or name concerned
    detail: str
    fixable: bool
    fixed: bool = False
    error: str = ""
    host: str = ""  # the hypervisor host concerned, for domains, disks and networks

    def as_dict(self) -> dict:
        return asdict(self)


class _Run:
    def __init__(self, ctx: Context, *, fix: bool, progress: Callable[[str], None] | None):
        self.ctx, self.fix, self.progress = ctx, fix, progress or (lambda _msg: None)
        self.drift: list[Drift] = []
        # username -> the uid the directory gives it now (None: no such account), for
        # the accounts _accounts could read; a home is only repaired for a matching uid.
        self.directory_uids: dict[str, int | None] = {}

    def probe(self, target: str, what: str, look: Callable[[], object]) -> tuple[bool, object]:
        """Run one host look-up; one that fails is reported and the run goes on with the rest."""
        try:
            return True, look()
        except NotFound:
            raise
        except ControllerError as e:
            self.found("check-failed", target, f"could not read {what}: {e.message}")
            return False, None

    def found(self, kind: str, target: str, detail: str, repair: Callable[[], None] | None = None) -> None:
        item = Drift(kind=kind, target=target, detail=detail, fixable=repair is not None,
                     host=getattr(self, "host", ""))
        if self.fix and repair is not None:
            try:
                repair()
                item.fixed = True
            except ControllerError as e:
                item.error = e.message
        self.drift.append(item)


def reconcile(
    ctx: Context,
    *,
    fix: bool = False,
    progress: Callable[[str], None] | None = None,
    hypervisor: bool = True,
) -> list[dict]:
    """Every drift found, as dicts; with fix=True after trying to repair each.

    hypervisor=False leaves out base images and domains (the sandbox's libvirt test
    driver lives inside the server process, so another process cannot see them).
    """
    run = _Run(ctx, fix=fix, progress=progress)
    run.hypervisor = hypervisor
    # Repairs run alone: no create or delete is half way while they look (an operation
    # in flight would look like drift), and none starts until they are done.
    with host_changes(ctx, exclusive=fix):
        _intents(run)
        _accounts(run)
        if ctx.config.cloud_auth.url:
            _registry(run)
        _homes(run)
        _groups(run)
        if hypervisor:
            _hypervisor_hosts(run)
    # After the exclusive lock: the sweep's power-offs and deletes take it shared, as the API's
    # do. Not without the hypervisor: its power-offs and deletes are host work (on the
    # sandbox the server process, which holds the domains, sweeps).
    if hypervisor:
        _leases(run)
    _record_report(ctx, run)
    return [d.as_dict() for d in run.drift]


def _leases(run: _Run) -> None:
    """Leases past a warning, their end or their keep that the service's sweep has not acted
    on (it is not running, or failed): reported as lease-warning, lease-expire, lease-delete,
    lease-notify; --fix runs the sweep's own code (controller/instances/leases.py)."""
    from controller.instances import leases

    due = leases.due(run.ctx)
    if not due:
        return
    done = {(d["kind"], d["instance"]) for d in leases.sweep(run.ctx)} if run.fix else set()
    for item in due:
        drift = Drift(kind=f"lease-{item['kind']}", target=item["instance"], detail=item["detail"], fixable=True)
        if run.fix:
            drift.fixed = (item["kind"], item["instance"]) in done
            if not drift.fixed:
                drift.error = "not done by this sweep (busy, done by another process, or failed: see the log)"
        run.drift.append(drift)


def _record_report(ctx: Context, run: _Run) -> None:
    """The report's counts per kind, kept for the service's metrics: reconcile usually runs in
    another process (`cloud-agent reconcile`, its timer) than the one Prometheus scrapes."""
    counts: dict[str, tuple[int, int]] = {}
    for item in run.drift:
        found, remaining = counts.get(item.kind, (0, 0))
        counts[item.kind] = (found + 1, remaining + (not item.fixed))
    ctx.store.record_reconcile(counts, fix=run.fix)


# -- operations a crash interrupted ------------------------------------------------------
def _intents(run: _Run) -> None:
    """Records left half way: deletes are finished, creates the client never saw succeed are
    undone. Nothing a user deleted comes back; nothing a user was told exists goes."""
    from controller.users import accounts, groups
    from controller.instances import instances
    from controller.storage import volumes

    ctx, homes, unix = run.ctx, run.ctx.adapters.homes, run.ctx.adapters.groups
    for account in ctx.store.list_accounts():
        if account["state"] == "deleting":
            run.found("account-disable-interrupted", account["username"],
                      "an account disable did not finish; finishing it",
                      lambda a=account: accounts.finish_disable(ctx, a))
    for volume in ctx.store.list_volumes(visible_to=None, with_intents=True):
        if volume["state"] == "ready":
            continue
        account = ctx.store.account_of_user(volume["owner_id"], ctx.config.controller_id)

        def finish(v=volume, a=account):
            if a is not None:
                retired = homes.retire(a["username"], token=v["id"], uid=v["uid"])
                if retired is not None:
                    volumes.remove_retired(ctx, retired)
            if a is not None and v["state"] == "deleting":
                volumes.finish_delete(ctx, v, a)
            else:
                ctx.store.delete_volume(v["id"])

        what = "a volume delete did not finish; finishing it" if volume["state"] == "deleting" else \
            "a volume create did not finish (the client saw no success); undoing it"
        run.found(f"volume-{'delete' if volume['state'] == 'deleting' else 'create'}-interrupted",
                  volume["id"], what, finish)
    read, retired = run.probe("homes", "deleted homes not removed yet", homes.list_retired)
    for path in retired if read else ():
        run.found("home-retired", path, "a deleted home is not removed yet (a crash, or a removal in progress)",
                  lambda p=path: volumes.remove_retired(ctx, p))
    for group in ctx.store.list_groups(visible_to=None, with_intents=True):
        if group["state"] == "ready":
            continue

        def finish_group(g=group):
            unix.delete(g["name"])
            groups.finish_delete(ctx, g)

        verb = "delete" if group["state"] == "deleting" else "create"
        run.found(f"group-{verb}-interrupted", group["name"],
                  f"a group {verb} did not finish; " + ("finishing it" if verb == "delete" else "undoing it"),
                  finish_group)
    from controller.instances import instance_claims

    for held in instance_claims.stale_claims(ctx):
        # Its process is gone: what it left half way is in the records below (moves, evacuations).
        run.found("instance-claim-stale", held["instance_id"],
                  f"the claim of process {held['pid']} on {held['machine']} ({held['operation']}, since "
                  f"{held['claimed_at_utc']}) remains after that process ended; removing it",
                  lambda h=held: instance_claims.drop_stale(ctx, h))
    if ctx.adapters.hypervisor_in_process and not run.hypervisor:
        return
    from controller.maintenance import evacuate

    for record in ctx.store.list_evacuations():
        # Never undone: the old host is dead, so the rebuild is finished where the row points.
        run.found("instance-evacuate-interrupted", record["instance_id"],
                  f"an evacuation from host {record['from_host']} to host {record['to_host']} did not finish; "
                  "finishing it (the instance is rebuilt from its image there)",
                  lambda r=record: evacuate.resume(ctx, r["instance_id"]))
    from controller.maintenance import drain

    for record in ctx.store.list_moves():
        # Finished, never undone past its commit: the old host's disk goes only after the new one's is checked.
        run.found("instance-move-interrupted", record["instance_id"],
                  f"a move from host {record['from_host']} to host {record['to_host']} did not finish; "
                  "finishing it (the disk is copied again if it was not yet committed; if host "
                  f"{record['to_host']} is dead, `cloud-agent host evacuate {record['to_host']} --host-is-down` "
                  f"returns the instance to its own disk on host {record['from_host']})",
                  lambda r=record: drain.resume(ctx, r["instance_id"]))
    for row in ctx.store.all_instances():
        if row.get("intent"):
            verb = "delete" if row["intent"] == "deleting" else "create"
            run.found(f"instance-{verb}-interrupted", row["id"],
                      f"an instance {verb} did not finish; " + ("finishing it" if verb == "delete" else "undoing it"),
                      lambda r=row: instances.finish_interrupted(ctx, r))


# -- system accounts ---------------------------------------------------------------
def _accounts(run: _Run) -> None:
    directory = run.ctx.adapters.directory
    accounts = [a for a in run.ctx.store.list_accounts() if a["state"] == "ready"]
    for i, account in enumerate(accounts, 1):
        run.progress(f"accounts {i}/{len(accounts)}")
        read, posix = run.probe(account["username"], "the directory entry",
                                lambda a=account: directory.get_account(a["username"]))
        if not read:
            continue
        run.directory_uids[account["username"]] = None if posix is None else posix.uid
        user = run.ctx.store.get_user(account["user_id"])
        inactive = user is not None and not user["active"]
        if posix is None:
            run.found(
                "account-missing", account["username"],
                f"system account {account['username']} (uid {account['uid']}) is not in the directory",
                lambda a=account, i=inactive: _recreate_account(run, a, locked=i),
            )
        elif posix.uid != account["uid"]:
            run.found("account-uid", account["username"],
                      f"directory uid {posix.uid}, recorded uid {account['uid']}; left for the admin")
        elif inactive and not posix.locked:
            run.found("account-lock", account["username"],
                      "the user is inactive but its system account is not locked",
                      lambda a=account: directory.lock_account(a["username"]))
        elif not inactive and posix.locked:
            run.found("account-lock", account["username"],
                      "the user is active but its system account is locked",
                      lambda a=account: directory.unlock_account(a["username"]))


def _recreate_account(run: _Run, account: dict, *, locked: bool) -> None:
    directory = run.ctx.adapters.directory
    posix = directory.create_account(account["username"], home=account["home"], uid=account["uid"])
    run.directory_uids[account["username"]] = posix.uid
    if locked:  # an inactive user's account comes back locked
        directory.lock_account(account["username"])


# -- accounts registered at cloud auth --------------------------------------------------
def _registry(run: _Run) -> None:
    """A controller following a cloud auth: every account recorded here is registered there
    under the same user, account id and uid, and no account is registered there for this
    cluster that is not recorded here. Either is what an enable or disable leaves when cloud
    auth stopped answering between its two steps; the repair finishes it."""
    from controller.cloud_auth.client import CloudAuthDown
    from controller.cloud_auth.follower import follower_for
    from controller.users.accounts import cloud_auth_registry

    ctx = run.ctx
    run.progress("accounts registered at cloud auth")
    try:
        # The copy made current first (it is as old as the server's last read otherwise).
        (ctx.cloud_auth or follower_for(ctx)).poll()
    except CloudAuthDown as e:
        run.found("check-failed", "cloud auth", f"could not read the accounts cloud auth lists: {e.message}")
        return
    registry = cloud_auth_registry(ctx)
    listed = ctx.store.registry_copy()
    recorded = {a["username"]: a for a in ctx.store.list_accounts()}
    for username, account in recorded.items():
        there = listed.get(username)
        if account["state"] != "ready":
            continue  # an enable or disable in flight, or one reconcile finishes above
        if there is None:
            run.found("account-unregistered", username,
                      f"system account {username} is recorded here but cloud auth does not list it for this cluster",
                      lambda a=account: registry.register(a["username"], user_id=a["user_id"], uuid=a["uuid"],
                                                          uid=a["uid"]))
        elif (there["user_id"], there["uuid"], there["uid"]) != (account["user_id"], account["uuid"], account["uid"]):
            run.found("account-registration", username,
                      f"cloud auth lists {username} for user {there['user_id']} (uid {there['uid']}), recorded "
                      f"here for user {account['user_id']} (uid {account['uid']}); left for the admin")
    for username in sorted(set(listed) - set(recorded)):
        run.found("account-registered-only", username,
                  f"cloud auth lists {username} for this cluster but no system account is recorded here",
                  lambda u=username: _unregister(registry, u))


def _unregister(registry, username: str) -> None:
    try:
        registry.unregister(username)
    except NotFound:
        pass  # gone already (a disable that finished after the copy was read)


# -- home volumes ---------------------------------------------------------------------
def _homes(run: _Run) -> None:
    ctx, homes = run.ctx, run.ctx.adapters.homes
    volumes = ctx.store.list_volumes(visible_to=None)
    # Volumes half made or half deleted are _intents' business, not orphan homes.
    with_volume = {v["owner_id"] for v in ctx.store.list_volumes(visible_to=None, with_intents=True)}
    for account in ctx.store.list_accounts():
        # A home with no volume record: a create whose clean-up failed, or a volume row lost.
        # Its data may matter to someone, so it is only reported.
        if account["user_id"] in with_volume:
            continue
        read, state = run.probe(account["username"], f"home {homes.path(account['username'])}",
                                lambda a=account: homes.inspect(a["username"]))
        if read and state.exists:
            run.found("home-without-volume", account["username"],
                      f"{homes.path(account['username'])} exists but no volume is recorded; left for the admin")
    for i, volume in enumerate(volumes, 1):
        run.progress(f"volumes {i}/{len(volumes)}")
        account = ctx.store.account_of_user(volume["owner_id"], ctx.config.controller_id)
        if account is None:
            run.found("volume-without-account", volume["id"], "the volume's owner has no system account")
            continue
        name, size = account["username"], volume["size_gb"]
        read, state = run.probe(volume["id"], f"home {homes.path(name)}", lambda n=name: homes.inspect(n))
        if not read:
            continue
        # A home is made, chowned or given a quota only for the uid the directory gives the
        # account now. While it differs from the record (reported as account-uid) the recorded
        # uid may be someone else's: repairing by it would hand them this home.
        unsure = _uid_doubt(run, account)
        guarded = _unless(unsure)
        why = f"; left for the admin: {unsure}" if unsure else ""
        if not state.exists:
            run.found(
                "home-missing", volume["id"], f"home {homes.path(name)} is missing (its data is gone){why}",
                guarded(lambda a=account, s=size: homes.create(a["username"], uid=a["uid"], gid=a["gid"], size_gb=s)),
            )
            continue
        if (state.uid, state.gid) != (account["uid"], account["gid"]) or state.mode != 0o700:
            run.found(
                "home-owner", volume["id"],
                f"home {homes.path(name)} is {state.uid}:{state.gid} mode {state.mode:o}, "
                f"expected {account['uid']}:{account['gid']} mode 700{why}",
                guarded(lambda a=account: homes.repair_owner(a["username"], uid=a["uid"], gid=a["gid"])),
            )
        if state.limit_gb is not None and state.limit_gb != size:
            run.found(
                "home-quota", volume["id"], f"quota {state.limit_gb} GB, recorded {size} GB{why}",
                guarded(lambda a=account, s=size: homes.resize(a["username"], uid=a["uid"], size_gb=s)),
            )
        elif state.limit_gb is None and state.quota_expected:
            run.found(
                "home-quota", volume["id"], f"no quota, recorded {size} GB{why}",
                guarded(lambda a=account, s=size: homes.resize(a["username"], uid=a["uid"], size_gb=s)),
            )
        # Removing them would lose the user's data, so they are only reported.
        if state.nested_subvolumes:
            run.found(
                "home-nested-subvolume", volume["id"],
                f"subvolumes nested in home {homes.path(name)}: "
                f"{', '.join(repr(p) for p in state.nested_subvolumes)}; data in them escapes the "
                f"{size} GB quota; left for the admin",
            )


def _unless(doubt: str) -> Callable[[Callable[[], None] | None], Callable[[], None] | None]:
    """No repair while there is a doubt (the drift is then reported as not fixable)."""
    return lambda repair: None if doubt else repair


def _uid_doubt(run: _Run, account: dict) -> str:
    """Why the recorded uid cannot be trusted for this account's home now ("" if it can)."""
    name = account["username"]
    if name not in run.directory_uids:
        return f"the directory entry of {name} could not be read"
    current = run.directory_uids[name]
    if current is None:
        return f"{name} is not in the directory"
    if current != account["uid"]:
        return f"the directory gives {name} uid {current}, the record says {account['uid']}"
    return ""


# -- groups ------------------------------------------------------------------------------
def _groups(run: _Run) -> None:
    groups_adapter = run.ctx.adapters.groups
    rows = run.ctx.store.list_groups(visible_to=None)
    for i, group in enumerate(rows, 1):
        run.progress(f"groups {i}/{len(rows)}")
        read, members = run.probe(group["name"], "the group", lambda g=group: groups_adapter.get(g["name"]))
        if not read:
            continue
        if members is None:
            run.found(
                "group-missing", group["name"], "the group is not on the host",
                lambda g=group: groups_adapter.create(g["name"], members=g["members"]),
            )
        elif sorted(members) != sorted(group["members"]):
            extra = sorted(set(members) - set(group["members"]))
            missing = sorted(set(group["members"]) - set(members))
            run.found(
                "group-members", group["name"],
                f"members added on the host: {extra or 'none'}; missing on the host: {missing or 'none'}",
                lambda g=group: groups_adapter.set_members(g["name"], g["members"]),
            )


# -- images and instances, host by host ----------------------------------------------------
def _hypervisor_hosts(run: _Run) -> None:
    """Each host in turn; one that does not answer is reported and the others are still
    compared and repaired."""
    from controller.errors import HostUnreachable
    from controller.hosts.host_routing import record_config_host, spec_of

    ctx = run.ctx
    own = record_config_host(ctx).name
    rows = ctx.store.list_hosts()
    recorded = {r["name"] for r in rows}
    for name in sorted({r["host"] for r in ctx.store.all_instances()} - recorded):
        run.found("host-missing", name, "instances are recorded on this hypervisor host, which is not; "
                  "left for the admin (`cloud-agent host add`)")
    for host in rows:
        run.host = host["name"]
        run.progress(f"host {host['name']}")
        hypervisor = ctx.adapters.hosts.hypervisor(spec_of(host))
        try:
            try:
                hypervisor.network_status()
            except HostUnreachable as e:
                run.found("host-unreachable", host["name"], f"{host['uri']} does not answer: {e.message}; "
                          "its instances were not compared")
                continue
            _network(run, hypervisor, host, own=host["name"] == own)
            _base_images(run, hypervisor, own=host["name"] == own)
            # Domains rebuilt together (a sandbox's start makes every one): the adapter
            # may group what costs more one at a time (DHCP reservations).
            with hypervisor.batch():
                _instances(run, hypervisor, host)
        except HostUnreachable as e:
            run.found("host-unreachable", host["name"], f"{host['uri']} stopped answering: {e.message}")
        finally:
            run.host = ""


def _base_images(run: _Run, hypervisor, *, own: bool) -> None:
    """On every host: temporary volumes of uploads that did not finish (a crash mid-upload;
    never used as a base image) are reported and, with --fix, removed (fix holds the
    host-change lock exclusive, so no create or `image add` is uploading meanwhile).
    The config's own host holds every image (`image add` makes them there); other hosts
    get theirs on first use."""
    read, partial = run.probe("base images", "temporary base image volumes", hypervisor.list_partial_base_images)
    for volume in partial if read else ():
        run.found("base-image-partial", volume,
                  "a temporary volume of a base image upload that did not finish (or is in progress); "
                  "never used as a base image",
                  lambda v=volume: hypervisor.delete_partial_base_image(v))
    if not own:
        return
    present = set(hypervisor.list_base_images())
    for image in run.ctx.store.list_images():
        if image["id"] in present:
            continue
        # A blank disk stands in only in the sandbox, whose test driver forgets everything
        # at exit; on a real host the admin must upload the image again.
        repair = None
        if run.ctx.adapters.hypervisor_in_process:
            repair = lambda i=image: hypervisor.create_base_image(i["id"], size_gb=i["min_disk"])  # noqa: E731
        run.found("base-image-missing", image["id"], f"base disk of image {image['name']!r} is missing", repair)


def _one_libvirt(run: _Run, hypervisor, other: str) -> bool | None:
    """Whether this host and host `other` reach one libvirt (never destroy on one what the row
    places on the other); None when that cannot be told now."""
    from controller.hosts.host_routing import hypervisor_of_host

    try:
        return hypervisor.identity().same_as(hypervisor_of_host(run.ctx, other).identity())
    except ControllerError:
        return None


def _network(run: _Run, hypervisor, host: dict, *, own: bool) -> None:
    read, state = run.probe("network", "the private network", hypervisor.network_status)
    if read and state != "active":
        # Only the config's own host's NAT network is the controller's to make; another
        # host's (often bridged) network is the admin's.
        run.found("network-missing", host["network"], f"the private network is {state}",
                  hypervisor.ensure_network if own else None)


def _instances(run: _Run, hypervisor, host: dict) -> None:
    from controller.instances.guests import guest_spec
    from controller.instances.instances import respawn
    from host_adapters.guests import seed as seeds
    from host_adapters.guests.guest import reservations_for
    from host_adapters.libvirt.nic_filters import nic_devices_for, same_nics

    ctx = run.ctx
    everything = ctx.store.all_instances()
    known = {r["id"] for r in everything if r["host"] == host["name"]}
    # Instances recorded on another host (evacuated from this one while it was dead): a
    # copy here is stale, never to be started; removed unless both records name one libvirt.
    uris = {h["name"]: h["uri"] for h in ctx.store.list_hosts()}
    elsewhere = {r["id"]: r["host"] for r in everything
                 if r["host"] != host["name"] and uris.get(r["host"]) != host["uri"]}
    evacuating = {e["instance_id"] for e in ctx.store.list_evacuations()}
    # An instance moving (drain) is in two places on purpose; its record is _intents' business.
    moving = {m["instance_id"] for m in ctx.store.list_moves()}
    macs = {m for r in everything for m in (r.get("mac"), r.get("public_mac")) if m}
    rows = [r for r in everything if not r.get("intent") and r["host"] == host["name"]
            and r["id"] not in evacuating | moving]
    # Each row is let go once it is compared (and repaired): 10,000 rows held until the
    # end of a sandbox's start were 20 MB, whose holes stayed in the server's memory.
    del everything
    rows.reverse()
    total = len(rows)
    from controller.errors import ControllerError, HostUnreachable

    try:
        dhcp = hypervisor.uses_dhcp_reservations()
    except HostUnreachable:
        raise
    except ControllerError:
        dhcp = True  # a missing network is reported above; reservations are then expected
    # A bridged network has no reservations: the guest's static config is all it needs.
    expected_reservations = reservations_for if dhcp else (lambda _guest: ())
    for i in range(1, total + 1):
        row = rows.pop()
        run.progress(f"instances {i}/{total}")
        try:
            read, info = run.probe(row["id"], "the domain", lambda r=row: hypervisor.describe(r["id"]))
        except NotFound:
            run.found("domain-missing", row["id"], "no domain and no disk on the host",
                      lambda r=row: respawn(ctx, r))
            continue
        if not read:
            continue
        if not info.defined and info.disk_path is None:
            # Only the seed is left: the controller made it from the record, nothing of the user's.
            run.found("domain-missing", row["id"], "no domain and no disk on the host (a seed remains)",
                      lambda r=row: (hypervisor.destroy(r["id"]), respawn(ctx, r)))
            continue
        if not info.defined:
            run.found("domain-missing", row["id"],
                      f"the disk {info.disk_path} remains but the domain is gone; left for the admin")
            continue
        if info.disk_path is None:
            run.found("disk-missing", row["id"], "the domain has lost its disk; left for the admin")
        read, guest = run.probe(row["id"], "what the guest should get", lambda r=row: guest_spec(ctx, r))
        if not read:
            continue
        update = lambda r=row, g=guest: hypervisor.set_guest(r["id"], g)  # noqa: E731
        tags = lambda shares: [s.tag for s in sorted(shares)]  # noqa: E731
        if tuple(sorted(info.shares)) != tuple(sorted(guest.shares)):
            run.found("domain-shares", row["id"],
                      f"virtiofs shares {tags(info.shares)}, expected {tags(guest.shares)}", update)
        expected_nics = tuple(sorted(nic_devices_for(guest), key=lambda n: n.mac))
        if not same_nics(info.nics, expected_nics):
            # A NIC without its filter (an instance made before NICs had one) is drift too.
            nics = lambda found: [(n.mac, n.filter.name if n.filter else None) for n in found]  # noqa: E731
            run.found("domain-nics", row["id"], f"NICs and filters {nics(info.nics)}, expected {nics(expected_nics)}",
                      update)
        if info.reservations != expected_reservations(guest):
            # A hostname missing: the DHCP host is there, its DNS name is not (network.py).
            held = lambda rs: [(r.mac, r.address, r.hostname or "no DNS name") for r in rs]  # noqa: E731
            run.found("network-reservation", row["id"],
                      f"reservations (MAC, address, name) {held(info.reservations)}, "
                      f"expected {held(expected_reservations(guest))}", update)
        expected_seed = seeds.render(row["id"], guest)
        if info.seed is None:
            run.found("seed-missing", row["id"], "the instance has no seed disk", update)
        elif info.seed != expected_seed:
            changed = sorted(k for k in set(info.seed) | set(expected_seed) if info.seed.get(k) != expected_seed.get(k))
            run.found("seed-content", row["id"], f"the seed's {', '.join(changed)} differ from the record", update)
        # A guest keeps the devices it booted with: a user removed from a running
        # guest keeps the home mounted until it is power-cycled, and doing that here
        # would lose the guest's state.
        if info.live_shares is not None and tuple(sorted(info.live_shares)) != tuple(sorted(guest.shares)):
            run.found(
                "domain-live-shares", row["id"],
                f"user access in the running guest differs from the record: it has shares "
                f"{tags(info.live_shares)}, expected {tags(guest.shares)}; "
                "power-off then power-on (or reboot) applies the record; left for the admin "
                "because a power cycle loses the guest's state",
            )
        if info.status != row["status"]:
            run.found(
                "instance-status", row["id"], f"host says {info.status}, database says {row['status']}",
                lambda r=row, s=info.status: ctx.store.set_instance_status(r["id"], s),
            )
    for orphan in sorted(set(hypervisor.list_instances()) - known - moving):
        one = _one_libvirt(run, hypervisor, elsewhere[orphan]) if orphan in elsewhere else False
        if one is None:
            run.found("domain-stale", orphan,
                      f"a domain, disk or seed of an instance now on host {elsewhere[orphan]}, which does not answer: "
                      "whether both are one libvirt cannot be told, so it is left until that host answers")
            continue
        if one:
            run.found("host-duplicate", orphan,
                      f"host {host['name']} and host {elsewhere[orphan]}, where the instance is recorded, reach the "
                      "same libvirt: its domain is the instance itself, never removed; `cloud-agent host remove` "
                      "the second record; left for the admin")
            continue
        if orphan in elsewhere:
            run.found("domain-stale", orphan,
                      f"a domain, disk or seed of an instance now on host {elsewhere[orphan]} (evacuated while "
                      "this host was down); removed, never started",
                      lambda i=orphan: hypervisor.destroy(i))
            continue
        run.found("domain-orphan", orphan, "a domain, disk or seed with no database record; left for the admin")
    read, reservations = run.probe("network", "the DHCP reservations", hypervisor.list_reservations)
    for r in reservations if read else ():
        if r.mac not in macs:
            run.found("reservation-orphan", r.mac,
                      f"DHCP reservation of {r.address} ({r.hostname or 'no name'}) for no instance",
                      lambda m=r.mac: hypervisor.drop_reservations([m]))
