"""Black-box tests of the published contract (the API spec, the README and docs/): groups.

The product is driven only from outside, through tests/fixtures/blackbox.py; every test
runs on both groups backends (`env` in tests/groups/conftest.py), local and ldap."""

from tests.fixtures.blackbox import GROUP_FIELDS, cc_err, cc_ok, is_uuid, make_group, unique


# ===========================================================================
# Groups
# ===========================================================================

def test_group_lifecycle_on_the_host(env):
    owner = env.user(account=True)
    m1, m2 = env.users({"owner": owner, "account": True, "login": False},
                       {"owner": owner, "account": True, "login": False})
    name = unique("g")
    g = make_group(env, owner, name, [owner.username])
    assert set(g) == GROUP_FIELDS
    assert is_uuid(g["group-id"]) and g["cloudauth-id"] == owner.id and g["group-name"] == name
    assert g["group-members"] == [owner.username]
    assert env.group_line(name)[1] == [owner.username]
    gid = env.group_line(name)[0]
    path = f"/v1/group/{g['group-id']}"

    def put(action, members):
        data = cc_ok(env.call("PUT", path, who=owner, json_body={"action": action, "group-members": members}))
        assert len(data) == 1 and data[0]["group-id"] == g["group-id"]
        line = env.group_line(name)
        assert line[0] == gid
        assert sorted(data[0]["group-members"]) == line[1]
        return line[1]

    assert put("add", [m1.username]) == sorted([owner.username, m1.username])
    assert put("add", [m2.username]) == sorted([owner.username, m1.username, m2.username])
    assert put("delete", [owner.username]) == sorted([m1.username, m2.username])
    assert put("replace", [owner.username]) == [owner.username]
    assert put("replace", []) == []
    assert cc_ok(env.call("GET", path, who=owner))[0]["group-members"] == []

    def in_gshadow():
        gshadow = (env.sandbox / "sysroot" / "etc" / "gshadow").read_text()
        return any(line.startswith(name + ":") for line in gshadow.splitlines())

    # Made by the shadow tools locally; an LDAP group never touches the system root.
    assert in_gshadow() is (env.groups_backend == "local")
    assert cc_ok(env.call("DELETE", path, who=owner)) == []
    assert env.group_line(name) is None
    assert not in_gshadow()
    cc_err(env.call("GET", path, who=owner), 404)


def test_group_without_members(env):
    u = env.user(account=True)
    name = unique("g")
    g = make_group(env, u, name)
    assert g["group-members"] == [] and env.group_line(name)[1] == []


def test_group_name_rule(env):
    u = env.user(account=True)
    for name in ("bad;name", "Upper", "1abc", "-abc", "a" * 33, "with space", "", "a.b", "x$(id)", "../etc"):
        r = env.call("POST", "/v1/group", who=u, json_body={"group-name": name})
        assert r.status == 400, (name, r.status, r.body)
        cc_err(r, 400)
        assert env.group_line(name) is None


def test_group_name_edges_and_conflicts(env):
    u = env.user(account=True)
    long_name = (unique("_g") + "x" * 32)[:32]
    assert make_group(env, u, long_name)["group-name"] == long_name
    name = unique("g")
    make_group(env, u, name)
    make_group(env, u, name, status=409)
    make_group(env, env.user(account=True), name, status=409)  # names are global
    make_group(env, u, env.existing_group, status=409)  # exists on the host (local) or in the directory
    make_group(env, u, u.username, status=409)     # the account's primary group
    cc_err(env.call("POST", "/v1/group", who=u, json_body={"group-members": []}), 400)
    cc_err(env.call("POST", "/v1/group", who=u, json_body={"group-name": unique("g"), "x": 1}), 400)
    cc_err(env.call("POST", "/v1/group", who=u, json_body={"group-name": unique("g"), "group-members": "a"}), 400)


def test_group_member_authority(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True}, {"account": True, "login": False})
    make_group(env, owner, unique("g"), [stranger.username], status=403)
    make_group(env, owner, unique("g"), [unique("nouser")], status=400)
    make_group(env, managed, unique("g"), [owner.username], status=403)  # not upward
    g = make_group(env, owner, unique("g"), [managed.username])
    path = f"/v1/group/{g['group-id']}"
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add", "group-members": [stranger.username]}), 403)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add", "group-members": ["nouser" + "zz"]}), 400)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "merge", "group-members": []}), 400)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add"}), 400)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add", "group-members": [], "group-name": "x"}),
           400)
    assert env.group_line(g["group-name"])[1] == [managed.username]
    # the superuser may add anyone
    g2 = make_group(env, env.admin, unique("g"), [stranger.username, owner.username])
    assert env.group_line(g2["group-name"])[1] == sorted([stranger.username, owner.username])


def test_group_visibility_and_queries(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True}, {"account": True})
    g_owner = make_group(env, owner, unique("g"))
    g_managed = make_group(env, managed, unique("g"))
    g_stranger = make_group(env, stranger, unique("g"))

    def listed(who, **query):
        return {g["group-id"] for g in cc_ok(env.call("GET", "/v1/group", who=who, query=query or None))}

    assert listed(managed) == {g_managed["group-id"]}
    assert listed(owner) == {g_owner["group-id"], g_managed["group-id"]}
    assert {g_owner["group-id"], g_managed["group-id"], g_stranger["group-id"]} <= listed(env.admin)
    assert listed(owner, **{"group-name": g_managed["group-name"]}) == {g_managed["group-id"]}
    assert listed(owner, **{"group-name": g_stranger["group-name"]}) == set()
    assert listed(env.admin, **{"group-name": g_stranger["group-name"]}) == {g_stranger["group-id"]}
    assert listed(owner, **{"cloudauth-id": managed.id}) == {g_managed["group-id"]}
    assert listed(stranger, **{"cloudauth-id": owner.id}) == set()
    cc_err(env.call("GET", "/v1/group", who=owner,
                    query={"group-name": g_owner["group-name"], "cloudauth-id": owner.id}), 400)
    cc_err(env.call("GET", "/v1/group", who=owner, query={"cloudauth-id": "x"}), 400)

    p = f"/v1/group/{g_owner['group-id']}"
    cc_err(env.call("GET", p, who=stranger), 404)
    cc_err(env.call("PUT", p, who=stranger, json_body={"action": "replace", "group-members": []}), 404)
    cc_err(env.call("DELETE", p, who=stranger), 404)
    cc_err(env.call("GET", p, who=managed), 404)
    cc_err(env.call("GET", "/v1/group/not-a-uuid", who=owner), 404)
    assert cc_ok(env.call("GET", p, who=owner)) == cc_ok(env.call("GET", p, who=env.admin))
    # the owner's owner may change and delete
    pm = f"/v1/group/{g_managed['group-id']}"
    cc_ok(env.call("PUT", pm, who=owner, json_body={"action": "add", "group-members": [managed.username]}))
    assert cc_ok(env.call("DELETE", pm, who=owner)) == []
    assert env.group_line(g_managed["group-name"]) is None
