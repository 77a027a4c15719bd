"""A delete the host could not finish (on fakes): once the domain is gone it is never undone;
the row keeps its intent, the answer says so (202), the owner sees no broken instance, and
`reconcile --fix` finishes it. The same on a real libvirtd: tests/hypervisor/test_pool_jobs.py."""

import pytest

from common.errors import HostError
from controller.maintenance.reconcile import reconcile
from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401  (fixture)
from tests.fixtures.api import give_volume

REFUSAL = "pool 'cc-remote-x' has asynchronous jobs running."


@pytest.fixture
def instance(client, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    return inst


def fail_after_the_domain(adapters):
    """destroy() removes the domain, then the host refuses the rest (as libvirt's pool did)."""
    hv = adapters.hypervisor
    real = hv.destroy

    def half(instance_id):
        hv.instances.pop(instance_id, None)
        raise HostError(f"destroy instance {instance_id}: {REFUSAL}")

    hv.destroy = half
    return real


def test_a_delete_cut_short_after_the_domain_is_accepted_and_finished_by_reconcile(client, cctx, adapters, people,
                                                                                   instance):
    owner, iid = people["owner"], instance["id"]
    real = fail_after_the_domain(adapters)
    r = client.simulate_delete(f"/v1/server-instance/{iid}", headers=owner.headers)
    assert r.status_code == 202 and r.json["success"] is True and r.json["data"] == []
    assert "is deleted" in r.json["msg"] and "reconcile --fix" in r.json["msg"] and REFUSAL in r.json["msg"]
    # The intent stays; the owner sees no broken instance: 404 to a GET, a task, the console.
    [row] = cctx.store.all_instances()
    assert row["id"] == iid and row["intent"] == "deleting"
    base = f"/v1/server-instance/{iid}"
    err(client.simulate_get(base, headers=owner.headers), 404)
    err(client.simulate_put(base, headers=owner.headers, json={"task": {"what": "power-on"}}), 404)
    err(client.simulate_get(f"{base}/console", headers=owner.headers), 404)
    assert iid not in [i["id"] for i in ok(client.simulate_get("/v1/server-instance", headers=owner.headers))]
    assert err(client.simulate_delete(base, headers=owner.headers), 404)
    assert iid in adapters.hypervisor.disks  # what the refusal left

    adapters.hypervisor.destroy = real
    drift = reconcile(cctx)
    assert [(d["kind"], d["target"]) for d in drift] == [("instance-delete-interrupted", iid)]
    fixed = reconcile(cctx, fix=True)
    assert [(d["kind"], d["fixed"]) for d in fixed] == [("instance-delete-interrupted", True)]
    assert cctx.store.all_instances() == []
    assert adapters.hypervisor.list_instances() == [] and iid not in adapters.hypervisor.disks
    assert not any(adapters.hypervisor.networks.values())  # no reservation of its MACs left
    assert reconcile(cctx) == []


def test_a_delete_refused_before_anything_went_is_503_and_changes_nothing(client, cctx, adapters, people, instance):
    adapters.hypervisor.fail_on["destroy"] = HostError(REFUSAL)
    err(client.simulate_delete(f"/v1/server-instance/{instance['id']}", headers=people["owner"].headers), 503)
    [row] = cctx.store.all_instances()
    assert row["intent"] is None
    assert ok(client.simulate_get(f"/v1/server-instance/{instance['id']}", headers=people["owner"].headers))
