"""Load a sandbox with a cluster's worth of users, accounts, homes, groups and instances.

`cloud-agent sandbox load` calls load(). The default shape is the benchmark's
(docs/performance.md): 10,000 users, of which 100 owners with 50 managed users
each and the rest plain users; a system account and a home volume for every
user; 1,000 groups owned by the owners, each with 5 of its owner's managed users;
10,000 instances (49 per owner, 1 per managed user, 1 each for the first plain
users), so an owner sees about 100 instances and a superuser all of them.

One useradd, groupadd or argon2 hash per user would take many minutes, so this
is a bulk path that keeps the invariants the service layer keeps:

- accounts go into the scratch system root with LocalDirectory.create_accounts
  and groups with local_groups.create_many (one rewrite of passwd, group,
  shadow and gshadow in the tools' format; uids above the uid mark, gids from
  `[groups] gid_min`..`gid_max`); usernames, uids, gids, emails and addresses are
  unique and checked by the schema's UNIQUE indexes as well;
- homes are made by the home volume adapter (owner, mode 0700, quota);
- instance addresses are the lowest free ones of `[network] subnet`, hostnames
  and MACs as controller.addresses makes them; each instance is admitted with
  controller.limits (per-user limits and host capacity) like a POST;
- every row is written in one transaction (Store.insert_loaded): a failure
  leaves no row; accounts, groups and homes made before it are listed in the
  error and reported by `cloud-agent reconcile` (only a scratch root is written).

Loaded users share one password (hashed once; shown in the result) and each
has its own API key and secret. Domains are not made here: in the sandbox the
libvirt test driver lives in the serving process, and `cloud-agent serve`
rebuilds every domain from the database at start (controller/maintenance/reconcile.py).
Only for the sandbox profile: a production database is loaded through the API.
"""

import secrets
from dataclasses import dataclass

from controller.storage import images
from controller import limits
from controller.addresses import hostname_for, mac_for, network_plan
from controller.context import Context
from controller.errors import InvalidInput
from controller.instances import lease_terms
from controller.users.groups import check_new_group_name
from controller.rules import new_id
from controller.security.crypto import new_api_key, new_api_secret
from controller.store import utc_now
from host_adapters.accounts import local_directory, local_groups


@dataclass(frozen=True)
class Shape:
    users: int = 10_000
    owners: int = 100
    managed_per_owner: int = 50
    instances: int = 10_000
    owner_instances: int = 49  # each owner's own; managed users get 1 each, plain users the rest
    groups: int = 1_000
    members_per_group: int = 5
    volume_gb: int = 1

    def check(self) -> None:
        plain = self.users - self.owners * (1 + self.managed_per_owner)
        if min(self.users, self.owners, self.managed_per_owner, self.instances, self.owner_instances,
               self.groups, self.members_per_group, self.volume_gb) < 0 or plain < 0:
            raise InvalidInput("the load needs users >= owners * (1 + managed_per_owner) and no negative count")
        if self.groups and not self.owners:
            raise InvalidInput("groups are owned by owners: give at least one owner")


def _sample(user: dict, secret: str, account: dict) -> dict:
    return {"userid": user["id"], "email": user["email"], "username": account["username"],
            "api_key": user["api_key"], "api_secret": secret}


def load(ctx: Context, shape: Shape = Shape(), *, progress=lambda _msg: None) -> dict:
    """Load the sandbox; returns counts, the shared password and a few users' credentials
    (an owner, a managed user, a plain user with an instance and one without)."""
    if not ctx.config.is_sandbox:
        raise InvalidInput("bulk loading is only for a sandbox ([controller] profile = sandbox)")
    if not (isinstance(ctx.adapters.directory, local_directory.LocalDirectory)
            and isinstance(ctx.adapters.groups, local_groups.CommandUnixGroups)):
        raise InvalidInput("bulk loading needs the local directory and UNIX groups of a scratch system root")
    shape.check()
    adapters, store, config = ctx.adapters, ctx.store, ctx.config
    now = utc_now()

    progress("image and flavor")
    image = images.add_image(ctx, name=f"load-{secrets.token_hex(3)}", os_name="debian", os_major="12",
                             os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name=f"load-tiny-{secrets.token_hex(3)}", memory=64, disk=1, vcpu=1)
    flavor_row = store.get_flavor(int(flavor["id"]))

    progress("users")
    tag = secrets.token_hex(3)  # a second load into the same sandbox gets other names
    password = "Load-" + secrets.token_hex(6) + "-42"
    password_hash = ctx.passwords.hash(password)
    users, secrets_of, kinds = [], {}, []

    def user(email: str, owner: str | None, kind: str) -> dict:
        secret = new_api_secret()
        row = {"id": new_id(), "email": email, "name": "", "password_hash": password_hash, "active": 1,
               "owner_userid": owner, "roles": [], "registration_source": "load", "api_key": new_api_key(),
               "api_secret_enc": ctx.secret_box.encrypt(secret), "created_at_utc": now}
        users.append(row)
        secrets_of[row["id"]] = secret
        kinds.append(kind)
        return row

    owners, managed_of = [], {}
    for o in range(shape.owners):
        owner = user(f"owner{o:04d}-{tag}@load.example", None, "owner")
        owners.append(owner)
        managed_of[owner["id"]] = [user(f"m{o:04d}x{m:03d}-{tag}@load.example", owner["id"], "managed")
                                   for m in range(shape.managed_per_owner)]
    while len(users) < shape.users:
        user(f"user{len(users):05d}-{tag}@load.example", None, "plain")
    if owners:  # the owners are new: only the limit counts
        limits.admit_count(config, "managed_users", overrides={}, owned=shape.managed_per_owner - 1)

    progress("system accounts")
    usernames = [f"{kind[0]}{i:05d}{tag}" for i, kind in enumerate(kinds)]
    home_root = config.volumes.home_root
    posix = local_directory.create_accounts(adapters.directory, [(name, adapters.homes.path(name))
                                                                 for name in usernames])
    made_accounts = [p.username for p in posix]
    accounts = [{"user_id": u["id"], "username": p.username, "uuid": new_id(), "uid": p.uid, "gid": p.gid,
                 "home": p.home, "cloud_controller_id": config.controller_id, "created_at_utc": now}
                for u, p in zip(users, posix)]
    account_of = {a["user_id"]: a for a in accounts}
    made_homes: list[str] = []
    made_groups: list[str] = []
    try:
        progress("homes")
        volumes = []
        for a in accounts:
            made_homes.append(adapters.homes.create(a["username"], uid=a["uid"], gid=a["gid"],
                                                    size_gb=shape.volume_gb))
            volumes.append({"id": new_id(), "owner_id": a["user_id"], "size_gb": shape.volume_gb, "name": None,
                            "visibility": "cluster", "mount_point": made_homes[-1], "creation_date": now,
                            "uid": a["uid"]})

        progress("groups")
        groups, members, specs = [], [], []
        for g in range(shape.groups):
            owner = owners[g % len(owners)]
            managed = managed_of[owner["id"]]
            start = (g // len(owners)) * shape.members_per_group
            chosen = [account_of[m["id"]]["username"]
                      for m in (managed[(start + k) % len(managed)] for k in range(shape.members_per_group))
                      ] if managed else []
            chosen = list(dict.fromkeys(chosen))
            name = check_new_group_name(ctx, f"lg{g:04d}{tag}")
            groups.append({"id": new_id(), "owner_id": owner["id"], "name": name, "creation_date": now})
            members += [(groups[-1]["id"], m, i) for i, m in enumerate(chosen)]
            specs.append((name, chosen))
        owned_groups: dict[str, int] = {}
        for row in groups:
            owner_id = row["owner_id"]
            if owner_id not in owned_groups:
                owned_groups[owner_id] = store.usage_of(owner_id)["groups"]
            limits.admit_count(config, "groups", overrides=store.limit_overrides(owner_id),
                               owned=owned_groups[owner_id])
            owned_groups[owner_id] += 1
        local_groups.create_many(adapters.groups, specs)
        made_groups = [name for name, _ in specs]

        progress("instances")
        instances, instance_users = _instances(ctx, shape, image=image, flavor=flavor_row, owners=owners,
                                               managed_of=managed_of, users=users, kinds=kinds,
                                               account_of=account_of, now=now)
        progress("database")
        store.insert_loaded(users=users, accounts=accounts, volumes=volumes, groups=groups, members=members,
                            instances=instances, instance_users=instance_users)
    except BaseException as e:
        # Only a scratch root and the sandbox's homes were written: name what stays for
        # `cloud-agent reconcile` and the admin, rather than guess at an undo.
        if isinstance(e, Exception):
            e.add_note(f"left behind by the failed load: {len(made_accounts)} accounts and {len(made_groups)} "
                       f"groups in the system root, {len(made_homes)} homes under {home_root}")
        raise

    with_instance = {i["owner_id"] for i in instances}
    plain = [u for u, k in zip(users, kinds) if k == "plain"]
    sample = {}
    if owners:
        sample["owner"] = _sample(owners[0], secrets_of[owners[0]["id"]], account_of[owners[0]["id"]])
        if managed_of[owners[0]["id"]]:
            m = managed_of[owners[0]["id"]][0]
            sample["managed"] = _sample(m, secrets_of[m["id"]], account_of[m["id"]])
    for label, wanted in (("plain", True), ("plain_without_instance", False)):
        found = next((u for u in plain if (u["id"] in with_instance) == wanted), None)
        if found is not None:
            sample[label] = _sample(found, secrets_of[found["id"]], account_of[found["id"]])
    return {
        "users": len(users), "owners": len(owners), "managed_users": sum(map(len, managed_of.values())),
        "accounts": len(accounts), "volumes": len(volumes), "groups": len(groups), "instances": len(instances),
        "image": image["id"], "flavor": flavor["id"], "password": password, "sample": sample,
        "instance_ids": [i["id"] for i in instances[:10]],
    }


def _instances(ctx: Context, shape: Shape, *, image, flavor, owners, managed_of, users, kinds, account_of, now):
    """Instance rows and their users: admitted by the limits, addresses allocated as a POST does."""
    config, store = ctx.config, ctx.store
    owners_list = [o["id"] for o in owners for _ in range(shape.owner_instances)]
    managed = [m["id"] for ms in managed_of.values() for m in ms]
    plain = [u["id"] for u, k in zip(users, kinds) if k == "plain"]
    wanted = (owners_list + managed)[: shape.instances]
    rest = shape.instances - len(wanted)
    if rest and not plain:
        raise InvalidInput(f"{rest} instances left over and no plain user to hold them")
    wanted += [plain[i % len(plain)] for i in range(rest)]

    plan = network_plan(config)
    if plan.has_public:
        raise InvalidInput("bulk loading does not allocate public addresses; load a sandbox without them")
    used = store.used_addresses()
    free_ips = (str(a) for a in plan.subnet.hosts() if a != plan.gateway and str(a) not in used["private_ip"])
    # Every loaded instance runs on the config's own host (the sandbox has one).
    host = config.libvirt.host_name
    capacity = ctx.adapters.hypervisor.host_capacity()
    allocated = _usage(store, None)
    owned: dict[str, dict] = {}
    rows, links = [], []
    for owner_id in wanted:
        if owner_id not in owned:
            owned[owner_id] = _usage(store, owner_id)
        limits.admit_instance(config, flavor=flavor, capacity=capacity, overrides=store.limit_overrides(owner_id),
                              owned=owned[owner_id], allocated=allocated)
        for usage in (owned[owner_id], allocated):
            usage["instances"] += 1
            usage["vcpus"] += flavor["vcpu"]
            usage["memory_mb"] += flavor["memory"]
        instance_id = new_id()
        ip = next(free_ips, None)
        if ip is None:
            raise InvalidInput(f"no free private address left in {plan.subnet}")
        hostname, mac = hostname_for(instance_id, used["hostname"]), mac_for(instance_id, used["mac"])
        used["hostname"].add(hostname)
        used["mac"].add(mac)
        rows.append({"id": instance_id, "owner_id": owner_id, "image_id": image["id"], "flavor_id": flavor["id"],
                     "status": "running", "hostname": hostname, "public_ip": None, "private_ip": ip, "mac": mac,
                     "public_mac": None, "creation_date": now, "host": host,
                     # The lease a create would give it (none while leases are off).
                     "expires_at": lease_terms.initial_expiry(ctx, flavor)})
        links.append((instance_id, account_of[owner_id]["uuid"]))
    return rows, links


def _usage(store, owner_id: str | None) -> dict:
    return store.usage_of(owner_id) if owner_id is not None else store.instance_usage()
