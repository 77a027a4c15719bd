"""cloud-guest-rules and its libvirt hook (host_adapters/libvirt/guest_rules_hook.py), on recorded
commands; the same on a real libvirtd is test_guest_rules_hook_kvm.py."""

import configparser
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import guest_rules
from host_adapters import subp
from host_adapters.libvirt import guest_rules_hook
from host_adapters.network import bridge_ports, nft_ruleset
from host_adapters.guests.guest import Nic
from host_adapters.network.guest_firewall import HOOK_PATH, NicRules, tap_name
from host_adapters.libvirt import firewall
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt.nic_filters import filter_for

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / guest_rules_hook.UNIT
PROGRAM = Path(sys.executable).parent / "cloud-guest-rules"
TAG = "0a1b2"

CLEAN = Nic(mac="52:54:00:00:00:0a", address="10.213.0.10", prefix=24, gateway="10.213.0.1", network="private")
ISOLATED = Nic(mac="52:54:00:00:00:0b", address="10.213.0.11", prefix=24, gateway="10.213.0.1", network="private",
               isolated=True)


def domain(nics=(CLEAN, ISOLATED), *, rules=True, taps=True) -> str:
    """A domain document as the controller defines it: each NIC's tap and its rules in the metadata."""
    return domain_xml.Domain(
        name="t-guest", uuid="6f1b2c3d-0000-4000-8000-000000000001", memory_mb=64, vcpu=1,
        interfaces=tuple(domain_xml.Interface(mac=n.mac, network=n.network,
                                              target_dev=tap_name(n.mac, TAG) if taps else None) for n in nics),
        nic_rules=tuple((n.mac, filter_for(n)) for n in nics) if rules else (),
    ).to_xml()


WANTED = (
    NicRules(tap=tap_name(CLEAN.mac, TAG), mac=CLEAN.mac, address=CLEAN.address),
    NicRules(tap=tap_name(ISOLATED.mac, TAG), mac=ISOLATED.mac, address=ISOLATED.address, gateway="10.213.0.1",
             subnet="10.213.0.0/24"),
)


class FakeHost:
    """`nft -f -` and `ip` as subp sees them: the transactions written, the taps' bridges, and a
    failure of a command when asked."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.nft_inputs: list[str] = []
        self.masters: dict[str, str | None] = {}
        self.fail: dict[str, str] = {}  # command -> its stderr, exit code 1

    def __call__(self, argv, *, input=None, timeout=None, **kwargs):
        assert timeout is not None and timeout <= 30, f"unbounded: {argv}"
        self.calls.append(list(argv))
        if argv[0] in self.fail:
            return subprocess.CompletedProcess(argv, 1, "", self.fail[argv[0]])
        if argv[0] == "nft":
            self.nft_inputs.append(input)
            return subprocess.CompletedProcess(argv, 0, "", "")
        if argv[:4] == ["ip", "-j", "link", "show"]:
            tap = argv[-1]
            if tap not in self.masters:
                return subprocess.CompletedProcess(argv, 1, "", f'Device "{tap}" does not exist.\n')
            link = {"ifname": tap, **({"master": self.masters[tap]} if self.masters[tap] else {})}
            return subprocess.CompletedProcess(argv, 0, json.dumps([link]), "")
        if argv[:3] == ["ip", "link", "set"]:
            return subprocess.CompletedProcess(argv, 0, "", "")
        raise AssertionError(f"unexpected command {argv}")


@pytest.fixture
def host(monkeypatch) -> FakeHost:
    fake = FakeHost()
    monkeypatch.setattr(subp, "_run", fake)
    return fake


def hook(stage: str, xml: str, capsys) -> tuple[int, str]:
    code = guest_rules.run(["libvirt-hook", "t-guest", stage, "begin", "-"], io.StringIO(xml))
    return code, capsys.readouterr().err


# -- what is read from a domain ----------------------------------------------------------------
@pytest.mark.parametrize("xml", [domain(), domain((ISOLATED,)), domain(taps=False), domain(rules=False)])
def test_the_rules_are_read_as_the_controller_reads_them(xml):
    assert guest_rules_hook.domain_rules is firewall.domain_rules  # one reading of a domain's rules


def test_a_domain_of_ours_gives_each_nics_rules_keyed_by_its_tap():
    assert guest_rules_hook.domain_rules(domain()) == WANTED
    assert guest_rules_hook.domain_taps(domain()) == tuple(r.tap for r in WANTED)


def test_the_program_knows_our_metadata_by_the_same_namespace():
    assert guest_rules.NIC_RULES_NS == domain_xml.NIC_RULES_NS
    assert guest_rules.STAGES == guest_rules_hook.STAGES


# -- the stages ------------------------------------------------------------------------------
def test_prepare_writes_the_domains_elements_with_the_table(host, capsys):
    assert hook("prepare", domain(), capsys) == (0, "")
    assert host.calls == [["nft", "-f", "-"]]
    assert host.nft_inputs == [nft_ruleset.batch(add=WANTED)]


def test_release_removes_the_domains_elements(host, capsys):
    assert hook("release", domain(), capsys) == (0, "")
    assert host.calls == [["nft", "-f", "-"]]
    assert host.nft_inputs == [nft_ruleset.batch(remove=WANTED)]


def test_start_seals_each_bridge_of_the_domains_taps_once(host, capsys):
    host.masters = {WANTED[0].tap: "virbr7", WANTED[1].tap: "virbr7"}
    assert hook("start", domain(), capsys) == (0, "")
    assert host.calls == [["ip", "-j", "link", "show", "dev", WANTED[0].tap],
                          ["ip", "-j", "link", "show", "dev", WANTED[1].tap],
                          bridge_ports.seal_argv("virbr7")]


@pytest.mark.parametrize("xml", [
    "<domain type='kvm'><name>other</name><devices><interface type='network'><mac address='52:54:00:00:00:0c'/>"
    "<target dev='cc-0a1b2-00000c'/></interface></devices></domain>",
    domain(rules=False),
    "<domain><description>urn:cloud-controller:nic-rules:1</description></domain>",  # the name alone is not ours
])
@pytest.mark.parametrize("stage", ["prepare", "start", "release"])
def test_a_domain_without_our_metadata_is_left_alone(host, capsys, xml, stage):
    assert hook(stage, xml, capsys) == (0, "")
    assert host.calls == []


@pytest.mark.parametrize("stage", ["migrate", "restore", "started", "stopped", "reconnect", "attach"])
def test_other_stages_do_nothing_and_read_nothing(host, stage):
    unread = io.StringIO(domain())
    assert guest_rules.run(["libvirt-hook", "t-guest", stage, "begin", "-"], unread) == 0
    assert unread.tell() == 0
    assert host.calls == []


# -- errors: one line, exit 1 (libvirt aborts the start and shows it) --------------------------------
def test_an_nft_that_cannot_write_aborts_with_its_error(host, capsys):
    host.fail["nft"] = ("/dev/stdin:29:92-102: Error: datatype mismatch, expected concatenation\n"
                        "add rule bridge cloud_controller from_guest ...\n     ^^^^^^^\n")
    code, err = hook("prepare", domain(), capsys)
    assert code == 1
    assert err == ("cloud-guest-rules: domain t-guest: cannot write its NICs' network rules: nft: "
                   "Error: datatype mismatch, expected concatenation\n")


def test_a_tap_on_no_bridge_aborts_the_start(host, capsys):
    host.masters = {WANTED[0].tap: "virbr7", WANTED[1].tap: None}
    code, err = hook("start", domain(), capsys)
    assert code == 1
    assert err == (f"cloud-guest-rules: domain t-guest: tap {WANTED[1].tap} is on no bridge: "
                   "its network rules would not apply\n")
    assert bridge_ports.seal_argv("virbr7") not in host.calls  # nothing sealed before every bridge is known


def test_a_missing_tap_aborts_the_start(host, capsys):
    code, err = hook("start", domain(), capsys)
    assert (code, err.count("\n")) == (1, 1)
    assert f'cannot read tap {WANTED[0].tap}: ip: Device "{WANTED[0].tap}" does not exist.' in err


def test_a_missing_nft_aborts_the_start(monkeypatch, capsys):
    def missing(argv, **kwargs):
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(subp, "_run", missing)
    assert hook("prepare", domain(), capsys) == (
        1, "cloud-guest-rules: domain t-guest: cannot write its NICs' network rules: command not found: nft\n")


def test_a_timed_out_nft_aborts_the_start(monkeypatch, capsys):
    def hangs(argv, timeout=None, **kwargs):
        raise subprocess.TimeoutExpired(argv, timeout)

    monkeypatch.setattr(subp, "_run", hangs)
    code, err = hook("prepare", domain(), capsys)
    assert code == 1 and err.endswith(f"nft: timed out after {guest_rules_hook.NFT_TIMEOUT} s\n")


def test_xml_of_ours_that_does_not_parse_is_refused(host, capsys):
    code, err = hook("prepare", f"<domain>{domain_xml.NIC_RULES_NS}", capsys)
    assert code == 1 and err.startswith("cloud-guest-rules: domain t-guest: its XML does not parse:")
    assert host.calls == []


def test_base_loads_the_table_with_no_elements(host, capsys):
    assert guest_rules.run(["base"], io.StringIO("")) == 0
    assert host.nft_inputs == ["\n".join(nft_ruleset.base()) + "\n"]
    assert nft_ruleset.batch() == host.nft_inputs[0]


def test_base_failing_says_why(host, capsys):
    host.fail["nft"] = "Error: Could not process rule: Operation not permitted\n"
    assert guest_rules.run(["base"], io.StringIO("")) == 1
    assert capsys.readouterr().err == ("cloud-guest-rules: cannot load the guests' network table: nft: "
                                       "Error: Could not process rule: Operation not permitted\n")


@pytest.mark.parametrize("args", [[], ["bogus"], ["base", "x"], ["libvirt-hook", "t-guest", "prepare"]])
def test_usage(host, capsys, args):
    assert guest_rules.run(args, io.StringIO(domain())) == 1
    assert capsys.readouterr().err.startswith("usage: cloud-guest-rules base | ")
    assert host.calls == []


# -- the program as libvirt runs it, and the script it is run by ---------------------------------
def fake_bin(tmp_path: Path) -> dict:
    """A PATH whose nft records its arguments and stdin in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nft").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/nft.args\ncat >> {tmp_path}/nft.in\n')
    (bin_dir / "nft").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.real_commands
def test_the_installed_program_writes_through_nft_on_path(tmp_path):
    assert PROGRAM.is_file(), f"{PROGRAM} is missing: run scripts/setup-host.sh"
    proc = subprocess.run([str(PROGRAM), "libvirt-hook", "t-guest", "prepare", "begin", "-"], input=domain(),
                          env=fake_bin(tmp_path), capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert (tmp_path / "nft.args").read_text() == "-f -\n"
    assert (tmp_path / "nft.in").read_text() == nft_ruleset.batch(add=WANTED)


def hook_script(tmp_path: Path, program: Path) -> Path:
    script = tmp_path / "hook"
    script.write_text(guest_rules_hook.hook_script(str(program)))
    script.chmod(0o755)
    return script


@pytest.mark.real_commands
@pytest.mark.parametrize("stage", ["prepare", "release"])
def test_the_hook_script_hands_its_stages_to_the_program(tmp_path, stage):
    program = tmp_path / "program"
    program.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat > {tmp_path}/xml\n')
    program.chmod(0o755)
    proc = subprocess.run([str(hook_script(tmp_path, program)), "t-guest", stage, "begin", "-"], input=domain(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "args").read_text() == f"libvirt-hook t-guest {stage} begin -\n"
    assert (tmp_path / "xml").read_text() == domain()


def fake_ip(tmp_path: Path, masters: dict[str, str]) -> dict:
    """`ip` as the hook script's start stage sees it: `-o link show dev TAP` gives the tap's
    line (with its bridge as master, or none), `link set ...` is recorded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    cases = "".join(f'  "{tap}") echo "7: {tap}: <BROADCAST,UP> mtu 1500 qdisc fq'
                    + (f' master {br}' if br else "") + ' state UP mode DEFAULT" ;;\n'
                    for tap, br in masters.items())
    (bin_dir / "ip").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -o ]; then\n  case "$5" in\n{cases}  *) echo "Device $5 does not exist" >&2; exit 1 ;;\n'
        "  esac\n  exit 0\nfi\n"
        f'echo "$@" >> {tmp_path}/ip.set\n')
    (bin_dir / "ip").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.real_commands
def test_the_hook_script_seals_the_bridges_of_its_taps_at_start_without_the_program(tmp_path):
    program = tmp_path / "program"
    program.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    program.chmod(0o755)
    taps = [tap_name(n.mac, TAG) for n in (CLEAN, ISOLATED)]
    env = fake_ip(tmp_path, {taps[0]: "virbr7", taps[1]: "br-public"})
    proc = subprocess.run([str(hook_script(tmp_path, program)), "t-guest", "start", "begin", "-"], input=domain(),
                          capture_output=True, text=True, timeout=30, env=env)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "ip.set").read_text().splitlines() == [
        " ".join(bridge_ports.seal_argv("virbr7")[1:]), " ".join(bridge_ports.seal_argv("br-public")[1:])]
    # A foreign domain: no tap of ours, nothing done.
    (tmp_path / "ip.set").unlink()
    proc = subprocess.run([str(hook_script(tmp_path, program)), "other", "start", "begin", "-"],
                          input="<domain><devices><interface><target dev='vnet3'/></interface></devices></domain>",
                          capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 0 and not (tmp_path / "ip.set").exists()


@pytest.mark.real_commands
def test_the_hook_script_aborts_a_start_whose_tap_is_on_no_bridge(tmp_path):
    taps = [tap_name(n.mac, TAG) for n in (CLEAN, ISOLATED)]
    env = fake_ip(tmp_path, {taps[0]: "virbr7", taps[1]: ""})
    proc = subprocess.run([str(hook_script(tmp_path, tmp_path / "program")), "t-guest", "start", "begin", "-"],
                          input=domain(), capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 1
    assert f"tap {taps[1]} is on no bridge" in proc.stderr


@pytest.mark.real_commands
def test_the_hook_script_runs_nothing_at_other_stages(tmp_path):
    program = tmp_path / "program"
    program.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\nexit 1\n")
    program.chmod(0o755)
    proc = subprocess.run([str(hook_script(tmp_path, program)), "t-guest", "migrate", "begin", "-"],
                          input=domain(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and not (tmp_path / "ran").exists()


@pytest.mark.real_commands
def test_without_its_program_the_hook_refuses_only_domains_of_ours(tmp_path):
    """A checkout moved away must not stop others' domains starting, nor let ours start unfiltered."""
    script = hook_script(tmp_path, tmp_path / "gone" / "cloud-guest-rules")
    foreign = subprocess.run([str(script), "other", "prepare", "begin", "-"],
                             input="<domain><name>other</name></domain>", capture_output=True, text=True, timeout=30)
    assert (foreign.returncode, foreign.stderr) == (0, "")
    ours = subprocess.run([str(script), "t-guest", "prepare", "begin", "-"], input=domain(),
                          capture_output=True, text=True, timeout=30)
    assert ours.returncode == 1
    assert "cloud-guest-rules is missing" in ours.stderr


def test_the_hook_path_is_libvirts_qemu_hook_folder():
    assert HOOK_PATH.startswith("/etc/libvirt/hooks/qemu.d/")


# -- the unit that loads the table at boot --------------------------------------------------------
def test_the_unit_loads_the_table_before_libvirt_and_after_nftables():
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(UNIT)
    unit, service = parser["Unit"], parser["Service"]
    assert set(unit["Before"].split()) >= {"libvirtd.service", "virtqemud.service", "libvirt-guests.service"}
    assert unit["After"].split() == ["nftables.service"] and unit["PartOf"] == "nftables.service"
    assert (service["Type"], service["RemainAfterExit"]) == ("oneshot", "yes")
    assert service["ExecStart"] == "/opt/cloud-controller/.venv/bin/cloud-guest-rules base"
    assert service["CapabilityBoundingSet"] == "CAP_NET_ADMIN"
    assert parser["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.real_commands
def test_the_units_command_loads_the_table_with_the_units_capabilities_alone():
    """`cloud-guest-rules base` under CAP_NET_ADMIN only, in a network namespace of its own: the
    table with its chains and no element."""
    for tool in ("unshare", "setpriv", "nft"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            pytest.fail(f"{tool} is not installed: run scripts/setup-host.sh", pytrace=False)
    assert PROGRAM.is_file(), f"{PROGRAM} is missing: run scripts/setup-host.sh"
    script = f"{PROGRAM} base && nft -j list table bridge cloud_controller"
    proc = subprocess.run(["unshare", "--net", "--", "setpriv", "--bounding-set=-all,+net_admin", "--inh-caps=-all",
                           "--", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)["nftables"]
    chains = {i["chain"]["name"] for i in listing if "chain" in i}
    assert chains == set(nft_ruleset.CHAINS)
    assert nft_ruleset.parse(proc.stdout) == set()
