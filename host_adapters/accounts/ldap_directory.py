"""System accounts as posixAccount entries in an LDAP directory (RFC 2307 / nis schema).

Configuration, section `[directory]` with `backend = ldap`:

    uri                 ldap://host[:port]/ or ldaps://host[:port]/ (required)
    base_dn             the directory suffix, e.g. dc=example,dc=org (required);
                        clashes of names and numbers are searched below it
    bind_dn             the DN the controller binds as (required); it needs read
                        access below base_dn, add/delete/modify below people_ou
                        and groups_ou, and add/modify of the uid mark entry
                        cn=cloud-controller-uid-mark,<base_dn>
    bind_password_file  a file holding the bind password; one trailing newline
                        is stripped (required; keep it mode 0600)
    people_ou           where accounts go, relative to base_dn (default ou=people)
    groups_ou           where private groups go, relative to base_dn (default ou=groups)
    uid_min, uid_max    inclusive range uidNumbers are allocated from
                        (default 10000 and 60000), each number once only;
                        keep it apart from the ranges of local accounts and
                        of other tools writing to the same directory
    default_shell       loginShell of new accounts (default /bin/bash)
    tls_ca_file         CA certificates that verify the server (ldaps:// or STARTTLS);
                        without it the system's ldap.conf defaults apply
    starttls            yes/no (default no): STARTTLS on an ldap:// URI
    timeout             seconds for connecting and for each operation (default 10)

`system_account(name)` is true for a posixAccount below base_dn whose uidNumber
is below uid_min, and for an account of the head node's own account files
(`[unix] root`, or the host's passwd and NSS when that is empty) below uid_min:
names an LDAP account must not take.

`ldap_directory_from_config(section)` turns such a section into an
`LdapDirectory`; both OUs must exist already (`check()` says so if not).

Entries written for account NAME with number N:

    uid=NAME,<people_ou>,<base_dn>  objectClass account, posixAccount, shadowAccount;
                                    uid, cn = NAME, uidNumber = gidNumber = N,
                                    homeDirectory, loginShell
    cn=NAME,<groups_ou>,<base_dn>   objectClass posixGroup; cn = NAME, gidNumber = N

`delete_account` removes both entries, like userdel also the memberUid values
naming the account in posixGroups below base_dn, and leaves a group of that
name alone when there is no account or its gidNumber is not the account's.

Allocation: numbers are never reused, so a new account never inherits a
removed one's files. The entry `cn=cloud-controller-uid-mark,<base_dn>`
(objectClass applicationProcess + extensibleObject) holds in its uidNumber the
highest number ever handed out; every controller writing to the directory
shares it. A creator moves it from M to M+1 with one compare-and-swap modify
(delete the value M, add M+1: the server applies both or neither, and refuses
with noSuchAttribute when another creator moved it first, after which the
creator reads it again), so N = M+1 is its own. The mark is made on first use
above every number of the range then in use. N is still skipped if some entry
below base_dn holds it as a uidNumber or gidNumber (written by another tool or
given by hand). A given uid raises the mark when it is above it. After adding
the account entry its creator searches for every entry holding N; if one was
written before its own (by entryCSN, else createTimestamp), it removes its
entry and takes the next number: the earliest writer never yields. An
exhausted range raises HostError (the operator must widen uid_min/uid_max;
nothing the client sends can fix it). The bind DN needs write access to the
mark entry (and the right to add it once below base_dn).

Locking: `lock_account` sets shadowExpire to 1 (expired since 1970-01-02),
which pam_ldap/nslcd enforce, and sssd with `ldap_account_expire_policy =
shadow` (or `access_provider = ldap` with `ldap_access_order = expire`);
sshd refuses expired accounts too. `unlock_account` removes that value only.

A lost connection (server down, restarted, timed out) is retried once on a
fresh connection; a second failure raises HostUnavailable. Any other LDAP
failure raises HostError naming the operation.
"""

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import pwd

import ldap
import ldap.dn
import ldap.filter
import ldap.modlist
from ldap.controls import SimplePagedResultsControl

from common.errors import Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters.accounts import sysroot
from host_adapters.accounts.directory import LOCKED_EXPIRE_DAY, Directory, PosixAccount, check_home, check_uid
from host_adapters.names import check_username

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors after which the connection is useless but a new one may work.
_CONNECTION_LOST = (ldap.SERVER_DOWN, ldap.CONNECT_ERROR, ldap.TIMEOUT, ldap.UNAVAILABLE)
_PAGE_SIZE = 500
# Losing the race for a number this many times in a row means something else
# is wrong (e.g. another tool writes clashing entries without this protocol).
_MAX_RACES = 20
# Compare-and-swap attempts on the uid mark before giving up (each loses only
# to another creator's success, so this bounds a storm, not normal use).
_MAX_MARK_TRIES = 200
_MAX_ID = 2**32 - 2  # (2**32 - 1) is (uid_t) -1, "no change" to chown()

_ACCOUNT_CLASSES = [b"top", b"account", b"posixAccount", b"shadowAccount"]
_GROUP_CLASSES = [b"top", b"posixGroup"]
_ACCOUNT_ATTRS = ["uid", "uidNumber", "gidNumber", "homeDirectory", "loginShell", "shadowExpire"]
_MARK_RDN = "cn=cloud-controller-uid-mark"
_MARK_CLASSES = [b"top", b"applicationProcess", b"extensibleObject"]
_MARK_DESCRIPTION = (b"uidNumber: the highest uidNumber cloud controllers have handed out below this "
                     b"entry's parent; it only grows. Never lower it or numbers are reused.")


def read_bind_password(path: str) -> str:
    """The bind password in `path`, without its trailing newline."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise HostUnavailable(f"cannot read the LDAP bind password file {path}: {reason}") from None
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            text = text[: -len(ending)]
            break
    if not text:
        raise HostUnavailable(f"the LDAP bind password file {path} is empty")
    return text


def ldap_directory_from_config(section: Mapping[str, str], *, system_root: str | None = None) -> "LdapDirectory":
    """An LdapDirectory from the `[directory]` config section (see the module docstring);
    system_root is `[unix] root` (None: the host's own account files)."""

    def required(key: str) -> str:
        value = (section.get(key) or "").strip()
        if not value:
            raise InvalidInput(f"[directory] {key} is required with backend = ldap")
        return value

    def integer(key: str, default: int) -> int:
        raw = (section.get(key) or "").strip()
        try:
            return int(raw) if raw else default
        except ValueError:
            raise InvalidInput(f"[directory] {key} must be an integer, not {raw!r}") from None

    raw_starttls = (section.get("starttls") or "no").strip().lower()
    if raw_starttls not in ("yes", "no", "true", "false", "on", "off", "1", "0"):
        raise InvalidInput(f"[directory] starttls must be yes or no, not {raw_starttls!r}")
    raw_timeout = (section.get("timeout") or "10").strip()
    try:
        timeout = float(raw_timeout)
    except ValueError:
        raise InvalidInput(f"[directory] timeout must be a number, not {raw_timeout!r}") from None

    return LdapDirectory(
        uri=required("uri"),
        base_dn=required("base_dn"),
        bind_dn=required("bind_dn"),
        bind_password=read_bind_password(required("bind_password_file")),
        people_ou=(section.get("people_ou") or "ou=people").strip(),
        groups_ou=(section.get("groups_ou") or "ou=groups").strip(),
        uid_min=integer("uid_min", 10000),
        uid_max=integer("uid_max", 60000),
        shell=(section.get("default_shell") or "/bin/bash").strip(),
        tls_ca_file=(section.get("tls_ca_file") or "").strip() or None,
        starttls=raw_starttls in ("yes", "true", "on", "1"),
        timeout=timeout,
        system_root=system_root,
    )


def _describe(error: ldap.LDAPError) -> str:
    detail = error.args[0] if error.args else None
    if isinstance(detail, dict):
        desc = detail.get("desc") or type(error).__name__
        info = detail.get("info")
        return f"{desc} ({info})" if info else str(desc)
    return str(error) or type(error).__name__


def _norm_dn(dn: str) -> str:
    try:
        return ldap.dn.dn2str(ldap.dn.str2dn(dn)).lower()
    except ldap.DECODING_ERROR:
        return dn.lower()


def _first(attrs: dict[str, list[bytes]], name: str) -> str | None:
    for key, values in attrs.items():
        if key.lower() == name.lower() and values:
            return values[0].decode("utf-8")
    return None


class LdapDirectory(Directory):
    """Accounts as posixAccount entries, each with a posixGroup of the same name and number."""

    def __init__(
        self,
        *,
        uri: str,
        base_dn: str,
        bind_dn: str,
        bind_password: str,
        people_ou: str = "ou=people",
        groups_ou: str = "ou=groups",
        uid_min: int = 10000,
        uid_max: int = 60000,
        shell: str = "/bin/bash",
        tls_ca_file: str | None = None,
        starttls: bool = False,
        timeout: float = 10,
        system_root: str | None = None,
    ):
        for key, dn in (("base_dn", base_dn), ("bind_dn", bind_dn),
                        ("people_ou", people_ou), ("groups_ou", groups_ou)):
            if not dn or not ldap.dn.is_dn(dn):
                raise InvalidInput(f"LDAP {key} {dn!r} is not a DN")
        if not 1 <= uid_min <= uid_max <= _MAX_ID:
            raise InvalidInput(f"LDAP uid range {uid_min}-{uid_max} is empty or out of 1-{_MAX_ID}")
        if starttls and uri.lower().startswith("ldaps:"):
            raise InvalidInput("LDAP starttls makes no sense with an ldaps:// URI")
        if timeout <= 0:
            raise InvalidInput("LDAP timeout must be positive")
        if not isinstance(shell, str) or not shell.startswith("/") or any(c in shell for c in ":\n\0"):
            raise InvalidInput(f"invalid shell {shell!r}: must be an absolute path without ':'")
        self._uri = uri
        self._base_dn = base_dn
        self._bind_dn = bind_dn
        self._bind_password = bind_password
        self._people_dn = f"{people_ou},{base_dn}"
        self._groups_dn = f"{groups_ou},{base_dn}"
        self._mark_dn = f"{_MARK_RDN},{base_dn}"
        self._uid_min = uid_min
        self._uid_max = uid_max
        self._shell = shell
        self._tls_ca_file = tls_ca_file
        self._starttls = starttls
        self._timeout = timeout
        # The head node's own account files (a scratch system root; None: the host's).
        self._system_root = sysroot.normalize_root(system_root)
        self._conn = None
        # One connection; an RLock because public methods hold it across calls.
        self._lock = threading.RLock()
        self.entries = LdapEntries(self)

    def __repr__(self) -> str:
        return f"LdapDirectory(uri={self._uri!r}, base_dn={self._base_dn!r}, bind_dn={self._bind_dn!r})"

    # -- the Directory interface -------------------------------------------

    def check(self) -> None:
        with self._lock:
            for dn in (self._base_dn, self._people_dn, self._groups_dn):
                try:
                    self._search(dn, ldap.SCOPE_BASE, "(objectClass=*)", ["1.1"])
                except ldap.NO_SUCH_OBJECT:
                    raise HostUnavailable(f"LDAP entry {dn} does not exist on {self._uri}") from None
                except ldap.LDAPError as e:
                    raise HostUnavailable(
                        f"LDAP read of {dn} on {self._uri} failed: {_describe(e)}") from None

    def create_account(self, username: str, *, home: str, uid: int | None = None) -> PosixAccount:
        check_username(username)
        check_home(home)
        check_uid(uid)
        with self._lock, self._errors(f"create of account {username}"):
            self._refuse_taken_name(username)
            if uid is not None:
                number = self._claim_given(username, home, uid)
            else:
                number = self._claim_next(username, home)
            group = {"objectClass": _GROUP_CLASSES, "cn": [username.encode()],
                     "gidNumber": [str(number).encode()]}
            try:
                self._add(self._group_dn(username), group)
            except ldap.ALREADY_EXISTS:
                self._remove_quietly(self._account_dn(username))
                raise Conflict(f"group {username} already exists in the directory") from None
            except BaseException:
                self._remove_quietly(self._account_dn(username))
                raise
            return PosixAccount(username=username, uid=number, gid=number, home=home, shell=self._shell)

    def get_account(self, username: str) -> PosixAccount | None:
        check_username(username)
        flt = f"(&(objectClass=posixAccount)(uid={ldap.filter.escape_filter_chars(username)}))"
        with self._lock, self._errors(f"lookup of account {username}"):
            found = self._search(self._people_dn, ldap.SCOPE_SUBTREE, flt, _ACCOUNT_ATTRS)
        return self._to_account(found, username=username)

    def get_account_by_uid(self, uid: int) -> PosixAccount | None:
        if check_uid(uid) is None:
            raise InvalidInput("uid must be given")
        flt = f"(&(objectClass=posixAccount)(uidNumber={ldap.filter.escape_filter_chars(str(uid))}))"
        with self._lock, self._errors(f"lookup of uid {uid}"):
            found = self._search(self._people_dn, ldap.SCOPE_SUBTREE, flt, _ACCOUNT_ATTRS)
        return self._to_account(found)

    def system_account(self, username: str) -> bool:
        check_username(username)
        local = sysroot.find_user(self._system_root, username)
        if local is not None and local.uid < self._uid_min:
            return True
        if local is None and self._system_root is None:
            try:
                if pwd.getpwnam(username).pw_uid < self._uid_min:
                    return True
            except KeyError:
                pass
        flt = f"(&(objectClass=posixAccount)(uid={ldap.filter.escape_filter_chars(username)}))"
        with self._lock, self._errors(f"lookup of account {username}"):
            found = self._search(self._base_dn, ldap.SCOPE_SUBTREE, flt, ["uidNumber"])
        for _dn, attrs in found:
            number = _first(attrs, "uidNumber") or ""
            if number.isdigit() and int(number) < self._uid_min:
                return True
        return False

    def delete_account(self, username: str) -> None:
        check_username(username)
        account_dn, group_dn = self._account_dn(username), self._group_dn(username)
        with self._lock, self._errors(f"delete of account {username}"):
            account = self._read(account_dn, ["gidNumber"])
            if account is None:
                # Without the account a group of that name may be anyone's: leave it.
                return
            # Memberships and the group go first, so a retry after a failure
            # here still finds the account and with it the right to remove them.
            # A later account of the same name must not inherit memberships.
            self._remove_memberships(username)
            group = self._read(group_dn, ["gidNumber"])
            if group is not None and _first(group, "gidNumber") == _first(account, "gidNumber"):
                self._delete(group_dn)
            self._delete(account_dn)

    def lock_account(self, username: str) -> None:
        check_username(username)
        with self._lock, self._errors(f"lock of account {username}"):
            self._modify_existing(username, [(ldap.MOD_REPLACE, "shadowExpire", [str(LOCKED_EXPIRE_DAY).encode()])])

    def unlock_account(self, username: str) -> None:
        check_username(username)
        with self._lock, self._errors(f"unlock of account {username}"):
            # Deleting the value 1 only: an expiry an admin set stays (noSuchAttribute).
            self._modify_existing(username, [(ldap.MOD_DELETE, "shadowExpire", [str(LOCKED_EXPIRE_DAY).encode()])],
                                  absent_is_fine=True)

    def _modify_existing(self, username: str, changes: list, *, absent_is_fine: bool = False) -> None:
        dn = self._account_dn(username)

        def op(conn, attempt):
            try:
                conn.modify_s(dn, changes)
            except ldap.NO_SUCH_OBJECT:
                raise NotFound(f"no account {username} in the directory") from None
            except ldap.NO_SUCH_ATTRIBUTE:
                if not absent_is_fine:
                    raise

        self._call(f"modify of {dn}", op)

    # -- allocation ---------------------------------------------------------

    def _refuse_taken_name(self, username: str) -> None:
        name = ldap.filter.escape_filter_chars(username)
        flt = f"(|(&(objectClass=posixAccount)(uid={name}))(&(objectClass=posixGroup)(cn={name})))"
        for dn, _ in self._search(self._base_dn, ldap.SCOPE_SUBTREE, flt, ["1.1"]):
            raise Conflict(f"{username} is already taken in the directory ({dn})")

    def _claim_given(self, username: str, home: str, uid: int) -> int:
        if self._holders(uid):
            raise Conflict(f"uid {uid} is already used in the directory")
        if not self._add_and_keep(username, home, uid):
            raise Conflict(f"uid {uid} was just taken in the directory")
        if self._uid_min <= uid <= self._uid_max:
            try:
                self._raise_mark(uid)
            except BaseException:
                self._remove_quietly(self._account_dn(username))
                raise
        return uid

    def _claim_next(self, username: str, home: str) -> int:
        for _ in range(_MAX_RACES):
            number = self._take_next_number()
            if self._holders(number):
                log.info("uidNumber %d is held by an entry made without the mark; %s takes the next one",
                         number, username)
                continue
            if self._add_and_keep(username, home, number):
                return number
            log.info("uidNumber %d was taken concurrently; %s tries the next one", number, username)
        raise HostError(f"could not allocate a uidNumber for {username}: "
                        f"{_MAX_RACES} numbers in a row were taken")

    # -- the high-water mark ------------------------------------------------

    def _read_mark(self) -> int:
        """The mark's value, making the entry (above every number in use) on first use."""
        attrs = self._read(self._mark_dn, ["uidNumber"])
        if attrs is None:
            start = max([self._uid_min - 1, *self._numbers_in_range()])
            entry = {"objectClass": _MARK_CLASSES, "cn": [_MARK_RDN.split("=", 1)[1].encode()],
                     "uidNumber": [str(start).encode()], "description": [_MARK_DESCRIPTION]}
            try:
                self._add(self._mark_dn, entry)
            except ldap.ALREADY_EXISTS:
                pass  # another controller made it first: its value counts
            attrs = self._read(self._mark_dn, ["uidNumber"])
        try:
            return int(_first(attrs or {}, "uidNumber") or "")
        except ValueError:
            raise HostError(f"LDAP entry {self._mark_dn} has no numeric uidNumber; set it to the "
                            "highest uidNumber ever handed out") from None

    def _move_mark(self, old: int, new: int) -> bool:
        """Compare-and-swap old -> new; False if another writer moved the mark first."""
        changes = [(ldap.MOD_DELETE, "uidNumber", [str(old).encode()]),
                   (ldap.MOD_ADD, "uidNumber", [str(new).encode()])]

        def op(conn, attempt):
            try:
                conn.modify_s(self._mark_dn, changes)
                return True
            except ldap.NO_SUCH_ATTRIBUTE:
                # Moved by another writer, or by our own first try before the
                # connection broke: either way `new` may not be ours.
                return False

        return self._call(f"modify of {self._mark_dn}", op)

    def _take_next_number(self) -> int:
        for _ in range(_MAX_MARK_TRIES):
            mark = self._read_mark()
            number = max(mark, self._uid_min - 1) + 1
            if number > self._uid_max:
                raise HostError(f"no uidNumber left in the LDAP range {self._uid_min}-{self._uid_max} "
                                f"(numbers up to {mark} were handed out and are never reused); "
                                "widen [directory] uid_min/uid_max")
            if self._move_mark(mark, number):
                return number
        raise HostError(f"the uid mark {self._mark_dn} kept moving under {_MAX_MARK_TRIES} tries")

    def _raise_mark(self, number: int) -> None:
        for _ in range(_MAX_MARK_TRIES):
            mark = self._read_mark()
            if mark >= number or self._move_mark(mark, number):
                return
        raise HostError(f"the uid mark {self._mark_dn} kept moving under {_MAX_MARK_TRIES} tries")

    def _numbers_in_range(self) -> list[int]:
        found = self._search(self._base_dn, ldap.SCOPE_SUBTREE, "(|(uidNumber=*)(gidNumber=*))",
                             ["uidNumber", "gidNumber"])
        numbers = []
        for dn, attrs in found:
            if _norm_dn(dn) == _norm_dn(self._mark_dn):
                continue
            for key, values in attrs.items():
                if key.lower() in ("uidnumber", "gidnumber"):
                    for v in values:
                        with contextlib.suppress(ValueError):
                            if self._uid_min <= int(v) <= self._uid_max:
                                numbers.append(int(v))
        return numbers

    def _add_and_keep(self, username: str, home: str, number: int) -> bool:
        """Add the account entry with `number`; False (and no entry) if another entry won the number."""
        self._add_account(username, home, number)
        try:
            lost = self._lost_race(username, number)
        except BaseException:
            self._remove_quietly(self._account_dn(username))
            raise
        if lost:
            self._remove_quietly(self._account_dn(username))
        return not lost

    def _holders(self, number: int) -> list[tuple[str, dict]]:
        """Entries holding number as a uidNumber or gidNumber, the mark entry left out."""
        n = ldap.filter.escape_filter_chars(str(number))
        found = self._search(self._base_dn, ldap.SCOPE_SUBTREE, f"(|(uidNumber={n})(gidNumber={n}))",
                             ["entryCSN", "createTimestamp"])
        mark = _norm_dn(self._mark_dn)
        return [(dn, attrs) for dn, attrs in found if _norm_dn(dn) != mark]

    def _lost_race(self, username: str, number: int) -> bool:
        """Whether an entry other than this account's holds `number` and was written first."""

        def written(item: tuple[str, dict]) -> tuple[str, str]:
            dn, attrs = item
            return (_first(attrs, "entryCSN") or _first(attrs, "createTimestamp") or "", _norm_dn(dn))

        mine_dn = _norm_dn(self._account_dn(username))
        holders = self._holders(number)
        mine = [h for h in holders if _norm_dn(h[0]) == mine_dn]
        others = [h for h in holders if _norm_dn(h[0]) != mine_dn]
        if not mine:
            return True  # someone removed it meanwhile: do not claim a number we cannot prove
        return any(written(o) < written(mine[0]) for o in others)

    def _add_account(self, username: str, home: str, number: int) -> None:
        entry = {
            "objectClass": _ACCOUNT_CLASSES,
            "uid": [username.encode()],
            "cn": [username.encode()],
            "uidNumber": [str(number).encode()],
            "gidNumber": [str(number).encode()],
            "homeDirectory": [home.encode()],
            "loginShell": [self._shell.encode()],
        }
        try:
            self._add(self._account_dn(username), entry)
        except ldap.ALREADY_EXISTS:
            raise Conflict(f"account {username} already exists in the directory") from None

    # -- entries --------------------------------------------------------------

    def _account_dn(self, username: str) -> str:
        return f"uid={ldap.dn.escape_dn_chars(username)},{self._people_dn}"

    def _group_dn(self, username: str) -> str:
        return f"cn={ldap.dn.escape_dn_chars(username)},{self._groups_dn}"

    def _to_account(
        self, found: list[tuple[str, dict]], *, username: str | None = None
    ) -> PosixAccount | None:
        for dn, attrs in sorted(found):
            try:
                uid = int(_first(attrs, "uidNumber") or "")
                gid = int(_first(attrs, "gidNumber") or "")
            except ValueError:
                log.warning("LDAP entry %s has a malformed uidNumber or gidNumber; ignored", dn)
                continue
            if username is None:
                rdn = ldap.dn.str2dn(dn)[0][0]
                username = rdn[1] if rdn[0].lower() == "uid" else (_first(attrs, "uid") or "")
            return PosixAccount(username=username, uid=uid, gid=gid,
                                home=_first(attrs, "homeDirectory") or "",
                                shell=_first(attrs, "loginShell") or "",
                                locked=_first(attrs, "shadowExpire") == str(LOCKED_EXPIRE_DAY))
        return None

    def _remove_memberships(self, username: str) -> None:
        flt = f"(&(objectClass=posixGroup)(memberUid={ldap.filter.escape_filter_chars(username)}))"
        for dn, _ in self._search(self._base_dn, ldap.SCOPE_SUBTREE, flt, ["1.1"]):
            self._remove_member(dn, username)

    def _read(self, dn: str, attrs: list[str]) -> dict[str, list[bytes]] | None:
        try:
            found = self._search(dn, ldap.SCOPE_BASE, "(objectClass=*)", attrs)
        except ldap.NO_SUCH_OBJECT:
            return None
        return found[0][1] if found else None

    def _remove_quietly(self, dn: str) -> None:
        """Undo part of a failed create; the caller's own error is the one reported."""
        try:
            self._delete(dn)
        except (ldap.LDAPError, HostError) as e:
            reason = _describe(e) if isinstance(e, ldap.LDAPError) else str(e)
            log.error("could not remove %s after a failed create (%s); reconcile will report it", dn, reason)

    # -- the connection ---------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except ldap.LDAPError as e:
            raise HostError(f"LDAP {what} on {self._uri} failed: {_describe(e)}") from None

    def _connect(self):
        conn = ldap.initialize(self._uri)
        conn.set_option(ldap.OPT_PROTOCOL_VERSION, ldap.VERSION3)
        conn.set_option(ldap.OPT_REFERRALS, 0)
        conn.set_option(ldap.OPT_NETWORK_TIMEOUT, self._timeout)
        conn.set_option(ldap.OPT_TIMEOUT, self._timeout)
        conn.timeout = self._timeout  # what python-ldap's synchronous calls wait for
        if self._tls_ca_file:
            conn.set_option(ldap.OPT_X_TLS_CACERTFILE, self._tls_ca_file)
            conn.set_option(ldap.OPT_X_TLS_REQUIRE_CERT, ldap.OPT_X_TLS_DEMAND)
            # TLS options take effect only in a new context, made after the others.
            conn.set_option(ldap.OPT_X_TLS_NEWCTX, 0)
        try:
            if self._starttls:
                conn.start_tls_s()
            conn.simple_bind_s(self._bind_dn, self._bind_password)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.unbind_s()
            raise
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.unbind_s()

    def _call(self, what: str, op: Callable[[object, int], T]) -> T:
        """op(connection, attempt) on a bound connection; a lost connection is retried once."""
        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self._connect()
                return op(self._conn, attempt)
            except _CONNECTION_LOST as e:
                self._drop()
                if attempt == 2:
                    hint = ""
                    tls = self._starttls or self._uri.lower().startswith("ldaps:")
                    if isinstance(e, ldap.CONNECT_ERROR) and tls:
                        # libldap reports a refused certificate only as "Connect error".
                        hint = "; TLS failed: check tls_ca_file and the server's certificate and name"
                    raise HostUnavailable(
                        f"LDAP server {self._uri} unavailable during {what}: {_describe(e)}{hint}") from None
                log.warning("LDAP connection to %s lost during %s (%s); reconnecting once",
                            self._uri, what, _describe(e))
            except (ldap.INVALID_CREDENTIALS, ldap.INAPPROPRIATE_AUTH) as e:
                self._drop()
                raise HostUnavailable(
                    f"LDAP bind to {self._uri} as {self._bind_dn} refused: {_describe(e)}") from None
        raise AssertionError("unreachable")

    def _search(self, base: str, scope: int, flt: str, attrs: list[str]) -> list[tuple[str, dict]]:
        def op(conn, attempt):
            page = SimplePagedResultsControl(criticality=False, size=_PAGE_SIZE, cookie=b"")
            found: list[tuple[str, dict]] = []
            while True:
                msgid = conn.search_ext(base, scope, flt, attrs, serverctrls=[page])
                _, data, _, controls = conn.result3(msgid, timeout=self._timeout)
                found.extend((dn, a) for dn, a in data if dn)  # dn None: a referral
                cookie = next((c.cookie for c in controls or ()
                               if c.controlType == SimplePagedResultsControl.controlType), b"")
                if not cookie:
                    return found
                page.cookie = cookie

        return self._call(f"search of {base}", op)

    def _add(self, dn: str, entry: dict[str, list[bytes]]) -> None:
        def op(conn, attempt):
            try:
                conn.add_s(dn, ldap.modlist.addModlist(entry))
            except ldap.ALREADY_EXISTS:
                # The first try may have been applied before the connection broke.
                if attempt == 1 or not self._has_entry(conn, dn, entry):
                    raise

        self._call(f"add of {dn}", op)

    def _has_entry(self, conn, dn: str, entry: dict[str, list[bytes]]) -> bool:
        try:
            [(_, attrs)] = conn.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)", list(entry))
        except (ldap.NO_SUCH_OBJECT, ValueError):
            return False
        have = {k.lower(): sorted(v) for k, v in attrs.items()}
        return all(have.get(k.lower()) == sorted(v) for k, v in entry.items() if k != "objectClass")

    def _remove_member(self, dn: str, username: str) -> None:
        def op(conn, attempt):
            # Already gone (a concurrent delete, or a first try that was applied
            # before the connection broke) is what this call wants anyway.
            with contextlib.suppress(ldap.NO_SUCH_ATTRIBUTE, ldap.NO_SUCH_OBJECT):
                conn.modify_s(dn, [(ldap.MOD_DELETE, "memberUid", [username.encode()])])

        self._call(f"modify of {dn}", op)

    def _delete(self, dn: str) -> None:
        def op(conn, attempt):
            with contextlib.suppress(ldap.NO_SUCH_OBJECT):
                conn.delete_s(dn)

        self._call(f"delete of {dn}", op)


class LdapEntries:
    """An LdapDirectory's one connection, for other adapters of the same server
    (host_adapters/accounts/ldap_groups.py): its lock, its retry of a lost connection once, and
    its mapping of LDAP failures to the project's errors."""

    def __init__(self, directory: LdapDirectory):
        self._d = directory
        self.uri, self.base_dn = directory._uri, directory._base_dn
        self.groups_dn = directory._groups_dn  # where the accounts' private groups go

    @contextlib.contextmanager
    def session(self, what: str) -> Iterator["LdapEntries"]:
        """The connection held for a sequence of calls; an LDAP failure inside becomes
        HostError naming `what` (a server that does not answer: HostUnavailable)."""
        with self._d._lock, self._d._errors(what):
            yield self

    def search(self, base: str, flt: str, attrs: list[str], *, scope: int = ldap.SCOPE_SUBTREE) -> list:
        """(dn, attrs) of every entry matching flt (escape every value put into it), paged."""
        return self._d._search(base, scope, flt, attrs)

    def read(self, dn: str, attrs: list[str]) -> dict[str, list[bytes]] | None:
        return self._d._read(dn, attrs)

    def add(self, dn: str, entry: dict[str, list[bytes]]) -> None:
        self._d._add(dn, entry)

    def delete(self, dn: str) -> None:
        """Remove the entry; already gone is no error."""
        self._d._delete(dn)

    def modify(self, dn: str, changes: list) -> None:
        """One modify request, applied whole or not at all; python-ldap's errors (no such
        object, a value that exists or does not) reach the caller."""
        self._d._call(f"modify of {dn}", lambda conn, attempt: conn.modify_s(dn, changes))
