"""docs/rest-api.md is generated from the OpenAPI document and must not drift from it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    path = ROOT / "dev" / "docs" / "make_rest_reference.py"
    spec = importlib.util.spec_from_file_location("make_rest_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_rest_reference"] = module
    spec.loader.exec_module(module)
    return module


def test_the_rest_reference_is_up_to_date():
    assert _generator().main(["--check"]) == 0, "run: python dev/docs/make_rest_reference.py"


def test_the_reference_covers_every_operation_schema_and_error_code():
    gen = _generator()
    doc = gen.document()
    text = (ROOT / "docs" / "rest-api.md").read_text()
    for path, item in doc["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in text
    for name in doc["components"]["schemas"]:
        if name not in ("HTTPValidationError", "ValidationError"):
            assert f"### {name} (schema)" in text
    from apollia_nb.sdk import errors

    for code in ("UNAUTHORIZED", "PAYLOAD_TOO_LARGE", "METHOD_NOT_ALLOWED", "UNKNOWN_TASK", "BAD_ANSWER"):
        assert f"| `{code}` |" in text
    assert errors.HTTP_ONLY_CODES == ("UNAUTHORIZED", "METHOD_NOT_ALLOWED", "PAYLOAD_TOO_LARGE")


def test_the_check_fails_when_the_doc_drifts(tmp_path, monkeypatch):
    gen = _generator()
    stale = tmp_path / "rest-api.md"
    stale.write_text((ROOT / "docs" / "rest-api.md").read_text().replace("Submit a task", "Submit a tusk"))
    monkeypatch.setattr(gen, "DOC", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_the_wire_enumerations_are_the_runtimes():
    from apollia_nb.governance.decision import Answer, Family
    from apollia_nb.runtime.states import ProcessState, SessionState, TaskStatus
    from apollia_nb.wire import schemas

    assert schemas.FAMILIES == tuple(f.value for f in Family)
    assert schemas.ANSWERS == tuple(a.value for a in Answer)
    assert schemas.TASK_STATUSES == tuple(s.value for s in TaskStatus)
    assert schemas.AGENT_STATES == tuple(s.value for s in ProcessState)
    assert schemas.SESSION_STATES == tuple(s.value for s in SessionState)
    assert schemas.FamilyName.__args__ == schemas.FAMILIES
    assert schemas.TaskStatus.__args__ == schemas.TASK_STATUSES
    assert schemas.AgentState.__args__ == schemas.AGENT_STATES
    assert schemas.SessionState.__args__ == schemas.SESSION_STATES
    assert schemas.AnswerName.__args__ == schemas.ANSWERS
