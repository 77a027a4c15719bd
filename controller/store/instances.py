"""Server-instances (table instances), the accounts they grant (instance_users), and the
claim each holds on its host state (instance_claims)."""

import json
from collections.abc import Iterable, Iterator

from controller.store.database import utc_now
from controller.store.hosts import DEFAULT_HOST


INSERT_INSTANCE = """INSERT INTO instances (id, owner_id, image_id, flavor_id, status, hostname, public_ip,
    private_ip, mac, public_mac, creation_date, intent, host, expires_at) VALUES (:id, :owner_id, :image_id,
    :flavor_id, :status, :hostname, :public_ip, :private_ip, :mac, :public_mac, :creation_date,
    :intent, :host, :expires_at)"""

INSERT_INSTANCE_USER = "INSERT INTO instance_users (instance_id, account_uuid) VALUES (?, ?)"


def _used_addresses(conn) -> dict[str, set[str]]:
    """What live instances use (keys private_ip, public_ip, mac, hostname), as allocate() takes it."""
    used: dict[str, set[str]] = {"private_ip": set(), "public_ip": set(), "mac": set(), "hostname": set()}
    for r in conn.execute("SELECT private_ip, public_ip, mac, public_mac, hostname FROM instances"):
        for key, value in (("private_ip", r[0]), ("public_ip", r[1]), ("mac", r[2]), ("mac", r[3]),
                           ("hostname", r[4])):
            if value is not None:
                used[key].add(value)
    return used


# A server-instance object (spec section 2.1) made by SQLite: `users` in the
# order they were granted (users_json, kept by triggers: migration _M10_LISTED_USERS), the
# address fields only when set. One printf per row: a json_object() with its nested array
# cost half as much again (10,000 rows: 57 ms, 37 ms; 21 ms with users_json).
#
# `expires-at` and `lease` (docs/leases.md): the lease's state is read against the two times
# the caller gives, in this order after the status's parameters: now, and the end of the
# first warning (expires-at at or before now: expired; at or before the second: expiring).
# Dates are stored as RFC 3339 UTC to the second, so text order is time order.
_INSTANCE_JSON = """printf(
    '{{"id":%s,"cloudauth-id":%s,"users":[%s],"server-image":%s,"server-flavor":"%d","creation-date":%s,"status":%s,"expires-at":%s,"lease":"%s"%s%s%s}}',
    json_quote(id), json_quote(owner_id),
    users_json,
    json_quote(image_id), flavor_id, json_quote(creation_date), json_quote({status}), json_quote(expires_at),
    CASE WHEN expires_at IS NULL THEN 'none' WHEN expires_at <= ? THEN 'expired'
         WHEN expires_at <= ? THEN 'expiring' ELSE 'active' END,
    iif(coalesce(hostname, '') = '', '', ',"hostname":' || json_quote(hostname)),
    iif(coalesce(public_ip, '') = '', '', ',"public-ip":' || json_quote(public_ip)),
    iif(coalesce(private_ip, '') = '', '', ',"private-ip":' || json_quote(private_ip)))"""

# The two forms a GET uses, made once: with the stored status, or with a status given.
_INSTANCE_JSON_STORED = _INSTANCE_JSON.format(status="status")
_INSTANCE_JSON_GIVEN = _INSTANCE_JSON.format(status="?")


def no_lease_times() -> tuple[str, str]:
    """The times a lease is read against when the caller gives none: now, and no warning."""
    now = utc_now()
    return now, now


def _with_users(row: dict) -> dict:
    """An instance row with `users` (account uuids in grant order) from its users_json."""
    row["users"] = json.loads("[" + row.pop("users_json") + "]")
    return row


class InstanceRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def insert_instance(self, instance: dict, account_uuids: list[str], *, allocate=None, admit=None,
                        place=None) -> dict:
        """Insert the instance and its users; return the row as stored.

        admit(overrides=, owned=, allocated=) may refuse it (by raising) inside the
        same write transaction, given the owner's limit overrides, what the owner
        holds (instances, vcpus, memory_mb) and what every live instance
        allocates (vcpus, memory_mb), so concurrent creates never pass a limit together.

        allocate(used) -> {column: value} picks the address columns inside the same
        write transaction, given what live instances use (keys private_ip,
        public_ip, mac, hostname: sets), so concurrent creates never share one.

        place(hosts) -> name picks the instance's host inside the same write
        transaction, given every host with what its live instances allocate
        (list_hosts rows), so concurrent creates never over-commit a host.
        """
        with self.write() as conn:
            if admit is not None:
                owner = instance["owner_id"]
                admit(overrides=self._limit_overrides(conn, owner), owned=self._instance_usage(conn, owner),
                      allocated=self._instance_usage(conn))
            if place is not None:
                instance = dict(instance, host=place(self._hosts(conn)))
            if allocate is not None:
                instance = dict(instance, **allocate(_used_addresses(conn)))
            row = {"mac": None, "public_mac": None, "intent": "creating", "host": DEFAULT_HOST, "expires_at": None,
                   **instance}
            conn.execute(INSERT_INSTANCE, row)
            conn.executemany(INSERT_INSTANCE_USER, [(instance["id"], u) for u in account_uuids])
        return row

    def list_instances(self, *, visible_to: str | None, owner_id: str | None = None,
                       instance_id: str | None = None, instance_ids: list[str] | None = None,
                       with_intents: bool = False, host: str | None = None) -> list[dict]:
        """Instances in creation order; those being created or deleted only with_intents (reconcile)."""
        where, params = self._where(visible_to, owner_id=owner_id, id=instance_id, host=host)
        if not with_intents:
            where += " AND intent IS NULL"
        if instance_ids is not None:
            if not instance_ids:
                return []
            where += f" AND id IN ({','.join('?' * len(instance_ids))})"
            params += list(instance_ids)
        return [_with_users(r) for r in
                self._all(f"SELECT * FROM instances WHERE {where} ORDER BY creation_date, id", params)]

    def instance_status_counts(self, *, visible_to: str | None, owner_id: str | None = None) -> dict[str, int]:
        """list_instances' rows counted by their stored status, in one statement (the portal's
        overview counts; no row is read into Python)."""
        where, params = self._where(visible_to, owner_id=owner_id)
        return {r["status"]: r["n"] for r in self._all(
            f"SELECT status, COUNT(*) AS n FROM instances WHERE {where} AND intent IS NULL GROUP BY status", params)}

    def get_instance(self, instance_id: str, *, visible_to: str | None) -> dict | None:
        """list_instances(instance_id=...)'s row (a GET of one instance: the most frequent request)."""
        where, params = self._where(visible_to, id=instance_id)
        row = self._one(f"SELECT * FROM instances WHERE {where} AND intent IS NULL", params)
        return _with_users(row) if row is not None else None

    def get_instance_json(self, instance_id: str, *, visible_to: str | None,
                          status: str | None = None, lease_times: tuple[str, str] | None = None) -> dict | None:
        """get_instance's id, host and stored status, with `json`: its server-instance object encoded
        as iter_instance_json encodes it, with the stored status or the status given, and its
        lease read against lease_times (now, end of the first warning; default: now, none)."""
        lease_times = tuple(lease_times or no_lease_times())
        where, params = self._where(visible_to, id=instance_id)
        obj = _INSTANCE_JSON_STORED if status is None else _INSTANCE_JSON_GIVEN
        sql = f"SELECT id, host, status, {obj} AS json FROM instances WHERE {where} AND intent IS NULL"
        if status is not None:
            return self._one(sql, [status, *lease_times, *params])
        params = [*lease_times, *params]
        # The stored form is remembered until the next committed write (controller/store/read_memo.py),
        # for the same lease times (to the second: a lease's state changes with time, not writes).
        # The times are kept with the answer, not in its key: the next second's answer replaces
        # it, and the memo does not fill with answers of seconds gone.
        mark = self.write_mark.read() if self.write_mark.usable else None
        key = (instance_id, visible_to)
        held = self._instance_memo.get(key, mark) if mark is not None else None
        if held is not None and held[0] == lease_times:
            return dict(held[1])
        row = self._one(sql, params)
        if row is not None and mark is not None:
            self._instance_memo.put(key, mark, (lease_times, dict(row)))
        return row

    def iter_instance_json(self, *, visible_to: str | None, owner_id: str | None = None,
                           error_hosts: Iterable[str] = (), per_chunk: int = 200,
                           lease_times: tuple[str, str] | None = None) -> Iterator[str]:
        """list_instances' rows (without intents) as server-instance objects
        encoded by SQLite: chunks of up to per_chunk JSON objects joined by commas, in
        creation order. Each chunk is read by its own statements, ended before it is
        yielded: a client that stops reading holds no transaction or cursor, in any thread.
        A row created or deleted while a long list is sent may be in it or not; none is
        listed twice (a chunk starts after the creation date and id the last one ended at).
        The stored status is given (status_sync brings it to the hosts' view first), or
        "error" for rows on error_hosts. SQLite builds a chunk in one step, without Python's
        GIL; rows are never Python objects."""
        where, params = self._where(visible_to, owner_id=owner_id)
        where += " AND intent IS NULL"
        error_hosts = list(error_hosts)
        status = "status"
        if error_hosts:
            status = f"CASE WHEN host IN ({','.join('?' * len(error_hosts))}) THEN 'error' ELSE status END"
        obj = _INSTANCE_JSON.format(status=status)
        # The object's parameters: the status's hosts, then the lease's two times.
        lease_times = tuple(lease_times or no_lease_times())
        obj_params = [*error_hosts, *lease_times]

        def chunks() -> Iterator[str]:
            after, after_params = "", []
            # The first chunk in one statement: up to per_chunk objects and how many there
            # are. A list shorter than a chunk (most of them) is then done; the two
            # statements below cost a GET's worth more (docs/performance.md). Such a list
            # is remembered until the next committed write (controller/store/read_memo.py).
            mark = self.write_mark.read() if self.write_mark.usable else None
            # The lease times with the answer, not in its key, as get_instance_json keeps them.
            key = ("list", visible_to, owner_id, tuple(error_hosts), per_chunk)
            held = self._list_memo.get(key, mark) if mark is not None else None
            if held is not None and held[0] == lease_times:
                count, text = held[1]
            else:
                count, text = self.conn.execute(
                    f"""SELECT count(*), group_concat(obj, ',') FROM (SELECT {obj} AS obj FROM instances
                        WHERE {where} ORDER BY creation_date, id LIMIT ?)""",
                    [*obj_params, *params, per_chunk]).fetchone()
                if count < per_chunk and mark is not None:
                    self._list_memo.put(key, mark, (lease_times, (count, text)))
            if count < per_chunk:
                if text:
                    yield text
                return
            while True:
                # The chunk ends at its per_chunk-th row (by the creation-order index); the
                # next starts after it. Each statement is done before its chunk is yielded:
                # nothing of the database is held between chunks.
                end = self.conn.execute(
                    f"""SELECT creation_date, id FROM instances WHERE {where}{after}
                        ORDER BY creation_date, id LIMIT 1 OFFSET ?""",
                    [*params, *after_params, per_chunk - 1]).fetchone()
                upto, upto_params = ("", []) if end is None else (" AND (creation_date, id) <= (?, ?)", list(end))
                # The objects are concatenated in the order the subquery gives them.
                text = self.conn.execute(
                    f"""SELECT group_concat(obj, ',') FROM (SELECT {obj} AS obj FROM instances
                        WHERE {where}{after}{upto} ORDER BY creation_date, id)""",
                    [*obj_params, *params, *after_params, *upto_params]).fetchone()[0]
                if text:
                    yield text
                if end is None:
                    return
                after, after_params = " AND (creation_date, id) > (?, ?)", list(end)

        return chunks()

    def sync_host_statuses(self, host: str, statuses: dict[str, str]) -> None:
        """The stored status of each live instance of the host set to statuses (one missing
        from it: "error", the host has no domain for it); only differing rows are written."""
        stored = self.conn.execute(
            "SELECT id, status FROM instances WHERE host = ? AND intent IS NULL", (host,)).fetchall()
        changed = {i: statuses.get(i, "error") for i, status in stored if statuses.get(i, "error") != status}
        if changed:
            self.set_live_instance_statuses(changed, host=host)

    def set_live_instance_statuses(self, statuses: dict[str, str], *, host: str) -> None:
        """Statuses of the host's live instances (those being created or deleted are left
        to the operation under way)."""
        with self.write() as conn:
            conn.executemany(
                "UPDATE instances SET status = ? WHERE id = ? AND host = ? AND intent IS NULL AND status != ?",
                [(status, instance_id, host, status) for instance_id, status in statuses.items()])

    def instance_hosts(self, *, visible_to: str | None, owner_id: str | None = None) -> list[str]:
        """The hosts holding live instances that iter_instance_json with the same filters gives."""
        # Remembered until the next committed write, as the lists (controller/store/read_memo.py).
        mark = self.write_mark.read() if self.write_mark.usable else None
        key = ("hosts", visible_to, owner_id)
        held = self._list_memo.get(key, mark) if mark is not None else None
        if held is not None:
            return list(held)
        where, params = self._where(visible_to, owner_id=owner_id)
        hosts = [r[0] for r in self.conn.execute(
            f"SELECT DISTINCT host FROM instances WHERE {where} AND intent IS NULL ORDER BY host", params)]
        if mark is not None:
            self._list_memo.put(key, mark, tuple(hosts))
        return hosts

    def instance_users(self, instance_ids: list[str]) -> dict[str, list[str]]:
        if not instance_ids:
            return {}
        marks = ",".join("?" * len(instance_ids))
        out: dict[str, list[str]] = {}
        for r in self._all(
            f"SELECT instance_id, account_uuid FROM instance_users WHERE instance_id IN ({marks}) ORDER BY rowid",
            instance_ids,
        ):
            out.setdefault(r["instance_id"], []).append(r["account_uuid"])
        return out

    def set_instance_users(self, instance_id: str, account_uuids: list[str]) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM instance_users WHERE instance_id = ?", (instance_id,))
            conn.executemany(INSERT_INSTANCE_USER, [(instance_id, u) for u in account_uuids])

    def set_instance_status(self, instance_id: str, status: str) -> None:
        with self.write() as conn:
            conn.execute("UPDATE instances SET status = ? WHERE id = ?", (status, instance_id))

    def set_instance_statuses(self, statuses: dict[str, str]) -> None:
        with self.write() as conn:
            conn.executemany("UPDATE instances SET status = ? WHERE id = ?",
                             [(status, instance_id) for instance_id, status in statuses.items()])

    def set_console_since(self, instance_id: str, mark: str | None) -> None:
        """The instance's console answers the output after `mark` (JSON; None: all of its run)."""
        with self.write() as conn:
            conn.execute("UPDATE instances SET console_since = ? WHERE id = ?", (mark, instance_id))

    def delete_instance(self, instance_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM instances WHERE id = ?", (instance_id,))

    def instances_with_account(self, account_uuid: str) -> list[str]:
        return [
            r["instance_id"]
            for r in self._all("SELECT instance_id FROM instance_users WHERE account_uuid = ?", (account_uuid,))
        ]

    def instances_with_accounts(self, account_uuids: list[str]) -> list[str]:
        """Ids of the instances any of these accounts can access."""
        if not account_uuids:
            return []
        marks = ",".join("?" * len(account_uuids))
        return [
            r["instance_id"]
            for r in self._all(
                f"SELECT DISTINCT instance_id FROM instance_users WHERE account_uuid IN ({marks}) ORDER BY instance_id",
                account_uuids,
            )
        ]

    def all_instances(self) -> list[dict]:
        return self.list_instances(visible_to=None, with_intents=True)

    def find_instance(self, instance_id: str) -> dict | None:
        """The instance's row whatever its intent (being created, deleted, moved), or None."""
        return next(iter(self.list_instances(visible_to=None, instance_id=instance_id, with_intents=True)), None)

    def set_instance_intent(self, instance_id: str, intent: str | None, *, expect: str | None = None) -> bool:
        """Set the instance's intent if it is `expect` now; False (nothing changed) otherwise."""
        with self.write() as conn:
            cur = conn.execute("UPDATE instances SET intent = ? WHERE id = ? AND intent IS ?",
                               (intent, instance_id, expect))
        return cur.rowcount == 1

    def used_addresses(self) -> dict[str, set[str]]:
        """What live instances use (keys private_ip, public_ip, mac, hostname), as allocate() takes it."""
        return _used_addresses(self.conn)

    def instance_counts(self) -> list[dict]:
        """Live instances per host and stored status."""
        return self._all("SELECT host, status, COUNT(*) AS instances FROM instances GROUP BY host, status")

    def take_instance_claim(self, claim: dict, *, replacing: str | None = None) -> tuple[bool, dict | None]:
        """Compare-and-set of the instance's claim: made when the instance has none, or (with
        `replacing`, a dead holder's token) put in its place only while that claim is still
        there. (True, None) when taken; (False, the claim that holds it); (False, None) when
        the instance does not exist. A replaced claim's refresh_wanted is kept."""
        with self.write() as conn:
            if replacing is None:
                cur = conn.execute(
                    """INSERT INTO instance_claims (instance_id, operation, token, pid, proc_start, boot_id, machine,
                       claimed_at_utc) SELECT :instance_id, :operation, :token, :pid, :proc_start, :boot_id, :machine,
                       :claimed_at_utc FROM instances WHERE id = :instance_id
                       ON CONFLICT (instance_id) DO NOTHING""", claim)
            else:
                cur = conn.execute(
                    """UPDATE instance_claims SET operation = :operation, token = :token, pid = :pid,
                       proc_start = :proc_start, boot_id = :boot_id, machine = :machine,
                       claimed_at_utc = :claimed_at_utc WHERE instance_id = :instance_id AND token = :replacing""",
                    dict(claim, replacing=replacing))
            if cur.rowcount == 1:
                return True, None
            held = conn.execute("SELECT * FROM instance_claims WHERE instance_id = ?",
                                (claim["instance_id"],)).fetchone()
        return False, dict(held) if held is not None else None

    def release_instance_claim(self, instance_id: str, token: str) -> bool:
        """Drop the claim with this token unless a guest refresh was asked for meanwhile: True
        when it is gone; False when one was (the request is cleared: the holder refreshes the
        guest, then releases again)."""
        with self.write() as conn:
            if conn.execute("DELETE FROM instance_claims WHERE instance_id = ? AND token = ? AND refresh_wanted = 0",
                            (instance_id, token)).rowcount:
                return True
            cur = conn.execute("UPDATE instance_claims SET refresh_wanted = 0 WHERE instance_id = ? AND token = ?",
                               (instance_id, token))
        return cur.rowcount == 0

    def drop_instance_claim(self, instance_id: str, token: str) -> bool:
        """Remove the claim with this token whatever it asks (a dead holder's, or one let go
        after its refreshes failed); False when it is no longer that claim."""
        with self.write() as conn:
            cur = conn.execute("DELETE FROM instance_claims WHERE instance_id = ? AND token = ?", (instance_id, token))
        return cur.rowcount == 1

    def want_guest_refresh(self, instance_id: str) -> bool:
        """Ask the holder of the instance's claim to rebuild its guest before it lets go;
        False when no claim is held (the caller refreshes it itself)."""
        with self.write() as conn:
            cur = conn.execute("UPDATE instance_claims SET refresh_wanted = 1 WHERE instance_id = ?", (instance_id,))
        return cur.rowcount == 1

    def list_instance_claims(self) -> list[dict]:
        return self._all("SELECT * FROM instance_claims ORDER BY claimed_at_utc, instance_id")
