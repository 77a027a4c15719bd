"""Hypervisor hosts (table hosts) with what their instances allocate, and the instances
leaving a host: moves (cloud-agent host drain) and evacuations (host evacuate)."""

import sqlite3

from controller.errors import Conflict
from controller.store.database import utc_now


# The host of instance rows made before there were hosts (migration _M8_HOSTS).
DEFAULT_HOST = "default"

# What instances moving to a host (cloud-agent host drain) allocate there before their row names it.
_MOVES_IN_FLIGHT = """SELECT m.to_host, f.vcpu, f.memory FROM moves m JOIN instances i ON i.id = m.instance_id
                      JOIN flavors f ON f.id = i.flavor_id WHERE i.host != m.to_host"""


class HostRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    _HOSTS_SQL = """SELECT h.*, COUNT(i.id) AS instances, COALESCE(SUM(f.vcpu), 0) AS allocated_vcpus,
                           COALESCE(SUM(f.memory), 0) AS allocated_memory_mb
                    FROM hosts h LEFT JOIN instances i ON i.host = h.name LEFT JOIN flavors f ON f.id = i.flavor_id
                    {where} GROUP BY h.name ORDER BY h.name"""

    @classmethod
    def _hosts(cls, conn: sqlite3.Connection, name: str | None = None) -> list[dict]:
        """Hosts with what their live instances (every row, being created or deleted too) allocate."""
        sql = cls._HOSTS_SQL.format(where="WHERE h.name = ?" if name is not None else "")
        hosts = [dict(r) for r in conn.execute(sql, () if name is None else (name,)).fetchall()]
        # An instance moving to a host (drain) counts there too until its row names it.
        for m in conn.execute(_MOVES_IN_FLIGHT).fetchall():
            for h in hosts:
                if h["name"] == m["to_host"]:
                    h["allocated_vcpus"] += m["vcpu"]
                    h["allocated_memory_mb"] += m["memory"]
        return hosts

    def list_hosts(self) -> list[dict]:
        return self._hosts(self.conn)

    def get_host(self, name: str) -> dict | None:
        """A host's record alone: the sums of host_with_allocation() scan its instances."""
        return self._one("SELECT * FROM hosts WHERE name = ?", (name,))

    def host_with_allocation(self, name: str) -> dict | None:
        """A host's record with what its instances allocate, as list_hosts() gives it."""
        return next(iter(self._hosts(self.conn, name)), None)

    def insert_host(self, host: dict) -> None:
        """Record a host; Conflict when its name exists or another record reaches the same
        libvirt (`host_uuid` or `pool_uuid`, checked in the insert's transaction)."""
        now = utc_now()
        values = {"enabled": 1, "vcpus": None, "memory_mb": None, "capacity_read_at": None, "host_uuid": None,
                  "pool_uuid": None, **host, "now": now}
        try:
            with self.write() as conn:
                self._refuse_same_libvirt(conn, values)
                conn.execute(
                    """INSERT INTO hosts (name, uri, storage_pool, network, enabled, vcpus, memory_mb,
                       capacity_read_at, host_uuid, pool_uuid, created_at_utc, updated_at_utc) VALUES (:name,
                       :uri, :storage_pool, :network, :enabled, :vcpus, :memory_mb, :capacity_read_at,
                       :host_uuid, :pool_uuid, :now, :now)""",
                    values,
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"a hypervisor host named {host['name']!r} exists") from None

    @staticmethod
    def _refuse_same_libvirt(conn: sqlite3.Connection, host: dict) -> None:
        other = conn.execute(
            "SELECT name, uri FROM hosts WHERE name != :name AND ((:host_uuid IS NOT NULL AND host_uuid = :host_uuid)"
            " OR (:pool_uuid IS NOT NULL AND pool_uuid = :pool_uuid))", host).fetchone()
        if other is not None:
            raise Conflict(f"another record, host {other['name']} ({other['uri']}), reaches the same libvirt "
                           f"(host UUID {host['host_uuid'] or 'none'}, storage pool UUID {host['pool_uuid']})")

    def set_host_identity(self, name: str, *, host_uuid: str | None, pool_uuid: str) -> None:
        """Record which libvirt host `name` reaches; Conflict when another record reaches it."""
        values = {"name": name, "host_uuid": host_uuid, "pool_uuid": pool_uuid}
        try:
            with self.write() as conn:
                self._refuse_same_libvirt(conn, values)
                conn.execute("UPDATE hosts SET host_uuid = :host_uuid, pool_uuid = :pool_uuid WHERE name = :name",
                             values)
        except sqlite3.IntegrityError:  # another process recorded it meanwhile
            raise Conflict(f"another record reaches the same libvirt as host {name}") from None

    def upsert_config_host(self, host: dict, *, legacy_name: str = DEFAULT_HOST) -> None:
        """The config's host: made, or its uri, pool and network set (enabled and capacity stay).
        Instances recorded on `legacy_name` while no such host exists move to it (rows made
        before hosts existed got that name)."""
        now = utc_now()
        with self.write() as conn:
            conn.execute(
                """INSERT INTO hosts (name, uri, storage_pool, network, enabled, created_at_utc, updated_at_utc)
                   VALUES (:name, :uri, :storage_pool, :network, 1, :now, :now)
                   ON CONFLICT (name) DO UPDATE SET uri = excluded.uri, storage_pool = excluded.storage_pool,
                   network = excluded.network, updated_at_utc = excluded.updated_at_utc
                   WHERE hosts.uri <> excluded.uri OR hosts.storage_pool <> excluded.storage_pool
                      OR hosts.network <> excluded.network""",
                dict(host, now=now),
            )
            if host["name"] != legacy_name:
                conn.execute("UPDATE instances SET host = ? WHERE host = ? AND NOT EXISTS "
                             "(SELECT 1 FROM hosts WHERE name = ?)", (host["name"], legacy_name, legacy_name))

    def set_host_enabled(self, name: str, enabled: bool) -> bool:
        with self.write() as conn:
            cur = conn.execute("UPDATE hosts SET enabled = ?, updated_at_utc = ? WHERE name = ?",
                               (int(enabled), utc_now(), name))
        return cur.rowcount == 1

    def set_host_capacity(self, name: str, *, vcpus: int, memory_mb: int, read_at: int) -> None:
        with self.write() as conn:
            conn.execute("UPDATE hosts SET vcpus = ?, memory_mb = ?, capacity_read_at = ? WHERE name = ?",
                         (vcpus, memory_mb, read_at, name))

    def delete_host(self, name: str) -> None:
        """Remove a host that holds no instance (Conflict otherwise; checked in the same transaction)."""
        with self.write() as conn:
            held = conn.execute("SELECT COUNT(*) FROM instances WHERE host = ?", (name,)).fetchone()[0]
            if held:
                raise Conflict(f"hypervisor host {name} holds {held} instance(s); delete or move them first")
            # A move or evacuation not finished names it as where a copy of a disk is or goes.
            named = conn.execute(
                "SELECT 'move', instance_id, from_host, to_host FROM moves WHERE from_host = ?1 OR to_host = ?1 "
                "UNION ALL SELECT 'evacuation', instance_id, from_host, to_host FROM evacuations "
                "WHERE from_host = ?1 OR to_host = ?1 ORDER BY 2", (name,)).fetchall()
            if named:
                what = ", ".join(f"the {r[0]} of instance {r[1]} from host {r[2]} to host {r[3]}" for r in named)
                raise Conflict(f"hypervisor host {name} is named by {what}, not finished; finish it (drain or "
                               "evacuate again, `reconcile --fix`) or abandon it (`host drain HOST --abandon`) first")
            conn.execute("DELETE FROM hosts WHERE name = ?", (name,))

    def begin_evacuation(self, instance_id: str, from_host: str, place) -> str | None:
        """Point a live instance of `from_host` at the host `place(hosts)` picks (hosts with
        their allocations, as list_hosts gives them) and record the evacuation, in one
        transaction: the new host's allocation counts it at once. None (nothing changed)
        when the instance is no longer a live one of `from_host`."""
        with self.write() as conn:
            row = conn.execute("SELECT host, intent FROM instances WHERE id = ?", (instance_id,)).fetchone()
            if row is None or row["host"] != from_host or row["intent"] is not None:
                return None
            # A move off the dead host not committed is moot: the copy it was making is not checked.
            # The guest it shut down is rebuilt in the power state it had before.
            conn.execute("UPDATE instances SET status = 'running' WHERE id = ?1 AND EXISTS (SELECT 1 FROM moves "
                         "WHERE instance_id = ?1 AND from_host = ?2 AND was_running = 1)", (instance_id, from_host))
            conn.execute("DELETE FROM moves WHERE instance_id = ? AND from_host = ?", (instance_id, from_host))
            target = place(self._hosts(conn))
            conn.execute("UPDATE instances SET host = ? WHERE id = ?", (target, instance_id))
            conn.execute("INSERT INTO evacuations (instance_id, from_host, to_host, started_at_utc) "
                         "VALUES (?, ?, ?, ?)", (instance_id, from_host, target, utc_now()))
        return target

    def list_evacuations(self, *, from_host: str | None = None) -> list[dict]:
        """Evacuations not finished, oldest first."""
        where, params = ("WHERE from_host = ?", (from_host,)) if from_host is not None else ("", ())
        return self._all(f"SELECT * FROM evacuations {where} ORDER BY started_at_utc, instance_id", params)

    def finish_evacuation(self, instance_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM evacuations WHERE instance_id = ?", (instance_id,))

    def undo_evacuation(self, instance_id: str) -> None:
        """The rebuild failed and nothing of it remains: the row names its old host again."""
        with self.write() as conn:
            conn.execute("UPDATE instances SET host = (SELECT from_host FROM evacuations WHERE instance_id = ?) "
                         "WHERE id = ? AND EXISTS (SELECT 1 FROM evacuations WHERE instance_id = ?)",
                         (instance_id, instance_id, instance_id))
            conn.execute("DELETE FROM evacuations WHERE instance_id = ?", (instance_id,))

    def begin_move(self, instance_id: str, from_host: str, place, *, was_running: bool) -> str | None:
        """Record the move of a live instance of `from_host` to the host `place(hosts)` picks
        (hosts with their allocations, as list_hosts gives them), in one transaction: the
        target's allocation counts it at once. The row still names `from_host`. None (nothing
        changed) when the instance is no longer a live one of `from_host`."""
        with self.write() as conn:
            row = conn.execute("SELECT host, intent FROM instances WHERE id = ?", (instance_id,)).fetchone()
            if row is None or row["host"] != from_host or row["intent"] is not None:
                return None
            target = place(self._hosts(conn))
            conn.execute("INSERT INTO moves (instance_id, from_host, to_host, was_running, started_at_utc) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (instance_id, from_host, target, int(was_running), utc_now()))
        return target

    def list_moves(self, *, from_host: str | None = None, instance_id: str | None = None) -> list[dict]:
        """Moves not finished, oldest first."""
        where, params = "WHERE 1", []
        if from_host is not None:
            where, params = where + " AND from_host = ?", params + [from_host]
        if instance_id is not None:
            where, params = where + " AND instance_id = ?", params + [instance_id]
        return self._all(f"SELECT * FROM moves {where} ORDER BY started_at_utc, instance_id", tuple(params))

    def commit_move(self, instance_id: str) -> None:
        """The target holds the checked copy: the row names it (shut off there; its console
        starts afresh with the run there)."""
        with self.write() as conn:
            conn.execute("UPDATE instances SET host = (SELECT to_host FROM moves WHERE instance_id = ?), "
                         "status = 'shutoff', console_since = NULL "
                         "WHERE id = ? AND EXISTS (SELECT 1 FROM moves WHERE instance_id = ?)",
                         (instance_id, instance_id, instance_id))

    def abandon_move(self, instance_id: str) -> dict | None:
        """The move is given up and the instance stays on, or returns to, its source (whose copy
        of the disk was never removed): the row names the source again (shut off there when it
        had been committed), and the record goes, in one transaction. The record, or None."""
        with self.write() as conn:
            move = conn.execute("SELECT * FROM moves WHERE instance_id = ?", (instance_id,)).fetchone()
            if move is None:
                return None
            conn.execute("UPDATE instances SET host = ?, status = 'shutoff', console_since = NULL "
                         "WHERE id = ? AND host = ?", (move["from_host"], instance_id, move["to_host"]))
            conn.execute("DELETE FROM moves WHERE instance_id = ?", (instance_id,))
        return dict(move)

    def end_move(self, instance_id: str) -> None:
        """The move is finished, or undone before its commit (the row names the source)."""
        with self.write() as conn:
            conn.execute("DELETE FROM moves WHERE instance_id = ?", (instance_id,))
