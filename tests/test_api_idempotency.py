"""Idempotency-Key over real HTTP: a retried POST is answered once, across a kill -9, and by the SDK.

Servers run on 127.0.0.1 (a background thread, or `apollia-os serve` as a
subprocess for the crash); windows are held open by fault points (a gated
runtime call, a transport that loses an answer), never by sleeps.
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import pytest

from apollia_nb.api.idempotency import Claim, Idempotency, fingerprint, parse_key, scope_of
from apollia_nb.errors import BadInput, IdempotencyInProgress, IdempotencyKeyReused
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.records import RuntimeRecords
from apollia_nb.sdk import AsyncClient, Client
from api_helpers import api_url, auth, keyed, served
from runtime_helpers import call, manifest

TOKEN = "idem-token"
AUTH = auth(TOKEN)
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])
TASK = {"agent": "clerk", "goal": "Write a.txt"}


@pytest.fixture
def served_home(home):
    with served(home, TOKEN, WRITER, timeout=30) as server_and_api:
        yield server_and_api


@pytest.fixture
def server(served_home):
    return served_home[0]


@pytest.fixture
def api(served_home):
    return served_home[1]


def error_code(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["code"]


# --- the pure parts ----------------------------------------------------------------------------------


def test_a_key_is_the_drafts_quoted_string_or_the_bare_text():
    assert parse_key([]) is None
    assert parse_key(['"8e03978e-40d5-43e8-bc93-6894a57f9324"']) == "8e03978e-40d5-43e8-bc93-6894a57f9324"
    assert parse_key(["8e03978e"]) == parse_key(['"8e03978e"'])
    assert parse_key([r'"with \"quotes\" and \\ and spaces"']) == 'with "quotes" and \\ and spaces'
    assert parse_key(["k" * 255]) == "k" * 255
    for bad in ([""], ['""'], ["a b"], ["k" * 256], ['"' + "k" * 256 + '"'], ["caf\u00e9"], ['"tab\there"'],
                ['"bad \\q escape"'], ['"unquoted " inside"'], ["a", "b"]):
        with pytest.raises(BadInput):
            parse_key(bad)


def test_the_same_request_is_the_same_json_and_query_and_scopes_part_routes_and_tokens():
    assert fingerprint("", b'{"a": 1, "b": [1, 2]}') == fingerprint("", b'{"b":[1,2],"a":1}')
    assert fingerprint("", b'{"a": 1}') != fingerprint("", b'{"a": 2}')
    assert fingerprint("", b'{"a": 1}') != fingerprint("x=1", b'{"a": 1}')
    assert fingerprint("", b"not json") != fingerprint("", b"not json!")
    assert scope_of(b"t", "POST", "/api/v1/tasks") == scope_of(b"t", "post", "/api/v1/tasks")
    assert scope_of(b"t", "POST", "/api/v1/tasks") != scope_of(b"u", "POST", "/api/v1/tasks")
    assert scope_of(b"t", "POST", "/api/v1/tasks/a/cancel") != scope_of(b"t", "POST", "/api/v1/tasks/b/cancel")


@pytest.mark.anyio
async def test_keys_are_remembered_across_a_reopen_for_24_hours_and_at_most_max_keys(tmp_path):
    now = [1_000_000.0]
    path = tmp_path / "runtime.db"
    records = RuntimeRecords(path)
    keys = Idempotency(records, clock=lambda: now[0], max_keys=3)
    assert await keys.begin("s", "k1", "fp") == Claim()
    with pytest.raises(IdempotencyInProgress):
        await keys.begin("s", "k1", "fp")
    assert await keys.finish("s", "k1", "fp", 202, {"headers": {}, "body": "{}"})
    # taken with the reference of its effect, and the server stops before it answers
    assert await keys.begin("s", "cut-off", "fp", {"task_id": "task-1"}) == Claim(ref={"task_id": "task-1"})
    records.close()

    records = RuntimeRecords(path)
    keys = Idempotency(records, clock=lambda: now[0], max_keys=3)
    assert await keys.begin("s", "k1", "fp") == (202, {"headers": {}, "body": "{}"})
    with pytest.raises(IdempotencyKeyReused):
        await keys.begin("s", "k1", "other")
    assert await keys.begin("other scope", "k1", "other") == Claim()  # another route or token: another key
    keys.release("other scope", "k1")
    # it may or may not have been done: the route gets the reference to look for it, and the key is held
    assert await keys.begin("s", "cut-off", "fp") == Claim(ref={"task_id": "task-1"}, left=True)
    with pytest.raises(IdempotencyInProgress):
        await keys.begin("s", "cut-off", "fp")
    keys.abandon("s", "cut-off", "fp")  # still unknown: left as it was
    assert await keys.begin("s", "cut-off", "fp") == Claim(ref={"task_id": "task-1"}, left=True)
    keys.abandon("s", "cut-off", "fp")
    with pytest.raises(IdempotencyKeyReused):
        await keys.begin("s", "cut-off", "other")
    records.forget_responses([("s", "cut-off")])
    keys = Idempotency(records, clock=lambda: now[0], max_keys=3)

    for i in (2, 3, 4):  # a fourth key pushes out the oldest
        now[0] += 1
        await keys.begin("s", f"k{i}", "fp")
        await keys.finish("s", f"k{i}", "fp", 201, {"headers": {}, "body": str(i)})
    assert [k for _, k, _, _, _ in records.remembered_keys()] == ["k2", "k3", "k4"]
    assert await keys.begin("s", "k1", "other") == Claim()  # forgotten: a new request
    keys.release("s", "k1")

    now[0] += 24 * 3600 - 1.5  # k2 (3 s before now) is now over 24 hours old; k3 and k4 are not yet
    assert await keys.begin("s", "k3", "fp") == (201, {"headers": {}, "body": "3"})
    records.flush()
    assert [k for _, k, _, _, _ in records.remembered_keys()] == ["k3", "k4"]
    records.close()


def test_the_sdk_retries_only_safe_requests_and_only_answers_a_retry_may_get_past():
    from apollia_nb.sdk.client import _Req, _Retry

    retry = _Retry(retries=2, backoff=0.5)
    keyed_post, get = _Req("POST", "/tasks", keyed=True), _Req("GET", "/tasks")
    plain_post, delete = _Req("POST", "/audit/replay/r"), _Req("DELETE", "/governance/rules/r")

    def answer(status, code=None):
        return httpx.Response(status, json={"code": code, "message": "m"} if code else None)

    assert [retry.delay(keyed_post, n, None) for n in range(3)] == [0.5, 1.0, None]  # bounded, doubling
    assert retry.delay(get, 0, None) == 0.5
    assert retry.delay(plain_post, 0, None) is None and retry.delay(delete, 0, None) is None
    for status, code in ((502, None), (503, None), (504, None), (503, "STORAGE_ERROR"),
                         (409, "IDEMPOTENCY_IN_PROGRESS")):
        assert retry.delay(keyed_post, 0, answer(status, code)) == 0.5, (status, code)
    for status, code in ((500, None), (502, "MODEL_ERROR"), (503, "POLICY_REFUSED"), (409, "CONFLICT"),
                         (422, "IDEMPOTENCY_KEY_REUSED"), (202, None), (404, "UNKNOWN_TASK")):
        assert retry.delay(keyed_post, 0, answer(status, code)) is None, (status, code)
    with pytest.raises(ValueError):
        _Retry(retries=-1)


@pytest.mark.anyio
async def test_a_key_whose_answer_the_disk_refuses_stays_taken_and_one_it_could_not_take_is_free(tmp_path):
    from concurrent.futures import Future

    from apollia_nb.errors import StorageFull

    records = RuntimeRecords(tmp_path / "runtime.db")
    keys = Idempotency(records)
    remember = records.remember_response

    def refused(*args, **kwargs):
        done = Future()
        done.set_exception(StorageFull("no space left"))
        return done

    records.remember_response = refused
    with pytest.raises(StorageFull):  # not taken: nothing is done, the key is free
        await keys.begin("s", "not-taken", "fp")
    records.remember_response = remember
    assert await keys.begin("s", "not-taken", "fp") == Claim()
    records.remember_response = refused
    answer = {"headers": {}, "body": "{}"}
    assert not await keys.finish("s", "not-taken", "fp", 202, answer)  # done, but its answer is not recorded
    records.remember_response = remember
    # never done a second time: the retry is answered from the answer this process holds, which it records
    assert await keys.begin("s", "not-taken", "fp") == Claim(left=True, answer=(202, answer, True))
    assert await keys.finish("s", "not-taken", "fp", 202, answer)
    assert await keys.begin("s", "not-taken", "fp") == (202, answer)
    records.close()


# --- over HTTP ---------------------------------------------------------------------------------------


def test_the_same_key_and_body_twice_is_one_task_and_the_first_answer(api):
    first = api.post("/tasks", json=TASK, headers=keyed("retry-1"))
    again = api.post("/tasks", json=dict(reversed(TASK.items())), headers=keyed('"retry-1"'))
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again.headers["Location"] == first.headers["Location"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert [t["id"] for t in api.get("/tasks").json()] == [first.json()["id"]]

    other = api.post("/tasks", json={**TASK, "goal": "Another"}, headers=keyed("retry-1"))
    assert error_code(other, 422) == "IDEMPOTENCY_KEY_REUSED"
    assert len(api.get("/tasks").json()) == 1  # refused: nothing was created

    elsewhere = api.post("/sessions", json={"agent": "clerk"}, headers=keyed("retry-1"))  # keys are per route
    assert elsewhere.status_code == 201 and "Idempotent-Replayed" not in elsewhere.headers
    without = [api.post("/tasks", json=TASK) for _ in range(2)]  # no key: two requests, two tasks
    assert len({r.json()["id"] for r in without}) == 2

    stranger = api.post("/tasks", json=TASK, headers={"Authorization": "Bearer wrong", **keyed("retry-1")})
    assert error_code(stranger, 401) == "UNAUTHORIZED"  # a key answers only its own token


def test_a_bad_key_is_bad_input_and_creates_nothing(api):
    for bad in ("", "has space", "k" * 256, '"unterminated'):
        assert error_code(api.post("/tasks", json=TASK, headers=keyed(bad)), 422) == "BAD_INPUT"
    twice = api.post("/tasks", json=TASK, headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert error_code(twice, 422) == "BAD_INPUT"
    assert api.get("/tasks").json() == []


def test_an_error_is_not_remembered_so_the_same_key_may_try_again(api):
    body = {"agent": "scribe", "goal": "Write"}
    assert error_code(api.post("/tasks", json=body, headers=keyed("later")), 404) == "UNKNOWN_AGENT"
    assert api.post("/agents", json={"manifest": WRITER.replace('"clerk"', '"scribe"')}).status_code == 201
    taken = api.post("/tasks", json=body, headers=keyed("later"))
    assert taken.status_code == 202 and "Idempotent-Replayed" not in taken.headers


def test_a_decision_answered_twice_with_one_key_is_answered_once(api):
    task = api.post("/tasks", json=TASK).json()
    assert api.get(f"/tasks/{task['id']}/wait").json()["status"] == "waiting"
    [pending] = api.get("/pending-decisions").json()
    answer = {"id": pending["id"], "answer": "once"}
    first = api.post("/pending-decisions/decide", json=answer, headers=keyed("answer-1"))
    again = api.post("/pending-decisions/decide", json=answer, headers=keyed("answer-1"))
    assert first.status_code == again.status_code == 200 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    unkeyed = api.post("/pending-decisions/decide", json=answer)  # without the key: already answered
    assert error_code(unkeyed, 409) == "CONFLICT"
    done = api.get(f"/tasks/{task['id']}/wait", params={"until": "finished"}).json()
    assert done["status"] == "completed"
    entries = api.get("/audit/entries", params={"run_id": task["run_id"], "limit": 1000}).json()["entries"]
    assert sum(e["kind"] == "answer" for e in entries) == 1, [e["kind"] for e in entries]


@pytest.fixture
def gated_submit(monkeypatch):
    """A fault point: ``Runtime.submit`` waits, off the server's loop, until the test lets it go."""
    entered, release = threading.Event(), threading.Event()
    original = Runtime.submit

    async def submit(self, *args, **kwargs):
        entered.set()
        await anyio.to_thread.run_sync(release.wait)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(Runtime, "submit", submit)
    return entered, release


def test_a_second_request_while_the_first_is_processed_is_409_in_progress(api, gated_submit):
    entered, release = gated_submit
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(api.post, "/tasks", json=TASK, headers=keyed("slow"))
        assert entered.wait(30)
        busy = api.post("/tasks", json=TASK, headers=keyed("slow"))
        assert error_code(busy, 409) == "IDEMPOTENCY_IN_PROGRESS"
        release.set()
        answered = first.result(30)
    assert answered.status_code == 202
    replayed = api.post("/tasks", json=TASK, headers=keyed("slow"))
    assert replayed.json() == answered.json() and replayed.headers["Idempotent-Replayed"] == "true"
    assert len(api.get("/tasks").json()) == 1


def test_a_submit_that_fails_after_its_task_was_recorded_is_found_by_its_retry_not_done_again(server, api,
                                                                                             monkeypatch):
    from apollia_nb import faults

    monkeypatch.setitem(faults._ARMED, "submit.after_commit", "raise")  # recorded, then an internal error
    failed = httpx.post(f"{server.url}/api/v1/tasks", json=TASK, headers={**AUTH, **keyed("half-done")})
    assert error_code(failed, 503) == "OUTCOME_UNKNOWN"  # not a refusal: it may have been done
    monkeypatch.delitem(faults._ARMED, "submit.after_commit")
    [task] = api.get("/tasks").json()
    again = api.post("/tasks", json=TASK, headers=keyed("half-done"))
    assert again.status_code == 202 and again.json()["id"] == task["id"], again.text
    assert again.headers["Location"].endswith(f"/tasks/{task['id']}")
    assert [t["id"] for t in api.get("/tasks").json()] == [task["id"]]


def test_an_answered_submit_survives_kill_9_and_a_restart(tmp_path):
    from test_api_serve import start, stop

    home = tmp_path / "home"
    proc, _ = start(home, "--token", TOKEN)
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=30) as api:
            assert api.post("/agents", json={"manifest": WRITER}).status_code == 201
            first = api.post("/tasks", json=TASK, headers=keyed("before-the-crash"))
            assert first.status_code == 202
    finally:
        stop(proc, signal.SIGKILL)  # right after the answer: no shutdown, nothing flushed on the way out
    proc, _ = start(home, "--token", TOKEN)
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=30) as api:
            again = api.post("/tasks", json=TASK, headers=keyed("before-the-crash"))
            assert again.status_code == 202 and again.json() == first.json(), again.text
            assert again.headers["Idempotent-Replayed"] == "true"
            assert [t["id"] for t in api.get("/tasks").json()] == [first.json()["id"]]
    finally:
        assert stop(proc) == 0


def test_a_submit_cut_off_between_its_task_and_its_answer_is_found_by_its_retry_not_done_twice(tmp_path):
    from test_api_serve import start, stop

    home = tmp_path / "home"
    # The fault point: the task is recorded, the submission not answered (its key taken, no answer yet).
    faulty, _ = start(home, "--token", TOKEN, env={"APOLLIA_FAULT": "submit.after_commit:kill"})
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            assert api.post("/agents", json={"manifest": WRITER}).status_code == 201
            with pytest.raises(httpx.TransportError):  # killed there: the client never hears back
                api.post("/tasks", json=TASK, headers=keyed("cut-off"))
    finally:
        assert stop(faulty) == -signal.SIGKILL
    proc, _ = start(home, "--token", TOKEN)
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=30) as api:
            [task] = api.get("/tasks").json()  # the submit took effect before the crash
            again = api.post("/tasks", json=TASK, headers=keyed("cut-off"))  # found by the id its key holds
            assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true", again.text
            assert (again.json()["id"], again.json()["run_id"]) == (task["id"], task["run_id"])
            assert [t["id"] for t in api.get("/tasks").json()] == [task["id"]]  # not done a second time
            assert api.post("/tasks", json=TASK, headers=keyed("cut-off")).json() == again.json()  # recorded now
            fresh = api.post("/tasks", json=TASK, headers=keyed("after-looking"))
            assert fresh.status_code == 202
    finally:
        assert stop(proc) == 0


# --- the SDK -----------------------------------------------------------------------------------------


@pytest.fixture
def finished(monkeypatch):
    """Set once a keyed answer has been remembered (the end of the first attempt's processing)."""
    done = threading.Event()
    original = Idempotency.finish

    async def finish(self, *args, **kwargs):
        await original(self, *args, **kwargs)
        done.set()

    monkeypatch.setattr(Idempotency, "finish", finish)
    return done


class Recording(httpx.HTTPTransport):
    """Real HTTP, noting each POST /tasks's key and status; ``on_response`` may act on an answer first."""

    def __init__(self, on_response=None) -> None:
        super().__init__()
        self.seen: list[tuple[str | None, int]] = []
        self.on_response = on_response

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/tasks"):
            self.seen.append((request.headers.get("Idempotency-Key"), response.status_code))
            if self.on_response is not None:
                self.on_response(request, response)
        return response


def test_the_sdk_retries_a_read_timeout_with_the_same_key_and_creates_one_task(server, api, gated_submit,
                                                                               finished):
    entered, release = gated_submit

    def on_response(request, response):
        if response.status_code == 409:  # the retry met the first attempt still in the gate: let it finish
            release.set()
            assert finished.wait(30)

    transport = Recording(on_response)
    with Client(server.url, TOKEN, timeout=2.0, transport=transport, backoff=0) as sdk:
        submitted = sdk.submit("clerk", "Write a.txt")  # the first attempt times out inside the gate
    assert entered.is_set()
    tasks = api.get("/tasks").json()
    assert [t["id"] for t in tasks] == [submitted.id]
    [(key, _), *rest] = transport.seen  # the timed-out attempt is not seen: it never answered
    assert [status for _, status in transport.seen] == [409, 202]
    assert key.startswith('"') and all(k == key for k, _ in rest)


def test_the_async_sdk_resends_a_lost_answer_with_the_callers_key(server, api):
    lost: list[str] = []

    class LoseFirst(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request):
            response = await super().handle_async_request(request)
            if request.method == "POST" and request.url.path.endswith("/tasks") and not lost:
                await response.aread()  # the server answered; the client never hears it
                lost.append(request.headers["Idempotency-Key"])
                raise httpx.ReadError("connection reset", request=request)
            return response

    async def main():
        async with AsyncClient(server.url, TOKEN, transport=LoseFirst(), backoff=0) as sdk:
            return await sdk.submit("clerk", "Write a.txt", idempotency_key="order-42")

    submitted = anyio.run(main)
    assert lost == ['"order-42"']
    assert [t["id"] for t in api.get("/tasks").json()] == [submitted.id]


def test_the_sdk_gives_up_after_its_retries_and_does_not_retry_what_is_not_safe(server):
    attempts: list[str] = []

    class Down(httpx.BaseTransport):
        def handle_request(self, request):
            attempts.append(f"{request.method} {request.url.path}")
            raise httpx.ConnectError("refused", request=request)

    with Client(server.url, TOKEN, transport=Down(), retries=2, backoff=0) as sdk:
        with pytest.raises(httpx.ConnectError):
            sdk.submit("clerk", "Write")
        assert attempts == ["POST /api/v1/tasks"] * 3
        attempts.clear()
        with pytest.raises(httpx.ConnectError):
            sdk.remove_rule("rule-1")  # a DELETE: sent once
        assert attempts == ["DELETE /api/v1/governance/rules/rule-1"]
        attempts.clear()
        with pytest.raises(httpx.ConnectError):
            list(sdk.send_message("chat-1", "hello"))  # a stream: sent once
        assert len(attempts) == 1
