"""System accounts in the local account files, made with `useradd` and removed with `userdel`.

`LocalDirectory(root)` acts on the host when root is empty, or inside the
system root `root` (see host_adapters/sysroot.py). Home directories are made
by the volume adapter, so `useradd -M` never creates one.
"""

import logging

from common.errors import CommandError, Conflict, ControllerError, HostError, InvalidInput
from host_adapters import subp, sysroot
from host_adapters.directory import Directory, PosixAccount, check_home, check_uid
from host_adapters.names import check_username

log = logging.getLogger(__name__)

_USERADD_UID_IN_USE = 4
_USERADD_NAME_IN_USE = 9  # the username or, with -U, the group name
_USERDEL_NO_SUCH_USER = 6
_USERDEL_USER_BUSY = 8
_GROUPDEL_NO_SUCH_GROUP = 6


def _account(entry: sysroot.PasswdEntry) -> PosixAccount:
    return PosixAccount(
        username=entry.name, uid=entry.uid, gid=entry.gid, home=entry.home, shell=entry.shell
    )


class LocalDirectory(Directory):
    def __init__(self, root: str | None = None, shell: str = "/bin/bash"):
        self.root = sysroot.normalize_root(root)
        if not isinstance(shell, str) or not shell.startswith("/") or set(shell) & set(":\n\0"):
            raise InvalidInput(f"invalid shell {shell!r}: must be an absolute path without ':'")
        self.shell = shell

    def _r(self) -> list[str]:
        return sysroot.root_args("-R", self.root)

    def check(self) -> None:
        sysroot.check_root(
            self.root, binaries=("useradd", "userdel", "groupdel"), files=("passwd", "group")
        )

    def get_account(self, username: str) -> PosixAccount | None:
        entry = sysroot.find_user(self.root, check_username(username))
        return None if entry is None else _account(entry)

    def get_account_by_uid(self, uid: int) -> PosixAccount | None:
        if check_uid(uid) is None:
            raise InvalidInput("uid must be given")
        entry = next((u for u in sysroot.read_passwd(self.root) if u.uid == uid), None)
        return None if entry is None else _account(entry)

    def create_account(self, username: str, *, home: str, uid: int | None = None) -> PosixAccount:
        check_username(username)
        check_home(home)
        check_uid(uid)
        with sysroot.lock(self.root):
            self._refuse_taken(username, uid)
            argv = ["useradd", *self._r(), "-U", "-M", "-d", home, "-s", self.shell]
            if uid is not None:
                argv += ["-u", str(uid)]
            argv.append(username)
            try:
                subp.run(argv)
            except Exception as e:
                # Names or ids known only to NSS (e.g. LDAP) are refused here.
                if isinstance(e, CommandError) and e.returncode == _USERADD_UID_IN_USE:
                    raise Conflict(f"uid {uid} is already in use") from None
                if isinstance(e, CommandError) and e.returncode == _USERADD_NAME_IN_USE:
                    raise Conflict(f"username or group name {username} is already in use") from None
                self._remove_leftovers(username)
                raise
            account = self.get_account(username)
        if account is None:
            raise HostError(f"useradd reported success but {username} is not in the passwd file")
        return account

    def _refuse_taken(self, username: str, uid: int | None) -> None:
        users = sysroot.read_passwd(self.root)
        if any(u.name == username for u in users):
            raise Conflict(f"username {username} is already in use")
        if sysroot.find_group(self.root, username) is not None:
            raise Conflict(f"a group named {username} already exists")
        if uid is not None and any(u.uid == uid for u in users):
            raise Conflict(f"uid {uid} is already in use")

    def _remove_leftovers(self, username: str) -> None:
        """After a failed useradd, remove what it may have written (both were absent before)."""
        try:
            if sysroot.find_user(self.root, username) is not None:
                subp.run(["userdel", *self._r(), username], ok_codes=(0, _USERDEL_NO_SUCH_USER))
            if sysroot.find_group(self.root, username) is not None:
                subp.run(["groupdel", *self._r(), username], ok_codes=(0, _GROUPDEL_NO_SUCH_GROUP))
        except ControllerError as e:
            # The caller gets the useradd error; this one only helps the admin clean up.
            log.error("could not remove leftovers of account %s: %s", username, e.message)

    def delete_account(self, username: str) -> None:
        check_username(username)
        with sysroot.lock(self.root):
            account = self.get_account(username)
            if account is None:
                # Without the account a group of that name may be anyone's: leave it.
                return
            try:
                subp.run(["userdel", *self._r(), username], ok_codes=(0, _USERDEL_NO_SUCH_USER))
            except CommandError as e:
                if e.returncode == _USERDEL_USER_BUSY:
                    raise Conflict(f"account {username} is in use by running processes") from None
                raise
            # userdel keeps the private group when USERGROUPS_ENAB is off or the
            # group has other members; it is still this account's group.
            group = sysroot.find_group(self.root, username)
            if group is not None and group.gid == account.gid:
                subp.run(["groupdel", *self._r(), username], ok_codes=(0, _GROUPDEL_NO_SUCH_GROUP))
