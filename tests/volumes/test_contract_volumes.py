"""Black-box tests of the published contract (the API spec, the README and docs/): storage volumes.

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import uuid

from tests.fixtures.blackbox import (
    DATE_TIME, VOLUME_FIELDS, VOLUME_REQUIRED, cc_err, cc_ok, is_uuid, max_size_gb,
)


# ===========================================================================
# Storage volumes
# ===========================================================================

def test_volume_needs_account_and_one_per_user(env):
    no_account, u = env.users({}, {"account": True})
    cc_err(env.call("POST", "/v1/storage-volume", who=no_account,
                    json_body={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 409)
    env.volume(u)
    cc_err(env.call("POST", "/v1/storage-volume", who=u,
                    json_body={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 409)


def test_volume_create_on_disk(env):
    u, other = env.users({"account": True}, {"account": True})
    vol = env.volume(u, size=3, **{"volume-name": "my home"})
    assert VOLUME_REQUIRED <= set(vol) <= VOLUME_FIELDS, vol
    assert is_uuid(vol["volume-id"]) and vol["cloudauth-id"] == u.id and vol["volume-size"] == 3
    assert vol["volume-name"] == "my home" and DATE_TIME.match(vol["creation-date"])
    home = env.home(u.username)
    assert vol["volume-type"] == {"visibility": "cluster", "mount-point": str(home)}
    st = home.stat()
    assert home.is_dir() and not home.is_symlink()
    assert (st.st_uid, st.st_gid) == (u.uid, u.gid)
    assert st.st_mode & 0o7777 == 0o700
    got = cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=u))
    assert got == [vol]

    v2 = env.volume(other)
    assert v2.get("volume-name") is None


VOLUME_BAD_BODIES = [
    {"volume-size": 0, "volume-type": {"visibility": "cluster"}},
    {"volume-size": -1, "volume-type": {"visibility": "cluster"}},
    {"volume-size": "1", "volume-type": {"visibility": "cluster"}},
    {"volume-size": 1.5, "volume-type": {"visibility": "cluster"}},
    {"volume-size": True, "volume-type": {"visibility": "cluster"}},
    {"volume-size": 1, "volume-type": {"visibility": "local"}},
    {"volume-size": 1, "volume-type": {}},
    {"volume-size": 1, "volume-type": {"visibility": "cluster", "extra": 1}},
    {"volume-size": 1},
    {"volume-type": {"visibility": "cluster"}},
    {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "colour": "red"},
    {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": 7},
]


def test_volume_bad_bodies(env):
    u = env.user(account=True)
    for body in VOLUME_BAD_BODIES:
        r = env.call("POST", "/v1/storage-volume", who=u, json_body=body)
        assert r.status == 400, (body, r.status, r.body)
        cc_err(r, 400)
    assert cc_ok(env.call("GET", "/v1/storage-volume", who=u)) == []
    assert not env.home(u.username).exists()


def test_volume_size_bounds(env):
    top = max_size_gb(env)
    u, v = env.users({"account": True}, {"account": True})
    r = env.call("POST", "/v1/storage-volume", who=u,
                 json_body={"volume-size": top + 1, "volume-type": {"visibility": "cluster"}})
    cc_err(r, 400)
    # The refusal names the cap and the setting that sets it.
    assert r.body["msg"] == f"volume-size {top + 1} GB is too large: at most {top} GB ([volumes] max_size_gb)"
    assert not env.home(u.username).exists()
    assert env.volume(u, size=top)["volume-size"] == top
    assert env.volume(v, size=1)["volume-size"] == 1


def test_volume_visibility_and_delete_rights(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True}, {"account": True})
    grandchild = env.user(owner=managed, account=True)
    v_grandchild = env.volume(grandchild)
    v_owner, v_managed, v_stranger = env.volume(owner), env.volume(managed), env.volume(stranger)

    def listed(who, **query):
        return {v["volume-id"] for v in cc_ok(env.call("GET", "/v1/storage-volume", who=who, query=query or None))}

    assert listed(owner) == {v_owner["volume-id"], v_managed["volume-id"]}  # not the grandchild's
    assert listed(managed) == {v_managed["volume-id"], v_grandchild["volume-id"]}
    assert {v_owner["volume-id"], v_managed["volume-id"], v_stranger["volume-id"]} <= listed(env.admin)
    assert listed(env.admin, **{"cloudauth-id": managed.id}) == {v_managed["volume-id"]}
    assert listed(owner, **{"cloudauth-id": managed.id}) == {v_managed["volume-id"]}
    assert listed(stranger, **{"cloudauth-id": owner.id}) == set()
    cc_err(env.call("GET", "/v1/storage-volume", who=owner, query={"cloudauth-id": "nope"}), 400)

    cc_err(env.call("GET", f"/v1/storage-volume/{v_owner['volume-id']}", who=stranger), 404)
    cc_err(env.call("GET", f"/v1/storage-volume/{v_owner['volume-id']}", who=managed), 404)
    cc_err(env.call("GET", f"/v1/storage-volume/{v_grandchild['volume-id']}", who=owner), 404)
    cc_err(env.call("DELETE", f"/v1/storage-volume/{v_owner['volume-id']}", who=stranger), 404)
    cc_err(env.call("GET", "/v1/storage-volume/not-a-uuid", who=owner), 404)
    cc_err(env.call("GET", f"/v1/storage-volume/{uuid.uuid4()}", who=owner), 404)

    r = env.call("PUT", f"/v1/storage-volume/{v_owner['volume-id']}", who=owner, json_body={"volume-size": 2})
    cc_err(r, 405)
    assert "PUT" not in r.allow() and {"GET", "DELETE"} <= r.allow()

    # the owner's owner may delete; the directory goes
    assert env.home(managed.username).is_dir()
    assert cc_ok(env.call("DELETE", f"/v1/storage-volume/{v_managed['volume-id']}", who=owner)) == []
    assert not env.home(managed.username).exists()
    cc_err(env.call("GET", f"/v1/storage-volume/{v_managed['volume-id']}", who=env.admin), 404)


def test_volume_delete_does_not_follow_symlinks(env, tmp_path):
    u = env.user(account=True)
    vol = env.volume(u)
    home = env.home(u.username)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (home / "sub").mkdir()
    (home / "sub" / "data").write_text("user data")
    (home / "link").symlink_to(outside)
    (home / "sub" / "filelink").symlink_to(outside / "keep.txt")
    assert cc_ok(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=u)) == []
    assert not home.exists() and not home.is_symlink()
    assert (outside / "keep.txt").read_text() == "keep"


def test_volume_resize_by_agent_matches_api(env):
    u = env.user(account=True)
    vol = env.volume(u, size=2)
    out = env.agent("volume", "resize", vol["volume-id"], "5")
    assert out["volume-size"] == 5
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=env.admin)) == [out]
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=u))[0]["volume-size"] == 5
