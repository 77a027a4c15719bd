"""Whether this host's virtiofsd can confine a home's share to its owner, as `cloud-agent
check` reports it (issue 16, finding 12): the descriptors libvirt reads, the binary's own
--help, and the check row."""

import json
import os
import stat
import subprocess

import pytest

from controller.errors import HostUnavailable
from controller.monitoring.health import run_checks
from host_adapters.guests import virtiofs
from host_adapters.factory import build_adapters, is_local_qemu


def _descriptor(directory, name, binary, kind="fs"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps({"description": "x", "type": kind, "binary": binary}))


def test_find_virtiofsd_reads_the_descriptors_as_libvirt_does(tmp_path):
    usr, etc = tmp_path / "usr", tmp_path / "etc"
    _descriptor(usr, "10-gpu.json", "/usr/bin/gpu", kind="gpu")  # another device type: skipped
    _descriptor(usr, "50-qemu-virtiofsd.json", "/usr/lib/qemu/virtiofsd")
    _descriptor(usr, "60-rust.json", "/usr/libexec/virtiofsd")
    dirs = (str(usr), str(etc))
    assert virtiofs.find_virtiofsd(dirs) == "/usr/lib/qemu/virtiofsd"  # first in file-name order
    etc.mkdir()
    (etc / "50-qemu-virtiofsd.json").write_text("")  # an empty file in /etc hides the one in /usr/share
    assert virtiofs.find_virtiofsd(dirs) == "/usr/libexec/virtiofsd"
    _descriptor(etc, "60-rust.json", "/opt/virtiofsd")  # the same name in /etc replaces it
    assert virtiofs.find_virtiofsd(dirs) == "/opt/virtiofsd"


def test_no_virtiofsd_descriptor_is_unavailable(tmp_path):
    _descriptor(tmp_path, "10-gpu.json", "/usr/bin/gpu", kind="gpu")
    with pytest.raises(HostUnavailable, match="no virtiofsd"):
        virtiofs.find_virtiofsd((str(tmp_path), str(tmp_path / "missing")))


def _fake_binary(tmp_path, help_text: str) -> str:
    path = tmp_path / "virtiofsd"
    path.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'virtiofsd 9.9'; exit 0; fi\n"
                    f"cat <<'EOF'\n{help_text}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


C_HELP = """usage: virtiofsd [options]
    -o sandbox=namespace|chroot
    -o modcaps=CAPLIST         Modify the list of capabilities
    -o killpriv_v2/no_killpriv_v2
    --socket-path=PATH         path for the vhost-user socket"""

RUST_HELP = """Usage: virtiofsd [OPTIONS]
      --sandbox <SANDBOX>  Sandbox mechanism [default: namespace]
      --uid-map <UID_MAP>  Map a range of UIDs from the host into the namespace
      --gid-map <GID_MAP>  Map a range of GIDs from the host into the namespace
      --translate-uid <TRANSLATE_UID>  Map uids between guest and host
      --translate-gid <TRANSLATE_GID>  Map gids between guest and host"""


@pytest.mark.real_commands
@pytest.mark.parametrize("help_text, options", [
    (C_HELP, ()),
    (RUST_HELP, ("--translate-uid", "--translate-gid", "--uid-map", "--gid-map")),
    ("  --uid-map <UID_MAP>\n  --no-gid-map-here", ("--uid-map",)),  # half a mapping is none
])
def test_probe_reads_what_the_binary_offers(tmp_path, help_text, options):
    facts = virtiofs.probe_virtiofsd(_fake_binary(tmp_path, help_text))
    assert facts.version == "virtiofsd 9.9"
    assert facts.id_map_options == options
    line = virtiofs.describe(facts)
    assert line.startswith(virtiofs.NOT_CONFINED)
    if len(options) == 4:
        assert facts.can_map_ids and "can map uids and gids" in line and "does not configure" in line
    else:
        assert not facts.can_map_ids and "cannot map uids and gids" in line


@pytest.mark.real_commands
@pytest.mark.integration
def test_this_hosts_virtiofsd_is_found_probed_and_reported():
    """The virtiofsd libvirt would start here, asked for real."""
    binary = virtiofs.find_virtiofsd()
    assert os.access(binary, os.X_OK)
    helped = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10)
    line = virtiofs.LocalShareConfinement().describe()
    assert line.startswith(virtiofs.NOT_CONFINED) and binary in line
    offered = [o for o in virtiofs.ID_MAP_OPTIONS if o in helped.stdout + helped.stderr]
    if len(offered) < 2:  # QEMU's C virtiofsd: nothing to map ids with
        assert "cannot map uids and gids" in line
    else:
        assert "can map uids and gids" in line


def test_check_reports_the_share_confinement_and_a_missing_virtiofsd(cctx, adapters):
    adapters.shares = virtiofs.FakeShareConfinement()
    rows = {c["name"]: c for c in run_checks(cctx, thorough=True)}
    assert rows["virtiofs"]["ok"] is True
    assert rows["virtiofs"]["detail"].startswith(virtiofs.NOT_CONFINED)
    assert "/usr/libexec/virtiofsd (virtiofsd 0.0) cannot map uids and gids" in rows["virtiofs"]["detail"]
    adapters.shares.error = HostUnavailable("no virtiofsd: nothing of type fs")
    rows = {c["name"]: c for c in run_checks(cctx, thorough=True)}
    assert rows["virtiofs"] == {"name": "virtiofs", "ok": False, "detail": "no virtiofsd: nothing of type fs"}
    assert "virtiofs" not in {c["name"] for c in run_checks(cctx)}  # not on every /healthz


@pytest.mark.parametrize("uri, local", [
    ("qemu:///system", True), ("qemu+unix:///system", True), ("qemu+ssh://node1/system", False),
    ("qemu+tcp://node1/system", False), ("test:///default", False),
])
def test_only_a_local_qemu_host_is_probed(uri, local, config_values):
    from controller.config import config_from_dict

    assert is_local_qemu(uri) is local
    config_values["libvirt"]["uri"] = uri
    if local:
        shares = build_adapters(config_from_dict(config_values)).shares
        assert isinstance(shares, virtiofs.LocalShareConfinement)
    elif uri.startswith("test"):
        assert build_adapters(config_from_dict(config_values)).shares is None
