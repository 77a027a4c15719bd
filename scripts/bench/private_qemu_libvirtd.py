"""A real libvirtd (QEMU driver) of the benchmark's own, for the burst of creates.

It must not touch the machine's libvirtd, its domains, networks or files, so it
runs as tests/fixtures/remote_libvirtd.py runs its second host: in a mount
namespace of its own with its own /run/libvirt, /var/lib/libvirt,
/var/cache/libvirt and /etc/libvirt (bind-mounted state folders), and in a
network namespace of its own (its NAT network, bridge and dnsmasq live there
and nowhere else). It listens only on a unix socket in its state folder,
root-only (0700), reached as `qemu+unix:///system?socket=...`; no TCP listener.
QEMU runs as root (its pool and homes live in root's temporary folders) and
writes its output to files itself (`stdio_handler = "file"`: no virtlogd).

stop() destroys every domain it holds, then ends the daemon by its PID.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from private_libvirtd import stop_process

_STATE_DIRS = {"run": "/run/libvirt", "lib": "/var/lib/libvirt", "cache": "/var/cache/libvirt",
               "etc": "/etc/libvirt"}
_MAX_SOCKET_PATH = 107


class PrivateQemuLibvirtd:
    def __init__(self, folder: Path, *, hook: str | None = None):
        """`hook`: the text of a libvirt qemu hook this daemon runs (its own /etc/libvirt's
        hooks/qemu.d/cloud-controller), as a host set up by scripts/setup-host.sh does."""
        self.folder = Path(folder).resolve()
        self.hook = hook
        self.sockets = self.folder / "sock"
        self.socket = self.sockets / "libvirt-sock"
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={quote(str(self.socket), safe='/')}"

    def start(self, timeout: float = 30) -> "PrivateQemuLibvirtd":
        libvirtd = shutil.which("libvirtd") or "/usr/sbin/libvirtd"
        unshare = shutil.which("unshare") or "/usr/bin/unshare"
        if len(str(self.sockets / "libvirt-admin-sock")) > _MAX_SOCKET_PATH:
            raise RuntimeError(f"state folder {self.folder} is too long a path for a unix socket")
        for sub in (*_STATE_DIRS, "sock"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.sockets, 0o700)
        # The network filters the package installs (clean-traffic, which earlier versions used), as on a head node.
        if Path("/etc/libvirt/nwfilter").is_dir() and not (self.folder / "etc" / "nwfilter").exists():
            shutil.copytree("/etc/libvirt/nwfilter", self.folder / "etc" / "nwfilter")
        if self.hook is not None:
            hooks = self.folder / "etc" / "hooks" / "qemu.d"
            hooks.mkdir(parents=True, exist_ok=True)
            (hooks / "cloud-controller").write_text(self.hook)
            os.chmod(hooks / "cloud-controller", 0o755)
        (self.folder / "etc" / "qemu.conf").write_text('user = "root"\ngroup = "root"\nstdio_handler = "file"\n')
        conf = self.folder / "libvirtd.conf"
        conf.write_text(
            f'unix_sock_dir = "{self.sockets}"\n'
            'unix_sock_ro_perms = "0700"\nunix_sock_rw_perms = "0700"\nunix_sock_admin_perms = "0700"\n'
            'auth_unix_rw = "none"\nauth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{self.folder / "libvirtd.log"}"\n'
        )
        mounts = " && ".join(f'mount --bind "{self.folder / sub}" "{path}"' for sub, path in _STATE_DIRS.items())
        argv = [unshare, "--mount", "--net", "--propagation", "slave", "sh", "-c",
                f'{mounts} && ip link set lo up && exec "{libvirtd}" -f "{conf}" -p "{self.folder / "libvirtd.pid"}"']
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIBVIRT_")}
        with open(self.folder / "libvirtd.out", "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = (self.folder / "libvirtd.out").read_text(errors="replace")[-2000:]
                self.proc = None
                raise RuntimeError(f"the private QEMU libvirtd exited at start:\n{text}")
            if self._answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the private QEMU libvirtd did not open {self.socket} within {timeout:g} s")

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.socket))
            except OSError:
                return False
        return True

    def define_pool(self, name: str, path: Path) -> None:
        import libvirt

        path.mkdir(parents=True, exist_ok=True)
        conn = libvirt.open(self.uri)
        try:
            conn.storagePoolCreateXML(f"<pool type='dir'><name>{name}</name><target><path>{path}</path></target>"
                                      "</pool>", 0)
        finally:
            conn.close()

    def destroy_domains(self) -> int:
        """Every domain of this daemon destroyed and undefined (TCG guests eat the CPU the next
        measure needs); how many there were."""
        import libvirt

        conn = libvirt.open(self.uri)
        try:
            domains = conn.listAllDomains(0)
            for dom in domains:
                try:
                    if dom.isActive():
                        dom.destroy()
                    if dom.isPersistent():
                        dom.undefine()
                except libvirt.libvirtError:
                    pass
            return len(domains)
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self._answers():
            try:
                self.destroy_domains()
            except Exception:  # noqa: BLE001 - the daemon is stopped whatever happens
                pass
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=15)
