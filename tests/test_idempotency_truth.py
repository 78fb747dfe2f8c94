"""A refusal means nothing happened; a success means it is durable; a retry with the same key never does it twice.

Real servers on 127.0.0.1 (a background thread, or ``apollia-os serve`` as a
subprocess for the crashes). The windows are named fault points
(apollia_nb/faults.py): ``idempotency.before_finish`` (a request carried out and
durable, its key's answer not yet recorded), ``route.before_settle`` (a request
carried out, its runtime.db rows not yet confirmed), ``answer.after_journal`` (an
answer journaled, governance.db not yet written); ``full`` makes the write there
fail as a full disk does, ``kill`` ends the server there.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import pytest

from apollia_nb import faults
from apollia_nb.dbutil import FAULT_ENV
from apollia_nb.errors import Conflict, OutcomeUnknown
from apollia_nb.runtime import Runtime
from apollia_nb.sdk import Client
from api_helpers import api_url, auth, keyed, served
from runtime_helpers import call, manifest

TOKEN = "truth-token"
AUTH = auth(TOKEN)
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])
SCRIBE = WRITER.replace('"clerk"', '"scribe"')
TASK = {"agent": "clerk", "goal": "Write a.txt"}


@pytest.fixture
def served_home(home):
    with served(home, TOKEN, WRITER) as server_and_api:
        yield server_and_api


@pytest.fixture
def server(served_home):
    return served_home[0]


@pytest.fixture
def api(served_home):
    return served_home[1]


@pytest.fixture
def armed(monkeypatch):
    """Arm a fault point in this process (the in-process server's); disarmed again by ``disarm``."""

    class Armed:
        def __call__(self, name: str, action: str) -> None:
            monkeypatch.setitem(faults._ARMED, name, action)

        def disarm(self, name: str) -> None:
            monkeypatch.delitem(faults._ARMED, name)

    return Armed()


def waiting_decision(api: httpx.Client) -> tuple[dict, dict]:
    """A task suspended on its first call, and the decision it waits on."""
    task = api.post("/tasks", json=TASK).json()
    assert api.get(f"/tasks/{task['id']}/wait").json()["status"] == "waiting"
    [pending] = [p for p in api.get("/pending-decisions").json() if p["task_id"] == task["id"]]
    return task, pending


def answers_journaled(api: httpx.Client, run_id: str) -> list[dict]:
    entries = api.get("/audit/entries", params={"run_id": run_id, "limit": 1000}).json()["entries"]
    return [e for e in entries if e["kind"] == "answer"]


# Each creating route: how to ask for it once (path, body) and how many of its effects exist.

def _tasks(api):
    return "/tasks", TASK, lambda: len(api.get("/tasks").json())


def _agents(api):
    return "/agents", {"manifest": SCRIBE}, lambda: sum(a["name"] == "scribe" for a in api.get("/agents").json())


def _rules(api):
    body = {"tool": "bash_executor", "effect": "deny", "prefix": "rm"}
    return "/governance/rules", body, lambda: len(api.get("/governance/rules").json())


def _batches(api):
    body = {"agent": "clerk", "items": [{"name": "a.txt"}], "goal": "Write {name}"}
    return "/batches", body, lambda: len(api.get("/batches").json())


def _sessions(api):
    return "/sessions", {"agent": "clerk"}, lambda: len(api.get("/sessions").json())


def _fork(api):
    session = api.post("/sessions", json={"agent": "clerk"}).json()
    return f"/sessions/{session['id']}/fork", None, lambda: len(api.get("/sessions").json()) - 1


def _decide(api):
    task, pending = waiting_decision(api)
    return ("/pending-decisions/decide", {"id": pending["id"], "answer": "once"},
            lambda: len(answers_journaled(api, task["run_id"])))


CREATING = {"tasks": _tasks, "agents": _agents, "rules": _rules, "batches": _batches, "sessions": _sessions,
            "fork": _fork, "decide": _decide}


# --- the key's answer refused after the request took effect -------------------------------------------


@pytest.fixture
def refused_answers(monkeypatch):
    """While on, runtime.db refuses (ENOSPC, its storage fault point) every write made while a key's answer
    is recorded: the request is carried out and durable, then the disk refuses its answer."""
    from apollia_nb.api.idempotency import Idempotency

    on = [False]
    original = Idempotency.finish

    async def finish(self, *args, **kwargs):
        if not on[0]:
            return await original(self, *args, **kwargs)
        monkeypatch.setenv(FAULT_ENV, "runtime.db:ENOSPC")
        try:
            return await original(self, *args, **kwargs)
        finally:
            monkeypatch.delenv(FAULT_ENV)

    monkeypatch.setattr(Idempotency, "finish", finish)
    return on


@pytest.mark.parametrize("route", sorted(CREATING))
def test_a_request_whose_keys_answer_the_disk_refuses_is_answered_and_its_retry_gets_the_first_answer(
        api, refused_answers, route):
    path, body, effects = CREATING[route](api)
    before = effects()
    refused_answers[0] = True  # carried out and durable; the key's answer refused
    first = api.post(path, json=body, headers=keyed(f"full-{route}"))
    assert 200 <= first.status_code < 300, first.text  # done: never a refusal
    assert effects() == before + 1
    again = api.post(path, json=body, headers=keyed(f"full-{route}"))  # the disk still refuses the answer
    assert (again.status_code, again.json()) == (first.status_code, first.json())
    assert again.headers["Idempotent-Replayed"] == "true"
    refused_answers[0] = False
    recorded = api.post(path, json=body, headers=keyed(f"full-{route}"))  # now recorded as well
    assert (recorded.status_code, recorded.json()) == (first.status_code, first.json())
    assert recorded.headers.get("Location") == first.headers.get("Location")
    assert effects() == before + 1


PLANNER = manifest("planner", planner=[{"steps": ["look"]}], actor=[{"text": "Looked."}])


def _entries(api: httpx.Client, run_id: str, kind: str) -> list[dict]:
    entries = api.get("/audit/entries", params={"run_id": run_id, "limit": 1000}).json()["entries"]
    return [e["payload"] for e in entries if e["kind"] == kind]


def _planned(api: httpx.Client) -> dict:
    """A task of PLANNER waiting for its plan's approval."""
    task = api.post("/tasks", json={"agent": "planner", "goal": "Look", "approve_plan": True}).json()
    assert api.get(f"/tasks/{task['id']}/wait").json()["awaiting_plan_approval"]
    return task


def _planned_session(api: httpx.Client) -> dict:
    """A plan-mode session of PLANNER with a plan waiting for an answer."""
    session = api.post("/sessions", json={"agent": "planner", "plan_mode": True}).json()
    with api.stream("POST", f"/sessions/{session['id']}/messages", json={"text": "Look"}) as resp:
        assert "event: plan" in "\n".join(resp.iter_lines())
    assert api.get(f"/sessions/{session['id']}").json()["pending_plan"] == ["look"]
    return session


def _state(api: httpx.Client, path: str, field: str = "state") -> str:
    return api.get(path).json()[field]


# Every other writing route: (path, body) of its request and, after the restart, a check that its effect is
# there once, ``check(api, the retry's answer)``.

def _start(api):
    assert api.post("/agents/clerk/stop").status_code == 200
    return ("/agents/clerk/start", None,
            lambda api, again: _state(api, "/agents/clerk") == again.json()["state"] == "active")


def _stop(api):
    # A restart loads only the agents not stopped: the retry is answered from the stopped agent's row.
    return ("/agents/clerk/stop", None,
            lambda api, again: again.json()["state"] == "stopped" and again.json()["name"] == "clerk"
            and "clerk" not in [a["name"] for a in api.get("/agents").json()])


def _cancel(api):
    task, _ = waiting_decision(api)
    return (f"/tasks/{task['id']}/cancel", None,
            lambda api, again: again.json()["status"] == _state(api, f"/tasks/{task['id']}", "status") == "cancelled"
            and [p["status"] for p in _entries(api, task["run_id"], "task_status")].count("cancelled") == 1)


def _task_plan(approved: bool):
    def setup(api):
        task = _planned(api)
        body = None if approved else {"reason": "not now"}

        def check(api, again) -> bool:
            answers = [p for p in _entries(api, task["run_id"], "plan") if "approved" in p]
            done = api.get(f"/tasks/{task['id']}/wait", params={"until": "finished"}).json()
            return (again.json()["id"] == task["id"] and [p["approved"] for p in answers] == [approved]
                    and done["status"] == ("completed" if approved else "failed"))

        return f"/tasks/{task['id']}/plan/{'approve' if approved else 'reject'}", body, check

    return setup


def _session_plan(approved: bool):
    def setup(api):
        session = _planned_session(api)
        body = None if approved else {"reason": "not now"}

        def check(api, again) -> bool:
            answers = [p for p in _entries(api, session["run_id"], "plan") if "approved" in p]
            return again.json()["pending_plan"] is None and [p["approved"] for p in answers] == [approved]

        return f"/sessions/{session['id']}/plan/{'approve' if approved else 'reject'}", body, check

    return setup


def _session_move(move: str, state: str, before: str | None = None):
    def setup(api):
        session = api.post("/sessions", json={"agent": "clerk"}).json()
        if before is not None:
            assert api.post(f"/sessions/{session['id']}/{before}").status_code < 300

        def check(api, again) -> bool:
            statuses = [p["status"] for p in _entries(api, session["run_id"], "session_status")]
            return (again.json()["state"] == _state(api, f"/sessions/{session['id']}") == state
                    and statuses.count(state) == 1)

        return f"/sessions/{session['id']}/{move}", None, check

    return setup


def _inject(api):
    session = api.post("/sessions", json={"agent": "clerk"}).json()

    def check(api, again) -> bool:
        history = api.get(f"/sessions/{session['id']}").json()["history"]
        return again.json()["id"] == session["id"] and [m["content"] for m in history] == ["only once"]

    return f"/sessions/{session['id']}/inject", {"text": "only once"}, check


def _created(count):
    """A creating route's check: the retry answers the one thing created, found at its ``Location``."""
    def check(api, again) -> bool:
        at = api.get(again.headers["Location"].removeprefix("/api/v1")).json()
        return count(api) == 1 and at["id"] == again.json()["id"]

    return check


def _batch_cancel(api):
    batch = api.post("/batches", json={"agent": "clerk", "items": [{"name": "a.txt"}], "goal": "Write {name}"}).json()
    return (f"/batches/{batch['id']}/cancel", None,
            lambda api, again: again.json()["status"] == _state(api, f"/batches/{batch['id']}", "status") == "cancelled")


def _with_check(setup, check):
    def wrapped(api):
        path, body, _ = setup(api)
        return path, body, check

    return wrapped


KILLED = {
    "tasks": _with_check(_tasks, lambda api, again: [t["id"] for t in api.get("/tasks").json()] == [again.json()["id"]]
                         and again.headers["Location"].endswith(again.json()["id"])),
    "agents": _with_check(_agents, lambda api, again: again.json()["name"] == "scribe"
                          and sum(a["name"] == "scribe" for a in api.get("/agents").json()) == 1),
    "rules": _with_check(_rules, lambda api, again: [r["id"] for r in api.get("/governance/rules").json()]
                         == [again.json()["id"]]),
    "decide": _with_check(_decide, lambda api, again: again.json()["answer"] == "once"
                          and len(answers_journaled(api, again.json()["run_id"])) == 1),
    "batches": _with_check(_batches, _created(lambda api: len(api.get("/batches").json()))),
    "sessions": _with_check(_sessions, _created(lambda api: len(api.get("/sessions").json()))),
    "fork": _with_check(_fork, _created(lambda api: len(api.get("/sessions").json()) - 1)),
    "agent-start": _start,
    "agent-stop": _stop,
    "task-cancel": _cancel,
    "task-plan-approve": _task_plan(True),
    "task-plan-reject": _task_plan(False),
    "session-pause": _session_move("pause", "paused"),
    "session-resume": _session_move("resume", "active", before="pause"),
    "session-close": _session_move("close", "closed"),
    "session-inject": _inject,
    "session-plan-approve": _session_plan(True),
    "session-plan-reject": _session_plan(False),
    "batch-cancel": _batch_cancel,
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("route", sorted(KILLED))
def test_a_server_killed_after_the_effect_and_before_the_keys_answer_finds_the_effect_at_the_retry(
        tmp_path, route):
    from test_api_serve import start, stop

    home = tmp_path / "home"
    faulty, _ = start(home, "--token", TOKEN, env={"APOLLIA_FAULT": "idempotency.before_finish:kill"})
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            for agent in (WRITER, PLANNER):  # no key: not the point
                assert api.post("/agents", json={"manifest": agent}).status_code == 201
            path, body, check = KILLED[route](api)
            with pytest.raises(httpx.TransportError):  # killed there: the client never hears back
                api.post(path, json=body, headers=keyed("cut-off"))
    finally:
        assert stop(faulty) == -signal.SIGKILL
    proc, _ = start(home, "--token", TOKEN)
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            again = api.post(path, json=body, headers=keyed("cut-off"))
            assert 200 <= again.status_code < 300 and again.headers["Idempotent-Replayed"] == "true", again.text
            assert check(api, again), again.json()  # done once: found, not done again
            replay = api.post(path, json=body, headers=keyed("cut-off"))  # recorded by the retry
            assert (replay.status_code, replay.json()) == (again.status_code, again.json())
            assert replay.headers["Idempotent-Replayed"] == "true"
    finally:
        assert stop(proc) == 0


def test_every_writing_route_can_find_what_an_unanswered_request_did():
    """A route that honours Idempotency-Key and cannot look its effect up would leave a retry after a crash
    with OUTCOME_UNKNOWN only: every POST of the app names or finds its effect."""
    from apollia_nb.api.app import create_app
    from apollia_nb.api.idempotency import IdempotentRoute

    app = create_app(token="t")
    routes = [r for included in app.routes for r in getattr(getattr(included, "original_router", None), "routes", ())]
    keyed_routes = [r for r in routes if isinstance(r, IdempotentRoute)]
    assert len(keyed_routes) >= len(KILLED)
    blind = sorted(f"{sorted(r.methods)} {r.path}" for r in keyed_routes if r.effect is None or r.effect.find is None)
    assert blind == []
    paths = {r.path for r in keyed_routes}
    assert {"/sessions/{session_id}/inject", "/batches/{batch_id}/cancel", "/agents/{name}/start"} <= paths


# --- rows not yet committed: OUTCOME_UNKNOWN, never a refusal ----------------------------------------


def test_a_change_whose_rows_runtime_db_refuses_is_outcome_unknown_and_its_retry_answers_it_once(api, armed):
    session = api.post("/sessions", json={"agent": "clerk"}).json()
    path = f"/sessions/{session['id']}/inject"
    armed("route.before_settle", "full")  # the message is added; runtime.db refuses its row for now
    first = api.post(path, json={"text": "one more thing"}, headers=keyed("inject-1"))
    assert first.status_code == 503 and first.json()["code"] == "OUTCOME_UNKNOWN", first.text
    assert "same Idempotency-Key" in first.json()["message"]
    still = api.post(path, json={"text": "one more thing"}, headers=keyed("inject-1"))
    assert still.status_code == 503 and still.json()["code"] == "OUTCOME_UNKNOWN"  # not recorded yet
    unkeyed = api.post(f"/sessions/{session['id']}/pause")
    assert unkeyed.status_code == 503 and unkeyed.json()["code"] == "OUTCOME_UNKNOWN"  # no key: not a refusal
    armed.disarm("route.before_settle")
    again = api.post(path, json={"text": "one more thing"}, headers=keyed("inject-1"))
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true", again.text
    history = api.get(f"/sessions/{session['id']}").json()["history"]
    assert sum("one more thing" in str(m) for m in history) == 1  # added once, whatever the retries
    assert api.post(path, json={"text": "one more thing"}, headers=keyed("inject-1")).json() == again.json()


def test_a_request_cut_off_by_an_internal_error_is_outcome_unknown_and_a_route_without_a_lookup_is_not_redone(
        api, armed):
    session = api.post("/sessions", json={"agent": "clerk"}).json()
    armed("route.before_settle", "raise")
    cut = api.post(f"/sessions/{session['id']}/inject", json={"text": "hello"}, headers=keyed("cut"))
    assert cut.status_code == 503 and cut.json()["code"] == "OUTCOME_UNKNOWN"
    armed.disarm("route.before_settle")
    again = api.post(f"/sessions/{session['id']}/inject", json={"text": "hello"}, headers=keyed("cut"))
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    history = api.get(f"/sessions/{session['id']}").json()["history"]
    assert sum("hello" in str(m) for m in history) == 1


# --- one answer per decision -------------------------------------------------------------------------


def test_an_answer_journaled_whose_store_the_disk_refuses_is_journaled_once_however_it_is_retried(api, armed):
    task, pending = waiting_decision(api)
    answer = {"id": pending["id"], "answer": "once"}
    armed("answer.after_journal", "full")  # journaled; governance.db refuses it
    first = api.post("/pending-decisions/decide", json=answer, headers=keyed("a-1"))
    assert first.status_code == 503 and first.json()["code"] == "OUTCOME_UNKNOWN", first.text
    again = api.post("/pending-decisions/decide", json=answer, headers=keyed("a-1"))  # still refused
    assert again.json()["code"] == "OUTCOME_UNKNOWN"
    other = api.post("/pending-decisions/decide", json={**answer, "answer": "refuse"}, headers=keyed("a-2"))
    assert other.status_code == 409 and "journaled" in other.json()["message"]  # answered once already
    armed.disarm("answer.after_journal")
    stored = api.post("/pending-decisions/decide", json=answer, headers=keyed("a-1"))
    assert stored.status_code == 200 and stored.json()["answer"] == "once", stored.text
    assert api.post("/pending-decisions/decide", json=answer, headers=keyed("a-1")).json() == stored.json()
    assert api.post("/pending-decisions/decide", json=answer, headers=keyed("a-3")).status_code == 409
    done = api.get(f"/tasks/{task['id']}/wait", params={"until": "finished"}).json()
    assert done["status"] == "completed"
    assert len(answers_journaled(api, task["run_id"])) == 1
    calls = api.get("/audit/entries", params={"run_id": task["run_id"], "limit": 1000}).json()["entries"]
    assert sum(e["kind"] == "tool_call" and e["payload"].get("tool") == "write_file" for e in calls) <= 1


def test_an_answer_stored_by_another_key_after_the_disk_refused_it_is_not_journaled_again(api, armed):
    task, pending = waiting_decision(api)
    answer = {"id": pending["id"], "answer": "once"}
    armed("answer.after_journal", "full")
    assert api.post("/pending-decisions/decide", json=answer).json()["code"] == "OUTCOME_UNKNOWN"
    armed.disarm("answer.after_journal")
    # the person clicks again (a new request, no key or another one): the journaled answer is stored
    assert api.post("/pending-decisions/decide", json=answer, headers=keyed("b-2")).status_code == 200
    assert api.get(f"/tasks/{task['id']}/wait", params={"until": "finished"}).json()["status"] == "completed"
    assert len(answers_journaled(api, task["run_id"])) == 1


def test_racing_answers_to_one_decision_are_answered_once(api):
    task, pending = waiting_decision(api)

    def send(n: int) -> httpx.Response:
        return api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"},
                        headers=keyed(f"race-{n}"))

    with ThreadPoolExecutor(6) as pool:
        answered = list(pool.map(send, range(6)))
    assert sorted(r.status_code for r in answered) == [200] + [409] * 5
    assert api.get(f"/tasks/{task['id']}/wait", params={"until": "finished"}).json()["status"] == "completed"
    assert len(answers_journaled(api, task["run_id"])) == 1


@pytest.mark.anyio
async def test_a_card_answered_again_after_the_disk_refused_its_store_is_journaled_once(home, monkeypatch):
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        task = await rt.submit("clerk", "Write a.txt", watched=False)
        await task.settled()
        [card] = rt.pending
        monkeypatch.setitem(faults._ARMED, "answer.after_journal", "full")
        with pytest.raises(OutcomeUnknown):
            card.answer("once")
        with pytest.raises(Conflict):  # it is answered (in the journal): another answer is refused
            card.answer("refuse")
        monkeypatch.delitem(faults._ARMED, "answer.after_journal")
        card.answer("once")
        with anyio.fail_after(30):
            await task.wait()
        assert task.status == "completed"
        answers = rt.journal.entries(run_id=task.to_dict()["run_id"], kinds=["answer"])
        assert len(answers) == 1


# --- the SDK -----------------------------------------------------------------------------------------


class Watching(httpx.HTTPTransport):
    """Real HTTP; ``on_response`` sees each answer first (to end a fault once the client has met it)."""

    def __init__(self, on_response) -> None:
        super().__init__()
        self.seen: list[tuple[str, str | None, int]] = []
        self.on_response = on_response

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST":
            self.seen.append((request.url.path, request.headers.get("Idempotency-Key"), response.status_code))
            self.on_response(response)
        return response


def test_the_sdk_retries_a_full_disk_with_the_same_key_and_creates_one_task(server, api, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "runtime.db:ENOSPC")  # runtime.db refuses the key: nothing is done

    def on_response(response):
        if response.status_code == 507:
            monkeypatch.delenv(FAULT_ENV)  # space is freed

    transport = Watching(on_response)
    with Client(server.url, TOKEN, transport=transport, backoff=0) as sdk:
        submitted = sdk.submit("clerk", "Write a.txt")
    assert [status for _, _, status in transport.seen] == [507, 202]
    assert len({key for _, key, _ in transport.seen}) == 1
    assert [t["id"] for t in api.get("/tasks").json()] == [submitted.id]


def test_the_sdk_retries_outcome_unknown_with_the_same_key_and_gets_the_first_outcome(server, api, armed):
    session = api.post("/sessions", json={"agent": "clerk"}).json()
    armed("route.before_settle", "full")

    def on_response(response):
        if response.status_code == 503 and "route.before_settle" in faults._ARMED:
            armed.disarm("route.before_settle")

    transport = Watching(on_response)
    with Client(server.url, TOKEN, transport=transport, backoff=0) as sdk:
        sdk.inject(session["id"], "only once")
    assert [status for _, _, status in transport.seen] == [503, 200]
    assert len({key for _, key, _ in transport.seen}) == 1
    history = api.get(f"/sessions/{session['id']}").json()["history"]
    assert sum("only once" in str(m) for m in history) == 1


def test_the_sdk_gives_up_on_outcome_unknown_after_its_retries_and_the_same_key_gets_it_later(server, api, armed):
    session = api.post("/sessions", json={"agent": "clerk"}).json()
    armed("route.before_settle", "full")
    transport = Watching(lambda response: None)
    with Client(server.url, TOKEN, transport=transport, retries=2, backoff=0) as sdk:
        with pytest.raises(OutcomeUnknown):
            sdk.inject(session["id"], "later", idempotency_key="inject-later")
        assert [status for _, _, status in transport.seen] == [503] * 3  # bounded
        armed.disarm("route.before_settle")
        sdk.inject(session["id"], "later", idempotency_key="inject-later")
    history = api.get(f"/sessions/{session['id']}").json()["history"]
    assert sum("later" in str(m) for m in history) == 1


def test_the_sdk_retries_storage_and_unknown_outcomes_within_its_attempts_and_its_time():
    from apollia_nb.sdk.client import _Req, _Retry

    keyed_post, plain_post = _Req("POST", "/tasks", keyed=True), _Req("POST", "/audit/replay/r")

    def answer(status, code):
        return httpx.Response(status, json={"code": code, "message": "m"})

    retry = _Retry(retries=3, backoff=1.0, retry_for=2.5)
    for status, code in ((507, "STORAGE_FULL"), (503, "STORAGE_ERROR"), (503, "OUTCOME_UNKNOWN")):
        assert retry.delay(keyed_post, 0, answer(status, code)) == 1.0, code
        assert retry.delay(plain_post, 0, answer(status, code)) is None, code  # no key: not sent again
    assert retry.delay(keyed_post, 1, answer(507, "STORAGE_FULL"), elapsed=1.0) is None  # 1 + 2 s > 2.5 s
    assert retry.delay(keyed_post, 1, answer(507, "STORAGE_FULL"), elapsed=0.4) == 2.0
    assert _Retry(retry_for=None).delay(keyed_post, 2, None, elapsed=1e6) == 1.0
    with pytest.raises(ValueError):
        _Retry(retry_for=-1)


# --- a client's governed call, retried after the server restarted ------------------------------------


def _governed_call(outcome: str, api: httpx.Client) -> dict:
    """A call request a client kernel sends (``POST /internal/calls``) that the server decides ``outcome``."""
    from test_served_calls import call_body

    if outcome == "refuse":
        assert api.post("/governance/rules", json={"tool": "write_file", "effect": "deny"}).status_code == 201
    if outcome == "allow":
        return call_body("run-retried", tool="read_file", family="read", arguments={"path": "x.txt"},
                         decision={"call_id": "call-1", "tool": "read_file", "family": "read",
                                   "arguments": {"path": "x.txt"}, "connection": None, "path": "x.txt"})
    return call_body("run-retried")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("outcome, last", [("allow", "tool_call"), ("refuse", "tool_result"), ("ask", "decision")])
def test_a_governed_call_journaled_before_the_server_was_killed_is_answered_from_the_journal_at_its_retry(
        tmp_path, outcome, last):
    from test_api_serve import start, stop

    home = tmp_path / "home"
    faulty, _ = start(home, "--token", TOKEN, env={"APOLLIA_FAULT": "calls.after_commit:kill"})
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            body = _governed_call(outcome, api)
            with pytest.raises(httpx.TransportError):  # decided and journaled; killed before the answer
                api.post("/internal/calls", json=body)
    finally:
        assert stop(faulty) == -signal.SIGKILL
    proc, _ = start(home, "--token", TOKEN)
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            journaled = api.get("/audit/entries", params={"run_id": "run-retried", "limit": 100}).json()["entries"]
            shown = {**body["decision"], "arguments": {"path": "z.txt"}}  # the journal holds another decision
            moved = api.post("/internal/calls", json={**body, "decision": shown})
            assert moved.status_code == 409 and moved.json()["code"] == "CONFLICT", moved.text
            told = [{**body["before"][0], "payload": {**body["before"][0]["payload"], "text": "other"}}]
            assert api.post("/internal/calls", json={**body, "before": told}).status_code == 409
            again = api.post("/internal/calls", json=body)  # the client's retry: same run, call id and body
            assert again.status_code == 200, again.text
            answer = again.json()
            assert answer["decision"]["outcome"] == outcome
            assert [(e["seq"], e["kind"]) for e in answer["entries"]] == [(e["seq"], e["kind"]) for e in journaled]
            assert answer["entries"][-1]["kind"] == last
            after = api.get("/audit/entries", params={"run_id": "run-retried", "limit": 100}).json()["entries"]
            assert [e["seq"] for e in after] == [e["seq"] for e in journaled]  # nothing journaled twice
            assert api.post("/internal/calls", json=body).json()["entries"] == answer["entries"]
            other = api.post("/internal/calls", json={**body, "arguments": {"path": "y.txt", "content": "y"}})
            assert other.status_code == 409 and other.json()["code"] == "CONFLICT"
            assert api.get("/audit/verify").json()["ok"] is True
    finally:
        assert stop(proc) == 0
