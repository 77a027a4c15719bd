"""The sandbox's bulk load (agent/sandbox_load.py): many rows of several tables at once."""

import json

from controller.store.accounts import INSERT_ACCOUNT
from controller.store.groups import INSERT_GROUP, INSERT_MEMBER
from controller.store.instances import INSERT_INSTANCE, INSERT_INSTANCE_USER
from controller.store.users import INSERT_USER
from controller.store.volumes import INSERT_VOLUME


class BulkLoad:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def insert_loaded(self, *, users: list[dict], accounts: list[dict], volumes: list[dict], groups: list[dict],
                      members: list[tuple[str, str, int]], instances: list[dict],
                      instance_users: list[tuple[str, str]]) -> None:
        """The rows of a bulk load, in one transaction: all of them or none. The caller made
        them valid; the schema's UNIQUE and foreign keys still refuse a clash (IntegrityError)."""
        with self.write() as conn:
            conn.executemany(INSERT_USER, [dict(u, roles=json.dumps(sorted(u["roles"]))) for u in users])
            conn.executemany(INSERT_ACCOUNT, accounts)
            conn.executemany(INSERT_VOLUME, [dict(v, state="ready") for v in volumes])
            conn.executemany(INSERT_GROUP, [dict(g, state="ready") for g in groups])
            conn.executemany(INSERT_MEMBER, members)
            conn.executemany(INSERT_INSTANCE, [{"expires_at": None, **i, "intent": None} for i in instances])
            conn.executemany(INSERT_INSTANCE_USER, instance_users)
