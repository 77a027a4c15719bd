"""GET /v1/server-instance/<id>/console on fake host adapters (the console, docs/api.md): the
output since the last start, `bytes`, `ready` from the seed's marker, reboots, visibility."""

import json

import pytest

from common.errors import HostUnreachable
from host_adapters.guests import seed as seeds
from host_adapters.guests.console import MAX_BYTES, ConsoleMark
from host_adapters.guests.guest import GuestSpec
from host_adapters.fake_hypervisor import FakeHypervisor
from tests.fixtures.api import give_volume
from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401  (fixture)


def console_of(client, caller, instance_id, query=None):
    return client.simulate_get(f"/v1/server-instance/{instance_id}/console", headers=caller.headers,
                               query_string=query)


@pytest.fixture
def running(client, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    return inst


def prints(adapters, instance_id, text: str) -> None:
    """What the guest writes on its serial port."""
    adapters.hypervisor.instances[instance_id].console += text.encode()


# -- the seed ----------------------------------------------------------------------------------
def test_the_seed_makes_cloud_init_print_the_ready_marker_naming_the_instance():
    docs = seeds.render("inst-1", GuestSpec(hostname="vm-1"))
    user_data = json.loads(docs["user-data"].split("\n", 1)[1])
    assert user_data["final_message"] == seeds.ready_marker("inst-1")
    assert "inst-1" in seeds.ready_marker("inst-1")
    assert seeds.ready_marker("inst-1") != seeds.ready_marker("inst-2")
    # cloud-init reads `$name` as a template variable: the marker has none.
    assert "$" not in user_data["final_message"]


# -- the answer --------------------------------------------------------------------------------
def test_console_answers_the_output_since_start_and_ready_once_the_marker_is_printed(client, adapters, people,
                                                                                     running):
    owner = people["owner"]
    [got] = ok(console_of(client, owner, running["id"]))
    assert got == {"console": f"fake firmware: booting {running['hostname']}\r\n", "ready": False}
    prints(adapters, running["id"], "Linux version 6.1\r\n")
    [got] = ok(console_of(client, owner, running["id"]))
    assert got["console"].endswith("Linux version 6.1\r\n") and got["ready"] is False
    prints(adapters, running["id"], seeds.ready_marker(running["id"]) + "\r\nlogin: ")
    [got] = ok(console_of(client, owner, running["id"]))
    assert got["ready"] is True and got["console"].endswith("login: ")


def test_another_instances_marker_is_not_ready(client, adapters, people, running):
    prints(adapters, running["id"], seeds.ready_marker("some-other-instance") + "\r\n")
    [got] = ok(console_of(client, people["owner"], running["id"]))
    assert got["ready"] is False


def test_bytes_takes_the_end_of_the_output_and_ready_looks_further_back(client, adapters, people, running):
    prints(adapters, running["id"], seeds.ready_marker(running["id"]) + "\r\n" + "x" * 5000 + "END")
    [got] = ok(console_of(client, people["owner"], running["id"], "bytes=10"))
    assert got == {"console": "x" * 7 + "END", "ready": True}
    [got] = ok(console_of(client, people["owner"], running["id"]))
    assert got["console"].startswith("fake firmware") and got["console"].endswith("END")


def test_a_read_is_one_call_to_the_host(client, adapters, people, running):
    before = adapters.hypervisor.host_calls
    ok(console_of(client, people["owner"], running["id"]))
    assert adapters.hypervisor.host_calls - before == 1, adapters.hypervisor.calls


def test_the_default_is_the_last_64_kib(client, adapters, people, running):
    prints(adapters, running["id"], "a" * 70000 + "b" * 65536)
    [got] = ok(console_of(client, people["owner"], running["id"]))
    assert got["console"] == "b" * 65536


def test_output_is_decoded_as_utf8_with_replacement(client, adapters, people, running):
    adapters.hypervisor.instances[running["id"]].console += b"caf\xc3\xa9 \xff\xfe end"
    [got] = ok(console_of(client, people["owner"], running["id"]))
    assert got["console"].endswith("café \ufffd\ufffd end")


@pytest.mark.parametrize("value", ["0", "-1", "1048577", "abc", "1.5", "", "99999999999999999999", "\u0665", " 5"])
def test_a_bad_bytes_is_400(client, adapters, people, running, value):
    calls = adapters.hypervisor.calls["console"]
    assert "bytes" in err(console_of(client, people["owner"], running["id"], f"bytes={value}"), 400)
    assert adapters.hypervisor.calls["console"] == calls  # refused before the host is asked


def test_bytes_given_twice_is_400(client, people, running):
    err(console_of(client, people["owner"], running["id"], "bytes=1&bytes=2"), 400)


def test_the_largest_bytes_is_1_mib(client, adapters, people, running):
    prints(adapters, running["id"], "z" * (MAX_BYTES + 10))
    [got] = ok(console_of(client, people["owner"], running["id"], f"bytes={MAX_BYTES}"))
    assert got["console"] == "z" * MAX_BYTES


# -- starts and reboots ------------------------------------------------------------------------
def task(client, caller, instance_id, what):
    return client.simulate_put(f"/v1/server-instance/{instance_id}", headers=caller.headers,
                               json={"task": {"what": what}})


def test_a_reboot_answers_only_what_came_after_it_and_clears_ready(client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    prints(adapters, iid, "first boot\r\n" + seeds.ready_marker(iid) + "\r\n")
    assert ok(console_of(client, owner, iid))[0]["ready"] is True
    ok(task(client, owner, iid, "reboot"))
    [got] = ok(console_of(client, owner, iid))
    # The fake's reset keeps the run: the output goes on, the answer starts at the reboot.
    assert "first boot" not in got["console"] and got["console"].startswith("fake firmware")
    assert got["ready"] is False
    prints(adapters, iid, "second boot\r\n" + seeds.ready_marker(iid) + "\r\n")
    [got] = ok(console_of(client, owner, iid))
    assert got["ready"] is True and "second boot" in got["console"]


def test_a_power_cycle_starts_the_output_afresh(client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    prints(adapters, iid, "first run\r\n" + seeds.ready_marker(iid) + "\r\n")
    ok(task(client, owner, iid, "power-off"))
    [got] = ok(console_of(client, owner, iid))
    assert "first run" in got["console"] and got["ready"] is False  # kept, but no guest runs
    ok(task(client, owner, iid, "power-on"))
    [got] = ok(console_of(client, owner, iid))
    assert got == {"console": f"fake firmware: booting {running['hostname']}\r\n", "ready": False}


def test_a_reboot_mark_of_an_earlier_run_counts_no_more(cctx, client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    prints(adapters, iid, "x" * 100)
    ok(task(client, owner, iid, "reboot"))
    ok(task(client, owner, iid, "power-off"))
    ok(task(client, owner, iid, "power-on"))
    [got] = ok(console_of(client, owner, iid))
    assert got["console"] == f"fake firmware: booting {running['hostname']}\r\n"


# -- who sees it, and hosts --------------------------------------------------------------------
def test_visible_exactly_to_those_who_see_the_instance(client, people, running):
    for name in ("owner", "admin", "managed", "stranger"):
        seen = client.simulate_get(f"/v1/server-instance/{running['id']}", headers=people[name].headers)
        console = console_of(client, people[name], running["id"])
        assert console.status_code == seen.status_code, name
    err(console_of(client, people["stranger"], running["id"]), 404)
    ok(console_of(client, people["admin"], running["id"]))
    err(console_of(client, people["owner"], "00000000-0000-0000-0000-000000000000"), 404)


def test_no_token_is_401(client, running):
    r = client.simulate_get(f"/v1/server-instance/{running['id']}/console")
    assert r.status_code == 401


def test_a_host_that_does_not_answer_is_503(client, adapters, people, running):
    adapters.hypervisor.fail_on["console"] = HostUnreachable("cannot connect to libvirt at fake host")
    err(console_of(client, people["owner"], running["id"]), 503)


def test_deleting_the_instance_deletes_its_console(client, adapters, people, running):
    ok(client.simulate_delete(f"/v1/server-instance/{running['id']}", headers=people["owner"].headers))
    assert adapters.hypervisor.console(running["id"], max_bytes=MAX_BYTES).data == b""
    err(console_of(client, people["owner"], running["id"]), 404)


# -- bounded reads -----------------------------------------------------------------------------
def streamed(adapters):
    """Count the bytes each console call brings from the host."""
    counts = []
    real = adapters.hypervisor.console

    def counting(instance_id, **kw):
        out = real(instance_id, **kw)
        counts.append(len(out.data))
        return out

    adapters.hypervisor.console = counting
    return counts


def test_a_small_read_streams_what_it_answers_and_new_output_once(client, adapters, people, running):
    prints(adapters, running["id"], "boot\r\n" * 100_000 + seeds.ready_marker(running["id"]) + "\r\n")
    counts = streamed(adapters)
    [got] = ok(console_of(client, people["owner"], running["id"], "bytes=1"))
    assert got == {"console": "\n", "ready": True}
    assert sum(counts) < 800_000  # what was printed, once (the 1 MiB bound of old: each read)
    for _ in range(5):
        counts.clear()
        [got] = ok(console_of(client, people["owner"], running["id"], "bytes=1"))
        assert got == {"console": "\n", "ready": True} and counts == [1]
    # New output is looked through once, not the whole again; a marker cut by two reads is found.
    prints(adapters, running["id"], "x" * 5000)
    counts.clear()
    ok(console_of(client, people["owner"], running["id"], "bytes=1"))
    assert sum(counts) <= 1 + 5000


def test_ready_is_found_across_two_reads_that_cut_the_marker(client, adapters, people, running):
    marker = seeds.ready_marker(running["id"])
    prints(adapters, running["id"], "y" * 3000 + marker[:5])
    assert ok(console_of(client, people["owner"], running["id"], "bytes=1"))[0]["ready"] is False
    prints(adapters, running["id"], marker[5:] + "\r\n" + "z" * 3000)
    assert ok(console_of(client, people["owner"], running["id"], "bytes=1"))[0]["ready"] is True


def test_console_reads_in_flight_are_bounded_per_user(client, adapters, people, running):
    import threading

    from controller.instances import console as console_service

    release, entered = threading.Event(), threading.Semaphore(0)
    real = adapters.hypervisor.console

    def slow(instance_id, **kw):
        entered.release()
        assert release.wait(10)
        return real(instance_id, **kw)

    adapters.hypervisor.console = slow
    answers = []
    readers = [threading.Thread(target=lambda: answers.append(console_of(client, people["owner"], running["id"])))
               for _ in range(console_service.READS_PER_USER)]
    for t in readers:
        t.start()
    for _ in readers:
        assert entered.acquire(timeout=10)
    try:
        refused = console_of(client, people["owner"], running["id"])
        assert refused.status_code == 429 and refused.headers.get("Retry-After") == "1"
        assert "console reads" in refused.json["msg"]
    finally:
        release.set()
        for t in readers:
            t.join(10)
    assert [a.status_code for a in answers] == [200] * console_service.READS_PER_USER
    ok(console_of(client, people["owner"], running["id"]))  # the slots are free again


# -- the fake adapter --------------------------------------------------------------------------
def test_fake_console_validates_its_arguments():
    from common.errors import InvalidInput

    hv = FakeHypervisor()
    for bad in (-1, MAX_BYTES + 1, True, "10"):
        with pytest.raises(InvalidInput):
            hv.console("i1", max_bytes=bad)
    with pytest.raises(InvalidInput):
        hv.console("../x", max_bytes=1)
    assert hv.console("i1", max_bytes=10).data == b"" and hv.console("i1", max_bytes=10).mark is None


def test_fake_console_since_a_mark_of_this_run():
    hv = FakeHypervisor()
    hv.base_images["b"] = 1
    hv.spawn("i1", base_image="b", vcpu=1, memory_mb=64, disk_gb=1, guest=GuestSpec(hostname="h"))
    first = hv.console("i1", max_bytes=0)
    assert first.data == b"" and first.mark.size == len(b"fake firmware: booting h\r\n")
    hv.instances["i1"].console += b"more"
    assert hv.console("i1", max_bytes=100, since=first.mark).data == b"more"
    assert hv.console("i1", max_bytes=2, since=first.mark).data == b"re"
    other = ConsoleMark(run="another run", size=first.mark.size)
    assert hv.console("i1", max_bytes=100, since=other).data == b"fake firmware: booting h\r\nmore"
