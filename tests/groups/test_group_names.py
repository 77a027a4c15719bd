"""Groups made through the API never take a privileged name, follow the site's name policy,
get numbers from their own range, and never take a name an account needs (issue 8, finding 1)."""

import pytest

from controller.users.accounts import enable_account
from controller.config import config_from_dict
from controller.errors import Conflict, HostError, InvalidInput
from host_adapters import subp
from host_adapters.factory import build_adapters
from host_adapters.accounts.local_groups import CommandUnixGroups
from tests.fixtures.api import config_values_for, enable, make_caller

# What the issue names, and a sample of the rest of the list.
PRIVILEGED = ["root", "adm", "admin", "sudo", "wheel", "docker", "lxd", "libvirt", "libvirt-qemu", "kvm",
              "disk", "shadow", "staff", "kmem", "video", "render", "input", "tty", "plugdev", "netdev",
              "incus-admin", "slurm", "munge", "systemd-journal", "systemd-network", "systemd-anything"]


@pytest.fixture
def alice(cctx):
    caller = make_caller(cctx, "alice@example.org")
    enable(cctx, caller, username="alice")
    return caller


@pytest.fixture
def root_user(cctx):
    caller = make_caller(cctx, "root-user@example.org", roles=("superuser",))
    enable(cctx, caller, username="rootuser")
    return caller


def post_group(client, caller, name, members=None):
    body = {"group-name": name, **({"group-members": members} if members is not None else {})}
    return client.simulate_post("/v1/group", headers=caller.headers, json=body)


def nothing_made(cctx, adapters, name):
    assert cctx.store.list_groups(visible_to=None) == []
    assert adapters.groups.get(name) is None


@pytest.mark.parametrize("name", PRIVILEGED)
@pytest.mark.parametrize("who", ["alice", "root_user"])
def test_a_privileged_name_is_refused_for_everyone(client, cctx, adapters, request, who, name):
    """Not even a superuser's token makes one: it would hand host root to its members."""
    caller = request.getfixturevalue(who)
    r = post_group(client, caller, name, ["alice"] if who == "alice" else None)
    assert r.status_code == 403, r.text
    assert r.json["success"] is False and r.json["data"] == []
    assert "reserved" in r.json["msg"] and name in r.json["msg"]
    nothing_made(cctx, adapters, name)


def test_a_reserved_name_that_exists_on_the_host_is_named_as_existing(client, cctx, adapters, alice):
    adapters.groups.groups["root"] = []
    r = post_group(client, alice, "root")
    assert r.status_code == 409 and "exists on the host" in r.json["msg"]
    assert cctx.store.list_groups(visible_to=None) == []


@pytest.mark.parametrize("name", ["lab", "_g1", "admins", "sudo-users", "dockerish", "g" + "x" * 31, "a"])
def test_other_posix_names_are_accepted_by_default(client, cctx, adapters, alice, name):
    """Group names (docs/api.md): a POSIX name that is not refused and not on the host is accepted."""
    r = post_group(client, alice, name, ["alice"])
    assert r.status_code == 201, r.text
    assert adapters.groups.get(name) == ["alice"]


def test_refused_names_of_the_site(client, cctx, adapters, alice):
    cctx.config = cctx.config.with_values({"groups": {"refused_names": "hpcadmin, gpu-admins"}})
    for name in ("hpcadmin", "gpu-admins", "sudo"):
        assert post_group(client, alice, name).status_code == 403
        nothing_made(cctx, adapters, name)
    assert post_group(client, alice, "hpcadmins").status_code == 201


def test_a_name_prefix_is_required_when_configured(client, cctx, adapters, alice):
    cctx.config = cctx.config.with_values({"groups": {"name_prefix": "g-"}})
    for name in ("lab", "g-", "xg-lab"):
        r = post_group(client, alice, name)
        assert r.status_code == 400 and "'g-'" in r.json["msg"] and "name_prefix" in r.json["msg"], r.text
        nothing_made(cctx, adapters, name)
    assert post_group(client, alice, "g-lab", ["alice"]).status_code == 201
    assert adapters.groups.get("g-lab") == ["alice"]


def test_a_name_pattern_is_required_when_configured(client, cctx, adapters, alice):
    cctx.config = cctx.config.with_values({"groups": {"name_pattern": "proj-[a-z]+"}})
    r = post_group(client, alice, "lab")
    assert r.status_code == 400 and "name_pattern" in r.json["msg"]
    nothing_made(cctx, adapters, "lab")
    assert post_group(client, alice, "proj-x").status_code == 201


def test_the_pattern_never_lets_a_privileged_name_through(client, cctx, adapters, alice):
    cctx.config = cctx.config.with_values({"groups": {"name_pattern": ".*"}})
    assert post_group(client, alice, "docker").status_code == 403
    nothing_made(cctx, adapters, "docker")


# -- the account side: the two namespaces never meet ------------------------------------------
def test_without_a_prefix_an_account_cannot_take_an_api_groups_name(client, cctx, adapters, alice):
    assert post_group(client, alice, "carol").status_code == 201
    carol = make_caller(cctx, "carol@example.org")
    with pytest.raises(Conflict, match="group named carol was made through the API"):
        enable_account(cctx, carol.email, username="carol")
    assert adapters.directory.get_account("carol") is None
    assert cctx.store.account_of_user(carol.id, cctx.config.controller_id) is None
    assert adapters.groups.get("carol") == []  # the API group is untouched
    enable_account(cctx, carol.email, username="carol2")


def test_with_a_prefix_usernames_may_not_start_with_it(cctx, adapters):
    cctx.config = cctx.config.with_values({"groups": {"name_prefix": "g-"}})
    carol = make_caller(cctx, "carol@example.org")
    with pytest.raises(InvalidInput, match="name_prefix"):
        enable_account(cctx, carol.email, username="g-carol")
    assert adapters.directory.get_account("g-carol") is None
    assert cctx.store.account_of_user(carol.id, cctx.config.controller_id) is None


def test_account_enable_refusal_from_the_agent_is_a_clean_usage_error(tmp_path):
    """The agent path: `account enable` of a username an API group has is one line, exit 1."""
    from tests.fixtures.agent import run_agent

    from controller.config import write_config
    from controller.context import build_context
    from controller.security.crypto import generate_key_file
    from controller.store import Store
    from host_adapters.accounts.sysroot import make_sysroot

    values = config_values_for(tmp_path)
    make_sysroot(values["unix"]["root"])
    (tmp_path / "home").mkdir()
    path = str(tmp_path / "controller.ini")
    write_config(values, path)
    config = config_from_dict(values, path=path)
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    ctx = build_context(config, store=store)
    make_caller(ctx, "dave@example.org")
    store.insert_group({"id": "00000000-0000-4000-8000-000000000001", "owner_id":
                        store.get_user_by_email("dave@example.org")["id"], "name": "dave",
                        "creation_date": "2026-01-01T00:00:00Z"}, [])
    proc = run_agent("--json", "account", "enable", "dave@example.org", "--username", "dave", config=path)
    assert proc.returncode == 1
    assert "made through the API" in proc.stdout
    assert "dave:" not in (tmp_path / "sysroot" / "etc" / "passwd").read_text()


# -- numbers from their own range ---------------------------------------------------------------
def test_groupadd_is_given_the_configured_range(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subp, "_run", lambda argv, **kw: calls.append(argv) or
                        __import__("subprocess").CompletedProcess(argv, 0, "", ""))
    values = config_values_for(tmp_path)
    from host_adapters.accounts.sysroot import make_sysroot

    make_sysroot(values["unix"]["root"])
    groups = build_adapters(config_from_dict(values)).groups
    assert groups.gid_range == (70000, 79999)  # the default: apart from the accounts' range
    groups.create("lab")
    assert calls == [["groupadd", "-R", str(values["unix"]["root"]), "-K", "GID_MIN=70000", "-K", "GID_MAX=79999",
                      "lab"]]
    values["groups"] = {"gid_min": 80000, "gid_max": 80009}
    assert build_adapters(config_from_dict(values)).groups.gid_range == (80000, 80009)


@pytest.mark.real_commands
def test_real_groupadd_takes_numbers_from_the_range_only(sysroot):
    groups = CommandUnixGroups(sysroot, gid_range=(70000, 70001))
    groups.create("one")
    groups.create("two")
    assert (groups.gid("one"), groups.gid("two")) == (70000, 70001)
    with pytest.raises(HostError, match="70000-70001.*gid_min/gid_max"):
        groups.create("three")
    assert groups.get("three") is None


def test_the_fake_keeps_to_its_range_too(adapters):
    adapters.groups.gid_range = (500, 500)
    adapters.groups.create("one")
    assert adapters.groups.gid("one") == 500
    with pytest.raises(HostError):
        adapters.groups.create("two")
    assert adapters.groups.get("two") is None


@pytest.mark.parametrize("groups, message", [
    ({"name_prefix": "G-"}, "name_prefix"),
    ({"name_prefix": "-g"}, "name_prefix"),
    ({"name_prefix": "g" * 32}, "name_prefix"),
    ({"name_pattern": "("}, "name_pattern"),
    ({"gid_min": 0}, "gid_min"),
    ({"gid_min": 80000, "gid_max": 70000}, "gid_min"),
    ({"gid_max": "many"}, "gid_max"),
])
def test_bad_group_policy_config_is_refused(tmp_path, groups, message):
    values = config_values_for(tmp_path)
    values["groups"] = groups
    with pytest.raises(InvalidInput, match=message):
        config_from_dict(values)
