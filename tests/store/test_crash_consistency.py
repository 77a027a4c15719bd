"""A service killed half way through a create or a delete, then `reconcile --fix`.

Each case runs one API call in a forked process that dies (os._exit, as a
SIGKILL would leave it: no clean-up runs) right before or right after the
host step of that call; the parent then runs reconcile with repairs, as
`cloud-agent reconcile --fix` does, on the same database and host: real
homes and groups in a scratch system root, and domains on the real libvirtd.
Afterwards database and host agree, nothing the user deleted is back, nothing
the user kept is gone, and a create the client never saw succeed is undone.
"""

import os
import uuid

import pytest
from falcon import testing

from controller.storage import images
from controller.users.accounts import enable_account
from controller.context import build_context
from controller.maintenance.reconcile import reconcile
from controller.store import Store
from host_adapters.factory import build_adapters
from tests.fixtures.api import make_caller, new_context
from tests.fixtures.libvirtd import cleanup_hypervisor, real_libvirt_values
from tests.api.test_api_real_parts import group_line

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]


@pytest.fixture
def world(tmp_path, sysroot, libvirt_dir_pool, libvirt_private_network, guest_virt):
    home_root = tmp_path / "homes"
    home_root.mkdir(mode=0o755)
    values = real_libvirt_values(tmp_path, pool=libvirt_dir_pool, network=libvirt_private_network, virt=guest_virt,
                                 sysroot=sysroot, home_root=home_root, prefix=f"cr{uuid.uuid4().hex[:6]}-")
    ctx = new_context(values, real_adapters=True)
    config, store = ctx.config, ctx.store
    alice = make_caller(ctx, "alice@example.org")
    enable_account(ctx, alice.email, username="alice")
    bob = make_caller(ctx, "bob@example.org")
    enable_account(ctx, bob.email, username="bob")
    image = images.add_image(ctx, name="blank", os_name="none", os_major="0", os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name="micro", memory=96, disk=1, vcpu=1)
    from api.app import create_app

    client = testing.TestClient(create_app(ctx))
    # What the user keeps: bob's volume and group must survive every case.
    kept_volume = client.simulate_post("/v1/storage-volume", headers=bob.headers,
                                       json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}).json
    kept_group = client.simulate_post("/v1/group", headers=bob.headers, json={"group-name": "bobs"}).json
    yield {"ctx": ctx, "client": client, "alice": alice, "bob": bob, "image": image, "flavor": flavor,
           "config": config, "sysroot": sysroot, "home_root": home_root,
           "kept_volume": kept_volume["data"][0], "kept_group": kept_group["data"][0]}
    cleanup_hypervisor(ctx.adapters.hypervisor)
    store.close()


def crash_during(world, adapter: str, method: str, when: str, call) -> int:
    """Run call(client) in a child that dies just before or after adapters.<adapter>.<method>."""
    pid = os.fork()
    if pid == 0:  # the child: its own database connection and adapters, like a fresh server
        code = 3
        try:
            config = world["config"]
            ctx = build_context(config, store=Store(config.database_path), adapters=build_adapters(config))
            target = getattr(ctx.adapters, adapter)
            real = getattr(target, method)

            def dying(*args, **kwargs):
                if when == "before":
                    os._exit(0)
                real(*args, **kwargs)
                os._exit(0)

            setattr(target, method, dying)
            from api.app import create_app

            call(testing.TestClient(create_app(ctx)))
            code = 4  # the call returned: the crash point was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child did not die at the crash point"
    world["ctx"].store.close()  # read what the dead process committed
    return status


def repair(world) -> list[dict]:
    drift = reconcile(world["ctx"], fix=True)
    assert all(d["fixed"] for d in drift if d["kind"].endswith("-interrupted")), drift
    assert [d for d in reconcile(world["ctx"]) if not d["fixed"]] == [], "drift remains after --fix"
    return drift


def assert_kept(world):
    ctx = world["ctx"]
    assert os.path.isdir(world["kept_volume"]["volume-type"]["mount-point"])
    assert ctx.store.list_volumes(visible_to=None, volume_id=world["kept_volume"]["volume-id"])
    assert group_line(world["sysroot"], "bobs") is not None
    assert ctx.store.list_groups(visible_to=None, name="bobs")


def post_volume(caller):
    return lambda client: client.simulate_post("/v1/storage-volume", headers=caller.headers,
                                               json={"volume-size": 1, "volume-type": {"visibility": "cluster"}})


@pytest.mark.parametrize("when", ["before", "after"])
def test_volume_create_killed_is_undone(world, when):
    crash_during(world, "homes", "create", when, post_volume(world["alice"]))
    drift = repair(world)
    assert "volume-create-interrupted" in [d["kind"] for d in drift]
    ctx = world["ctx"]
    assert ctx.store.volume_of_user(world["alice"].id) is None
    assert not (world["home_root"] / "alice").exists()
    assert_kept(world)
    assert post_volume(world["alice"])(world["client"]).status_code == 201  # the user can try again


@pytest.mark.parametrize("method, when, left", [
    ("retire", "before", "volume-delete-interrupted"),  # the intent recorded, the home in place
    ("retire", "after", "volume-delete-interrupted"),  # the home moved aside, the row still there
    ("purge", "before", "home-retired"),  # the row gone, the tree not removed yet
    ("purge", "after", None),  # the background removal done: nothing left
])
def test_volume_delete_killed_is_finished_not_undone(world, method, when, left):
    [vol] = post_volume(world["alice"])(world["client"]).json["data"]
    (world["home_root"] / "alice" / "data").write_text("the user's data")
    crash_during(world, "homes", method, when, lambda client: client.simulate_delete(
        f"/v1/storage-volume/{vol['volume-id']}", headers=world["alice"].headers))
    # Until reconcile runs, the volume is neither listed nor deletable twice.
    assert world["client"].simulate_get("/v1/storage-volume", headers=world["alice"].headers).json["data"] == []
    drift = repair(world)
    kinds = [d["kind"] for d in drift]
    assert (left in kinds) if left else not kinds
    assert world["ctx"].store.volume_of_user(world["alice"].id) is None
    assert not (world["home_root"] / "alice").exists()  # deleted, never re-created
    assert world["ctx"].adapters.homes.list_retired() == []
    assert_kept(world)


@pytest.mark.parametrize("when", ["before", "after"])
def test_group_create_killed_is_undone(world, when):
    crash_during(world, "groups", "create", when, lambda client: client.simulate_post(
        "/v1/group", headers=world["alice"].headers, json={"group-name": "alab"}))
    drift = repair(world)
    assert "group-create-interrupted" in [d["kind"] for d in drift]
    assert group_line(world["sysroot"], "alab") is None
    assert world["ctx"].store.list_groups(visible_to=None, name="alab", with_intents=True) == []
    assert_kept(world)


@pytest.mark.parametrize("when", ["before", "after"])
def test_group_delete_killed_is_finished_not_undone(world, when):
    [group] = world["client"].simulate_post("/v1/group", headers=world["alice"].headers,
                                            json={"group-name": "alab"}).json["data"]
    crash_during(world, "groups", "delete", when, lambda client: client.simulate_delete(
        f"/v1/group/{group['group-id']}", headers=world["alice"].headers))
    drift = repair(world)
    assert "group-delete-interrupted" in [d["kind"] for d in drift]
    assert group_line(world["sysroot"], "alab") is None  # never re-created
    assert world["ctx"].store.list_groups(visible_to=None, name="alab", with_intents=True) == []
    assert_kept(world)


def boot(world):
    body = {"server-image": world["image"]["id"], "server-flavor": world["flavor"]["id"]}
    return lambda client: client.simulate_post("/v1/server-instance", headers=world["alice"].headers, json=body)


@pytest.mark.parametrize("when", ["before", "after"])
def test_instance_create_killed_is_undone(world, when):
    post_volume(world["alice"])(world["client"])
    crash_during(world, "hypervisor", "spawn", when, boot(world))
    drift = repair(world)
    assert "instance-create-interrupted" in [d["kind"] for d in drift]
    ctx = world["ctx"]
    assert ctx.store.all_instances() == []
    assert ctx.adapters.hypervisor.list_instances() == []  # no domain, disk or seed
    assert ctx.adapters.hypervisor.list_reservations() == []
    assert_kept(world)


@pytest.mark.parametrize("when", ["before", "after"])
def test_instance_delete_killed_is_finished_not_respawned(world, when):
    post_volume(world["alice"])(world["client"])
    [inst] = boot(world)(world["client"]).json["data"]
    crash_during(world, "hypervisor", "destroy", when, lambda client: client.simulate_delete(
        f"/v1/server-instance/{inst['id']}", headers=world["alice"].headers))
    r = world["client"].simulate_get(f"/v1/server-instance/{inst['id']}", headers=world["alice"].headers)
    assert r.status_code == 404  # being deleted: gone for the user already
    drift = repair(world)
    assert "instance-delete-interrupted" in [d["kind"] for d in drift]
    assert world["ctx"].store.all_instances() == []
    assert world["ctx"].adapters.hypervisor.list_instances() == []  # not respawned
    assert_kept(world)
