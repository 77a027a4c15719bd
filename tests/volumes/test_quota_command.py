"""`quota_backend = command`: a real site program, written here, driven through the adapter,
the API, `cloud-agent check`, `volume resize` and `reconcile`; and the two sample programs in
etc/ run against stand-in `zfs` and `lfs` that answer as the real tools do."""

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from controller.storage import volumes as volume_service
from controller.config import config_from_dict, sandbox_values
from controller.errors import HostError, HostUnavailable, InvalidInput
from host_adapters import factory
from host_adapters.homes.command_quota import CommandQuota, parse_get, program_message
from host_adapters.homes.homes import DirectoryHomeVolumes
from tests.agent.test_agent_controller import Sandbox, sandbox, sandbox_template  # noqa: F401 (fixtures)
from tests.fixtures.api import enable, make_caller

pytestmark = pytest.mark.real_commands

GIB = 1 << 30
UID, GID = 23456, 23456
ETC = Path(__file__).resolve().parents[2] / "etc"

# The site's program as a site might write it: argv to a log (tab-separated, one call a
# line), limits per uid in a state file; a file fail-VERB makes VERB fail with that file as
# its stderr, a file hang-VERB makes it hang (its child's pid in hang.pid).
PROGRAM = """#!/bin/sh
set -eu
here=$(dirname "$0")
state=$here/limits
touch "$state"
(IFS='\t'; printf '%s\\n' "$0\t$*") >> "$here/argv.log"
verb=$1
if [ -f "$here/fail-$verb" ]; then cat "$here/fail-$verb" >&2; exit 3; fi
if [ -f "$here/hang-$verb" ]; then sleep 60 & echo $! > "$here/hang.pid"; wait; fi
case $verb in
    set) { grep -v "^$3 " "$state" || true; echo "$3 $4"; } > "$state.new"; mv "$state.new" "$state" ;;
    get) awk -v u="$3" '$1 == u { print $2, 4096; found = 1 } END { if (!found) print "none" }' "$state" ;;
    remove) { grep -v "^$3 " "$state" || true; } > "$state.new"; mv "$state.new" "$state" ;;
    check) [ -d "$2" ] || { echo "home root $2 is not on the site filesystem" >&2; exit 1; } ;;
esac
"""


class Site:
    """The program's directory: its argv log, its limits, and the switches above."""

    def __init__(self, root: Path):
        self.dir = root
        root.mkdir(parents=True)
        self.program = str(root / "site-quota")
        Path(self.program).write_text(PROGRAM)
        os.chmod(self.program, 0o755)

    def calls(self) -> list[list[str]]:
        log = self.dir / "argv.log"
        return [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []

    def limits(self) -> dict[int, int]:
        state = self.dir / "limits"
        text = state.read_text() if state.exists() else ""
        return {int(u): int(b) for u, b in (line.split() for line in text.splitlines())}

    def set_limit(self, uid: int, size: int) -> None:
        rest = [f"{u} {b}\n" for u, b in self.limits().items() if u != uid]
        (self.dir / "limits").write_text("".join(rest) + f"{uid} {size}\n")

    def fail(self, verb: str, stderr: str) -> None:
        (self.dir / f"fail-{verb}").write_text(stderr)

    def hang(self, verb: str) -> None:
        (self.dir / f"hang-{verb}").write_text("")

    def forget(self) -> None:
        (self.dir / "argv.log").unlink(missing_ok=True)

    def stop_hung(self) -> None:
        pid_file = self.dir / "hang.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def site(tmp_path):
    s = Site(tmp_path / "site")
    yield s
    s.stop_hung()


@pytest.fixture
def homes(tmp_path, site):
    root = tmp_path / "home"
    root.mkdir()
    return DirectoryHomeVolumes(str(root), CommandQuota(program=site.program, timeout=5))


# -- the adapter ----------------------------------------------------------------------------
def test_create_resize_inspect_delete_run_the_program_with_the_documented_argv(homes, site):
    path = homes.create("alice", uid=UID, gid=GID, size_gb=2)
    assert site.calls() == [[site.program, "set", path, str(UID), str(2 * GIB)]]
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID, GID, 0o700)
    assert site.limits() == {UID: 2 * GIB}

    homes.resize("alice", uid=UID, size_gb=5)
    info = homes.inspect("alice")
    assert info.limit_bytes == 5 * GIB and info.quota_expected
    homes.delete("alice", uid=UID)
    assert site.calls()[1:] == [
        [site.program, "set", path, str(UID), str(5 * GIB)],
        [site.program, "get", path, str(UID)],
        [site.program, "remove", path, str(UID)],
    ]
    assert site.limits() == {} and not os.path.lexists(path)


def test_a_retired_home_is_removed_under_its_new_path_and_the_recorded_uid(homes, site):
    homes.create("alice", uid=UID, gid=GID, size_gb=1)
    os.chown(homes.path("alice"), 999, 999)  # root in a guest chowned the tree
    retired = homes.retire("alice", token="f00d", uid=UID)
    site.forget()
    homes.purge(retired)
    assert site.calls() == [[site.program, "remove", retired, str(UID)]]
    assert site.limits() == {} and not os.path.lexists(retired)


def test_check_runs_the_program_and_names_its_failure(homes, site, tmp_path):
    homes.check()
    assert site.calls() == [[site.program, "check", homes.home_root]]
    site.fail("check", "lfs: cannot reach the MDS\n")
    with pytest.raises(HostUnavailable, match="quota command check failed \\(exit 3\\): lfs: cannot reach the MDS"):
        homes.check()


def test_a_failed_set_leaves_no_home_and_says_what_the_program_said(homes, site):
    site.fail("set", "zfs: permission denied\nsecond line\n\n" + "x" * 5000 + "\n" + "never shown\n")
    with pytest.raises(HostError) as e:
        homes.create("alice", uid=UID, gid=GID, size_gb=3)
    assert e.value.message.startswith("quota command set failed (exit 3): zfs: permission denied / second line / x")
    assert "never shown" not in e.value.message and len(e.value.message) < 400
    path = homes.path("alice")
    assert not os.path.lexists(path) and site.limits() == {}
    # What the failed set may have done is undone too.
    assert [c[1] for c in site.calls()] == ["set", "remove"]


def test_a_failed_resize_keeps_the_old_limit(homes, site):
    homes.create("alice", uid=UID, gid=GID, size_gb=2)
    site.fail("set", "quota server busy\n")
    with pytest.raises(HostError, match="quota server busy"):
        homes.resize("alice", uid=UID, size_gb=9)
    assert site.limits() == {UID: 2 * GIB} and os.path.isdir(homes.path("alice"))


def test_a_failed_remove_still_removes_the_tree_and_reports(homes, site):
    path = homes.create("alice", uid=UID, gid=GID, size_gb=2)
    site.fail("remove", "quota entry locked\n")
    with pytest.raises(HostError, match="quota command remove failed \\(exit 3\\): quota entry locked"):
        homes.delete("alice", uid=UID)
    assert not os.path.lexists(path)


def test_a_hanging_program_is_cut_at_the_timeout(tmp_path, site):
    root = tmp_path / "home"
    root.mkdir()
    homes = DirectoryHomeVolumes(str(root), CommandQuota(program=site.program, timeout=1))
    site.hang("set")
    started = time.monotonic()
    with pytest.raises(HostError, match="quota command set did not finish within 1 s"):
        homes.create("alice", uid=UID, gid=GID, size_gb=1)
    assert time.monotonic() - started < 10
    assert not os.path.lexists(homes.path("alice"))


def test_get_reads_the_documented_output(homes, site):
    path = homes.create("alice", uid=UID, gid=GID, size_gb=1)
    assert homes.quota.get_limit(path, uid=UID) == GIB
    assert homes.quota.get_limit(path, uid=UID + 1) is None  # prints "none"
    assert parse_get("1073741824 5000 extra\n") == GIB
    assert parse_get("0\n") is None and parse_get("none\n") is None
    for bad in ("", "ten gigabytes\n", "-5\n", "1.5\n", "1" * 21 + "\n"):
        with pytest.raises(HostError, match="quota command get printed"):
            parse_get(bad)


def test_the_message_is_bounded_and_printable():
    assert program_message("\x1b[31mred\x1b[0m\n") == "?[31mred?[0m"
    assert program_message("") == "no message"
    assert len(program_message("y" * 10_000)) == 300


def test_a_program_gone_or_no_longer_executable_is_unavailable(homes, site):
    os.chmod(site.program, 0o644)
    with pytest.raises(HostUnavailable, match="cannot be run"):
        homes.create("alice", uid=UID, gid=GID, size_gb=1)
    os.unlink(site.program)
    with pytest.raises(HostUnavailable, match="cannot be run"):
        homes.check()
    assert not os.path.lexists(homes.path("alice"))


# -- the config -----------------------------------------------------------------------------
def config_with(tmp_path, sudo="none", **volumes):
    values = sandbox_values(str(tmp_path))
    values["guest"] = {"sudo": sudo}
    values["volumes"].update(volumes)
    return config_from_dict(values)


def test_the_factory_builds_the_command_backend_with_its_program_and_timeout(tmp_path, site):
    config = config_with(tmp_path, quota_backend="command", quota_command=site.program,
                         quota_command_timeout_seconds=7)
    built = factory.build_quota(config)
    assert isinstance(built, CommandQuota)
    assert (built.program, built.timeout) == (site.program, 7)


@pytest.mark.parametrize("change, message", [
    ({"quota_command": ""}, "quota_backend = command needs quota_command"),
    ({"quota_command": "site-quota"}, "must be an absolute path"),
    ({"quota_command": "/nonexistent/site-quota"}, "No such file or directory"),
    ({"mode": 0o644}, "is not an executable file"),
    ({"mode": 0o775}, "must be owned by root and not writable by group or others"),
    ({"quota_command_timeout_seconds": 0}, "quota_command_timeout_seconds must be 1 or more"),
    ({"quota_command_timeout_seconds": 601}, "quota_command_timeout_seconds must be from 1 to 600"),
    ({"quota_backend": "btrfs"}, "quota_command is run only with quota_backend = command, not btrfs"),
    ({"sudo": "owner"}, "sudo = owner cannot be used with \\[volumes\\] quota_backend = command"),
])
def test_the_config_refuses_a_bad_command_setup(tmp_path, site, change, message):
    keys = {"quota_backend": "command", "quota_command": site.program}
    os.chmod(site.program, change.pop("mode", 0o755))
    sudo = change.pop("sudo", "none")
    keys.update(change)
    with pytest.raises(InvalidInput, match=message):
        config_with(tmp_path, sudo=sudo, **keys)


# -- through the API ------------------------------------------------------------------------
@pytest.fixture
def api(cctx, client, tmp_path, site):
    root = tmp_path / "api-home"
    root.mkdir()
    cctx.adapters.homes = DirectoryHomeVolumes(str(root), CommandQuota(program=site.program, timeout=1))
    alice = make_caller(cctx, "alice@example.org")
    account = enable(cctx, alice, "alice")
    return cctx, client, alice, account


def post_volume(client, caller, size=2):
    return client.simulate_post("/v1/storage-volume", headers=caller.headers,
                                json={"volume-size": size, "volume-type": {"visibility": "cluster"}})


def test_volume_create_resize_delete_through_the_api(api, site):
    ctx, client, alice, account = api
    r = post_volume(client, alice, 2)
    assert r.status_code == 201, r.json
    [vol] = r.json["data"]
    home = vol["volume-type"]["mount-point"]
    uid = str(account["uid"])
    assert site.calls() == [[site.program, "set", home, uid, str(2 * GIB)]]
    assert os.path.isdir(home) and site.limits() == {account["uid"]: 2 * GIB}

    volume_service.resize_volume(ctx, vol["volume-id"], 4)
    assert site.calls()[-1] == [site.program, "set", home, uid, str(4 * GIB)]
    assert ctx.store.volume_of_user(alice.id)["size_gb"] == 4

    r = client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=alice.headers)
    assert r.status_code == 200, r.json  # no background worker here: the purge ran in the request
    [verb, retired, who] = site.calls()[-1][1:]
    assert (verb, who, os.path.dirname(retired)) == ("remove", uid, os.path.dirname(home))
    assert os.path.basename(retired) == f".retired-{vol['volume-id']}.{uid}"
    assert not os.path.lexists(home) and not os.path.lexists(retired) and site.limits() == {}
    assert ctx.store.volume_of_user(alice.id) is None


def test_a_failing_program_is_503_with_its_message_and_nothing_half_made(api, site):
    ctx, client, alice, account = api
    site.fail("set", "lfs setquota: quota is not enabled on /lustre\n")
    r = post_volume(client, alice)
    assert r.status_code == 503
    assert r.json["success"] is False
    assert r.json["msg"] == "quota command set failed (exit 3): lfs setquota: quota is not enabled on /lustre"
    assert os.listdir(ctx.adapters.homes.home_root) == []
    assert ctx.store.volume_of_user(alice.id) is None


def test_a_failed_resize_keeps_the_old_size(api, site):
    ctx, client, alice, account = api
    [vol] = post_volume(client, alice, 2).json["data"]
    site.fail("set", "over the project's allocation\n")
    with pytest.raises(HostError, match="over the project's allocation"):
        volume_service.resize_volume(ctx, vol["volume-id"], 8)
    assert ctx.store.volume_of_user(alice.id)["size_gb"] == 2
    assert site.limits() == {account["uid"]: 2 * GIB}


def test_a_hanging_program_is_503_at_the_timeout(api, site):
    ctx, client, alice, account = api
    site.hang("set")
    started = time.monotonic()
    r = post_volume(client, alice)
    assert r.status_code == 503 and r.json["msg"] == "quota command set did not finish within 1 s"
    assert time.monotonic() - started < 10
    assert os.listdir(ctx.adapters.homes.home_root) == []
    assert ctx.store.volume_of_user(alice.id) is None


# -- cloud-agent check, volume resize and reconcile on a sandbox ---------------------------
def use_command(sandbox: Sandbox, program: str) -> None:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(sandbox.config)
    parser["volumes"]["quota_backend"] = "command"
    parser["volumes"]["quota_command"] = program
    with open(sandbox.config, "w") as f:
        parser.write(f)


def test_cloud_agent_check_and_reconcile_use_the_program(sandbox, site):
    use_command(sandbox, site.program)
    home_root = str(sandbox.root / "home")
    out = sandbox.ok("check")
    assert {"name": "quota_backend", "ok": True, "detail": ""} in out["checks"]
    assert site.calls() == [[site.program, "check", home_root]]

    sandbox.ok("account", "enable", "admin@example.org", "--username", "ccadmin")
    api = sandbox.api()
    vol = api.create_volume(api.headers, size=2)
    [row] = sandbox.rows("SELECT uid FROM volumes")
    home = os.path.join(home_root, "ccadmin")
    uid = str(row["uid"])
    assert site.calls()[-1] == [site.program, "set", home, uid, str(2 * GIB)]

    sandbox.ok("volume", "resize", vol["volume-id"], "3")
    assert site.calls()[-1] == [site.program, "set", home, uid, str(3 * GIB)]

    site.set_limit(row["uid"], 5 * GIB)  # changed behind the controller's back
    site.forget()
    proc = sandbox.run("--json", "reconcile")
    assert proc.returncode == 1
    assert "quota 5.0 GB, recorded 3 GB" in proc.stdout
    assert [site.program, "get", home, uid] in site.calls()
    sandbox.ok("reconcile", "--fix")
    assert site.calls()[-1] == [site.program, "set", home, uid, str(3 * GIB)]
    assert site.limits() == {row["uid"]: 3 * GIB}
    sandbox.ok("reconcile")

    site.fail("set", "project allocation exhausted\n")
    assert "project allocation exhausted" in sandbox.error("volume", "resize", vol["volume-id"], "9")
    assert sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 3

    site.fail("check", "lfs: cannot reach the MDS\n")
    proc = sandbox.run("--json", "check")
    assert proc.returncode == 1
    [quota] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "quota_backend"]
    assert quota == {"name": "quota_backend", "ok": False,
                     "detail": "quota command check failed (exit 3): lfs: cannot reach the MDS"}
    proc = sandbox.run("check")
    assert "FAIL quota_backend: quota command check failed (exit 3): lfs: cannot reach the MDS" in proc.stdout


# -- the sample programs in etc/, against stand-in tools ------------------------------------
STAND_IN = """#!/bin/sh
# Stands in for {tool}: records its argv, answers from {tool}.answers (pattern<TAB>output).
here=$(dirname "$0")
(IFS='\t'; printf '%s\\n' "$*") >> "$here/{tool}.argv"
while IFS='\t' read -r pattern output; do
    case "$*" in $pattern) printf '%b' "$output"; exit 0 ;; esac
done < "$here/{tool}.answers"
echo "{tool}: no answer for: $*" >&2
exit 1
"""


class Tool:
    """A stand-in for a real tool, first on PATH."""

    def __init__(self, bin_dir: Path, name: str):
        self.bin_dir, self.name = bin_dir, name
        bin_dir.mkdir(exist_ok=True)
        path = bin_dir / name
        path.write_text(STAND_IN.format(tool=name))
        path.chmod(0o755)
        (bin_dir / f"{name}.answers").write_text("")

    def answer(self, pattern: str, output: str = "") -> None:
        with open(self.bin_dir / f"{self.name}.answers", "a") as f:
            f.write(f"{pattern}\t{output}\n")

    def calls(self) -> list[list[str]]:
        log = self.bin_dir / f"{self.name}.argv"
        return [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []


def run_sample(script: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C"}
    return subprocess.run(["/bin/sh", str(script), *args], capture_output=True, text=True, env=env, timeout=30)


def sample_ok(script: Path, bin_dir: Path, *args: str) -> str:
    """What a sample printed on stdout; it must succeed."""
    proc = run_sample(script, bin_dir, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_zfs_sample_sets_reads_and_removes_user_quotas(tmp_path):
    zfs = Tool(tmp_path / "bin", "zfs")
    home_root = tmp_path / "home"
    home_root.mkdir()
    home = f"{home_root}/alice"
    zfs.answer(f"list -H -o name {home_root}", "tank/home\\n")
    zfs.answer(f"get -Hp -o value userquota@{UID},userused@{UID} tank/home", f"{2 * GIB}\\n12345\\n")
    zfs.answer(f"get -Hp -o value userquota@{UID + 1},userused@{UID + 1} tank/home", "0\\n0\\n")
    zfs.answer("set *")
    script = ETC / "quota-command-zfs.sh"

    def ok(*args):
        return sample_ok(script, zfs.bin_dir, *args)

    assert ok("check", str(home_root)) == ""
    assert ok("set", home, str(UID), str(2 * GIB)) == ""
    assert ok("get", home, str(UID)) == f"{2 * GIB} 12345\n"
    assert parse_get(ok("get", home, str(UID))) == 2 * GIB
    assert parse_get(ok("get", home, str(UID + 1))) is None
    assert ok("remove", f"{home_root}/.retired-f00d.{UID}", str(UID)) == ""
    assert zfs.calls() == [
        ["list", "-H", "-o", "name", str(home_root)],
        ["list", "-H", "-o", "name", str(home_root)],
        ["set", f"userquota@{UID}={2 * GIB}", "tank/home"],
        ["list", "-H", "-o", "name", str(home_root)],
        ["get", "-Hp", "-o", "value", f"userquota@{UID},userused@{UID}", "tank/home"],
        ["list", "-H", "-o", "name", str(home_root)],
        ["get", "-Hp", "-o", "value", f"userquota@{UID},userused@{UID}", "tank/home"],
        ["list", "-H", "-o", "name", str(home_root)],
        ["get", "-Hp", "-o", "value", f"userquota@{UID + 1},userused@{UID + 1}", "tank/home"],
        ["list", "-H", "-o", "name", str(home_root)],
        ["set", f"userquota@{UID}=1K", "tank/home"],
    ]


def test_the_lustre_sample_sets_reads_and_removes_user_quotas(tmp_path):
    lfs = Tool(tmp_path / "bin", "lfs")
    mount = tmp_path / "lustre"
    home_root = mount / "home"
    home_root.mkdir(parents=True)
    home = f"{home_root}/alice"
    # The sample with MOUNT set, as a site installs it.
    script = tmp_path / "cloud-quota-lustre"
    text = (ETC / "quota-command-lustre.sh").read_text()
    assert "\nMOUNT=/lustre\n" in text
    script.write_text(text.replace("\nMOUNT=/lustre\n", f"\nMOUNT={mount}\n"))
    # lfs quota -q: one row; a long mount name is put on a line of its own; '*' marks a
    # limit exceeded (kbytes quota limit grace files quota limit grace).
    lfs.answer(f"quota -q -u 0 {mount}", f"{mount}\\n        0       0       0       -       0       0       0       -\\n")
    lfs.answer(f"quota -q -u {UID} {mount}",
               f"{mount}\\n  2097160*       0 2097152       -      12       0       0       -\\n")
    lfs.answer(f"quota -q -u {UID + 1} {mount}", f" {mount}   4   0   0   -   1   0   0   -\\n")
    lfs.answer("setquota *")

    def ok(*args):
        return sample_ok(script, lfs.bin_dir, *args)

    assert ok("check", str(home_root)) == ""
    assert ok("set", home, str(UID), str(2 * GIB)) == ""
    assert ok("get", home, str(UID)) == f"{2 * GIB} {2097160 * 1024}\n"
    assert parse_get(ok("get", home, str(UID + 1))) is None
    assert ok("remove", f"{home_root}/.retired-f00d.{UID}", str(UID)) == ""
    assert lfs.calls() == [
        ["quota", "-q", "-u", "0", str(mount)],
        ["setquota", "-u", str(UID), "-b", "0", "-B", str(2 * GIB // 1024), str(mount)],
        ["quota", "-q", "-u", str(UID), str(mount)],
        ["quota", "-q", "-u", str(UID + 1), str(mount)],
        ["setquota", "-u", str(UID), "-b", "0", "-B", "1", "-i", "0", "-I", "1", str(mount)],
    ]


@pytest.mark.parametrize("sample", ["quota-command-zfs.sh", "quota-command-lustre.sh"])
@pytest.mark.parametrize("args, message", [
    ([], "usage"),
    (["resize", "/lustre/home/a", "1", "2"], "unknown action 'resize'"),
    (["set", "/lustre/home/a", "1"], "usage"),
    (["set", "/lustre/home/a", "1", "2", "3"], "usage"),
    (["set", "relative/a", "1", "1073741824"], "relative/a"),
    (["set", "/lustre/home/../etc", "1", "1073741824"], "refusing the path"),
    (["set", "/lustre/home/a b", "1", "1073741824"], "refusing the path"),
    (["set", "/lustre/home/a", "-1", "1073741824"], "UID must be a decimal number"),
    (["set", "/lustre/home/a", "12345678901", "1073741824"], "UID is too long"),
    (["set", "/lustre/home/a", "1", "1G"], "BYTES must be a decimal number"),
    (["get", "/lustre/home/a", "x;reboot"], "UID must be a decimal number"),
    (["remove", "/lustre/home/a"], "usage"),
    (["check"], "usage"),
])
def test_the_samples_refuse_bad_arguments_before_running_anything(tmp_path, sample, args, message):
    tool = Tool(tmp_path / "bin", "zfs" if "zfs" in sample else "lfs")
    tool.answer("*", "tank/home\\n")
    proc = run_sample(ETC / sample, tool.bin_dir, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert tool.calls() == []


@pytest.mark.parametrize("sample, tool_name", [("quota-command-zfs.sh", "zfs"), ("quota-command-lustre.sh", "lfs")])
def test_a_failing_tool_fails_the_sample_with_its_message(tmp_path, sample, tool_name):
    tool = Tool(tmp_path / "bin", tool_name)  # answers nothing: every call fails
    proc = run_sample(ETC / sample, tool.bin_dir, "set", "/lustre/home/alice", str(UID), str(GIB))
    assert proc.returncode != 0
    assert f"{tool_name}: no answer for:" in proc.stderr
    assert len(tool.calls()) == 1


# -- the program's directories (a root-owned program in a directory others can write) ------


@pytest.mark.parametrize("where", ["site", "parent"])
def test_the_config_refuses_a_program_in_a_directory_others_can_write(tmp_path, site, where):
    directory = site.dir if where == "site" else site.dir.parent
    os.chmod(directory, 0o777)
    try:
        with pytest.raises(InvalidInput, match=f"directory {directory} on its path must be owned by root and "
                                               "not writable by group or others"):
            config_with(tmp_path, quota_backend="command", quota_command=site.program)
    finally:
        os.chmod(directory, 0o755 if where == "site" else 0o700)
    # Once the directory is closed again the same program is accepted.
    config_with(tmp_path, quota_backend="command", quota_command=site.program)


def test_the_config_checks_the_directories_a_symlink_leads_to(tmp_path, site):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    real = open_dir / "real-quota"
    real.write_text(PROGRAM)
    os.chmod(real, 0o755)
    os.chmod(open_dir, 0o777)
    link = site.dir / "linked-quota"
    os.symlink(real, link)
    with pytest.raises(InvalidInput, match=f"directory {open_dir} on its path must be owned by root"):
        config_with(tmp_path, quota_backend="command", quota_command=str(link))


def test_a_sticky_root_directory_is_accepted(tmp_path, site):
    # /tmp itself (1777, root's) holds every test's folder: only an entry's owner may rename it.
    assert os.stat("/tmp").st_mode & stat.S_ISVTX
    config_with(tmp_path, quota_backend="command", quota_command=site.program)


def test_check_refuses_a_program_whose_directory_was_opened_after_start(homes, site):
    homes.check()
    site.forget()
    os.chmod(site.dir, 0o777)
    try:
        with pytest.raises(HostUnavailable, match=f"quota command {site.program} cannot be run: directory "
                                                  f"{site.dir} on its path must be owned by root"):
            homes.check()
    finally:
        os.chmod(site.dir, 0o755)
    assert site.calls() == []  # not run as root
