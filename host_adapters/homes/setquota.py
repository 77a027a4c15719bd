"""`quota_backend = setquota`: classic user quota (ext4 and others), one limit per uid."""

import os
import re

from common.errors import HostError, HostUnavailable
from host_adapters import subp
from host_adapters.homes.quota import KibQuotaRows, GIB, KIB, QuotaBackend, check_id, check_size_gb, make_plain_home, remove_tree


# What a uid gets on the filesystem once its home is removed (SetQuota.remove).
DENY_KIB = 1
DENY_INODES = 1


class SetQuota(KibQuotaRows, QuotaBackend):
    """Classic user quota set with setquota on `filesystem` (its mount point).

    The limit is the uid's over the whole filesystem, so files the user owns
    elsewhere on it count too. After `remove` the uid keeps the smallest
    limits there are (DENY_KIB, DENY_INODES), never "unlimited".
    """

    name = "setquota"
    binds_every_writer = False  # files another uid writes (guest root: uid 0) count elsewhere
    reports_usage = True

    def __init__(self, *, filesystem: str):
        self.filesystem = filesystem

    def check(self, home_root: str) -> None:
        try:
            proc = subp.run(["quotaon", "-p", "-u", self.filesystem], ok_codes=(0, 1))
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(f"user quota unusable on {self.filesystem}: {e}") from e
        # quotaon -p exits 1 when quota is on; the printed state decides.
        if not re.search(r"^user quota on .* is on$", proc.stdout, re.MULTILINE):
            raise HostUnavailable(f"user quota is off on {self.filesystem} (mount with usrquota, run quotaon)")
        if os.path.commonpath([self.filesystem, os.path.abspath(home_root)]) != self.filesystem:
            raise HostUnavailable(f"home_root {home_root} is not on {self.filesystem}")

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        make_plain_home(path)

    def _setquota(self, uid: int, hard_kib: int, hard_inodes: int = 0) -> None:
        # block-soft block-hard inode-soft inode-hard; 0 means "no limit".
        subp.run(["setquota", "-u", str(check_id("uid", uid)), "0", str(hard_kib), "0", str(hard_inodes),
                  self.filesystem])

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        self._setquota(uid, check_size_gb(size_gb) * GIB // KIB)

    def _quota_row(self, uid: int) -> tuple[int, int] | None:
        """(used, hard limit) of the uid on the filesystem in KiB, or None when quota reports none."""
        argv = ["quota", "-u", "-v", "-w", "-p", f"--filesystem={self.filesystem}", str(check_id("uid", uid))]
        # quota exits 1 when the user is over a limit.
        out = subp.run(argv, ok_codes=(0, 1)).stdout
        lines = [line.split() for line in out.splitlines() if line.strip()]
        rows = [row for header, row in zip(lines, lines[1:]) if header[0] == "Filesystem"]
        if not rows:
            return None  # "Disk quotas for user #N (uid N): none"
        # filesystem, blocks (a '*' when over), soft, hard, ... in KiB
        used = rows[0][1].removesuffix("*") if len(rows[0]) > 1 else ""
        if len(rows[0]) < 4 or not rows[0][3].isdigit() or not used.isdigit():
            raise HostError(f"cannot read the quota output: {out.strip()!r}")
        return int(used), int(rows[0][3])

    def remove(self, path: str, *, uid: int | None) -> None:
        if uid is not None:
            check_id("uid", uid)
        remove_tree(path)
        if uid is None:
            return
        # Zero would mean "unlimited": the account outlives its volume, and a uid
        # without a home must not fill the filesystem from elsewhere on it (a
        # scratch or shared directory). The smallest limits setquota can express
        # (1 KiB, 1 inode) leave it nothing; a new volume sets its own limit.
        self._setquota(uid, DENY_KIB, DENY_INODES)
