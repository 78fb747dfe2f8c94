"""Fuzz the live API from its own OpenAPI document (schemathesis): no 5xx, no response off its schema.

Every operation of the document gets a bounded number of generated requests
(valid and invalid), sent over real HTTP with the token to a server on an
ephemeral port that holds an agent and a waiting task. Every default
schemathesis check applies: server errors, undocumented status codes or
content types, responses that do not match their schema, invalid data
accepted, auth ignored. The document the cases are generated from is the
app's own; a test checks it is byte for byte what the live server serves.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from apollia_nb.api.app import create_app
from apollia_nb.api.idempotency import parse_key
from apollia_nb.api.server import ServerThread
from apollia_nb.errors import BadInput
from runtime_helpers import call, manifest

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

DOCUMENT = create_app(None, token=TOKEN).openapi()
# The token through schemathesis's own auth, so its negative cases may still leave it out.
CONFIG = SchemathesisConfig.from_str(f'[auth.openapi.bearerToken]\nbearer = "{TOKEN}"\n')
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    with ServerThread(root / "home", token=TOKEN) as srv:
        with httpx.Client(base_url=srv.url + "/api/v1", headers=AUTH) as api:
            writer = manifest(actor=[{"tool_calls": [call("write_file", path="f.txt", content="x")]}],
                              workspace=str(root / "workspace"))
            api.post("/agents", json={"manifest": writer}).raise_for_status()
            sub = api.post("/tasks", json={"agent": "clerk", "goal": "Write"}).json()
            assert api.get(f"/tasks/{sub['id']}/wait").json()["status"] == "waiting"
        with requests.Session() as session:
            yield srv, session


def test_the_fuzzed_document_is_the_one_the_live_server_serves(live):
    srv, _ = live
    assert httpx.get(srv.url + "/api/v1/openapi.json").json() == DOCUMENT


@schema.parametrize()
@settings(max_examples=20, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error_or_a_response_off_its_schema(case, live):
    srv, session = live
    excluded = []
    if (case.method, case.path) == ("POST", "/api/v1/agents"):
        # A manifest is TOML text with rules of its own: most schema-valid strings are not manifests,
        # and the server rightly answers 422 MANIFEST_INVALID.
        excluded.append(positive_data_acceptance)
    if case.path.startswith("/api/v1/internal/"):
        # A home's clients speak these: their bodies carry meaning a schema cannot state (SQL text, a seq
        # within the journal, a checkpoint the server signed, an identity that must match the agent's), so
        # most schema-valid values are rightly 422 BAD_INPUT; never a 5xx, never off the schema.
        excluded.append(positive_data_acceptance)
    key = (case.headers or {}).get("Idempotency-Key")
    if key is not None and _valid_key(key):
        # A key names one request, and keeping keys unique is the client's part: a generated key used
        # again with another body is rightly 422 IDEMPOTENCY_KEY_REUSED.
        case.headers["Idempotency-Key"] = uuid.uuid4().hex
    case.call_and_validate(base_url=srv.url, session=session, timeout=30, excluded_checks=excluded)


def _valid_key(key: str) -> bool:
    try:
        return parse_key([key]) is not None
    except BadInput:
        return False
