"""Property-based requests generated from /v1/openapi.json against the whole app on fake adapters.

Every generated request must get an answer that is not a server error, with a
status code, content type and body the document describes. (Requests the
document allows but a business rule refuses, such as a weak password, are not
counted against the app.)
"""

import pathlib
import tempfile

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from controller.config import config_from_dict
from controller.context import build_context
from controller.security.crypto import generate_key_file
from controller.store import Store
from host_adapters.factory import fake_adapters
from tests.fixtures.api import config_values_for, enable, make_caller


def _app(tmp_path):
    config = config_from_dict(config_values_for(tmp_path))
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    ctx = build_context(config, store=store, adapters=fake_adapters())
    admin = make_caller(ctx, "admin@example.org", roles=("superuser",))
    enable(ctx, admin, username="ccadmin")
    return create_app(ctx), admin


# The schema must exist at collection time, so the app is built once at import,
# in a temporary folder removed when the test process exits.
_STATE = tempfile.TemporaryDirectory(prefix="openapi-fuzz-")
APP, ADMIN = _app(pathlib.Path(_STATE.name))
schema = schemathesis.openapi.from_wsgi("/v1/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_get_documented_answers(case):
    case.call_and_validate(
        headers={"X-Auth-Token": ADMIN.token, "X-Auth-Cloudauth-Id": ADMIN.id},
        # Headers: every answer's documented X-Request-Id (history and request ids, docs/api.md).
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
                response_headers_conformance],
    )
