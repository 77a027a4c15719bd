"""Bad input to the user interface: always the envelope with the right 4xx, never a 500."""

import json
from urllib.parse import urlencode

import pytest

from tests.fixtures.api import PASSWORD, make_caller, user_envelope

# Every endpoint, called by POST (which all of them accept); {id} and {email} name a real user.
ENDPOINTS = [
    "/v1/auth/token",
    "/v1/user/list",
    "/v1/user/view/{id}",
    "/v1/user/create",
    "/v1/user/update/{id}",
    "/v1/user/search",
    "/v1/user/set_password/{id}",
    "/v1/user/view_api_secret/{id}",
    "/v1/user/reset_api_secret/{id}",
    "/v1/user/delete/{email}",
]
JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def target(ctx, admin):
    return make_caller(ctx, "target@example.org")


def url(path: str, target) -> str:
    return path.format(id=target.id, email=target.email)


def snapshot(ctx) -> list[dict]:
    """The users table as stored, to prove a refused request changed nothing."""
    return [dict(r) for r in ctx.store.conn.execute("SELECT * FROM users ORDER BY id").fetchall()]


def post(client, caller, path, *, body=None, json_body=None, headers=None):
    sent = dict(caller.headers)
    sent.update(headers or {})
    return client.simulate_post(path, headers=sent, body=body, json=json_body)


# -- bodies that are not a JSON object ------------------------------------------
def bodies(content_type: dict | None, rows: dict[str, tuple[bytes, str]]) -> list:
    """One case per row, `id: (body, what the message names)`, sent with `content_type`."""
    return [pytest.param(raw, content_type, message, id=name) for name, (raw, message) in rows.items()]


BAD_BODIES = bodies(JSON, {
    "truncated": (b'{"email": ', "malformed JSON"),
    "single-quotes": (b"{'email': 'a@example.org'}", "malformed JSON"),
    "trailing-comma": (b'{"a": 1,}', "malformed JSON"),
    "array": (b'[{"email": "a@example.org"}]', "JSON object"),
    "string": (b'"a string"', "JSON object"),
    "number": (b"42", "JSON object"),
    "null": (b"null", "JSON object"),
    "bool": (b"true", "JSON object"),
    "not-utf8": (b'{"name": "\xff\xfe"}', "UTF-8"),
    "deep-nesting": (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
    "lone-surrogate": (b'{"email": "\\ud800@example.org", "name": "\\udfff"}', "surrogate"),
}) + bodies(None, {
    "truncated-untyped": (b'{"email": ', "malformed JSON"),
}) + bodies(FORM, {
    "json-labelled-form": (b'{"email": ', "malformed JSON"),
    "array-as-form": (b"[1, 2]", "form"),
    "form-without-values": (b"email&password", "form"),
    "form-not-utf8": (b"name=\xff", "form"),
})


@pytest.mark.parametrize("raw, content_type, message", BAD_BODIES)
@pytest.mark.parametrize("path", ENDPOINTS)
def test_bodies_that_are_not_an_object_are_400(ctx, user_client, admin, target, path, raw, content_type, message):
    before = snapshot(ctx)
    resp = post(user_client, admin, url(path, target), body=raw, headers=content_type)
    user_envelope(resp, 400)
    assert message in resp.json["message"]
    assert snapshot(ctx) == before


@pytest.mark.parametrize("content_type", [
    "text/plain", "multipart/form-data; boundary=x", "application/xml", "application/octet-stream", "text/json",
])
@pytest.mark.parametrize("path", ENDPOINTS)
def test_unknown_content_type_is_415(ctx, user_client, admin, target, path, content_type):
    before = snapshot(ctx)
    resp = post(user_client, admin, url(path, target), body=b'{"name": "x"}', headers={"Content-Type": content_type})
    user_envelope(resp, 415)
    assert content_type.split(";")[0] in resp.json["message"]
    assert snapshot(ctx) == before


@pytest.mark.parametrize("content_type", [
    "application/json; charset=utf-8", "application/vnd.api+json", "APPLICATION/JSON",
])
def test_json_content_type_variants_are_accepted(ctx, user_client, admin, content_type):
    resp = post(user_client, admin, "/v1/user/create", headers={"Content-Type": content_type},
                body=json.dumps({"email": "v@example.org", "password": PASSWORD}).encode())
    user_envelope(resp, 200, data=True)
    assert ctx.store.get_user_by_email("v@example.org") is not None


@pytest.mark.parametrize("path", ENDPOINTS)
def test_oversize_body_is_413(ctx, user_client, admin, target, path):
    limit = ctx.config.server.max_body_bytes
    body = json.dumps({"name": "x" * limit}).encode()
    before = snapshot(ctx)
    resp = post(user_client, admin, url(path, target), body=body, headers=JSON)
    user_envelope(resp, 413)
    assert snapshot(ctx) == before


def test_body_at_the_limit_is_read(ctx, user_client, admin, target):
    limit = ctx.config.server.max_body_bytes
    # Names are bounded (255 characters): an unknown parameter, which is ignored, fills the body.
    head = json.dumps({"name": "Target", "padding": ""}).encode()
    body = json.dumps({"name": "Target", "padding": "x" * (limit - len(head))}).encode()
    assert len(body) == limit
    resp = post(user_client, admin, f"/v1/user/update/{target.id}", body=body, headers=JSON)
    user_envelope(resp, 200)
    assert ctx.store.get_user(target.id)["name"] == "Target"


def test_body_limit_comes_from_config(ctx, admin):
    from falcon import testing

    from api.app import create_app

    ctx.config = ctx.config.with_values({"server": {"max_body_bytes": "100"}})
    client = testing.TestClient(create_app(ctx, interfaces=("user",)))
    user_envelope(post(client, admin, "/v1/user/list", body=b'{"a": "' + b"x" * 100 + b'"}', headers=JSON), 413)
    user_envelope(post(client, admin, "/v1/user/list", body=b'{"a": "' + b"x" * 80 + b'"}', headers=JSON), 200,
                  data=True)


# -- wrong types and values ---------------------------------------------------
WRONG_VALUES = [
    ("/v1/user/create", {"email": 5, "password": PASSWORD}, "email"),
    ("/v1/user/create", {"email": ["a@example.org"], "password": PASSWORD}, "email"),
    ("/v1/user/create", {"email": "n@example.org", "password": 12345678901234567}, "password"),
    ("/v1/user/create", {"email": "n@example.org", "password": [PASSWORD]}, "password"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "name": {"first": "a"}}, "name"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "name": 7}, "name"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "owner_userid": 5}, "owner_userid"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "owner_userid": "nope"}, "owner_userid"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "registration_source": []},
     "registration_source"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": "yes"}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": True}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": 1.5}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": "1.0"}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": "\u00b2"}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": "--1"}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": "-"}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": -1}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": 10**30}, "active"),
    ("/v1/user/create", {"email": "n@example.org", "password": PASSWORD, "active": [1]}, "active"),
    ("/v1/user/create", {"password": PASSWORD}, "email"),
    ("/v1/user/create", {"email": "n@example.org"}, "password"),
    ("/v1/user/create", {"email": "", "password": PASSWORD}, "email"),
    ("/v1/user/create", {"email": "n@example.org", "password": ""}, "password"),
    ("/v1/user/update/{id}", {"email": []}, "email"),
    ("/v1/user/update/{id}", {"email": ""}, "email"),
    ("/v1/user/update/{id}", {"name": 5}, "name"),
    ("/v1/user/update/{id}", {"name": None, "active": "x"}, "active"),
    ("/v1/user/update/{id}", {"active": -3}, "active"),
    ("/v1/user/update/{id}", {"active": -(2**70)}, "active"),
    ("/v1/user/update/{id}", {"active": {}}, "active"),
    ("/v1/user/set_password/{id}", {}, "password"),
    ("/v1/user/set_password/{id}", {"password": 12345678901234567}, "password"),
    ("/v1/user/search", {}, "email or username"),
    ("/v1/user/search", {"email": 5}, "email"),
    ("/v1/user/search", {"username": ["a"]}, "username"),
    ("/v1/user/list", {"owner_userid": "not-a-uuid"}, "owner_userid"),
    ("/v1/user/list", {"owner_userid": 12}, "owner_userid"),
    ("/v1/user/list", {"registration_source": 1}, "registration_source"),
]


@pytest.mark.parametrize("path, body, word", WRONG_VALUES)
def test_wrong_types_and_values_are_400(ctx, user_client, admin, target, path, body, word):
    before = snapshot(ctx)
    resp = post(user_client, admin, url(path, target), json_body=body)
    user_envelope(resp, 400)
    assert word in resp.json["message"]
    assert snapshot(ctx) == before


@pytest.mark.parametrize("query", [
    "owner_userid=nope", "owner_userid=", "registration_source=a&owner_userid=x",
])
def test_bad_query_values_are_400(user_client, admin, query):
    user_envelope(user_client.simulate_get("/v1/user/list", headers=admin.headers, query_string=query), 400)


@pytest.mark.parametrize("query", ["email=%FF%FE", "email=%ED%A0%80", "username=%00", "email=a&email=b"])
def test_odd_query_strings_are_harmless(user_client, admin, query):
    resp = user_client.simulate_get("/v1/user/search", headers=admin.headers, query_string=query)
    assert user_envelope(resp, 200, data=True) == {"total": 0, "users": []}


# -- form bodies --------------------------------------------------------------
def test_form_body_creates_a_user(ctx, user_client, admin):
    resp = post(user_client, admin, "/v1/user/create", headers=FORM,
                body=f"email=f%2Btag%40example.org&password={PASSWORD}&name=Form+User&active=0".encode())
    userid = user_envelope(resp, 200, data=True)["userid"]
    row = ctx.store.get_user(userid)
    assert (row["email"], row["name"], row["active"]) == ("f+tag@example.org", "Form User", 0)


def test_form_body_wrong_values_are_400(ctx, user_client, admin):
    resp = post(user_client, admin, "/v1/user/create", headers=FORM,
                body=f"email=x%40example.org&password={PASSWORD}&active=abc".encode())
    user_envelope(resp, 400)
    assert ctx.store.get_user_by_email("x@example.org") is None


def test_json_sent_as_form_is_read_as_json(ctx, user_client, admin):
    # What `curl -d '{...}'` sends.
    resp = post(user_client, admin, "/v1/user/create", headers=FORM,
                body=json.dumps({"email": "c@example.org", "password": PASSWORD}).encode())
    user_envelope(resp, 200, data=True)


def test_body_overrides_query_string(ctx, user_client, admin, target):
    resp = user_client.simulate_post(f"/v1/user/update/{target.id}?name=fromquery", headers=admin.headers,
                                     json={"name": "frombody"})
    user_envelope(resp, 200)
    assert ctx.store.get_user(target.id)["name"] == "frombody"


# -- ids in the path ----------------------------------------------------------
NOT_UUIDS = [
    "not-a-uuid", "123", "0", "{id_braces}", "{id_nodash}", "{id}x", "%20{id}",
    "00000000-0000-0000-0000-00000000000g", "..%2Flist", "%00",
]


@pytest.mark.parametrize("bad", NOT_UUIDS)
@pytest.mark.parametrize("path", [
    "/v1/user/view/{}", "/v1/user/update/{}", "/v1/user/set_password/{}",
    "/v1/user/view_api_secret/{}", "/v1/user/reset_api_secret/{}",
])
def test_non_uuid_ids_are_404(ctx, user_client, admin, target, path, bad):
    bad = bad.format(id=target.id, id_braces="%7B" + target.id + "%7D",
                     id_nodash=target.id.replace("-", ""))
    before = snapshot(ctx)
    resp = post(user_client, admin, path.format(bad), json_body={"password": "Valid-password-1", "name": "x"})
    user_envelope(resp, 404)
    assert snapshot(ctx) == before


def test_upper_case_ids_name_the_same_user(ctx, user_client, admin, target):
    # UUIDs compare case-insensitively (RFC 4122).
    resp = user_client.simulate_get(f"/v1/user/view/{target.id.upper()}", headers=admin.headers)
    assert user_envelope(resp, 200, data=True)["user"]["id"] == target.id


@pytest.mark.parametrize("email", ["nobody@example.org", "not-an-email", "%00", "a%40b"])
def test_delete_of_unknown_email_is_404(user_client, admin, email):
    user_envelope(post(user_client, admin, f"/v1/user/delete/{email}"), 404)


# -- emails -------------------------------------------------------------------
BAD_EMAILS = [
    "plain", "a@b", "a@@example.org", "a b@example.org", "a@example..org", "@example.org", "a@",
    "a@-example.org", "a@example-.org", "a@.example.org", "a@example.org.", "a@exa mple.org",
    "a@example.org\n", " a@example.org", "\u00fc@example.org", "a@ex\u00e4mple.org", "a\x00@example.org",
    "a@example.org,b@example.org", "<a@example.org>", "x" * 250 + "@example.org",
    "a@" + "b" * 64 + ".org",
]


@pytest.mark.parametrize("email", BAD_EMAILS)
def test_bad_emails_are_400(ctx, user_client, admin, target, email):
    before = snapshot(ctx)
    resp = post(user_client, admin, "/v1/user/create", json_body={"email": email, "password": PASSWORD})
    user_envelope(resp, 400)
    assert "email" in resp.json["message"]
    resp = post(user_client, admin, f"/v1/user/update/{target.id}", json_body={"email": email})
    user_envelope(resp, 400)
    assert snapshot(ctx) == before


@pytest.mark.parametrize("email", [
    "a@example.org", "first.last+tag@sub.example.co.uk", "o'neil@example.org", "x@a-b.example", "A_B@EXAMPLE.ORG",
])
def test_good_emails_are_accepted(ctx, user_client, admin, email):
    resp = post(user_client, admin, "/v1/user/create", json_body={"email": email, "password": PASSWORD})
    userid = user_envelope(resp, 200, data=True)["userid"]
    assert ctx.store.get_user(userid)["email"] == email


@pytest.mark.parametrize("existing, new", [
    ("dup@example.org", "dup@example.org"),
    ("dup@example.org", "DUP@Example.ORG"),
    ("Dup@Example.org", "dup@example.org"),
])
def test_duplicate_email_is_409_case_insensitive(ctx, user_client, admin, existing, new):
    make_caller(ctx, existing)
    before = snapshot(ctx)
    resp = post(user_client, admin, "/v1/user/create", json_body={"email": new, "password": PASSWORD})
    user_envelope(resp, 409)
    assert "email" in resp.json["message"]
    other = make_caller(ctx, "other@example.org")
    resp = post(user_client, admin, f"/v1/user/update/{other.id}", json_body={"email": new})
    user_envelope(resp, 409)
    assert ctx.store.get_user(other.id)["email"] == "other@example.org"
    assert len(snapshot(ctx)) == len(before) + 1


def test_changing_only_the_case_of_ones_own_email_is_fine(ctx, user_client, target):
    resp = post(user_client, target, f"/v1/user/update/{target.id}", json_body={"email": "TARGET@example.org"})
    user_envelope(resp, 200)
    assert ctx.store.get_user(target.id)["email"] == "TARGET@example.org"


# -- the password rule --------------------------------------------------------
PASSWORDS = [
    ("Abcdefghijk1!", 400),                 # 13
    ("Abcdefghijkl1", 400),                 # 13, two classes
    ("Abcdefghijkl12", 200),                # 14
    ("abcdefghijklmnopqrstuvw1", 200),      # 24
    ("abcdefghijklmnopqrstuvwx1", 400),     # 25
    ("a" * 40 + "1", 400),
    ("abcdefghijklmnop", 400),              # letters only
    ("ABCDEFGHIJKLMNOP", 400),
    ("12345678901234567", 400),             # digits only
    ("!@#$%^&*()_+-=[]{}", 400),            # punctuation only
    ("abcdefg hijklmnop", 400),             # letters and a space: one class
    ("abcdefghijklmn!", 200),               # letters + punctuation
    ("1234567890123!", 200),                # digits + punctuation
    ("abcdefghijklm1", 200),                # letters + digits
    ("\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u00e9\u00e9t\u00e97", 200),  # non-ASCII letters count as letters
    ("abcdefghijklm\t1", 400),              # control character
    ("abcdefghijklm\x001", 400),
    ("", 400),
    (" " * 16, 400),
]


@pytest.mark.parametrize("password, status", PASSWORDS)
def test_password_rule_on_create(ctx, user_client, admin, password, status):
    resp = post(user_client, admin, "/v1/user/create", json_body={"email": "p@example.org", "password": password})
    user_envelope(resp, status, data=True)
    row = ctx.store.get_user_by_email("p@example.org")
    if status == 200:
        assert ctx.passwords.verify(row["password_hash"], password)
    else:
        assert row is None
        assert "password" in resp.json["message"]


@pytest.mark.parametrize("password, status", PASSWORDS)
def test_password_rule_on_set_password(ctx, user_client, admin, target, password, status):
    resp = post(user_client, admin, f"/v1/user/set_password/{target.id}", json_body={"password": password})
    user_envelope(resp, status)
    assert ctx.passwords.verify(ctx.store.get_user(target.id)["password_hash"], password if status == 200 else PASSWORD)


# -- paths and methods --------------------------------------------------------
@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/user/nope"),
    ("POST", "/v1/user/nope"),
    ("POST", "/v1/user"),
    ("GET", "/v1/user/view"),
    ("GET", "/v1/user/view/"),
    ("POST", "/v1/user/delete"),
    ("POST", "/v1/user/view/{id}/extra"),
    ("POST", "/v1/auth/nope"),
    ("POST", "/v2/user/list"),
])
def test_unknown_path_is_404(user_client, admin, target, method, path):
    resp = user_client.simulate_request(method, url(path, target), headers=admin.headers)
    assert resp.status_code == 404
    if path.startswith(("/v1/user", "/v1/auth")):
        user_envelope(resp, 404)
    else:
        assert resp.json["success"] is False


@pytest.mark.parametrize("method, path, allowed", [
    ("GET", "/v1/user/create", {"POST"}),
    ("PUT", "/v1/user/create", {"POST"}),
    ("GET", "/v1/user/update/{id}", {"POST"}),
    ("GET", "/v1/user/set_password/{id}", {"POST"}),
    ("GET", "/v1/user/reset_api_secret/{id}", {"POST"}),
    ("GET", "/v1/user/delete/{email}", {"POST"}),
    ("DELETE", "/v1/user/delete/{email}", {"POST"}),
    ("PUT", "/v1/user/list", {"GET", "POST"}),
    ("DELETE", "/v1/user/view/{id}", {"GET", "POST"}),
    ("PATCH", "/v1/user/update/{id}", {"POST"}),
    ("PUT", "/v1/user/view_api_secret/{id}", {"GET", "POST"}),
    ("DELETE", "/v1/user/search", {"GET", "POST"}),
    ("GET", "/v1/auth/token", {"POST"}),
    ("PUT", "/v1/auth/token", {"POST"}),
])
def test_wrong_method_is_405_with_allow(ctx, user_client, admin, target, method, path, allowed):
    before = snapshot(ctx)
    resp = user_client.simulate_request(method, url(path, target), headers=admin.headers)
    user_envelope(resp, 405)
    listed = {m.strip() for m in resp.headers["Allow"].split(",")}
    assert listed - {"OPTIONS"} == allowed
    assert snapshot(ctx) == before


# -- a sweep: any value of any parameter on any endpoint ---------------------------
ODD_VALUES = [None, True, False, 0, -1, 1.5, 10**40, "", " ", "x" * 5000, [], [1], {}, {"a": 1}, "\x00", "\u2028",
              "0", "false", "null", "\U0001f600" * 10, "../../etc/passwd", "'; DROP TABLE users; --"]
PARAMS = ["email", "password", "name", "owner_userid", "active", "registration_source", "show_inactive",
          "username", "set_to_null", "api_key", "api_secret"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_any_value_of_any_parameter_is_answered_in_the_envelope(ctx, user_client, admin, path):
    target = make_caller(ctx, "sweep-target@example.org")
    for name in PARAMS:
        for value in ODD_VALUES:
            if ctx.store.get_user(target.id) is None:  # a delete succeeded
                target = make_caller(ctx, "sweep-target@example.org")
            body = {"email": "sweep@example.org", "password": PASSWORD, name: value}
            if path == "/v1/auth/token":
                body = {name: value}
            resp = post(user_client, admin, url(path, target), json_body=body)
            assert resp.status_code in (200, 400, 401, 403, 404, 409), (name, value, resp.text)
            assert resp.json["success"] is (resp.status_code == 200)
            assert resp.json["version"] == "1"
            ctx.store.conn.execute("DELETE FROM users WHERE email = 'sweep@example.org'")
    assert ctx.store.get_user(admin.id) is not None


# -- numbers: ASCII digits, their length bounded before int() (issue 16, finding 14) ---------
# Python's int() refuses over 4,300 digits with a ValueError (a 500 before the permission
# check), takes other scripts' digits ("\u0661" is 1, fullwidth "\uff11" too), and
# str.isdigit() passes superscripts that int() then refuses.
LONG_DIGITS = "1" * 5000
NOT_ASCII_DIGITS = ["\u00b9", "\u00b2\u00b3", "\u0661", "\uff11", "\u0967", "\U0001d7cf", "1\u0660"]


@pytest.mark.parametrize("value, word", [(LONG_DIGITS, "out of range"), ("-" + LONG_DIGITS, "out of range"),
                                         ("9" * 20, "out of range")]
                         + [(v, "must be an integer") for v in NOT_ASCII_DIGITS])
@pytest.mark.parametrize("sent_as", ["json", "form", "query"])
@pytest.mark.parametrize("who", ["superuser", "the user itself"])
def test_long_or_non_ascii_integers_are_400(ctx, user_client, admin, target, value, word, sent_as, who):
    caller = admin if who == "superuser" else target
    path = f"/v1/user/update/{target.id}"
    before = snapshot(ctx)
    if sent_as == "json":
        resp = post(user_client, caller, path, json_body={"active": value})
    elif sent_as == "form":
        resp = post(user_client, caller, path, headers=FORM, body=urlencode({"active": value}).encode())
    else:
        resp = user_client.simulate_post(path, headers=caller.headers, query_string=urlencode({"active": value}))
    user_envelope(resp, 400)
    assert word in resp.json["message"] and "active" in resp.json["message"], resp.json
    assert snapshot(ctx) == before


def test_an_integer_literal_of_5000_digits_is_400_in_plain_words(ctx, user_client, admin, target):
    before = snapshot(ctx)
    resp = post(user_client, target, f"/v1/user/update/{target.id}", headers=JSON,
                body=b'{"active": ' + LONG_DIGITS.encode() + b"}")
    user_envelope(resp, 400)
    assert "integer of 5000 characters" in resp.json["message"]
    assert "sys." not in resp.json["message"]  # no word of Python's own settings
    assert snapshot(ctx) == before


def test_ascii_digits_still_set_active(ctx, user_client, admin, target):
    for sent, stored in ((" 0 ", 0), ("1", 1), ("00", 0)):
        user_envelope(post(user_client, admin, f"/v1/user/update/{target.id}", headers=FORM,
                           body=urlencode({"active": sent}).encode()), 200)
        assert ctx.store.get_user(target.id)["active"] == stored
