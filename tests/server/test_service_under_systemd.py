"""The shipped units as systemd runs them: `systemd/cloud-controller.service` and
`systemd/cloud-controller-reconcile.service`, copied as they are into a Debian container
booted by systemd-nspawn (tests/fixtures/nspawn.py), drive the tests' real libvirtd.

The container shares the network namespace of that libvirtd (where the guests' bridges
are), holds CAP_NET_ADMIN (nspawn's default set has none), and reaches libvirtd through
its sockets (/run/libvirt bound in). Whatever the unit's hardening forbids, the service
cannot do here either: a unit whose capabilities cannot run `nft` makes no guest and never
reports healthy. The paths the domains use (pool, consoles, homes) are bound at the same
path inside and out, outside /tmp (the units' PrivateTmp would hide them); the checkout is
bound read-only at /opt/cloud-controller, where a head node keeps it, and the project's venv
at the units' /opt/cloud-controller/.venv, with the Python it was made from at its own path.
The venv names the checkout's own path (its scripts' first lines, its editable install's
finder), which may be under /tmp or /var/tmp, hidden from the units: copies of those files
naming /opt/cloud-controller are bound over them (installed()).
"""

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fixtures.libvirtd import LIBVIRT_NETNS, DirPool, GuestVirt, in_netns, real_libvirt_values
from tests.fixtures.nspawn import Bind, Container
from tests.fixtures.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
VENV = Path(sys.prefix)  # the venv running the tests
INSTALLED_ROOT = "/opt/cloud-controller"
INSTALLED_VENV = f"{INSTALLED_ROOT}/.venv"
AGENT = f"{INSTALLED_VENV}/bin/cloud-agent"
CONFIG = "/etc/cloud-controller/controller.ini"
PASSWORD = "correct-horse-42"
HEALTHY_WITHIN = 120  # seconds from `systemctl start` returning to /healthz answering 200
CALL_TIMEOUT = 180  # seconds for one API call (a create under software emulation included)
TABLE = ("bridge", "cloud_controller")
HOST_FILES = ("/etc/libvirt/hooks", "/usr/share/qemu/vhost-user", "/etc/qemu/vhost-user")


def run(argv: list[str], *, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout,
                          stdin=None if input is not None else subprocess.DEVNULL)


@dataclass
class Api:
    """The service's HTTP API, reached in the network namespace it listens in (curl there)."""

    uri: str
    port: int

    def call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        argv = ["curl", "-sS", "--max-time", str(CALL_TIMEOUT), "-X", method, "-o", "-", "-w", "\n%{http_code}",
                "-H", "Content-Type: application/json"]
        for key, value in (headers or {}).items():
            argv += ["-H", f"{key}: {value}"]
        if body is not None:
            argv += ["--data-binary", "@-"]
        argv.append(f"http://127.0.0.1:{self.port}{path}")
        proc = run(in_netns(self.uri, argv), input=json.dumps(body) if body is not None else None,
                   timeout=CALL_TIMEOUT + 10)
        if proc.returncode != 0:
            return 0, proc.stderr.strip()
        text, _, status = proc.stdout.rpartition("\n")
        try:
            return int(status), json.loads(text)
        except ValueError:
            return int(status), text


@dataclass
class Deployment:
    """The service in its container, on the tests' libvirtd."""

    container: Container
    api: Api
    uri: str
    prefix: str
    pool: DirPool
    sysroot: str  # the system root of its accounts and groups ([unix] root)
    taps: set[str] = field(default_factory=set)  # every tap a test saw: removed from the table at the end

    def inside(self, *argv: str, input: str | None = None, timeout: float = 120):
        return self.container.run(list(argv), input=input, timeout=timeout)

    def agent(self, *args: str, input: str | None = None) -> dict:
        """`cloud-agent --json ARGS` inside, as an admin of the head node runs it."""
        proc = self.inside(AGENT, "--json", *args, input=input, timeout=300)
        assert proc.returncode == 0, f"cloud-agent {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return json.loads(proc.stdout)

    def journal(self, unit: str, lines: int = 60) -> str:
        """The unit's last `lines` lines, without the command log lines (one per command run)."""
        proc = self.inside("journalctl", "--no-pager", "-o", "cat", "-u", unit)
        kept = [line for line in proc.stdout.splitlines() if " INFO host_adapters.subp " not in line]
        return "\n".join(kept[-lines:]) + proc.stderr

    def systemctl(self, *args: str, timeout: float = 180):
        return self.inside("systemctl", *args, timeout=timeout)

    def start_service(self) -> None:
        started = self.systemctl("start", "cloud-controller.service")
        assert started.returncode == 0, (f"systemctl start cloud-controller: {started.stderr}\n"
                                         f"{self.journal('cloud-controller.service')}")
        deadline = time.monotonic() + HEALTHY_WITHIN
        while True:
            status, body = self.api.call("GET", "/healthz")
            if status == 200:
                return
            if time.monotonic() > deadline:
                # What the check says with the container's full capabilities, to tell a unit
                # that forbids something from a host that is not ready.
                check = self.inside(AGENT, "check", timeout=300)
                pytest.fail(f"/healthz answered {status} {body} for {HEALTHY_WITHIN} s under the unit; "
                            f"its journal ends:\n{self.journal('cloud-controller.service')}\n"
                            f"`cloud-agent check` outside the unit:\n{check.stdout}{check.stderr}", pytrace=False)
            time.sleep(1)

    def nft_table(self) -> dict:
        """`nft -j list table bridge cloud_controller` in the daemon's network namespace."""
        proc = run(in_netns(self.uri, ["nft", "-j", "list", "table", *TABLE]))
        assert proc.returncode == 0, f"the guests' table is not there: {proc.stderr}"
        return json.loads(proc.stdout)


def nic_macs(listing: dict) -> set[tuple[str, str]]:
    """(tap, MAC) of each element of the table's `nic_mac` set."""
    found = set()
    for item in listing.get("nftables", []):
        s = item.get("set") if isinstance(item, dict) else None
        if isinstance(s, dict) and s.get("name") == "nic_mac":
            for elem in s.get("elem", []):
                tap, mac = elem["concat"]
                found.add((tap, mac.lower()))
    return found


def service_root() -> Path:
    """A new folder for what the domains use, outside /tmp and readable by libvirt's helpers."""
    base = Path("/var/lib")
    path = Path(tempfile.mkdtemp(prefix="cloud-controller-test-", dir=base))
    path.chmod(0o755)
    return path


def installed(staged: Path) -> list[Bind]:
    """Copies, in `staged`, of the venv's files that name the checkout's or the venv's own path
    (each script's first line, the editable install's finder), naming /opt/cloud-controller
    instead, each bound over its original inside the container."""
    staged.mkdir(mode=0o755)
    renamed = [(str(VENV), INSTALLED_VENV), (str(ROOT), INSTALLED_ROOT)]  # the venv first: it may be in ROOT
    found = []
    candidates = [p for p in (VENV / "bin").iterdir() if p.is_file() and not p.is_symlink()]
    candidates += list(VENV.glob("lib/python3*/site-packages/__editable__*finder.py"))
    for path in candidates:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # a binary
        changed = text
        for old, new in renamed:
            changed = changed.replace(old, new)
        if changed == text:
            continue
        copy = staged / f"{len(found)}-{path.name}"
        copy.write_text(changed)
        copy.chmod(path.stat().st_mode & 0o777)
        found.append(Bind(str(copy), f"{INSTALLED_VENV}/{path.relative_to(VENV)}", read_only=True))
    return found


def binds(root: Path) -> tuple[Bind, ...]:
    """What the container needs of this machine (see the module's docstring)."""
    made_from = Path(sys.base_prefix)
    found = [
        Bind("/run/libvirt"),
        Bind(str(root)),
        Bind(str(ROOT), read_only=True),
        Bind(str(ROOT), INSTALLED_ROOT, read_only=True),
        Bind(str(VENV), INSTALLED_VENV, read_only=True),
        *installed(root / "installed"),
    ]
    if not VENV.is_relative_to(ROOT):
        found.append(Bind(str(VENV), read_only=True))
    # The service checks the libvirt host by its files, as on a head node where they are its
    # own: libvirt's hooks (the one writing each start's rules) and QEMU's vhost-user
    # descriptors (virtiofsd). Missing here, the check fails and says why.
    found += [Bind(path, read_only=True) for path in HOST_FILES if Path(path).is_dir()]
    # A Python of the distribution is in the container's own /usr (nspawn.PACKAGES).
    if made_from != Path("/usr"):
        found.append(Bind(str(made_from), read_only=True))
    return tuple(found)


def make_pool(uri: str, path: Path) -> DirPool:
    import libvirt

    path.mkdir(mode=0o755)
    name = f"cc-systemd-{uuid.uuid4().hex[:8]}"
    conn = libvirt.open(uri)
    try:
        conn.storagePoolCreateXML(
            f"<pool type='dir'><name>{name}</name><target><path>{path}</path></target></pool>", 0)
    finally:
        conn.close()
    return DirPool(uri=uri, name=name, path=str(path))


def remove_pool(pool: DirPool, prefix: str) -> None:
    """Every domain named with `prefix`, then the pool and its volumes."""
    import libvirt

    from tests.fixtures.libvirtd import remove_console_pool

    conn = libvirt.open(pool.uri)
    try:
        for dom in conn.listAllDomains(0):
            if dom.name().startswith(prefix):
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
        try:
            found = conn.storagePoolLookupByName(pool.name)
        except libvirt.libvirtError:
            return
        found.refresh(0)
        for vol in found.listAllVolumes(0):
            vol.delete(0)
        found.destroy()
        remove_console_pool(conn, pool.name)
    finally:
        conn.close()


def forget_taps(uri: str, taps: set[str]) -> None:
    """Remove the elements of `taps` from the daemon's table (what a failed test left there)."""
    from host_adapters.network import nft_ruleset

    listed = run(in_netns(uri, nft_ruleset.list_argv()))
    if listed.returncode != 0:
        return  # no table: nothing left
    left = tuple(n for n in nft_ruleset.parse(listed.stdout) if n.tap in taps)
    if left:
        run(in_netns(uri, ["nft", "-f", "-"]), input=nft_ruleset.batch(remove=left))


@pytest.fixture(scope="module")
def deployment(debian_rootfs, libvirtd_system, libvirt_private_network, tmp_path_factory):
    """The shipped service unit started by the container's systemd, healthy, with an admin."""
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed: run scripts/setup-host.sh", pytrace=False)
    uri = libvirtd_system
    prefix = f"sd{uuid.uuid4().hex[:6]}-"
    taps: set[str] = set()
    # Undone in the reverse order, each step even when one before it fails.
    with contextlib.ExitStack() as undo:
        root = service_root()
        undo.callback(shutil.rmtree, root, ignore_errors=True)  # the pool, its consoles, homes, accounts
        pool = make_pool(uri, root / "pool")
        undo.callback(remove_pool, pool, prefix)
        undo.callback(forget_taps, uri, taps)
        (root / "homes").mkdir(mode=0o755)
        from host_adapters.accounts.sysroot import make_sysroot

        sysroot = make_sysroot(root / "sysroot")
        values = real_libvirt_values(root / "state", pool=pool, network=libvirt_private_network,
                                     virt=GuestVirt("qemu", "qemu64"), sysroot=sysroot,
                                     home_root=str(root / "homes"), prefix=prefix)
        port = free_port()
        # Where a head node keeps them (etc/controller.ini.sample), inside the container.
        values["database"]["path"] = "/var/lib/cloud-controller/controller.db"
        values["auth"]["secret_key_file"] = "/etc/cloud-controller/secret.key"
        values["server"].update(host="127.0.0.1", port=port, interfaces="controller,user")
        # Blank disks run no OS to hear the power button.
        values["guest"]["shutdown_timeout_seconds"] = 2

        container = Container(debian_rootfs, log=tmp_path_factory.mktemp("nspawn") / "console.log",
                              binds=binds(root), netns=LIBVIRT_NETNS.get(uri), capabilities=("CAP_NET_ADMIN",))
        undo.callback(container.stop)
        container.start()
        for name in ("cloud-controller.service", "cloud-controller-reconcile.service"):
            container.write(f"/etc/systemd/system/{name}", (UNITS / name).read_text())
        container.write(CONFIG, ini_text(values), mode=0o640, folder_mode=0o750)
        dep = Deployment(container=container, api=Api(uri, port), uri=uri, prefix=prefix, pool=pool,
                         sysroot=sysroot, taps=taps)
        assert dep.systemctl("daemon-reload").returncode == 0
        dep.start_service()
        yield dep


def ini_text(values: dict) -> str:
    import configparser
    import io

    parser = configparser.ConfigParser(interpolation=None)
    for section, keys in values.items():
        parser[section] = {k: str(v) for k, v in keys.items()}
    out = io.StringIO()
    parser.write(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def admin(deployment) -> dict:
    """A superuser with a system account, a home volume, a blank image and a tiny flavor: the
    headers of its token and the body of a create."""
    made = deployment.agent("user", "create-superuser", "--email", "admin@example.org", "--password-file", "-",
                            input=PASSWORD + "\n")
    deployment.agent("account", "enable", "admin@example.org", "--username", "ccadmin")
    image = deployment.agent("image", "add", "--name", "blank", "--os-name", "none", "--os-major", "0",
                             "--os-minor", "0", "--min-disk", "1", "--min-ram", "64")
    flavor = deployment.agent("flavor", "add", "--name", "micro", "--memory", "128", "--disk", "1", "--vcpu", "1")
    status, body = deployment.api.call("POST", "/v1/auth/token",
                                       {"api_key": made["api_key"], "api_secret": made["api_secret"]})
    assert status == 200, body
    headers = {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": body["data"]["userid"]}
    status, body = deployment.api.call("POST", "/v1/storage-volume",
                                       {"volume-size": 1, "volume-type": {"visibility": "cluster"}}, headers)
    assert status == 201, body
    return {"headers": headers, "create": {"server-image": image["id"], "server-flavor": flavor["id"]}}


def create(deployment: Deployment, admin: dict) -> tuple[dict, str, str]:
    """An instance made through the API: its record, and its NIC's tap and MAC (from libvirt)."""
    import libvirt

    status, body = deployment.api.call("POST", "/v1/server-instance", admin["create"], admin["headers"])
    assert status == 201, f"{status} {body}\n{deployment.journal('cloud-controller.service')}"
    [inst] = body["data"]
    conn = libvirt.open(deployment.uri)
    try:
        dom = conn.lookupByName(f"{deployment.prefix}{inst['id']}")
        assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        [nic] = ET.fromstring(dom.XMLDesc(0)).findall("devices/interface")
    finally:
        conn.close()
    tap, mac = nic.find("target").get("dev"), nic.find("mac").get("address").lower()
    deployment.taps.add(tap)
    return inst, tap, mac


def delete(deployment: Deployment, admin: dict, instance_id: str) -> None:
    import libvirt

    status, body = deployment.api.call("DELETE", f"/v1/server-instance/{instance_id}", headers=admin["headers"])
    assert status == 200 and body["data"] == [], body
    conn = libvirt.open(deployment.uri)
    try:
        assert f"{deployment.prefix}{instance_id}" not in [d.name() for d in conn.listAllDomains(0)]
    finally:
        conn.close()


def test_the_unit_runs_a_guest_with_its_rules(deployment, admin):
    """Under the unit's capabilities and sandbox the service is healthy (its check writes the
    table), a create through the API runs the guest with its NIC's elements in the host's table,
    and a delete removes both."""
    inst, tap, mac = create(deployment, admin)
    assert inst["status"] == "running"
    assert (tap, mac) in nic_macs(deployment.nft_table())
    # Its check, which writes the running guests' rules again, still passes.
    status, body = deployment.api.call("GET", "/healthz")
    assert status == 200, body

    delete(deployment, admin, inst["id"])
    assert (tap, mac) not in nic_macs(deployment.nft_table())


def test_the_unit_makes_groups_in_its_system_root(deployment, admin):
    """groupadd and gpasswd in a chroot (the system root) under the unit's system call filter."""
    group_file = Path(deployment.sysroot) / "etc" / "group"
    status, body = deployment.api.call("POST", "/v1/group", {"group-name": "ccteam", "group-members": ["ccadmin"]},
                                       admin["headers"])
    assert status == 201, f"{status} {body}\n{deployment.journal('cloud-controller.service')}"
    [group] = body["data"]
    assert [line for line in group_file.read_text().splitlines() if line.startswith("ccteam:")][0].endswith(
        ":ccadmin")
    status, body = deployment.api.call("DELETE", f"/v1/group/{group['group-id']}", headers=admin["headers"])
    assert status == 200, body
    assert "ccteam:" not in group_file.read_text()


def test_the_reconcile_unit_fixes_a_guests_rules(deployment, admin):
    """A running guest whose definition lost its rules (and the host its elements) is repaired by
    the reconcile unit with --fix: the definition and the host's table hold them again."""
    import libvirt

    from host_adapters.libvirt.xml import NIC_RULES_NS, nic_rules_of

    inst, tap, mac = create(deployment, admin)
    domain = f"{deployment.prefix}{inst['id']}"
    # The service would restore the elements itself within a minute: stopped, only the unit acts.
    assert deployment.systemctl("stop", "cloud-controller.service").returncode == 0
    try:
        conn = libvirt.open(deployment.uri)
        try:
            dom = conn.lookupByName(domain)
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, NIC_RULES_NS,
                            libvirt.VIR_DOMAIN_AFFECT_CONFIG)
            assert nic_rules_of(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)) == {}
        finally:
            conn.close()
        forget_taps(deployment.uri, {tap})
        assert (tap, mac) not in nic_macs(deployment.nft_table())

        # The shipped unit with --fix, as an admin would add it (a drop-in).
        deployment.container.write(
            "/etc/systemd/system/cloud-controller-reconcile.service.d/fix.conf",
            f"[Service]\nExecStart=\nExecStart={AGENT} reconcile --fix\n")
        assert deployment.systemctl("daemon-reload").returncode == 0
        ran = deployment.systemctl("start", "cloud-controller-reconcile.service", timeout=300)
        journal = deployment.journal("cloud-controller-reconcile.service")
        assert ran.returncode == 0, f"the reconcile unit failed: {ran.stderr}\n{journal}"
        assert f"FIXED domain-nics {inst['id']}" in journal, journal
        assert "DRIFT" not in journal, journal

        assert (tap, mac) in nic_macs(deployment.nft_table())
        conn = libvirt.open(deployment.uri)
        try:
            kept = nic_rules_of(conn.lookupByName(domain).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        finally:
            conn.close()
        assert list(kept) == [mac]
    finally:
        deployment.start_service()
    delete(deployment, admin, inst["id"])
    assert (tap, mac) not in nic_macs(deployment.nft_table())
