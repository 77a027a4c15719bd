"""Instance leases in the `cloud` command (docs/client.md): the EXPIRES column of `server list`,
the exact end in `server show`, `server renew [--hours H]` and `server create --lease H`.

The API on waitress in this process, on fake host adapters, with leases on (`[leases] default
= 36h`, `max = 7d`), driven through the installed `cloud` as a subprocess by the owner of the
instances (credentials from CC_* variables). The end of a lease is set through the service
itself where a test needs one (leases.admin_lease, or a past date in the store); what a
command did is read back from the store.
"""

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from agent.cloud.server_commands import expires_in
from api.app import create_app
from common.client import Server
from controller.instances import lease_terms, leases
from tests.api.test_controller_api import boot, ok, people  # noqa: F401 - people is a fixture
from tests.fixtures.api import config_values_for, give_volume
from tests.client.test_cloud_newcomer import _column, _field
from tests.fixtures.cloud import Cloud
from tests.fixtures.guest_e2e import served

DEFAULT_HOURS, MAX_HOURS = 36, 7 * 24
NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)


# -- the rule of the EXPIRES column (no service) --------------------------------------------------
def _at(**delta) -> str:
    return (NOW + timedelta(**delta)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(("expires_at", "lease", "shown"), [
    (None, "none", "-"),
    (None, None, "-"),
    (_at(hours=5), "expired", "expired"),  # the service's word wins over the client's clock
    (_at(hours=-1), "active", "expired"),  # and an end past by the client's clock is past
    (_at(seconds=0), "active", "expired"),
    (_at(seconds=20), "expiring", "in 1 min"),  # never "in 0 min"
    (_at(minutes=40), "expiring", "in 40 min"),
    (_at(minutes=119), "expiring", "in 119 min"),
    (_at(hours=2), "active", "in 2 h"),
    (_at(hours=36, seconds=-2), "active", "in 36 h"),  # a lease just renewed for 36 h
    (_at(hours=47, minutes=20), "active", "in 47 h"),
    (_at(hours=48), "active", "in 2 d"),
    (_at(days=3, hours=13), "active", "in 4 d"),
    (_at(days=400), "active", "in 400 d"),
    ("2026-12-01T12:00:00+00:00", "active", "in 2 h"),  # any RFC 3339 form
    ("not a date", "active", "not a date"),  # shown as it is
])
def test_expires_in_says_when_a_lease_ends_in_short(expires_at, lease, shown):
    assert expires_in(expires_at, lease, now=NOW) == shown


def test_a_server_object_without_lease_fields_has_no_lease():
    """An older service sends neither field: no end, lease "none" (and --json keeps its object)."""
    old = {"id": "i", "cloudauth-id": "u", "users": [], "server-image": "im", "server-flavor": "1",
           "creation-date": "2026-01-01T00:00:00Z", "status": "running"}
    s = Server.from_api(old)
    assert (s.expires_at, s.lease, s.raw) == (None, "none", old)
    s = Server.from_api({**old, "expires-at": "2026-12-03T10:00:00Z", "lease": "active"})
    assert (s.expires_at, s.lease) == ("2026-12-03T10:00:00Z", "active")


# -- against the service ----------------------------------------------------------------------------
@pytest.fixture
def config_values(tmp_path):
    values = config_values_for(tmp_path)
    values["leases"] = {"default": f"{DEFAULT_HOURS}h", "max": "7d"}
    return values


class Svc:
    def __init__(self, base: str, client, cctx, owner, catalog):
        self.base, self.client, self.ctx, self.owner, self.catalog = base, client, cctx, owner, catalog

    def create(self) -> dict:
        """A new instance of the owner's, through the API (leased for the default 36 h)."""
        return ok(boot(self.client, self.owner, self.catalog), 201)[0]

    def stored(self, instance_id: str) -> dict:
        [row] = [r for r in self.ctx.store.list_instances(visible_to=None) if r["id"] == instance_id]
        return row

    def ends_in(self, instance_id: str) -> float:
        """Seconds from now to the stored end of the instance's lease."""
        return lease_terms.seconds_of(self.stored(instance_id)["expires_at"]) - time.time()


@pytest.fixture
def svc(client, cctx, people, catalog):  # noqa: F811
    owner = people["owner"]
    give_volume(client, owner)
    with served(create_app(cctx)) as base:
        yield Svc(base, client, cctx, owner, catalog)


@pytest.fixture
def owner(svc, tmp_path):
    return Cloud(tmp_path / "owner", env={"CC_URL": svc.base, "CC_API_KEY": svc.owner.api_key,
                                           "CC_API_SECRET": svc.owner.api_secret})


def test_the_expires_column_shows_none_a_time_left_and_expired(svc, owner):
    default, none, short, long_, past = (svc.create() for _ in range(5))
    leases.admin_lease(svc.ctx, none["id"], hours=None)
    leases.admin_lease(svc.ctx, short["id"], hours=0.5)
    leases.admin_lease(svc.ctx, long_["id"], hours=100)
    assert svc.ctx.store.set_instance_lease(past["id"], "2020-01-01T00:00:00Z")

    table = owner.ok("server", "list")
    assert table.splitlines()[0].split() == ["ID", "HOSTNAME", "STATUS", "OWNER", "IMAGE", "FLAVOR", "PRIVATE-IP",
                                             "PUBLIC-IP", "CREATED", "EXPIRES"]
    assert _column(table, "EXPIRES", default["id"]) == "in 36 h"
    assert _column(table, "EXPIRES", none["id"]) == "-"
    assert _column(table, "EXPIRES", short["id"]) == "in 30 min"
    assert _column(table, "EXPIRES", long_["id"]) == "in 4 d"
    assert _column(table, "EXPIRES", past["id"]) == "expired"
    # What the table says is what the service holds, and --json is the service's objects.
    assert svc.stored(none["id"])["expires_at"] is None
    assert svc.stored(past["id"])["expires_at"] == "2020-01-01T00:00:00Z"
    assert abs(svc.ends_in(default["id"]) - DEFAULT_HOURS * 3600) < 60
    listed = {s["id"]: s for s in owner.ok("--json", "server", "list")}
    assert (listed[none["id"]]["expires-at"], listed[none["id"]]["lease"]) == (None, "none")
    assert (listed[past["id"]]["expires-at"], listed[past["id"]]["lease"]) == ("2020-01-01T00:00:00Z", "expired")
    assert listed[default["id"]]["expires-at"] == svc.stored(default["id"])["expires_at"]
    assert listed[default["id"]]["lease"] == "active"
    assert listed[short["id"]]["lease"] == "expiring"  # within the first warning (24 h) of its end


def test_show_prints_the_exact_end_and_the_lease_state(svc, owner):
    made, none = svc.create(), svc.create()
    leases.admin_lease(svc.ctx, none["id"], hours=None)
    end = svc.stored(made["id"])["expires_at"]
    shown = owner.ok("server", "show", made["hostname"])
    assert _field(shown, "expires-at") == f"{end} (in 36 h)" and _field(shown, "lease") == "active"
    assert f"hostname:   {made['hostname']}" in shown  # the fields stay aligned
    shown = owner.ok("server", "show", none["hostname"])
    assert _field(shown, "expires-at") == "-" and _field(shown, "lease") == "none"
    assert svc.ctx.store.set_instance_lease(made["id"], "2020-01-01T00:00:00Z")
    shown = owner.ok("server", "show", made["id"])
    assert _field(shown, "expires-at") == "2020-01-01T00:00:00Z (expired)" and _field(shown, "lease") == "expired"
    assert owner.ok("--json", "server", "show", made["hostname"])["expires-at"] == "2020-01-01T00:00:00Z"


def test_renew_with_hours_and_with_the_default(svc, owner):
    made = svc.create()
    host = made["hostname"]
    leases.admin_lease(svc.ctx, made["id"], hours=1)
    said = owner.ok("server", "renew", host, "--hours", "10").strip()
    end = svc.stored(made["id"])["expires_at"]
    assert said == f"{host} now ends at {end} (in 10 h)"
    assert abs(svc.ends_in(made["id"]) - 10 * 3600) < 60
    # Without --hours: the cluster's default lease again, from now.
    leases.admin_lease(svc.ctx, made["id"], hours=1)
    said = owner.ok("server", "renew", made["id"][:8]).strip()
    end = svc.stored(made["id"])["expires_at"]
    assert said == f"{host} now ends at {end} (in 36 h)"
    assert abs(svc.ends_in(made["id"]) - DEFAULT_HOURS * 3600) < 60
    # --json: the renewed object; a fraction of an hour is sent as it is.
    doc = owner.ok("--json", "server", "renew", host, "--hours", "1.5")
    assert doc["id"] == made["id"] and doc["expires-at"] == svc.stored(made["id"])["expires_at"]
    assert doc["lease"] == "expiring" and abs(svc.ends_in(made["id"]) - 1.5 * 3600) < 60
    # An expired one renewed is no longer expired.
    assert svc.ctx.store.set_instance_lease(made["id"], "2020-01-01T00:00:00Z")
    assert owner.ok("server", "renew", host, "--hours", "3").strip().endswith("(in 3 h)")
    assert abs(svc.ends_in(made["id"]) - 3 * 3600) < 60
    # Hours must be above 0: a usage error, nothing sent.
    before = svc.stored(made["id"])["expires_at"]
    proc = owner.run("server", "renew", host, "--hours", "0")
    assert proc.returncode == 2 and "--hours" in proc.stderr
    assert svc.stored(made["id"])["expires_at"] == before


def test_renew_beyond_the_max_says_the_services_message_and_changes_nothing(svc, owner):
    made = svc.create()
    before = svc.stored(made["id"])["expires_at"]
    message = f"hours 200 is beyond the longest lease allowed: {MAX_HOURS} hours ([leases] max)"
    assert owner.error("server", "renew", made["hostname"], "--hours", "200") == message
    proc = owner.run("--json", "server", "renew", made["hostname"], "--hours", "200")
    assert proc.returncode == 1 and json.loads(proc.stdout) == {"error": message, "status": 400}
    assert svc.stored(made["id"])["expires_at"] == before


def test_renew_with_leases_off_says_so(svc, owner):
    made = svc.create()
    leases.admin_lease(svc.ctx, made["id"], hours=None)
    svc.ctx.config = svc.ctx.config.with_values({"leases": {"default": "", "max": ""}})
    message = owner.error("server", "renew", made["hostname"], "--hours", "5")
    assert message.startswith("leases are off on this cluster: ")
    proc = owner.run("--json", "server", "renew", made["hostname"])
    assert proc.returncode == 1 and json.loads(proc.stdout) == {"error": message, "status": 409}
    assert svc.stored(made["id"])["expires_at"] is None
    assert _column(owner.ok("server", "list"), "EXPIRES", made["id"]) == "-"


def test_renew_names_only_a_server_the_caller_sees(svc, owner, people, tmp_path):  # noqa: F811
    made = svc.create()
    before = svc.stored(made["id"])["expires_at"]
    stranger = people["stranger"]
    other = Cloud(tmp_path / "stranger", env={"CC_URL": svc.base, "CC_API_KEY": stranger.api_key,
                                               "CC_API_SECRET": stranger.api_secret})
    assert other.error("server", "renew", made["id"], "--hours", "5") == (
        f"no server named {made['id']!r} that you can see")
    assert svc.stored(made["id"])["expires_at"] == before


def test_create_with_a_lease_ends_then(svc, owner):
    doc = owner.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small", "--lease", "2")
    assert abs(svc.ends_in(doc["id"]) - 2 * 3600) < 60
    # Within the first warning (24 h) of its end: expiring.
    assert doc["expires-at"] == svc.stored(doc["id"])["expires_at"] and doc["lease"] == "expiring"
    shown = owner.ok("server", "create", "--image", "Debian 12", "--flavor", "small", "--lease", "72")
    made_id = _field(shown, "id")
    assert abs(svc.ends_in(made_id) - 72 * 3600) < 60
    assert _field(shown, "expires-at") == f"{svc.stored(made_id)['expires_at']} (in 3 d)"
    assert _column(owner.ok("server", "list"), "EXPIRES", made_id) == "in 3 d"


def test_create_whose_lease_is_refused_still_made_the_server_and_says_so(svc, owner):
    def mine() -> set[str]:
        return {r["id"] for r in svc.ctx.store.list_instances(visible_to=None) if r["owner_id"] == svc.owner.id}

    before = mine()
    message = owner.error("server", "create", "--image", "Debian 12", "--flavor", "small", "--lease", "500")
    [made_id] = mine() - before
    row = svc.stored(made_id)
    assert message == (f"server {row['hostname']} ({made_id}) was created, but its lease was not renewed: "
                       f"hours 500 is beyond the longest lease allowed: {MAX_HOURS} hours ([leases] max); "
                       f"it ends at {row['expires_at']} (the default lease)")
    assert abs(svc.ends_in(made_id) - DEFAULT_HOURS * 3600) < 60  # the default lease, untouched
    # --json: the error with the server's id, status and end, for a script to go on with.
    proc = owner.run("--json", "server", "create", "--image", "Debian 12", "--flavor", "small", "--lease", "500")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    [second] = mine() - before - {made_id}
    assert set(doc) == {"error", "id", "status", "expires-at"}
    assert doc["id"] == second and doc["status"] == svc.stored(second)["status"]
    assert doc["expires-at"] == svc.stored(second)["expires_at"]
    assert doc["error"].startswith(f"server {svc.stored(second)['hostname']} ({second}) was created")
    # With leases off the create succeeds and the renewal is refused (409): the server has no end.
    svc.ctx.config = svc.ctx.config.with_values({"leases": {"default": "", "max": ""}})
    message = owner.error("server", "create", "--image", "Debian 12", "--flavor", "small", "--lease", "2")
    [third] = mine() - before - {made_id, second}
    assert message.startswith(f"server {svc.stored(third)['hostname']} ({third}) was created, but its lease was "
                              "not renewed: leases are off on this cluster: ")
    assert message.endswith("; it has no end") and svc.stored(third)["expires_at"] is None


def test_an_expired_server_cannot_be_started_until_renewed(svc, owner):
    made = svc.create()
    host = made["hostname"]
    assert owner.ok("--json", "server", "stop", host)["status"] == "shutoff"
    assert svc.ctx.store.set_instance_lease(made["id"], "2020-01-01T00:00:00Z")
    message = owner.error("server", "start", host)
    assert message == f"lease expired at 2020-01-01T00:00:00Z; renew it first (`cloud server renew {host}`)"
    assert svc.stored(made["id"])["status"] == "shutoff"
    owner.ok("server", "renew", host)
    assert owner.ok("server", "start", host).strip() == f"started {host}: running"
    assert svc.stored(made["id"])["status"] == "running"
