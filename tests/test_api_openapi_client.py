"""The OpenAPI document is valid OpenAPI 3.1 and usable by a standard generator.

The document is fetched from a live server on 127.0.0.1 without a token (as
the document says, so a generator can), checked with ``openapi-spec-validator``,
and turned into a client by ``openapi-python-client``; that generated client
then registers an agent, submits a task, answers its pending decision, waits
for it to complete and reads its event stream, against the same server.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import httpx
import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from apollia_nb.api.server import ServerThread
from runtime_helpers import call, manifest

TOKEN = "generated-client-token"


def writer(workspace) -> str:
    return manifest(actor=[{"tool_calls": [call("write_file", path="report.txt", content="ok")]}, {"text": "Filed."}],
                    workspace=str(workspace))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("openapi")
    with ServerThread(root / "home", token=TOKEN) as srv:
        srv.workspace = root / "workspace"
        yield srv


#: POST routes that take no Idempotency-Key, each for a reason the docs give: a replay changes nothing;
#: another agent's tool sends its hook input as it is (no key, and each call is decided afresh); an answer
#: holding a person's token is never stored for a replay (adding someone twice is refused, revoking twice
#: changes nothing more).
UNKEYED_POSTS = {"/api/v1/audit/replay/{run_id}", "/api/v1/hooks/{tool}", "/api/v1/people",
                 "/api/v1/people/{name}/revoke", "/api/v1/people/{name}/rotate"}


def test_the_served_document_is_valid_openapi_3_1_and_needs_no_token(live):
    served = httpx.get(live.url + "/api/v1/openapi.json")
    assert served.status_code == 200
    doc = served.json()
    assert doc["openapi"].startswith("3.1.")
    validate(doc)  # raises on any error
    assert "/api/v1/openapi.json" in doc["info"]["description"] and "without a token" in doc["info"]["description"]
    assert httpx.get(live.url + "/api/v1/docs").status_code == 200  # the browsable form, as the document says
    assert httpx.get(live.url + "/api/v1/agents").status_code == 401  # the API itself does need it
    for path, item in doc["paths"].items():
        for method, op in item.items():
            stream = op["responses"].get("200", {}).get("content", {}).get("text/event-stream")
            if stream is not None:
                assert stream["schema"]["type"] == "string", (method, path)
                assert stream["x-itemSchema"]["oneOf"], (method, path)
            if method == "post" and not path.startswith("/api/v1/internal/") and stream is None \
                    and path not in UNKEYED_POSTS:
                assert "Idempotency-Key" in [p["name"] for p in op.get("parameters", [])], path

    broken = json.loads(json.dumps(doc))  # the check can fail: 3.2's itemSchema is refused in a 3.1 document
    broken["paths"]["/api/v1/tasks/{task_id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"][
        "itemSchema"] = {"type": "object"}
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_a_generated_client_submits_a_task_answers_its_decision_and_sees_it_complete(live, tmp_path, monkeypatch):
    spec = tmp_path / "openapi.json"
    spec.write_text(httpx.get(live.url + "/api/v1/openapi.json").text)
    generated = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec),
         "--output-path", str(tmp_path / "apollia_generated"), "--meta", "none"],
        capture_output=True, text=True, timeout=240,
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    monkeypatch.syspath_prepend(str(tmp_path))

    def mod(name: str):
        return importlib.import_module(f"apollia_generated.{name}")

    client = mod("client").AuthenticatedClient(base_url=live.url, token=TOKEN, raise_on_unexpected_status=True)
    models = mod("models")
    register_agent, submit_task = mod("api.agents.register_agent"), mod("api.tasks.submit_task")
    wait_task, task_events, list_tasks = mod("api.tasks.wait_task"), mod("api.tasks.task_events"), mod(
        "api.tasks.list_tasks")
    list_pending, decide = mod("api.pending_decisions.list_pending_decisions"), mod("api.pending_decisions.decide")

    agent = register_agent.sync(client=client, body=models.ManifestIn(manifest=writer(live.workspace)))
    assert isinstance(agent, models.Agent) and agent.name == "clerk"

    body = models.TaskIn(agent="clerk", goal="Write the report")
    submission = submit_task.sync(client=client, body=body, idempotency_key="generated-1")
    assert isinstance(submission, models.Submission)
    again = submit_task.sync_detailed(client=client, body=body, idempotency_key="generated-1")
    assert again.status_code == 202 and again.parsed.id == submission.id  # a retry: the same task
    assert again.headers["Idempotent-Replayed"] == "true"

    waiting = wait_task.sync(submission.id, client=client, timeout=30)
    assert isinstance(waiting, models.Task) and waiting.status == models.TaskStatus.WAITING
    [decision] = list_pending.sync(client=client)
    assert decision.task_id == submission.id
    answer = models.DecideIn(id=decision.id, answer=models.DecideInAnswer.ONCE)
    answered = decide.sync(client=client, body=answer)
    assert isinstance(answered, models.PendingDecision) and answered.id == decision.id

    done = wait_task.sync(submission.id, client=client, until=models.WaitTaskUntil.FINISHED, timeout=60)
    assert done.status == models.TaskStatus.COMPLETED
    stream = task_events.sync(submission.id, client=client)  # an event stream is text to a 3.1 client
    assert isinstance(stream, str) and "event: task" in stream and '"completed"' in stream
    assert [t.id for t in list_tasks.sync(client=client)] == [submission.id]
    assert (live.workspace / "report.txt").read_text() == "ok"
