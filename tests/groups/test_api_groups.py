"""The group endpoints on the service with fake host adapters, on both groups backends: the
fake (what the local backend promises) and LDAP groups on a real slapd (tests/fixtures/slapd.py)."""

import ldap
import pytest

from controller.errors import HostError
from host_adapters.factory import fake_adapters
from host_adapters.accounts.ldap_groups import LdapUnixGroups
from tests.api.test_controller_api import err, make_group, ok, people  # noqa: F401 (people: a fixture)
from tests.groups.test_ldap_groups import group_entry
from tests.users.test_ldap_directory import make


@pytest.fixture(params=["fake", pytest.param("ldap", marks=[pytest.mark.integration, pytest.mark.real_commands])])
def adapters(request):
    """Fake adapters; for ldap, accounts and groups are entries in a fresh tree of the slapd."""
    adapters = fake_adapters()
    if request.param == "ldap":
        tree = request.getfixturevalue("ldap_tree")
        adapters.directory = make(tree.server, tree.base_dn)
        adapters.groups = LdapUnixGroups(adapters.directory, gid_range=(70000, 70099))
        request.addfinalizer(adapters.directory._drop)
    return adapters


def break_groups(adapters, step, monkeypatch):
    """The groups backend fails at `step` (create or add_members) before changing anything."""
    if isinstance(adapters.groups, LdapUnixGroups):
        def refuse(*args, **kwargs):
            raise ldap.UNWILLING_TO_PERFORM({"desc": "Server is unwilling to perform"})

        monkeypatch.setattr(adapters.directory.entries, {"create": "add", "add_members": "modify"}[step], refuse)
    else:
        adapters.groups.fail_on[step] = HostError(f"{step} broke")


def test_group_create_update_delete(client, cctx, adapters, people):
    owner = people["owner"]
    [g] = ok(make_group(client, owner, "lab", ["owner", "managed"]), 201)
    assert g["group-name"] == "lab" and g["cloudauth-id"] == owner.id and g["group-members"] == ["owner", "managed"]
    assert set(g) == {"group-id", "cloudauth-id", "group-name", "group-members"}
    assert adapters.groups.get("lab") == ["owner", "managed"]
    gid = g["group-id"]
    put = lambda action, members: client.simulate_put(f"/v1/group/{gid}", headers=owner.headers,  # noqa: E731
                                                      json={"action": action, "group-members": members})
    [g] = ok(put("delete", ["managed"]))
    assert g["group-members"] == ["owner"] and adapters.groups.get("lab") == ["owner"]
    [g] = ok(put("add", ["managed"]))
    assert g["group-members"] == ["owner", "managed"] and sorted(adapters.groups.get("lab")) == ["managed", "owner"]
    [g] = ok(put("replace", ["managed"]))
    assert g["group-members"] == ["managed"] and adapters.groups.get("lab") == ["managed"]
    [g] = ok(put("replace", []))
    assert g["group-members"] == [] and adapters.groups.get("lab") == []
    err(put("add", ["stranger"]), 403)
    err(put("add", ["ghost"]), 400)
    err(put("add", ["Bad;Name"]), 400)
    err(put("merge", ["owner"]), 400)
    assert adapters.groups.get("lab") == []
    assert ok(client.simulate_delete(f"/v1/group/{gid}", headers=owner.headers)) == []
    assert adapters.groups.get("lab") is None
    assert cctx.store.list_groups(visible_to=None) == []


@pytest.mark.parametrize("name", ["bad;name", "Upper", "-dash", "9digit", "a" * 33, "", "x y", "../etc"])
def test_bad_group_names_never_reach_the_host(client, cctx, adapters, people, name):
    err(make_group(client, people["owner"], name), 400)
    assert cctx.store.list_groups(visible_to=None) == []


def test_group_conflicts_and_member_authority(client, cctx, adapters, people):
    ok(make_group(client, people["owner"], "lab"), 201)
    err(make_group(client, people["stranger"], "lab"), 409)
    err(make_group(client, people["owner"], "owner"), 409)  # the owner's private group exists on the host
    err(make_group(client, people["owner"], "other", ["stranger"]), 403)
    err(make_group(client, people["owner"], "other", ["ghost"]), 400)
    assert adapters.groups.get("other") is None
    ok(make_group(client, people["admin"], "admins", ["stranger", "owner"]), 201)


def test_group_queries_and_visibility(client, people):
    [lab] = ok(make_group(client, people["managed"], "lab"), 201)
    [x] = ok(make_group(client, people["stranger"], "xgroup"), 201)
    names = lambda who, q="": [g["group-name"] for g in ok(client.simulate_get(f"/v1/group{q}", headers=people[who].headers))]  # noqa: E731
    assert names("owner") == ["lab"] and names("managed") == ["lab"] and names("stranger") == ["xgroup"]
    assert sorted(names("admin")) == ["lab", "xgroup"]
    assert names("admin", "?group-name=lab") == ["lab"]
    assert names("owner", "?group-name=xgroup") == []
    assert names("admin", f"?cloudauth-id={people['stranger'].id}") == ["xgroup"]
    err(client.simulate_get(f"/v1/group?group-name=lab&cloudauth-id={people['owner'].id}",
                            headers=people["owner"].headers), 400)
    err(client.simulate_get(f"/v1/group/{x['group-id']}", headers=people["owner"].headers), 404)
    [g] = ok(client.simulate_get(f"/v1/group/{lab['group-id']}", headers=people["owner"].headers))
    assert g == lab


@pytest.mark.parametrize("step", ["create"])
def test_group_host_failure_leaves_no_row(client, cctx, adapters, people, step, monkeypatch):
    break_groups(adapters, step, monkeypatch)
    err(make_group(client, people["owner"], "lab", ["owner"]), 503)
    assert cctx.store.list_groups(visible_to=None) == []
    assert adapters.groups.get("lab") is None


def test_group_update_host_failure_keeps_members(client, cctx, adapters, people, monkeypatch):
    [g] = ok(make_group(client, people["owner"], "lab", ["owner"]), 201)
    break_groups(adapters, "add_members", monkeypatch)
    err(client.simulate_put(f"/v1/group/{g['group-id']}", headers=people["owner"].headers,
                            json={"action": "add", "group-members": ["managed"]}), 503)
    assert cctx.store.list_groups(visible_to=None)[0]["members"] == ["owner"]
    assert adapters.groups.get("lab") == ["owner"]


# -- reconcile: the database against the backend's groups -----------------------------------
def group_drift(ctx, **kw):
    from controller.maintenance.reconcile import reconcile

    return {(d["kind"], d["target"]): d for d in reconcile(ctx, hypervisor=False, **kw) if d["kind"].startswith("group")}


def test_reconcile_reports_and_repairs_group_drift(client, cctx, adapters, people, request):
    ok(make_group(client, people["owner"], "lab", ["owner", "managed"]), 201)
    ok(make_group(client, people["owner"], "gone", ["owner"]), 201)
    # Changed behind the service's back: a member dropped, one added, a group removed.
    adapters.groups.remove_members("lab", ["managed"])
    adapters.groups.add_members("lab", ["stranger"])
    adapters.groups.delete("gone")
    drift = group_drift(cctx)
    assert set(drift) == {("group-members", "lab"), ("group-missing", "gone")}
    assert "added on the host: ['stranger']; missing on the host: ['managed']" in drift["group-members", "lab"]["detail"]
    assert all(d["fixable"] and not d["fixed"] for d in drift.values())
    assert adapters.groups.get("gone") is None and adapters.groups.get("lab") == ["owner", "stranger"]
    fixed = group_drift(cctx, fix=True)
    assert set(fixed) == set(drift) and all(d["fixed"] and not d["error"] for d in fixed.values())
    assert sorted(adapters.groups.get("lab")) == ["managed", "owner"] and adapters.groups.get("gone") == ["owner"]
    assert group_drift(cctx) == {}
    if isinstance(adapters.groups, LdapUnixGroups):  # the entries themselves, as ldapsearch reads them
        tree = request.getfixturevalue("ldap_tree")
        assert sorted(group_entry(tree, "lab")["memberUid"]) == ["managed", "owner"]
        assert group_entry(tree, "gone")["memberUid"] == ["owner"]


def test_reconcile_undoes_an_interrupted_create(cctx, adapters, people):
    from controller.store import utc_now

    cctx.store.insert_group({"id": "00000000-0000-4000-8000-000000000001", "owner_id": people["owner"].id,
                             "name": "half", "creation_date": utc_now()}, ["owner"],
                            admit=lambda **kw: None)  # left "creating": the crash came before the row turned ready
    adapters.groups.create("half", members=["owner"])
    drift = group_drift(cctx, fix=True)
    assert drift["group-create-interrupted", "half"]["fixed"]
    assert adapters.groups.get("half") is None
    assert cctx.store.list_groups(visible_to=None, with_intents=True) == []
