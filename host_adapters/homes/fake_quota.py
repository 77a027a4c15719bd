"""`FakeQuota`: real directories with limits kept in memory, for tests."""

import os

from common.errors import HostError
from host_adapters.homes.quota import GIB, NoQuota, check_id, check_size_gb, make_plain_home, remove_tree


class FakeQuota(NoQuota):
    """Real directories (so DirectoryHomeVolumes can run on a temp dir) with in-memory limits.

    `limits` maps path -> bytes; tests may set `nested` (path -> relative
    paths) to stand for nested subvolumes. Set `fail_on[method_name] =
    exception` to make that method raise it before changing anything.
    """

    name = "fake"
    enforces_limits = True
    reports_usage = True

    def __init__(self):
        self.limits: dict[str, int] = {}
        self.used: dict[str, int] = {}  # path -> bytes the limit counts (tests set it; 0 when unset)
        self.nested: dict[str, tuple[str, ...]] = {}
        self.fail_on: dict[str, Exception] = {}

    def _maybe_fail(self, method: str) -> None:
        error = self.fail_on.get(method)
        if error is not None:
            raise error

    def check(self, home_root: str) -> None:
        self._maybe_fail("check")

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        self._maybe_fail("make_home")
        make_plain_home(path)

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        check_id("uid", uid)
        check_size_gb(size_gb)
        self._maybe_fail("set_limit")
        if not os.path.isdir(path):
            raise HostError(f"cannot set a quota on {path}: no such directory")
        self.limits[path] = size_gb * GIB

    def get_limit(self, path: str, *, uid: int) -> int | None:
        self._maybe_fail("get_limit")
        return self.limits.get(path)

    def get_usage(self, path: str, *, uid: int) -> int | None:
        check_id("uid", uid)
        self._maybe_fail("get_usage")
        return self.used.get(path, 0) if os.path.isdir(path) else None

    def remove(self, path: str, *, uid: int | None) -> None:
        self._maybe_fail("remove")
        remove_tree(path)
        self.limits.pop(path, None)
        self.used.pop(path, None)
        self.nested.pop(path, None)

    def nested_subvolumes(self, path: str) -> tuple[str, ...]:
        self._maybe_fail("nested_subvolumes")
        return self.nested.get(path, ())
