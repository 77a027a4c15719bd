#!/usr/bin/env python3
"""Count what creates, lists, GETs, power operations and reconcile cost on many hosts.

Builds a controller in a temporary folder on HOSTS libvirt test-driver nodes
(each a node file of its own), creates INSTANCES instances through the API in
process, and prints, per operation, the Hypervisor calls made (each is one to
a few libvirt RPCs), the SQL statements run and the time taken. docs/scaling.md
extrapolates these numbers.

    .venv/bin/python scripts/scale_hosts.py --hosts 5 --instances 500
"""

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Counting:
    """A Hypervisor whose calls are counted in `counter` (by method name)."""

    def __init__(self, inner, counter: Counter):
        self._inner, self._counter = inner, counter

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self._counter[name] += 1
            return attr(*args, **kwargs)

        return call


def node_file(folder: Path, name: str, cpus: int, memory_mb: int) -> str:
    path = folder / f"{name}.xml"
    path.write_text(f"""<node><cpu><mhz>2000</mhz><model>x86_64</model><nodes>1</nodes><sockets>1</sockets>
<cores>{cpus}</cores><threads>1</threads><active>{cpus}</active></cpu><memory>{memory_mb * 1024}</memory>
<network><name>cc-private</name><bridge name='virbr-{name}'/><forward mode='nat'/>
<ip address='10.213.0.1' netmask='255.255.0.0'><dhcp/></ip></network>
<pool type='dir'><name>pool-{name}</name><target><path>/pool-{name}</path></target></pool></node>""")
    return f"test://{path}"


def superuser(ctx, client, email: str, username: str) -> dict:
    """A superuser with a system account and a home volume, as an admin and the API make
    them; the auth headers of its requests."""
    from controller.users.accounts import enable_account
    from controller.auth.tokens import issue_token
    from controller.users.users import insert_user

    row, secret = insert_user(ctx, email=email, password="scale-hosts-pass-1", roles=("superuser",))
    token = issue_token(ctx, api_key=row["api_key"], api_secret=secret)["token"]
    enable_account(ctx, email, username=username)
    headers = {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": row["id"]}
    r = client.simulate_post("/v1/storage-volume", headers=headers,
                             json={"volume-size": 1, "volume-type": {"visibility": "cluster"}})
    assert r.status_code == 201, r.json
    return headers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=5)
    parser.add_argument("--instances", type=int, default=500)
    args = parser.parse_args()

    from falcon import testing

    from api.app import create_app
    from controller.hosts import host_records
    from controller.storage import images
    from controller.config import config_from_dict, sandbox_values
    from controller.context import build_context
    from controller.maintenance.reconcile import reconcile
    from controller.security.crypto import generate_key_file
    from controller.store import Store
    from host_adapters.factory import Adapters, build_hypervisor, config_host, fake_adapters
    from host_adapters.host_pool import HostPool

    folder = Path(tempfile.mkdtemp(prefix="scale-hosts-"))
    values = sandbox_values(str(folder))
    values["auth"].update({"argon2_time_cost": 1, "argon2_memory_kib": 1024})
    values["capacity"] = {"cpu_allocation_ratio": "16", "ram_allocation_ratio": "1.5", "reserved_host_memory_mb": "0"}
    values["limits"] = {"instances": -1, "vcpus": -1, "memory_mb": -1, "groups": 10, "managed_users": 10}
    config = config_from_dict(values)
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    calls: dict[str, Counter] = {}
    fakes = fake_adapters()
    hypervisor = build_hypervisor(config)
    own = config_host(config)
    # The pool build_hosts makes, with each host's Hypervisor counted.
    pool = HostPool(lambda spec: Counting(hypervisor if spec == own else build_hypervisor(config, spec),
                                          calls.setdefault(spec.name, Counter())),
                    retry_seconds=config.hosts.retry_seconds)
    ctx = build_context(config, store=store, adapters=Adapters(
        hypervisor=hypervisor, homes=fakes.homes, groups=fakes.groups, directory=fakes.directory,
        hypervisor_in_process=True, hosts=pool))
    host_records.set_enabled(ctx, "default", False)
    per_host_mb = args.instances // args.hosts * 1024 + 1024
    for i in range(args.hosts):
        host_records.add_host(ctx, name=f"node-{i:02d}", uri=node_file(folder, f"node-{i:02d}", 64, per_host_mb),
                       storage_pool=f"pool-node-{i:02d}", network="cc-private")
    client = testing.TestClient(create_app(ctx))
    alice = superuser(ctx, client, "alice@example.org", "alice")
    image = images.add_image(ctx, name="Debian", os_name="debian", os_major="12", os_minor="7", min_disk=1,
                             min_ram=256)
    flavor = images.add_flavor(ctx, name="one", memory=1536, disk=2, vcpu=1)
    body = {"server-image": image["id"], "server-flavor": flavor["id"]}

    statements = [0]
    store.conn.set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))

    def measure(what: str, run, times: int = 1):
        for c in calls.values():
            c.clear()
        statements[0] = 0
        began = time.perf_counter()
        for _ in range(times):
            run()
        took = (time.perf_counter() - began) / times
        total = Counter()
        for c in calls.values():
            total.update(c)
        per = {k: round(v / times, 2) for k, v in sorted(total.items())}
        hosts_touched = sum(1 for c in calls.values() if c)
        print(f"{what:<34} {sum(total.values()) / times:8.2f} host calls {per}, on {hosts_touched} hosts; "
              f"{statements[0] / times:7.1f} SQL statements; {took * 1000:8.2f} ms")

    made = []

    def create():
        r = client.simulate_post("/v1/server-instance", headers=alice, json=body)
        assert r.status_code == 201, r.json
        made.append(r.json["data"][0]["id"])

    measure(f"create (first {args.hosts}, image copies)", create, args.hosts)
    measure(f"create (to {args.instances})", create, args.instances - args.hosts)
    measure(f"list of {len(made)}",
            lambda: client.simulate_get("/v1/server-instance", headers=alice), 5)
    measure("GET one", lambda: client.simulate_get(f"/v1/server-instance/{made[0]}", headers=alice), 50)
    measure("power-off + power-on", lambda: [
        client.simulate_put(f"/v1/server-instance/{made[1]}", headers=alice,
                            json={"task": {"what": w}}) for w in ("power-off", "power-on")], 20)
    measure("reconcile (check only)", lambda: reconcile(ctx))
    print(f"placed: {Counter(r['host'] for r in store.all_instances())}")


if __name__ == "__main__":
    main()
