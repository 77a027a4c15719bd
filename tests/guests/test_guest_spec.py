"""What an instance's guest is told, on fake host adapters: addresses, users, groups, homes, and
that every change reaches the seed (guests, docs/guests.md)."""

import ipaddress
import json
import threading

import pytest

from controller.users import accounts as account_service
from controller.addresses import allocate, network_plan
from controller.config import config_from_dict
from controller.errors import InvalidInput
from controller.maintenance.reconcile import reconcile
from host_adapters.guests import seed as seeds
from host_adapters.guests.guest import GuestGroup, GuestUser
from tests.fixtures.api import config_values_for, give_volume
from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401  (fixture)


def guest_of(adapters, instance_id):
    return adapters.hypervisor.instances[instance_id].guest


def user_data(adapters, instance_id) -> dict:
    text = adapters.hypervisor.seeds[instance_id]["user-data"]
    assert text.startswith("#cloud-config\n")
    return json.loads(text.split("\n", 1)[1])


# -- addresses ----------------------------------------------------------------------------
def test_hostname_and_private_ip_are_in_the_201_and_every_get(client, cctx, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    [inst] = ok(boot(client, owner, catalog), 201)
    subnet = ipaddress.IPv4Network(cctx.config.network.subnet)
    assert ipaddress.IPv4Address(inst["private-ip"]) in subnet
    assert inst["private-ip"] != str(subnet.network_address + 1)  # the gateway is the host's
    assert inst["hostname"] == f"vm-{inst['id'].replace('-', '')[:8]}"
    assert "public-ip" not in inst
    [got] = ok(client.simulate_get(f"/v1/server-instance/{inst['id']}", headers=owner.headers))
    assert (got["hostname"], got["private-ip"]) == (inst["hostname"], inst["private-ip"])
    [listed] = ok(client.simulate_get("/v1/server-instance", headers=owner.headers))
    assert listed["private-ip"] == inst["private-ip"]


def test_the_guest_gets_its_nic_name_and_address(client, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    guest = guest_of(adapters, inst["id"])
    [nic] = guest.nics
    assert nic.address == inst["private-ip"] and guest.hostname == inst["hostname"]
    assert nic.mac.startswith("52:54:00:") and nic.network == "default"
    network = json.loads(adapters.hypervisor.seeds[inst["id"]]["network-config"])
    [entry] = network["config"]
    assert entry["mac_address"] == nic.mac
    assert entry["subnets"][0]["address"] == f"{inst['private-ip']}/16"
    meta = json.loads(adapters.hypervisor.seeds[inst["id"]]["meta-data"])
    assert meta == {"instance-id": inst["id"], "local-hostname": inst["hostname"]}
    assert [r.mac for r in adapters.hypervisor.describe(inst["id"]).reservations] == [nic.mac]


def test_addresses_are_unique_and_freed_at_delete(client, cctx, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    made = [ok(boot(client, owner, catalog), 201)[0] for _ in range(3)]
    assert len({i["private-ip"] for i in made}) == 3 and len({i["hostname"] for i in made}) == 3
    freed = made[0]["private-ip"]
    ok(client.simulate_delete(f"/v1/server-instance/{made[0]['id']}", headers=owner.headers))
    [again] = ok(boot(client, owner, catalog), 201)
    assert again["private-ip"] == freed  # the lowest free address


def test_an_exhausted_subnet_is_409_and_leaves_nothing(tmp_path, people, client, cctx, catalog):
    cctx.config = cctx.config.with_values({"network": {"subnet": "10.99.0.0/29"}})  # 6 hosts, one of them the gateway
    owner = people["owner"]
    give_volume(client, owner)
    for _ in range(5):
        ok(boot(client, owner, catalog), 201)
    assert "no free private" in err(boot(client, owner, catalog), 409)
    assert len(cctx.store.all_instances()) == 5


def test_concurrent_allocations_never_share_an_address(cctx, people, catalog):
    plan = network_plan(cctx.config)
    rows, errors = [], []

    def insert(n):
        try:
            from controller.rules import new_id
            from controller.store import utc_now

            row = {"id": new_id(), "owner_id": people["owner"].id, "image_id": catalog["public"]["id"],
                   "flavor_id": int(catalog["small"]["id"]), "status": "building", "hostname": None,
                   "public_ip": None, "private_ip": None, "creation_date": utc_now()}
            rows.append(cctx.store.insert_instance(row, [], allocate=lambda used: allocate(plan, row["id"], used)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            cctx.store.close()

    threads = [threading.Thread(target=insert, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for column in ("private_ip", "mac", "hostname"):
        assert len({r[column] for r in rows}) == 16


def test_public_addresses_when_configured(tmp_path, adapters):
    from api.app import create_app
    from falcon import testing

    from controller.storage import images
    from controller.context import build_context
    from controller.security.crypto import generate_key_file
    from controller.store import Store
    from tests.fixtures.api import make_caller, enable

    values = config_values_for(tmp_path)
    values["network"].update(public_bridge="br-pub", public_pool="198.51.100.10-198.51.100.11", public_prefix=24,
                             public_gateway="198.51.100.1", public_dns="198.51.100.53")
    config = config_from_dict(values)
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    ctx = build_context(config, store=store, adapters=adapters)
    client = testing.TestClient(create_app(ctx))
    alice = make_caller(ctx, "alice@example.org")
    enable(ctx, alice, username="alice")
    give_volume(client, alice)
    image = images.add_image(ctx, name="i", os_name="d", os_major="12", os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name="f", memory=128, disk=1, vcpu=1)
    body = {"server-image": image["id"], "server-flavor": flavor["id"]}
    made = [ok(client.simulate_post("/v1/server-instance", headers=alice.headers, json=body), 201)[0]
            for _ in range(2)]
    assert [i["public-ip"] for i in made] == ["198.51.100.10", "198.51.100.11"]
    guest = adapters.hypervisor.instances[made[0]["id"]].guest
    public = [n for n in guest.nics if n.bridge]
    assert [(n.bridge, n.address, n.prefix, n.gateway) for n in public] == [
        ("br-pub", "198.51.100.10", 24, "198.51.100.1")]
    r = client.simulate_post("/v1/server-instance", headers=alice.headers, json=body)
    assert r.status_code == 409 and "no free public" in r.json["msg"]
    store.close()


@pytest.mark.parametrize("key, value", [
    ("subnet", "10.0.0.0/33"), ("subnet", "10.0.0.1/24"), ("subnet", "10.0.0.0/30"), ("name", ""),
])
def test_bad_network_config_is_refused_naming_the_key(tmp_path, key, value):
    values = config_values_for(tmp_path)
    values["network"][key] = value
    with pytest.raises(InvalidInput, match=f"\\[network\\] {key}"):
        config_from_dict(values)


def test_a_public_bridge_needs_a_pool(tmp_path):
    values = config_values_for(tmp_path)
    values["network"].update(public_bridge="br0", public_pool="10.0.0.9-10.0.0.1", public_prefix=24)
    with pytest.raises(InvalidInput, match="public_pool"):
        config_from_dict(values)


# -- users, groups and homes in the guest --------------------------------------------------
def test_every_user_with_an_account_is_in_the_guest_with_uid_gid_groups_and_home(client, cctx, adapters, people,
                                                                                 catalog):
    owner, managed, acc = people["owner"], people["managed"], people["accounts"]
    give_volume(client, owner)
    ok(client.simulate_post("/v1/group", headers=owner.headers,
                            json={"group-name": "lab", "group-members": ["owner", "managed"]}), 201)
    [inst] = ok(boot(client, owner, catalog, users=[acc["managed"]["uuid"]]), 201)
    guest = guest_of(adapters, inst["id"])
    lab_gid = adapters.groups.gid("lab")
    assert guest.groups == (GuestGroup("lab", lab_gid),)
    assert guest.users == (
        GuestUser(username="managed", uid=acc["managed"]["uid"], gid=acc["managed"]["gid"],
                  home=acc["managed"]["home"], mounted=False, groups=("lab",)),
        GuestUser(username="owner", uid=acc["owner"]["uid"], gid=acc["owner"]["gid"],
                  home=adapters.homes.path("owner"), mounted=True, groups=("lab",)),
    )
    # Only homes that exist are shared.
    assert [s.tag for s in adapters.hypervisor.describe(inst["id"]).shares] == ["owner"]
    data = user_data(adapters, inst["id"])
    assert data["ssh_pwauth"] is False and data["users"] == []
    script = data["bootcmd"][0] if isinstance(data["bootcmd"][0], str) else data["bootcmd"][0][-1]
    assert f"ensure_user owner {acc['owner']['uid']} {acc['owner']['gid']} {adapters.homes.path('owner')} lab" in script
    assert f"mount_home owner {adapters.homes.path('owner')}" in script
    assert "mount_home managed" not in script
    assert "NOPASSWD" not in script  # [guest] sudo = none


def test_guest_sudo_owner_gives_the_owner_root_only(client, cctx, adapters, people, catalog):
    cctx.config = cctx.config.with_values({"guest": {"sudo": "owner"}})
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog, users=[people["accounts"]["managed"]["uuid"]]), 201)
    sudo = {u.username: u.sudo for u in guest_of(adapters, inst["id"]).users}
    assert sudo == {"owner": True, "managed": False}
    assert "owner ALL=(ALL) NOPASSWD:ALL" in adapters.hypervisor.seeds[inst["id"]]["user-data"]


def test_every_change_reaches_the_seed(client, cctx, adapters, people, catalog):
    owner, managed, acc = people["owner"], people["managed"], people["accounts"]
    give_volume(client, owner)
    [inst] = ok(boot(client, owner, catalog), 201)
    iid = inst["id"]

    def users():
        spec = guest_of(adapters, iid)
        assert adapters.hypervisor.seeds[iid] == seeds.render(iid, spec)  # the seed follows the definition
        return {u.username: (u.mounted, u.groups) for u in spec.users}

    assert users() == {"owner": (True, ())}
    task = {"task": {"what": "modify-users", "how": "add", "users": [acc["managed"]["uuid"]]}}
    ok(client.simulate_put(f"/v1/server-instance/{iid}", headers=owner.headers, json=task))
    assert users() == {"owner": (True, ()), "managed": (False, ())}
    give_volume(client, managed)
    assert users()["managed"] == (True, ())
    [group] = ok(client.simulate_post("/v1/group", headers=owner.headers,
                                      json={"group-name": "lab", "group-members": ["managed"]}), 201)
    assert users()["managed"] == (True, ("lab",))
    ok(client.simulate_put(f"/v1/group/{group['group-id']}", headers=owner.headers,
                           json={"action": "add", "group-members": ["owner"]}))
    assert users() == {"owner": (True, ("lab",)), "managed": (True, ("lab",))}
    ok(client.simulate_put(f"/v1/group/{group['group-id']}", headers=owner.headers,
                           json={"action": "delete", "group-members": ["managed"]}))
    assert users()["managed"] == (True, ())
    ok(client.simulate_delete(f"/v1/group/{group['group-id']}", headers=owner.headers))
    assert users()["owner"] == (True, ())
    [vol] = ok(client.simulate_get("/v1/storage-volume", headers=managed.headers))
    ok(client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=managed.headers))
    assert users()["managed"] == (False, ())
    account_service.disable_account(cctx, managed.email)
    assert users() == {"owner": (True, ())}
    task = {"task": {"what": "modify-users", "how": "replace", "users": []}}
    ok(client.simulate_put(f"/v1/server-instance/{iid}", headers=owner.headers, json=task))
    assert users() == {"owner": (True, ())}  # the owner always stays


def test_a_changed_seed_reaches_a_running_guest_at_reboot(client, adapters, people, catalog):
    owner, acc = people["owner"], people["accounts"]
    give_volume(client, owner)
    [inst] = ok(boot(client, owner, catalog), 201)
    task = {"task": {"what": "modify-users", "how": "add", "users": [acc["managed"]["uuid"]]}}
    ok(client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=owner.headers, json=task))
    fake = adapters.hypervisor.instances[inst["id"]]
    assert {u.username for u in fake.live_guest.users} == {"owner"}
    ok(client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=owner.headers,
                           json={"task": {"what": "reboot"}}))
    assert {u.username for u in fake.live_guest.users} == {"owner", "managed"}


def test_delete_leaves_no_seed_and_no_reservation(client, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    ok(client.simulate_delete(f"/v1/server-instance/{inst['id']}", headers=people["owner"].headers))
    assert inst["id"] not in adapters.hypervisor.seeds
    assert adapters.hypervisor.list_reservations() == []


# -- reconcile ------------------------------------------------------------------------------
def _kinds(cctx, fix=False):
    return sorted((d["kind"], d["fixed"]) for d in reconcile(cctx, fix=fix))


def test_reconcile_repairs_seed_reservation_and_network(client, cctx, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    hv = adapters.hypervisor
    assert _kinds(cctx) == []
    hv.seeds[inst["id"]] = dict(hv.seeds[inst["id"]], **{"user-data": "#cloud-config\n{}"})
    hv.networks[hv.network].clear()
    assert _kinds(cctx, fix=True) == [("network-reservation", True), ("seed-content", True)]
    assert _kinds(cctx) == []
    del hv.seeds[inst["id"]]
    assert _kinds(cctx, fix=True) == [("seed-missing", True)]
    del hv.networks[hv.network]
    found = _kinds(cctx, fix=True)
    assert ("network-missing", True) in found
    assert hv.network in hv.networks


def test_reconcile_reports_and_drops_an_orphan_reservation(cctx, adapters):
    from host_adapters.guests.guest import Reservation

    hv = adapters.hypervisor
    hv.networks[hv.network]["52:54:00:aa:bb:cc"] = Reservation("52:54:00:aa:bb:cc", "10.213.9.9", "vm-gone")
    assert _kinds(cctx, fix=True) == [("reservation-orphan", True)]
    assert hv.list_reservations() == []


# -- deactivated users (issue 16, finding 9) -------------------------------------------------
def _set_active(client, people, who, active: int):
    r = client.simulate_post(f"/v1/user/update/{who.id}", headers=people["admin"].headers, json={"active": active})
    assert r.status_code == 200, r.text


def test_a_deactivated_user_is_in_no_guest_and_has_no_share_until_reactivated(client, cctx, adapters, people,
                                                                               catalog):
    owner, managed, acc = people["owner"], people["managed"], people["accounts"]
    give_volume(client, owner)
    give_volume(client, managed)
    [inst] = ok(boot(client, owner, catalog, users=[acc["managed"]["uuid"]]), 201)
    iid = inst["id"]
    hv = adapters.hypervisor

    def in_guest():
        assert hv.seeds[iid] == seeds.render(iid, guest_of(adapters, iid))
        script = user_data(adapters, iid)["bootcmd"][0]
        users = {u.username for u in guest_of(adapters, iid).users}
        assert ("ensure_user managed " in script) == ("managed" in users)
        return users, sorted(s.tag for s in hv.describe(iid).shares)

    assert in_guest() == ({"owner", "managed"}, ["managed", "owner"])
    _set_active(client, people, managed, 0)
    # Out of the seed (its next boot removes the account) and of the domain's shares.
    assert in_guest() == ({"owner"}, ["owner"])
    # Still on the instance's list: reactivation gives the access back.
    [got] = ok(client.simulate_get(f"/v1/server-instance/{iid}", headers=owner.headers))
    assert acc["managed"]["uuid"] in got["users"]
    # The running guest keeps the share it booted with until its next boot (`user apply`).
    assert _kinds(cctx) == [("domain-live-shares", False)]
    assert {u.username for u in hv.instances[iid].live_guest.users} == {"owner", "managed"}
    ok(client.simulate_put(f"/v1/server-instance/{iid}", headers=owner.headers, json={"task": {"what": "reboot"}}))
    assert {u.username for u in hv.instances[iid].live_guest.users} == {"owner"}
    assert _kinds(cctx) == []
    _set_active(client, people, managed, 1)
    assert in_guest() == ({"owner", "managed"}, ["managed", "owner"])
    # A deactivated owner is out of its own instances too.
    _set_active(client, people, owner, 0)
    assert in_guest() == ({"managed"}, ["managed"])


def test_a_spec_made_while_inactive_leaves_the_user_out(client, cctx, adapters, people, catalog):
    from controller.instances.guests import guest_spec

    owner, managed, acc = people["owner"], people["managed"], people["accounts"]
    give_volume(client, owner)
    _set_active(client, people, managed, 0)
    [inst] = ok(boot(client, owner, catalog, users=[acc["managed"]["uuid"]]), 201)
    row = cctx.store.list_instances(visible_to=None, instance_id=inst["id"])[0]
    assert [u.username for u in guest_spec(cctx, row).users] == ["owner"]
    assert [u.username for u in guest_of(adapters, inst["id"]).users] == ["owner"]


# -- network filters (issue 16, finding 8) ---------------------------------------------------
def test_each_nic_sends_only_from_its_address_and_isolation_follows_the_config(client, cctx, adapters, people,
                                                                               catalog):
    from host_adapters.libvirt.xml import FilterRef

    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    hv = adapters.hypervisor
    [nic] = hv.describe(inst["id"]).nics
    assert nic.filter == FilterRef("cloud-controller-clean", (("IP", inst["private-ip"]),))

    cctx.config = cctx.config.with_values({"network": {"isolate_guests": "true"}})
    [isolated] = ok(boot(client, people["owner"], catalog), 201)
    [nic] = hv.describe(isolated["id"]).nics
    assert nic.filter == FilterRef("cloud-controller-isolated", (
        ("GATEWAY", "10.213.0.1"), ("IP", isolated["private-ip"]), ("SUBNET", "10.213.0.0"), ("SUBNET_PREFIX", "16")))
    # The instance made before is drift now (as one made before NICs had filters), and repaired.
    assert _kinds(cctx, fix=True) == [("domain-nics", True)]
    assert hv.describe(inst["id"]).nics[0].filter.name == "cloud-controller-isolated"
    assert _kinds(cctx) == []


def test_isolate_guests_must_be_a_boolean(tmp_path):
    values = config_values_for(tmp_path)
    values["network"]["isolate_guests"] = "maybe"
    with pytest.raises(InvalidInput, match=r"\[network\] isolate_guests"):
        config_from_dict(values)
