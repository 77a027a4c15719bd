"""Forward-only schema migrations; the applied version is PRAGMA user_version.

Append a new SQL script to MIGRATIONS to change the schema; never edit one that
has shipped.
"""

import sqlite3


_M1_USERS = """
        CREATE TABLE users (
            id TEXT PRIMARY KEY,
            email TEXT NOT NULL COLLATE NOCASE UNIQUE,
            name TEXT NOT NULL DEFAULT '',
            password_hash TEXT NOT NULL,
            active INTEGER NOT NULL DEFAULT 1,
            owner_userid TEXT REFERENCES users(id) ON DELETE SET NULL,
            roles TEXT NOT NULL DEFAULT '[]',
            registration_source TEXT NOT NULL DEFAULT '',
            api_key TEXT NOT NULL UNIQUE,
            api_secret_enc TEXT,
            created_at_utc TEXT NOT NULL
        );
        CREATE INDEX users_owner ON users(owner_userid);
        CREATE INDEX users_active_created ON users(active, created_at_utc);

        CREATE TABLE tokens (
            token_hash TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            source TEXT NOT NULL CHECK (source IN ('api_key', 'password')),
            expires_at INTEGER NOT NULL,
            created_at_utc TEXT NOT NULL
        );
        CREATE INDEX tokens_user ON tokens(user_id, source);

        CREATE TABLE system_accounts (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE RESTRICT,
            username TEXT NOT NULL UNIQUE,
            uuid TEXT NOT NULL UNIQUE,
            uid INTEGER NOT NULL,
            gid INTEGER NOT NULL,
            home TEXT NOT NULL,
            cloud_controller_id INTEGER NOT NULL,
            created_at_utc TEXT NOT NULL
        );
        CREATE INDEX system_accounts_user ON system_accounts(user_id);
        -- One system account per user on each controller.
        CREATE UNIQUE INDEX system_accounts_user_controller ON system_accounts(user_id, cloud_controller_id);
"""


_M2_CONTROLLER = """
        CREATE TABLE images (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            public INTEGER NOT NULL DEFAULT 1,
            os_name TEXT NOT NULL,
            os_major TEXT NOT NULL,
            os_minor TEXT NOT NULL,
            min_disk INTEGER NOT NULL,
            min_ram INTEGER NOT NULL,
            active INTEGER NOT NULL DEFAULT 1,
            base_volume TEXT NOT NULL,
            creation_date TEXT NOT NULL
        );
        CREATE TABLE image_access (
            image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            PRIMARY KEY (image_id, user_id)
        );
        CREATE INDEX image_access_user ON image_access(user_id);

        CREATE TABLE flavors (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL UNIQUE,
            memory INTEGER NOT NULL,
            disk INTEGER NOT NULL,
            vcpu INTEGER NOT NULL
        );

        CREATE TABLE instances (
            id TEXT PRIMARY KEY,
            owner_id TEXT NOT NULL REFERENCES users(id) ON DELETE RESTRICT,
            image_id TEXT NOT NULL REFERENCES images(id) ON DELETE RESTRICT,
            flavor_id INTEGER NOT NULL REFERENCES flavors(id) ON DELETE RESTRICT,
            status TEXT NOT NULL,
            hostname TEXT,
            public_ip TEXT,
            private_ip TEXT,
            creation_date TEXT NOT NULL
        );
        CREATE INDEX instances_owner ON instances(owner_id);

        CREATE TABLE instance_users (
            instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
            account_uuid TEXT NOT NULL REFERENCES system_accounts(uuid) ON DELETE CASCADE,
            PRIMARY KEY (instance_id, account_uuid)
        );
        CREATE INDEX instance_users_account ON instance_users(account_uuid);

        -- One volume per user: the UNIQUE on owner_id is the rule, not a check in Python.
        CREATE TABLE volumes (
            id TEXT PRIMARY KEY,
            owner_id TEXT NOT NULL UNIQUE REFERENCES users(id) ON DELETE RESTRICT,
            size_gb INTEGER NOT NULL,
            name TEXT,
            visibility TEXT NOT NULL DEFAULT 'cluster',
            mount_point TEXT NOT NULL,
            creation_date TEXT NOT NULL
        );

        CREATE TABLE groups (
            id TEXT PRIMARY KEY,
            owner_id TEXT NOT NULL REFERENCES users(id) ON DELETE RESTRICT,
            name TEXT NOT NULL UNIQUE,
            creation_date TEXT NOT NULL
        );
        CREATE INDEX groups_owner ON groups(owner_id);
        CREATE TABLE group_members (
            group_id TEXT NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
            username TEXT NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (group_id, username)
        );
"""


_M3_AUDIT = """
        CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at_utc TEXT NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL DEFAULT '',
            result TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX audit_at ON audit(at_utc);
        CREATE INDEX audit_actor ON audit(actor, at_utc);
"""


_M4_INSTANCE_ADDRESSES = """
        ALTER TABLE instances ADD COLUMN mac TEXT;
        ALTER TABLE instances ADD COLUMN public_mac TEXT;
        -- Addresses and names are unique among live instances; a deleted row frees them.
        CREATE UNIQUE INDEX instances_private_ip ON instances(private_ip) WHERE private_ip IS NOT NULL;
        CREATE UNIQUE INDEX instances_public_ip ON instances(public_ip) WHERE public_ip IS NOT NULL;
        CREATE UNIQUE INDEX instances_hostname ON instances(hostname) WHERE hostname IS NOT NULL;
        CREATE UNIQUE INDEX instances_mac ON instances(mac) WHERE mac IS NOT NULL;
        CREATE UNIQUE INDEX instances_public_mac ON instances(public_mac) WHERE public_mac IS NOT NULL;
"""


_M5_LIMITS = """
        -- Per-user overrides of the [limits] defaults; NULL keeps the config's value.
        CREATE TABLE user_limits (
            user_id TEXT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
            instances INTEGER,
            vcpus INTEGER,
            memory_mb INTEGER,
            groups INTEGER,
            managed_users INTEGER
        );
        -- Flavors may be private like images: usable by the users granted them.
        ALTER TABLE flavors ADD COLUMN public INTEGER NOT NULL DEFAULT 1;
        CREATE TABLE flavor_access (
            flavor_id INTEGER NOT NULL REFERENCES flavors(id) ON DELETE CASCADE,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            PRIMARY KEY (flavor_id, user_id)
        );
        CREATE INDEX flavor_access_user ON flavor_access(user_id);
"""


_M6_INTENT = """
        -- What an operation set out to do, recorded before it touches the host, so a crash
        -- half way is finished (a delete) or undone (a create) by reconcile, never reversed.
        ALTER TABLE instances ADD COLUMN intent TEXT CHECK (intent IN ('creating', 'deleting'));
        ALTER TABLE volumes ADD COLUMN state TEXT NOT NULL DEFAULT 'ready'
            CHECK (state IN ('creating', 'ready', 'deleting'));
        ALTER TABLE groups ADD COLUMN state TEXT NOT NULL DEFAULT 'ready'
            CHECK (state IN ('creating', 'ready', 'deleting'));
        ALTER TABLE system_accounts ADD COLUMN state TEXT NOT NULL DEFAULT 'ready'
            CHECK (state IN ('ready', 'deleting'));
"""


_M7_AUTH_HARDENING = """
        -- An admin command's hold on the address it looked a user up by: while a live row
        -- names an address, no other user may take it (docs/decisions.md).
        CREATE TABLE email_reservations (
            id TEXT PRIMARY KEY,
            email TEXT NOT NULL COLLATE NOCASE,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            holder TEXT NOT NULL,
            expires_at INTEGER NOT NULL
        );
        CREATE INDEX email_reservations_email ON email_reservations(email);

        -- An owner holds every role of its managed users (superuser holds all): cut the
        -- links made before that rule.
        UPDATE users SET owner_userid = NULL
        WHERE owner_userid IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM users o, json_each(o.roles) r
                          WHERE o.id = users.owner_userid AND r.value = 'superuser')
          AND EXISTS (SELECT 1 FROM json_each(users.roles) mine
                      WHERE mine.value NOT IN (SELECT r.value FROM users o, json_each(o.roles) r
                                               WHERE o.id = users.owner_userid));
"""


_M8_HOSTS = """
        -- Hypervisor hosts (issue 10). The config's [libvirt] uri is the host named by
        -- [libvirt] host_name; `cloud-agent init` and the service's start write its row.
        -- vcpus and memory_mb are what libvirt's getInfo said when last read (NULL: never).
        CREATE TABLE hosts (
            name TEXT PRIMARY KEY,
            uri TEXT NOT NULL,
            storage_pool TEXT NOT NULL,
            network TEXT NOT NULL,
            enabled INTEGER NOT NULL DEFAULT 1,
            vcpus INTEGER,
            memory_mb INTEGER,
            capacity_read_at INTEGER,
            created_at_utc TEXT NOT NULL,
            updated_at_utc TEXT NOT NULL
        );
        -- The host an instance runs on; rows made before there were hosts run on the
        -- default one (its row is written by init from the config's host_name).
        ALTER TABLE instances ADD COLUMN host TEXT NOT NULL DEFAULT 'default';
        CREATE INDEX instances_host ON instances(host);
"""


_M9_LIST_ORDER = """
        -- Instance lists are in creation order: with this index SQLite reads live
        -- instances in that order instead of sorting all of them first, so the
        -- superuser's list of 10,000 streams from the first row.
        CREATE INDEX instances_live_created ON instances(creation_date, id) WHERE intent IS NULL;
        -- An instance's users in the order they were granted (an index entry ends with the
        -- rowid), read per row of a list without sorting them each time.
        CREATE INDEX instance_users_granted ON instance_users(instance_id);
"""


# An instance's users as lists show them: their account uuids in grant order, each a JSON
# string, joined by commas. SQLite keeps it with the rows of instance_users (a list of
# 10,000 instances read it per row in 16 of its 37 ms).
_INSTANCE_USERS_JSON = """coalesce((SELECT group_concat(json_quote(account_uuid)) FROM (
            SELECT account_uuid FROM instance_users WHERE instance_id = {of} ORDER BY rowid)), '')"""

_M10_LISTED_USERS = f"""
        ALTER TABLE instances ADD COLUMN users_json TEXT NOT NULL DEFAULT '';
        UPDATE instances SET users_json = {_INSTANCE_USERS_JSON.format(of="instances.id")};
        CREATE TRIGGER instance_user_added AFTER INSERT ON instance_users BEGIN
            UPDATE instances SET users_json = {_INSTANCE_USERS_JSON.format(of="NEW.instance_id")}
            WHERE id = NEW.instance_id;
        END;
        -- Also when an account's deletion takes it off its instances (ON DELETE CASCADE).
        CREATE TRIGGER instance_user_removed AFTER DELETE ON instance_users BEGIN
            UPDATE instances SET users_json = {_INSTANCE_USERS_JSON.format(of="OLD.instance_id")}
            WHERE id = OLD.instance_id;
        END;
        -- The hosts holding rows of a list, read before it (status_sync) without a table look-up per row.
        CREATE INDEX instances_live_host ON instances(host) WHERE intent IS NULL;
        CREATE TRIGGER instance_user_changed AFTER UPDATE ON instance_users BEGIN
            UPDATE instances SET users_json = {_INSTANCE_USERS_JSON.format(of="instances.id")}
            WHERE id IN (OLD.instance_id, NEW.instance_id);
        END;
"""


# The uid a volume's quota is kept under (setquota: the uid; xfs: its project), recorded
# when the home is made: removal acts on it, never on the owner of the tree, which root in
# a guest can chown. Existing rows take the uid of the account whose home is the volume's
# mount point, else of the user's only account; NULL when neither is known (the tree is
# then removed and no quota changed).
_M11_VOLUME_UID = """
        ALTER TABLE volumes ADD COLUMN uid INTEGER;
        UPDATE volumes SET uid = COALESCE(
            (SELECT a.uid FROM system_accounts a WHERE a.user_id = volumes.owner_id AND a.home = volumes.mount_point),
            (SELECT MIN(a.uid) FROM system_accounts a WHERE a.user_id = volumes.owner_id
             GROUP BY a.user_id HAVING COUNT(*) = 1));
"""


# An instance of a dead host being rebuilt on another (`cloud-agent host evacuate`): the
# row already names the new host (its allocation counts there from the start); this record
# says the rebuild is not done, so running the command again, or reconcile --fix, finishes
# it, and the old host's copy is known as stale when that host answers again.
_M12_EVACUATIONS = """
        CREATE TABLE evacuations (
            instance_id TEXT PRIMARY KEY REFERENCES instances(id) ON DELETE CASCADE,
            from_host TEXT NOT NULL,
            to_host TEXT NOT NULL,
            started_at_utc TEXT NOT NULL
        );
"""


# Where the console output of an instance's run ended when the API last rebooted it (a reset
# keeps the run, hence the output): the console endpoint answers what came after it. JSON
# {"run": ..., "size": ...} (host_adapters/guests/console.py ConsoleMark); NULL: from the start.
_M13_CONSOLE_SINCE = """
        ALTER TABLE instances ADD COLUMN console_since TEXT;
"""


# The last reconcile's report, whichever process ran it (`cloud-agent reconcile`, its
# timer, or `serve` at start): drift per kind, for the service's metrics (controller/monitoring/metrics.py).
_M14_RECONCILE_REPORT = """
        CREATE TABLE reconcile_runs (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            finished_at INTEGER NOT NULL,
            fix INTEGER NOT NULL
        );
        CREATE TABLE reconcile_drift (
            kind TEXT PRIMARY KEY,
            found INTEGER NOT NULL,
            remaining INTEGER NOT NULL
        );
"""


# Request ids (controller/audit/request_ids.py) on audit rows, and the instance history
# (controller/audit/history.py): no foreign key to instances, since the history outlives the
# instance for the audit retention; `owner_id` keeps whose it was, for its visibility.
_M15_INSTANCE_HISTORY = """
        ALTER TABLE audit ADD COLUMN request_id TEXT NOT NULL DEFAULT '';
        CREATE TABLE instance_actions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            instance_id TEXT NOT NULL,
            owner_id TEXT NOT NULL,
            action TEXT NOT NULL,
            requester TEXT,
            request_id TEXT NOT NULL,
            result TEXT NOT NULL CHECK (result IN ('success', 'error')),
            message TEXT NOT NULL DEFAULT '',
            at_utc TEXT NOT NULL
        );
        CREATE INDEX instance_actions_instance ON instance_actions(instance_id, id);
        CREATE INDEX instance_actions_at ON instance_actions(at_utc);
"""


# An instance being moved off a host that answers (`cloud-agent host drain`), a cold move: the
# row names the host it is on (the source until the target's copy is defined and checked,
# then the target); this record names the target, whose allocation counts it from the start
# (store._hosts), and the power state to give it there. Running drain again, or reconcile
# --fix, finishes a move cut short; the source's disk is removed only after the commit.
_M16_MOVES = """
        CREATE TABLE moves (
            instance_id TEXT PRIMARY KEY REFERENCES instances(id) ON DELETE CASCADE,
            from_host TEXT NOT NULL,
            to_host TEXT NOT NULL,
            was_running INTEGER NOT NULL,
            started_at_utc TEXT NOT NULL
        );
"""


# One claim per instance on its host state (controller/instances/instance_claims.py): whichever process
# moves, evacuates, powers, re-users or refreshes an instance's guest holds it while it works,
# taken by compare-and-set on this row. The holder is named by its process (pid, the kernel's
# start time of that pid, the machine's boot id) so that the claim of a process that died is
# known as stale and taken over or removed (reconcile --fix). `refresh_wanted`: a user
# change arrived while the claim was held; the holder rebuilds the guest before it lets go.
_M_INSTANCE_CLAIMS = """
        CREATE TABLE instance_claims (
            instance_id TEXT PRIMARY KEY REFERENCES instances(id) ON DELETE CASCADE,
            operation TEXT NOT NULL,
            token TEXT NOT NULL,
            pid INTEGER NOT NULL,
            proc_start TEXT NOT NULL,
            boot_id TEXT NOT NULL,
            machine TEXT NOT NULL,
            refresh_wanted INTEGER NOT NULL DEFAULT 0,
            claimed_at_utc TEXT NOT NULL
        );
"""
# Which libvirt each host record reaches (Hypervisor.identity: the host's UUID and its pool's),
# read at `host add` and before a drain. One libvirt is one record: a second one (another URI
# for the same daemon) would let a drain "clean" the target and destroy the instance itself.
# NULL: not read yet (records made before this); filled at the next add or drain.
_M_HOST_IDENTITY = """
        ALTER TABLE hosts ADD COLUMN host_uuid TEXT;
        ALTER TABLE hosts ADD COLUMN pool_uuid TEXT;
        CREATE UNIQUE INDEX hosts_host_uuid ON hosts(host_uuid) WHERE host_uuid IS NOT NULL;
        CREATE UNIQUE INDEX hosts_pool_uuid ON hosts(pool_uuid) WHERE pool_uuid IS NOT NULL;
"""
# The cloud portal's sessions (api/portal/): only a hash of the id the browser holds, so a
# copy of the database opens no session; `reveal_*` is a new API secret's show-once window
# (its hash only: the secret itself is the user's, stored encrypted in users).
_M_PORTAL_SESSIONS = """
        CREATE TABLE portal_sessions (
            id_hash TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
            created_at INTEGER NOT NULL,
            seen_at INTEGER NOT NULL,
            reveal_hash TEXT,
            reveal_until INTEGER
        );
        CREATE INDEX portal_sessions_user ON portal_sessions(user_id);
"""


# One cloud auth for several clusters: the controllers it serves (each with a secret kept
# as a hash), the accounts they registered, and the changes feed's outbox. The outbox is
# written by triggers in the transaction of each change, whatever code path made it, so a
# controller polling the feed misses none: a user's fields (never its password hash or
# secret), a system account here or at a controller, and a live token removed (a
# revocation, by its hash). The epoch names this database: a controller that last read
# another epoch starts again from a snapshot.
_NOW = "CAST(strftime('%s', 'now') AS INTEGER)"
_M_CLOUD_AUTH = f"""
        CREATE TABLE controllers (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            url TEXT NOT NULL,
            secret_hash TEXT NOT NULL,
            enabled INTEGER NOT NULL DEFAULT 1,
            created_at_utc TEXT NOT NULL,
            last_seen_utc TEXT
        );
        CREATE TABLE registered_accounts (
            controller_id INTEGER NOT NULL REFERENCES controllers(id) ON DELETE RESTRICT,
            username TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id) ON DELETE RESTRICT,
            uuid TEXT NOT NULL UNIQUE,
            uid INTEGER NOT NULL,
            created_at_utc TEXT NOT NULL,
            PRIMARY KEY (controller_id, username),
            UNIQUE (controller_id, user_id)
        );
        CREATE INDEX registered_accounts_user ON registered_accounts(user_id);
        CREATE TABLE auth_changes (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL CHECK (kind IN ('user', 'account', 'token')),
            key TEXT NOT NULL,
            at INTEGER NOT NULL
        );
        CREATE INDEX auth_changes_at ON auth_changes(at);
        CREATE TABLE auth_epoch (
            only INTEGER PRIMARY KEY CHECK (only = 1),
            epoch TEXT NOT NULL
        );
        INSERT INTO auth_epoch (only, epoch) VALUES (1, lower(hex(randomblob(16))));
        -- A controller following a cloud auth: where it stopped reading the feed.
        CREATE TABLE cloud_auth_follow (
            only INTEGER PRIMARY KEY CHECK (only = 1),
            epoch TEXT,
            seq INTEGER NOT NULL DEFAULT 0,
            last_good REAL
        );
        INSERT INTO cloud_auth_follow (only) VALUES (1);

        CREATE TRIGGER auth_changes_user_added AFTER INSERT ON users BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('user', NEW.id, {_NOW});
        END;
        CREATE TRIGGER auth_changes_user_changed AFTER UPDATE ON users
        WHEN OLD.email IS NOT NEW.email OR OLD.name IS NOT NEW.name OR OLD.active IS NOT NEW.active
          OR OLD.owner_userid IS NOT NEW.owner_userid OR OLD.roles IS NOT NEW.roles
          OR (OLD.api_secret_enc IS NULL) IS NOT (NEW.api_secret_enc IS NULL)
        BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('user', NEW.id, {_NOW});
        END;
        CREATE TRIGGER auth_changes_user_removed AFTER DELETE ON users BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('user', OLD.id, {_NOW});
        END;

        CREATE TRIGGER auth_changes_account_added AFTER INSERT ON system_accounts BEGIN
            INSERT INTO auth_changes (kind, key, at)
            VALUES ('account', NEW.cloud_controller_id || ':' || NEW.username, {_NOW});
        END;
        CREATE TRIGGER auth_changes_account_removed AFTER DELETE ON system_accounts BEGIN
            INSERT INTO auth_changes (kind, key, at)
            VALUES ('account', OLD.cloud_controller_id || ':' || OLD.username, {_NOW});
        END;
        CREATE TRIGGER auth_changes_registered_added AFTER INSERT ON registered_accounts BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('account', NEW.controller_id || ':' || NEW.username, {_NOW});
        END;
        CREATE TRIGGER auth_changes_registered_changed AFTER UPDATE ON registered_accounts BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('account', NEW.controller_id || ':' || NEW.username, {_NOW});
        END;
        CREATE TRIGGER auth_changes_registered_removed AFTER DELETE ON registered_accounts BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('account', OLD.controller_id || ':' || OLD.username, {_NOW});
        END;

        -- An expired token's removal (the purge) revokes nothing.
        CREATE TRIGGER auth_changes_token_removed AFTER DELETE ON tokens WHEN OLD.expires_at > {_NOW} BEGIN
            INSERT INTO auth_changes (kind, key, at) VALUES ('token', OLD.token_hash, {_NOW});
        END;
"""

# A controller's copy of the accounts cloud auth lists for its own cluster, kept from the
# feed, for reconcile to compare with the accounts recorded here.
_M_CLOUD_AUTH_REGISTRY = """
        CREATE TABLE cloud_auth_accounts (
            username TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            uuid TEXT NOT NULL,
            uid INTEGER NOT NULL
        );
"""

# A portal session's API token (for the clusters' pages at cloud auth), by its hash: the
# token ends with the session.
_M_PORTAL_TOKENS = """
        ALTER TABLE portal_sessions ADD COLUMN token_hash TEXT;
"""

# Instance leases (docs/leases.md): an instance's end, a flavor's own lease, and each warning,
# expiry and delete the sweep did, once per lease (the UNIQUE key), with its notification.
_M_LEASES = """
        ALTER TABLE instances ADD COLUMN expires_at TEXT;
        CREATE INDEX instances_expires ON instances(expires_at) WHERE expires_at IS NOT NULL;
        ALTER TABLE flavors ADD COLUMN lease_default_seconds INTEGER;
        ALTER TABLE flavors ADD COLUMN lease_max_seconds INTEGER;
        CREATE TABLE lease_events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            instance_id TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            event TEXT NOT NULL CHECK (event IN ('warning', 'expired', 'deleted')),
            -- A warning's distance before expiry, in seconds; 0 for the others.
            step INTEGER NOT NULL DEFAULT 0,
            -- The JSON object notify_command gets on stdin, made when the event happened.
            payload TEXT NOT NULL,
            at_utc TEXT NOT NULL,
            -- Set once notify_command took it (or when there is none).
            notified_at TEXT,
            -- A process running notify_command for it holds it until then.
            notifying_until TEXT,
            attempts INTEGER NOT NULL DEFAULT 0,
            UNIQUE (instance_id, expires_at, event, step)
        );
        CREATE INDEX lease_events_unnotified ON lease_events(id) WHERE notified_at IS NULL;
        CREATE INDEX lease_events_at ON lease_events(at_utc);
"""


MIGRATIONS = [
    _M1_USERS, _M2_CONTROLLER, _M3_AUDIT, _M4_INSTANCE_ADDRESSES, _M5_LIMITS, _M6_INTENT, _M7_AUTH_HARDENING,
    _M8_HOSTS, _M9_LIST_ORDER, _M10_LISTED_USERS, _M11_VOLUME_UID, _M12_EVACUATIONS, _M13_CONSOLE_SINCE,
    _M14_RECONCILE_REPORT, _M15_INSTANCE_HISTORY, _M16_MOVES, _M_INSTANCE_CLAIMS, _M_HOST_IDENTITY,
    _M_PORTAL_SESSIONS, _M_CLOUD_AUTH, _M_CLOUD_AUTH_REGISTRY,
    _M_PORTAL_TOKENS, _M_LEASES,
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> tuple[int, int]:
    """Apply pending migrations in one transaction each; return (before, after) versions."""
    before = conn.execute("PRAGMA user_version").fetchone()[0]
    if before > SCHEMA_VERSION:
        raise RuntimeError(
            f"database schema version {before} is newer than this code ({SCHEMA_VERSION})"
        )
    for version in range(before, SCHEMA_VERSION):
        # One script per migration, so the DDL and the version bump commit together
        # (executescript would commit any transaction opened outside it).
        try:
            conn.executescript(
                f"BEGIN IMMEDIATE;\n{MIGRATIONS[version]}\nPRAGMA user_version = {version + 1};\nCOMMIT;"
            )
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return before, SCHEMA_VERSION
