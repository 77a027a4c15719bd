"""A controller registers the accounts it makes at cloud auth (`PUT` / `DELETE
/v1/auth/accounts/N/USERNAME`), its own N only: usernames are unique per cluster, the same
username may be another user's on another cluster, and cloud auth's user view lists a
user's accounts on every cluster."""

import pytest
from falcon import testing

from controller.cloud_auth import registry
from tests.fixtures.api import enable, make_caller, user_envelope

UUIDS = [f"6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c{i:02d}" for i in range(20)]


@pytest.fixture
def app_client(cctx):
    from api.app import create_app

    return testing.TestClient(create_app(cctx, interfaces=("controller", "user")))


@pytest.fixture
def hpcs(ctx):
    return [registry.add_controller(ctx, controller_id=n, name=f"hpc{n}", url=f"https://hpc{n}.example.org")
            for n in (2, 3)]


def put(client, made, n, username, body):
    return client.simulate_put(f"/v1/auth/accounts/{n}/{username}", json=body,
                               headers={"Authorization": f"Controller {made['id']}:{made['secret']}"})


def delete(client, made, n, username):
    return client.simulate_delete(f"/v1/auth/accounts/{n}/{username}",
                                  headers={"Authorization": f"Controller {made['id']}:{made['secret']}"})


def test_register_is_unique_per_cluster_and_idempotent(ctx, app_client, hpcs):
    hpc2, hpc3 = hpcs
    alice, bob = make_caller(ctx, "alice@example.org"), make_caller(ctx, "bob@example.org")
    body = {"user_id": alice.id, "uuid": UUIDS[0], "uid": 20001}
    got = user_envelope(put(app_client, hpc2, 2, "alice", body), 200, data=True)
    assert got == {"controller_id": 2, "username": "alice", "user_id": alice.id, "uuid": UUIDS[0], "uid": 20001}
    assert user_envelope(put(app_client, hpc2, 2, "alice", body), 200, data=True) == got  # the same again
    # Another user, the same name on this cluster: 409; on another cluster: theirs.
    r = put(app_client, hpc2, 2, "alice", {"user_id": bob.id, "uuid": UUIDS[1], "uid": 20002})
    user_envelope(r, 409)
    assert "another user" in r.json["message"]
    user_envelope(put(app_client, hpc3, 3, "alice", {"user_id": bob.id, "uuid": UUIDS[2], "uid": 20001}), 200,
                  data=True)
    # The same user, a second name on one cluster: 409; the same name with another account id: 409.
    user_envelope(put(app_client, hpc2, 2, "alice2", {"user_id": alice.id, "uuid": UUIDS[3], "uid": 20003}), 409)
    user_envelope(put(app_client, hpc2, 2, "alice", {"user_id": alice.id, "uuid": UUIDS[4], "uid": 20001}), 409)
    # Another controller's N: 403, nothing made.
    user_envelope(put(app_client, hpc3, 2, "bob", {"user_id": bob.id, "uuid": UUIDS[5], "uid": 20005}), 403)
    user_envelope(delete(app_client, hpc3, 2, "alice"), 403)
    assert [(a["controller_id"], a["username"]) for a in ctx.store.registered_accounts_of_users([bob.id])[bob.id]] \
        == [(3, "alice")]
    # Cloud auth's user view lists every cluster's account.
    view = user_envelope(app_client.simulate_get(f"/v1/user/view/{alice.id}", headers=alice.headers), 200,
                         data=True)["user"]
    assert [(a["cloud_controller_id"], a["username"], a["uuid"]) for a in view["system_accounts"]] == \
        [(2, "alice", UUIDS[0])]
    assert isinstance(view["system_accounts"][0]["id"], int)
    # Removed: 200 with what was removed; again: 404.
    assert user_envelope(delete(app_client, hpc2, 2, "alice"), 200, data=True) == got
    user_envelope(delete(app_client, hpc2, 2, "alice"), 404)


def test_this_nodes_own_accounts_and_registered_ones_are_listed_together(ctx, cctx, app_client, hpcs):
    alice = make_caller(ctx, "alice@example.org")
    own = enable(ctx, alice, "alice")
    put(app_client, hpcs[0], 2, "alice", {"user_id": alice.id, "uuid": UUIDS[0], "uid": 20001})
    view = user_envelope(app_client.simulate_get(f"/v1/user/view/{alice.id}", headers=alice.headers), 200,
                         data=True)["user"]
    assert [(a["cloud_controller_id"], a["username"]) for a in view["system_accounts"]] == \
        [(ctx.config.controller.id, "alice"), (2, "alice")]
    assert own["uuid"] in {a["uuid"] for a in view["system_accounts"]}


@pytest.mark.parametrize("body,status", [
    ({"uuid": UUIDS[0], "uid": 20001}, 404),  # no user
    ({"user_id": "00000000-0000-4000-8000-000000000000", "uuid": UUIDS[0], "uid": 20001}, 404),
    ({"user_id": "USER", "uuid": "not-a-uuid", "uid": 20001}, 400),
    ({"user_id": "USER", "uuid": UUIDS[0], "uid": 0}, 400),
    ({"user_id": "USER", "uuid": UUIDS[0], "uid": "20001"}, 400),
    ({"user_id": "USER", "uuid": UUIDS[0], "uid": True}, 400),
])
def test_bad_registrations(ctx, app_client, hpcs, body, status):
    alice = make_caller(ctx, "alice@example.org")
    body = {k: (alice.id if v == "USER" else v) for k, v in body.items()}
    user_envelope(put(app_client, hpcs[0], 2, "alice", body), status)
    assert ctx.store.registered_accounts_of_users([alice.id])[alice.id] == []


@pytest.mark.parametrize("username", ["Alice", "a;b", "1abc", "a" * 33, "-x"])
def test_a_username_no_system_allows_is_a_400(ctx, app_client, hpcs, username):
    alice = make_caller(ctx, "alice@example.org")
    user_envelope(put(app_client, hpcs[0], 2, username, {"user_id": alice.id, "uuid": UUIDS[0], "uid": 20001}), 400)


def test_an_inactive_user_gets_no_account(ctx, app_client, hpcs):
    alice = make_caller(ctx, "alice@example.org", active=0)
    user_envelope(put(app_client, hpcs[0], 2, "alice", {"user_id": alice.id, "uuid": UUIDS[0], "uid": 20001}), 404)


def test_a_user_with_an_account_on_any_cluster_is_not_deleted(ctx, app_client, hpcs):
    admin = make_caller(ctx, "admin@example.org", roles=("superuser",))
    alice = make_caller(ctx, "alice@example.org")
    put(app_client, hpcs[0], 2, "alice", {"user_id": alice.id, "uuid": UUIDS[0], "uid": 20001})
    r = app_client.simulate_post("/v1/user/delete/alice@example.org", headers=admin.headers)
    user_envelope(r, 409)
    assert ctx.store.get_user(alice.id) is not None
