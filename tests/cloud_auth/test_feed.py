"""The changes feed a controller's replica follows (`GET /v1/auth/changes?since=SEQ`): every
change to users, accounts and live tokens is in it, written in the change's own transaction
(whatever made it), and a controller that is behind, ahead or on another database starts
again from a snapshot. Nothing secret is ever in it."""

import json
import re
import time

import pytest

from controller.auth.tokens import issue_token
from controller.cloud_auth import feed
from controller.security.crypto import token_hash
from controller.users import users
from tests.fixtures.api import PASSWORD, make_caller, user_envelope


class Replica:
    """What a controller does with the feed, in a few lines: follow it and keep what it says."""

    def __init__(self, client, made):
        self.client, self.headers = client, {"Authorization": f"Controller {made['id']}:{made['secret']}"}
        self.epoch, self.seq = "", 0
        self.users, self.accounts, self.revoked, self.pages = {}, {}, set(), []

    def page(self, **params) -> dict:
        r = self.client.simulate_get("/v1/auth/changes", headers=self.headers,
                                     params={k: str(v) for k, v in params.items() if v is not None})
        got = user_envelope(r, 200, data=True)
        assert set(got) == {"epoch", "seq", "reset", "more", "next", "users", "accounts", "revocations"}
        self.pages.append(r.text)
        return got

    def poll(self) -> dict:
        got = self.page(since=self.seq, epoch=self.epoch or None)
        if got["reset"]:
            self.users, self.accounts, self.revoked = {}, {}, set()
            first_seq = got["seq"]
            while True:
                self._apply(got)
                if not got["more"]:
                    break
                got = self.page(since=0, after=got["next"])
            self.epoch, self.seq = got["epoch"], first_seq
            return got
        self._apply(got)
        self.seq = got["seq"]
        while got["more"]:
            got = self.page(since=self.seq, epoch=self.epoch)
            self._apply(got)
            self.seq = got["seq"]
        return got

    def _apply(self, got):
        for u in got["users"]:
            if u.get("deleted"):
                self.users.pop(u["id"], None)
            else:
                self.users[u["id"]] = u
        for a in got["accounts"]:
            key = (a["controller_id"], a["username"])
            if a.get("deleted"):
                self.accounts.pop(key, None)
            else:
                self.accounts[key] = a
        self.revoked |= {r["token_hash"] for r in got["revocations"]}


def test_a_snapshot_then_every_kind_of_change(ctx, app_client, hpc):
    admin = make_caller(ctx, "admin@example.org", roles=("superuser",))
    alice = make_caller(ctx, "alice@example.org")
    replica = Replica(app_client, hpc)
    first = replica.poll()
    assert first["reset"] is True and first["epoch"] == ctx.store.feed_epoch()
    assert set(replica.users) == {admin.id, alice.id}
    assert replica.users[alice.id] == {
        "id": alice.id, "email": "alice@example.org", "name": "", "active": 1, "owner_userid": None, "roles": [],
        "api_secret_set": True, "created_at": ctx.store.get_user(alice.id)["created_at_utc"]}
    assert replica.poll()["reset"] is False  # caught up: an empty page, no reset
    assert replica.pages[-1] and json.loads(replica.pages[-1])["data"]["users"] == []

    # A new user, managed by alice.
    bob = make_caller(ctx, "bob@example.org", owner=alice)
    replica.poll()
    assert replica.users[bob.id]["owner_userid"] == alice.id
    # A role granted and revoked.
    users.change_role(ctx, "bob@example.org", "superuser", grant=True)
    replica.poll()
    assert replica.users[bob.id]["roles"] == ["superuser"]
    # A password login's token, then the password set: that token revoked, the key's kept.
    by_password = issue_token(ctx, email="bob@example.org", password=PASSWORD)["token"]
    users.admin_set_password(ctx, ctx.store.get_user(bob.id), PASSWORD + "-new")
    replica.poll()
    assert token_hash(by_password) in replica.revoked and token_hash(bob.token) not in replica.revoked
    # The API secret reset: the key's tokens revoked.
    users.admin_api_secret(ctx, ctx.store.get_user(bob.id), reset=True)
    replica.poll()
    assert token_hash(bob.token) in replica.revoked
    # Deactivated: the user says so, and alice's tokens are revoked.
    ctx.store.update_user(alice.id, {"active": 0})
    replica.poll()
    assert replica.users[alice.id]["active"] == 0 and token_hash(alice.token) in replica.revoked
    # A null secret shuts a user out: api_secret_set false.
    ctx.store.set_api_secret(admin.id, None)
    replica.poll()
    assert replica.users[admin.id]["api_secret_set"] is False and token_hash(admin.token) in replica.revoked
    # Registered accounts come and go; this node's own accounts are in it too.
    ctx.store.register_account(controller_id=2, username="bob", user_id=bob.id,
                               uuid="6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11", uid=20001, now="2026-12-02T00:00:00Z")
    replica.poll()
    assert replica.accounts[(2, "bob")] == {"controller_id": 2, "username": "bob", "user_id": bob.id,
                                            "uuid": "6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11", "uid": 20001}
    ctx.store.unregister_account(controller_id=2, username="bob")
    replica.poll()
    assert (2, "bob") not in replica.accounts
    # Deleted: gone from the replica.
    carol = make_caller(ctx, "carol@example.org")
    replica.poll()
    ctx.store.delete_user(carol.id)
    replica.poll()
    assert carol.id not in replica.users
    # What a fresh snapshot holds is what the changes made of the replica.
    fresh = Replica(app_client, hpc)
    fresh.poll()
    assert fresh.users == replica.users and fresh.accounts == replica.accounts


def test_an_expired_tokens_purge_revokes_nothing(ctx, app_client, hpc):
    make_caller(ctx, "alice@example.org")
    replica = Replica(app_client, hpc)
    replica.poll()
    with ctx.store.write() as conn:  # the token's time is over
        conn.execute("UPDATE tokens SET expires_at = ?", (int(time.time()) - 1,))
    assert ctx.store.purge_expired_tokens(now=int(time.time())) == 1
    assert replica.poll()["revocations"] == [] and ctx.store.feed_bounds()[1] == replica.seq


def test_changes_come_in_pages(ctx, app_client, hpc, monkeypatch):
    replica = Replica(app_client, hpc)
    replica.poll()
    monkeypatch.setattr(feed, "PAGE", 3)
    made = [make_caller(ctx, f"u{i}@example.org").id for i in range(8)]
    got = replica.page(since=replica.seq, epoch=replica.epoch)
    assert got["more"] is True and len(got["users"]) <= 3
    replica.poll()
    assert set(made) <= set(replica.users) and replica.seq == ctx.store.feed_bounds()[1]


def test_a_snapshot_comes_in_pages(ctx, app_client, hpc, monkeypatch):
    monkeypatch.setattr(feed, "SNAPSHOT_PAGE", 2)
    made = {make_caller(ctx, f"u{i}@example.org").id for i in range(5)}
    for i, user_id in enumerate(sorted(made)[:3]):
        ctx.store.register_account(controller_id=2, username=f"u{i}", user_id=user_id,
                                   uuid=f"6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c1{i}", uid=20001 + i, now="x")
    replica = Replica(app_client, hpc)
    replica.poll()
    assert set(replica.users) == made and len(replica.accounts) == 3
    assert len(replica.pages) == 3 + 2  # users 2+2+1, accounts 2+1


@pytest.mark.parametrize("why", ["another epoch", "ahead", "too old"])
def test_a_controller_behind_ahead_or_elsewhere_gets_a_snapshot(ctx, app_client, hpc, why):
    alice = make_caller(ctx, "alice@example.org")
    replica = Replica(app_client, hpc)
    replica.poll()
    for i in range(3):
        make_caller(ctx, f"u{i}@example.org")
    if why == "another epoch":
        replica.epoch = "0" * 32
    elif why == "ahead":  # a cloud auth restored from an older backup
        replica.seq = ctx.store.feed_bounds()[1] + 5
    else:
        with ctx.store.write() as conn:
            conn.execute("UPDATE auth_changes SET at = 0 WHERE seq <= ?", (replica.seq + 2,))
        assert ctx.store.prune_feed(before=1) >= 2
    replica.users.pop(alice.id)  # what a snapshot must bring back
    got = replica.poll()
    assert got["reset"] is True and alice.id in replica.users and len(replica.users) == 4


def test_bad_input_is_a_400(app_client, hpc):
    headers = {"Authorization": f"Controller 2:{hpc['secret']}"}
    for params in ({"since": "-1"}, {"since": "x"}, {"since": "1" * 30}, {"since": "0", "after": "other:x"}):
        user_envelope(app_client.simulate_get("/v1/auth/changes", headers=headers, params=params), 400)


def test_no_secret_ever_in_the_feed(ctx, app_client, hpc):
    admin = make_caller(ctx, "admin@example.org", roles=("superuser",))
    alice = make_caller(ctx, "alice@example.org", owner=admin)
    by_password = issue_token(ctx, email="alice@example.org", password=PASSWORD)["token"]
    replica = Replica(app_client, hpc)
    replica.poll()
    users.admin_set_password(ctx, ctx.store.get_user(alice.id), PASSWORD + "-new")
    secret = users.admin_api_secret(ctx, ctx.store.get_user(alice.id), reset=True)
    replica.poll()
    text = "\n".join(replica.pages)
    row = ctx.store.get_user(alice.id)
    for value in (alice.token, by_password, alice.api_secret, secret, PASSWORD, row["password_hash"],
                  row["api_secret_enc"], row["api_key"], hpc["secret"]):
        assert value not in text
    assert not re.search(r"\$argon2", text) and "password" not in text and "api_key" not in text


def test_a_snapshot_of_a_database_with_no_change_yet_is_not_taken_again(ctx, app_client, hpc):
    replica = Replica(app_client, hpc)
    first = replica.poll()
    assert first["reset"] is True and first["seq"] == 0 and replica.users == {}
    assert replica.poll()["reset"] is False
    alice = make_caller(ctx, "alice@example.org")
    got = replica.poll()
    assert got["reset"] is False and alice.id in replica.users
