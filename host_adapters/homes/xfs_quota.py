"""`quota_backend = xfs`: XFS project quota, one project per home."""

import os
import re

from common.errors import CommandError, HostError, HostUnavailable, InvalidInput
from host_adapters import subp
from host_adapters.homes.quota import KibQuotaRows, MAX_ID, QuotaBackend, check_id, check_size_gb, make_plain_home, remove_tree

# xfs_quota splits its -c command on whitespace itself; these would change its meaning.
_XFS_UNSAFE = re.compile(r"[\s'\"\\]")


class XfsQuota(KibQuotaRows, QuotaBackend):
    """XFS project quota: each home is a project tree whose id is derived from the uid.

    `mount_point` is the XFS filesystem (mounted with prjquota) holding the
    homes; project id = uid + project_id_offset. xfs_quota reports many
    errors only on stderr with exit code 0, so any stderr output is a failure.
    """

    name = "xfs"
    reports_usage = True

    def __init__(self, *, mount_point: str, project_id_offset: int = 0):
        self.mount_point = mount_point
        self.project_id_offset = project_id_offset

    def project_id(self, uid: int) -> int:
        pid = check_id("uid", uid) + self.project_id_offset
        if not 1 <= pid <= MAX_ID:
            raise InvalidInput(f"uid {uid} gives the unusable xfs project id {pid}")
        return pid

    def _xfs(self, command: str) -> str:
        argv = ["xfs_quota", "-x", "-c", command, self.mount_point]
        proc = subp.run(argv)
        if proc.stderr.strip():
            raise CommandError(argv, proc.returncode, proc.stderr)
        return proc.stdout

    def _check_path(self, path: str) -> None:
        if _XFS_UNSAFE.search(path):
            raise HostError(f"xfs_quota cannot be given the path {path!r} (whitespace or quotes)")
        if os.path.commonpath([self.mount_point, os.path.abspath(path)]) != self.mount_point:
            raise HostError(f"{path} is not on the xfs filesystem {self.mount_point}")

    def check(self, home_root: str) -> None:
        try:
            self._check_path(home_root)
            state = self._xfs("state -p")
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(f"xfs project quota unusable for {home_root}: {e}") from e
        if not re.search(r"Enforcement:\s*ON", state):
            raise HostUnavailable(f"project quota is not enforced on {self.mount_point} (mount with prjquota)")

    def make_home(self, path: str, *, uid: int) -> None:
        pid = self.project_id(uid)
        self._check_path(path)
        make_plain_home(path)
        try:
            self._xfs(f"project -s -p {path} {pid}")
        except BaseException:
            remove_tree(path)
            raise

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        check_size_gb(size_gb)
        self._xfs(f"limit -p bhard={size_gb}g {self.project_id(uid)}")

    def _quota_row(self, uid: int) -> tuple[int, int] | None:
        """(used, hard limit) of the uid's project in KiB, or None when xfs_quota prints none."""
        out = self._xfs(f"quota -p -N -n -v -b {self.project_id(uid)}")
        # device, used, soft, hard, ... in KiB; a long device name wraps the line.
        tokens = out.split()
        if len(tokens) < 4:
            return None
        try:
            return int(tokens[1]), int(tokens[3])
        except ValueError:
            raise HostError(f"cannot read the xfs_quota output: {out.strip()!r}") from None

    def remove(self, path: str, *, uid: int | None) -> None:
        pid = None if uid is None else self.project_id(uid)
        remove_tree(path)
        if pid is not None:
            self._xfs(f"limit -p bhard=0 {pid}")
