"""docs/api.md states every rule a user or admin needs, and its endpoint reference is the
OpenAPI document the service serves, written out: a path or method the service answers
that the page lacks, or a changed field or status, fails here."""

from pathlib import Path

from api.api_doc import generated_part, render
from tests.fixtures.api import adapters, cctx, client, config_values, ctx  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"


def test_every_path_and_method_the_service_serves_is_on_the_page(client):
    served = client.simulate_get("/v1/openapi.json")
    assert served.status_code == 200
    page = PAGE.read_text()
    missing = [f"{m.upper()} {p}" for p, ops in served.json["paths"].items() for m in ops
               if f"### `{m.upper()} {p}`" not in page]
    assert missing == []
    assert len(served.json["paths"]) >= 20


def test_the_endpoint_reference_is_the_served_document_written_out(client):
    served = client.simulate_get("/v1/openapi.json").json
    assert generated_part(PAGE.read_text()) == render(served), "run `python -m api.api_doc --write`"


def test_no_doc_cites_a_file_outside_the_repository():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert "CONTRACT.md" not in text and "cloud-controller-spec.md" not in text, doc.name
