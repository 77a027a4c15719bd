"""`cloud-agent user apply`: a user's changes reach its running guests now (issue 16, finding 9).

The real `cloud-agent` in a subprocess, against libvirt's test driver served by a
private libvirtd (so the domains the API made in this process are the agent's too):
bob is deactivated, and the command power-cycles exactly the running instances his
account has access to (a new domain id each), after asking on a terminal.
"""

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pexpect
import pytest

from tests.agent.test_agent_controller import BOB_EMAIL, USER_PASSWORD, Sandbox, add_image, login, make_sandbox
from tests.fixtures.agent import AGENT

CAROL_EMAIL = "carol@example.org"

# useradd and usermod act in the sandbox's scratch system root.
pytestmark = pytest.mark.real_commands


@dataclass
class Setup:
    sandbox: Sandbox
    conn: object  # a libvirt connection to the daemon: keeps its state and reads the domains
    own: str  # bob's instance
    granted: str  # carol's instance bob has access to
    other: str  # carol's instance without bob

    def domain(self, instance_id: str):
        return self.conn.lookupByName(f"cc-{instance_id}")

    def ids(self) -> dict[str, int]:
        return {i: self.domain(i).ID() for i in (self.own, self.granted, self.other)}

    def share_tags(self, instance_id: str, *, live: bool) -> list[str]:
        import libvirt

        xml = self.domain(instance_id).XMLDesc(0 if live else libvirt.VIR_DOMAIN_XML_INACTIVE)
        return sorted(t.get("dir") for t in ET.fromstring(xml).findall("devices/filesystem/target"))


@pytest.fixture
def setup(tmp_path, test_driver_daemon) -> Setup:
    import libvirt

    sandbox = make_sandbox(tmp_path)
    config = open(sandbox.config).read().replace("uri = test:///default", f"uri = {test_driver_daemon.uri}")
    open(sandbox.config, "w").write(config)
    conn = libvirt.open(test_driver_daemon.uri)
    api = sandbox.api()
    api.create_user(CAROL_EMAIL)
    sandbox.ok("account", "enable", BOB_EMAIL, "--username", "bob")
    carol_account = sandbox.ok("account", "enable", CAROL_EMAIL, "--username", "carol")
    image = add_image(sandbox)
    flavor = sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
    bob = login(api.client, {"email": BOB_EMAIL, "password": USER_PASSWORD})
    carol = login(api.client, {"email": CAROL_EMAIL, "password": USER_PASSWORD})
    bob_uuid = sandbox.rows("SELECT uuid FROM system_accounts WHERE username = 'bob'")[0]["uuid"]
    assert carol_account["uuid"] != bob_uuid

    api.create_volume(bob)
    api.create_volume(carol)

    def create(headers, users=()):
        r = api.client.simulate_post("/v1/server-instance", headers=headers, json={
            "server-image": image["id"], "server-flavor": flavor["id"]})
        assert r.status_code == 201, r.text
        instance_id = r.json["data"][0]["id"]
        if users:  # granted by the superuser (carol has no authority over bob)
            task = {"task": {"what": "modify-users", "how": "add", "users": list(users)}}
            r = api.client.simulate_put(f"/v1/server-instance/{instance_id}", headers=api.headers, json=task)
            assert r.status_code == 200, r.text
            api.client.simulate_put(f"/v1/server-instance/{instance_id}", headers=api.headers,
                                    json={"task": {"what": "reboot"}})  # the share reaches the running guest
        return instance_id

    made = Setup(sandbox, conn, own=create(bob), granted=create(carol, [bob_uuid]), other=create(carol))
    assert made.share_tags(made.granted, live=True) == ["bob", "carol"]
    # bob is deactivated: his shares leave the definitions at once, the running guests keep them.
    r = api.client.simulate_post(f"/v1/user/update/{bob['X-Auth-Cloudauth-Id']}", headers=api.headers,
                                 json={"active": 0})
    assert r.status_code == 200, r.text
    assert made.share_tags(made.granted, live=False) == ["carol"]
    assert made.share_tags(made.granted, live=True) == ["bob", "carol"]
    yield made
    conn.close()


def test_apply_power_cycles_the_running_instances_of_the_user_and_says_which(setup):
    before = setup.ids()
    out = setup.sandbox.ok("user", "apply", BOB_EMAIL, "--yes")
    cycled = sorted([setup.own, setup.granted])
    assert out["email"] == BOB_EMAIL
    assert [(i["id"], i["cycled"], i["status"]) for i in out["instances"]] == [(i, True, "running") for i in cycled]
    after = setup.ids()
    assert all(after[i] != before[i] for i in cycled)  # a new QEMU process: a new domain id
    assert after[setup.other] == before[setup.other]
    # The running guest now has only what its definition has: no share of bob's home.
    assert setup.share_tags(setup.granted, live=True) == ["carol"]
    assert setup.share_tags(setup.own, live=True) == []
    rows = setup.sandbox.rows("SELECT action, result FROM audit WHERE action = 'cloud-agent user apply'")
    assert rows == [{"action": "cloud-agent user apply", "result": "ok"}]


def test_apply_human_output_names_each_instance(setup):
    proc = setup.sandbox.run("user", "apply", BOB_EMAIL, "--yes")
    assert proc.returncode == 0, proc.stderr
    for instance_id in (setup.own, setup.granted):
        assert f"({instance_id}) on default: power-cycled, running" in proc.stdout
    assert setup.other not in proc.stdout


def test_apply_off_a_terminal_needs_yes_and_changes_nothing(setup):
    before = setup.ids()
    proc = setup.sandbox.run("user", "apply", BOB_EMAIL)
    assert proc.returncode == 2
    assert proc.stderr == "error: not on a terminal: add --yes to confirm\n" and proc.stdout == ""
    proc = setup.sandbox.run("user", "apply", BOB_EMAIL, input="y\n")
    assert proc.returncode == 2
    assert setup.ids() == before
    assert setup.share_tags(setup.own, live=True) == ["bob"]


def _spawn(setup, *args):
    env = dict(os.environ, CLOUD_CONTROLLER_CONFIG=setup.sandbox.config)
    return pexpect.spawn(str(AGENT), list(args), env=env, timeout=60, encoding="utf-8", dimensions=(24, 400))


@pytest.mark.parametrize("answer, cycled", [("n", False), ("", False), ("y", True)])
def test_apply_on_a_terminal_asks_first(setup, answer, cycled):
    before = setup.ids()
    child = _spawn(setup, "user", "apply", BOB_EMAIL)
    child.expect_exact(f"Power-cycle 2 running server-instance(s) of {BOB_EMAIL} now: ")
    child.expect_exact("? Their users lose unsaved work. [y/N]: ")
    assert setup.own in child.before and setup.granted in child.before and setup.other not in child.before
    child.sendline(answer)
    child.expect(pexpect.EOF)
    child.close()
    assert "Traceback" not in child.before
    after = setup.ids()
    if cycled:
        assert child.exitstatus == 0 and "power-cycled" in child.before
        assert after[setup.own] != before[setup.own] and after[setup.granted] != before[setup.granted]
    else:
        assert child.exitstatus == 1 and "error: aborted: nothing was changed" in child.before
        assert after[setup.own] == before[setup.own] and after[setup.granted] == before[setup.granted]
    assert after[setup.other] == before[setup.other]
