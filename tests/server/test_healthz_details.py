"""GET /healthz is anonymous: it names failed checks and nothing more (issue 8, finding 11).

The details (paths, LDAP and libvirt errors) are for the admin: `cloud-agent check` prints
them and the service log records them.
"""

import logging

from controller.errors import HostUnavailable
from controller.monitoring.health import monitor_of, run_checks

LDAP_DETAIL = "LDAP bind to ldap://10.1.2.3:389/ as cn=admin,dc=corp,dc=example refused: Invalid credentials"
PATH_DETAIL = "home_root /srv/cluster/homes does not exist"


def test_anonymous_healthz_names_failed_checks_only(client, adapters, caplog):
    adapters.directory.fail_on["check"] = HostUnavailable(LDAP_DETAIL)
    adapters.homes.fail_on["check"] = HostUnavailable(PATH_DETAIL)
    with caplog.at_level(logging.WARNING, logger="api.health_resource"):
        r = client.simulate_get("/healthz")
    assert r.status_code == 503
    assert r.json == {"status": "unavailable", "failed": [{"check": "directory"}, {"check": "quota_backend"}]}
    for secret in ("10.1.2.3", "cn=admin", "Invalid credentials", "/srv/cluster"):
        assert secret not in r.text
    # The operator still finds out why, in the log and from the agent's check.
    assert LDAP_DETAIL in caplog.text and PATH_DETAIL in caplog.text


def test_the_agent_check_keeps_the_details(cctx, adapters):
    adapters.directory.fail_on["check"] = HostUnavailable(LDAP_DETAIL)
    failed = {c["name"]: c["detail"] for c in run_checks(cctx) if not c["ok"]}
    assert failed == {"directory": LDAP_DETAIL}


def test_a_failure_is_logged_once_not_at_every_probe(cctx, client, adapters, caplog):
    adapters.directory.fail_on["check"] = HostUnavailable(LDAP_DETAIL)
    with caplog.at_level(logging.WARNING, logger="api.health_resource"):
        for _ in range(3):
            assert client.simulate_get("/healthz").status_code == 503
            monitor_of(cctx).refresh_now()  # a new round of checks, as the refresher runs them
    assert caplog.text.count(LDAP_DETAIL) == 1
