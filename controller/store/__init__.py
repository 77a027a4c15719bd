"""All SQL of the project: one SQLite database reached through sqlite-utils.

One connection per thread (a sqlite3 connection belongs to the thread that
made it), WAL so readers never wait for the writer, foreign keys on, and write
transactions opened with BEGIN IMMEDIATE so a read-then-write never fails with
SQLITE_BUSY half way. Hot paths run prepared SQL; sqlite-utils serves schema
work and admin paths.

`Store` is the one object callers hold (`store.method(...)`); its methods live
in one module per family of tables, composed here: database.py (connections,
transactions, migrations), users.py, accounts.py, tokens.py (tokens and portal
sessions), images.py (images and flavors), instances.py (instances, their users
and claims), leases.py (leases and what the sweep did), hosts.py (hosts, moves, evacuations), volumes.py, groups.py,
limits.py, records.py (audit, instance history, reconcile report), cloud_auth.py
(the controllers a cloud auth serves, their accounts, the changes feed) and bulk.py
(the sandbox's bulk load). read_memo.py, write_mark.py and migrations.py serve
them all. The service imports `Store` and `utc_now` from here, never a family's
module. Imports only the kernel (errors, limits).
"""

from controller.store.accounts import AccountRows
from controller.store.bulk import BulkLoad
from controller.store.cloud_auth import CloudAuthRows, FollowRows
from controller.store.database import Database, utc_now
from controller.store.groups import GroupRows
from controller.store.hosts import HostRows
from controller.store.images import ImageRows
from controller.store.instances import InstanceRows
from controller.store.leases import LeaseRows
from controller.store.limits import LimitRows
from controller.store.records import RecordRows
from controller.store.tokens import TokenRows
from controller.store.users import UserRows
from controller.store.volumes import VolumeRows

__all__ = ["Store", "utc_now"]


class Store(Database, UserRows, AccountRows, TokenRows, ImageRows, InstanceRows, LeaseRows, HostRows, VolumeRows,
            GroupRows, LimitRows, RecordRows, CloudAuthRows, FollowRows, BulkLoad):
    """The database, with every family's reads and writes."""
