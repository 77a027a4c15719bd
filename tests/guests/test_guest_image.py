"""The cached Debian 12 guest image boots and lets the seed's user in by SSH.

Independent of libvirt: QEMU is started directly, in software emulation
(KVM on these machines is nested and cannot boot Linux), with a throwaway
overlay on the cached image, a NoCloud seed on a read-only virtio disk (the
cloud kernel has no AHCI, so no SATA CD-ROM) and user-mode networking whose
only way in is SSH forwarded from 127.0.0.1.
"""

import io
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.processes import stop_process

pytestmark = [pytest.mark.integration, pytest.mark.real_commands, pytest.mark.guest]

UID = 10000
SSH_WAIT = 240  # seconds; about 30 s is usual under TCG
QEMU_BINARIES = ("qemu-system-x86_64", "qemu-img", "ssh", "ssh-keygen")


@dataclass
class Guest:
    port: int
    key: Path
    console_log: Path
    qemu_log: Path
    process: subprocess.Popen


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    # Direct subprocess: host_adapters.subp is what the unit tests guard.
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)


def _checked(argv: list[str], timeout: float = 60) -> str:
    proc = _run(argv, timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_seed(path: Path, public_key: str, instance_id: str) -> None:
    """A NoCloud seed: ISO 9660 labelled cidata with user-data and meta-data."""
    try:
        import pycdlib
    except ImportError:
        pytest.fail("pycdlib is missing from the venv (.venv/bin/pip install pycdlib)", pytrace=False)
    user_data = (
        "#cloud-config\n"
        "users:\n"
        "  - name: alice\n"
        f"    uid: {UID}\n"
        "    shell: /bin/bash\n"
        "    lock_passwd: true\n"
        "    ssh_authorized_keys:\n"
        f"      - {public_key}\n"
        "ssh_pwauth: false\n"
    )
    meta_data = f"instance-id: {instance_id}\nlocal-hostname: guest-image-test\n"
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for iso_name, name, content in (("USERDATA", "user-data", user_data), ("METADATA", "meta-data", meta_data)):
        data = content.encode()
        iso.add_fp(io.BytesIO(data), len(data), iso_path=f"/{iso_name}.;1", rr_name=name, joliet_path=f"/{name}")
    iso.write(str(path))
    iso.close()


def _start_qemu(tmp: Path, image: Path, seed: Path, port: int) -> tuple[subprocess.Popen, Path, Path]:
    overlay = tmp / "overlay.qcow2"
    # The cached image is only ever a read-only backing file.
    _checked(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image), str(overlay)])
    console_log = tmp / "console.log"
    qemu_log = tmp / "qemu.log"
    argv = [
        "qemu-system-x86_64",
        "-accel", "tcg",
        "-m", "1024",
        "-smp", "2",
        "-display", "none",
        "-monitor", "none",
        "-no-reboot",
        "-serial", f"file:{console_log}",
        "-drive", f"file={overlay},if=virtio,format=qcow2",
        "-drive", f"file={seed},if=virtio,format=raw,readonly=on",
        # restrict=on: the guest reaches nothing; only the forward comes in.
        "-netdev", f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device", "virtio-net-pci,netdev=net0",
    ]  # fmt: skip
    with open(qemu_log, "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return process, console_log, qemu_log


def ssh(guest: Guest, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    argv = [
        "ssh",
        "-F", "/dev/null",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR",
        "-o", "ConnectTimeout=5",
        "-o", "IdentitiesOnly=yes",
        "-p", str(guest.port),
        "-i", str(guest.key),
        "alice@127.0.0.1",
        command,
    ]  # fmt: skip
    return _run(argv, timeout)


def _wait_for_ssh(guest: Guest) -> float:
    started = time.monotonic()
    deadline = started + SSH_WAIT
    last = None
    while time.monotonic() < deadline:
        if guest.process.poll() is not None:
            pytest.fail(f"QEMU exited with {guest.process.returncode} before SSH answered")
        try:
            last = ssh(guest, "id", timeout=30)
        except subprocess.TimeoutExpired:
            last = None
        if last is not None and last.returncode == 0:
            return time.monotonic() - started
        time.sleep(3)
    detail = last.stderr.strip() if last is not None else "ssh timed out"
    pytest.fail(f"no SSH login within {SSH_WAIT} s (last error: {detail})")


def _print_logs(guest: Guest) -> None:
    for name, path in (("serial console", guest.console_log), ("QEMU", guest.qemu_log)):
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        print(f"----- {name} log ({path}) -----\n{text}")


@pytest.fixture
def booted_guest(guest_image, tmp_path):
    missing = [b for b in QEMU_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)} (scripts/setup-host.sh installs them)", pytrace=False)
    key = tmp_path / "id_ed25519"
    _checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "guest-image-test", "-f", str(key)])
    seed = tmp_path / "seed.iso"
    _write_seed(seed, (tmp_path / "id_ed25519.pub").read_text().strip(), f"iid-{tmp_path.name}")
    port = _free_loopback_port()
    process, console_log, qemu_log = _start_qemu(tmp_path, guest_image, seed, port)
    guest = Guest(port, key, console_log, qemu_log, process)
    try:
        yield guest
    finally:
        stop_process(process, timeout=15)


def test_guest_boots_and_accepts_the_seed_users_ssh_key(booted_guest):
    guest = booted_guest
    try:
        waited = _wait_for_ssh(guest)
        print(f"SSH answered {waited:.0f} s after QEMU started")

        # A clean first boot: every cloud-init module succeeded.
        status = ssh(guest, "cloud-init status --wait", timeout=SSH_WAIT)
        assert "status: done" in status.stdout, f"cloud-init: {status.stdout}{status.stderr}"

        uid = ssh(guest, "id -u")
        assert uid.returncode == 0, uid.stderr
        assert uid.stdout.strip() == str(UID)

        # The seed grants no sudo and the image has no default sudoer.
        sudo = ssh(guest, "sudo -n true")
        assert sudo.returncode != 0, "alice can sudo without a password"

        # virtiofs comes from the kernel package and is loaded at boot.
        module = ssh(guest, "/usr/sbin/modinfo -n virtiofs && grep -w virtiofs /proc/filesystems")
        assert module.returncode == 0, f"virtiofs unavailable: {module.stdout}{module.stderr}"
        assert "virtiofs.ko" in module.stdout
    except BaseException:
        _print_logs(guest)
        raise
