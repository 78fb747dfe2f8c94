"""What a client's governed call and journal append are answered with, as sent on the wire: exactly the JSON
their documented models (``CallOut``, ``JournalRows``) give, though the server builds these answers itself
rather than checking them against the models on every request. And how the client sends its call requests:
on kept connections of the standard library's HTTP, a connection the server closed replaced once, a stopped
server told apart from one that may have got the request.

Against a real server (uvicorn on 127.0.0.1 on a port of its own, the home's journal and governance), and a
plain HTTP server on 127.0.0.1 (port 0) for the connections.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
from typing import Any

import httpx
import pytest

from apollia_nb.api.internal import CallOut, GovernanceSnapshot, JournalRows
from apollia_nb.api.server import ServerThread
from apollia_nb.runtime.remote import JsonPosts, LoopPosts, NotSent

TOKEN = "served-call-answers-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALLS = "/api/v1/internal/calls"


@pytest.fixture
def served(home):
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as client:
        yield client


def call_body(run_id: str, call_id: str, **changes: Any) -> dict[str, Any]:
    body = {"call_id": call_id, "run_id": run_id, "agent": "clerk", "tool": "list_dir", "family": "read",
            "arguments": {"path": "."}, "decision": {"call_id": call_id, "tool": "list_dir", "arguments": {"path": "."}},
            "before": [{"kind": "model_response", "run_id": run_id, "agent": "clerk",
                        "payload": {"role": "actor", "turn": 1, "text": "é ✓", "tool_calls": []}}]}
    return {**body, **changes}


def as_documented(model: Any, response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON, checked to be exactly what ``model`` sends for it (nothing more, nothing less)."""
    assert response.headers["content-type"] == "application/json"
    sent = response.json()
    assert model.model_validate(sent).model_dump(mode="json") == sent
    return sent


def test_a_call_answer_is_its_documented_model_with_the_snapshot_only_when_the_client_holds_another(served):
    snapshot = served.get("/api/v1/internal/governance/snapshot").json()
    stale = as_documented(CallOut, served.post(CALLS, json=call_body("run-a", "c1", generation="old.1")))
    assert stale["snapshot"] == GovernanceSnapshot.model_validate(snapshot).model_dump(mode="json")
    assert stale["generation"] == snapshot["generation"]
    none_held = as_documented(CallOut, served.post(CALLS, json=call_body("run-a", "c2")))
    assert none_held["snapshot"] == stale["snapshot"]
    held = as_documented(CallOut, served.post(CALLS, json=call_body("run-a", "c3", generation=snapshot["generation"])))
    assert held["snapshot"] is None
    assert held["decision"] == {"outcome": "allow", "line": held["decision"]["line"], "answers": [],
                                "reason": held["decision"]["reason"], "rule_id": None}
    kinds = [row["kind"] for row in held["entries"]]
    assert kinds == ["model_response", "decision", "tool_call"]
    assert json.loads(held["entries"][0]["payload"])["text"] == "é ✓"  # not escaped, not re-encoded
    # a retry is answered as the first was
    again = as_documented(CallOut, served.post(CALLS, json=call_body("run-a", "c1", generation="old.1")))
    assert again == stale


def test_a_refused_call_answer_is_its_documented_model(served):
    served.post("/api/v1/governance/rules", json={"tool": "list_dir", "effect": "deny", "agent": "clerk"}).raise_for_status()
    refused = as_documented(CallOut, served.post(CALLS, json=call_body("run-r", "c1")))
    assert refused["decision"]["outcome"] == "refuse" and refused["decision"]["rule_id"]
    assert [row["kind"] for row in refused["entries"]] == ["model_response", "decision", "tool_result"]


def test_an_append_answer_is_its_documented_model_and_201(served):
    response = served.post("/api/v1/internal/journal/entries", json={"entries": [
        {"kind": "note", "payload": {"text": "ü"}, "run_id": "run-n", "agent": None}]})
    assert response.status_code == 201
    rows = as_documented(JournalRows, response)["entries"]
    assert [(r["kind"], json.loads(r["payload"])) for r in rows] == [("note", {"text": "ü"})]


def test_a_bad_call_is_still_refused_before_anything_is_journaled(served):
    head = served.get("/api/v1/internal/journal/head").json()["seq"]
    bad = served.post(CALLS, json=call_body("run-b", "c1", family="bogus"))
    assert bad.status_code == 422
    assert served.get("/api/v1/internal/journal/head").json()["seq"] == head


# --- the client's call requests: keep-alive connections of the standard library ---------------------------


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers each POST with its body; closes the connection after each answer without saying so when the
    server's ``drop`` is set (as a server does with a connection idle past its keep-alive time)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # the name http.server calls
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, self.headers["Authorization"], json.loads(body)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.drop:  # type: ignore[attr-defined]
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.seen, server.drop, server.connections = [], False, 0  # type: ignore[attr-defined]
    accept = server.get_request

    def counted() -> Any:
        server.connections += 1  # type: ignore[attr-defined]
        return accept()

    server.get_request = counted  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class OnLoop:
    """``LoopPosts`` with ``JsonPosts``'s blocking face: each post on an event loop of its own (its sockets
    belong to no loop, so a kept one serves the next loop too)."""

    def __init__(self, posts: LoopPosts) -> None:
        self.posts = posts

    def post(self, path: str, body: Any) -> tuple[int, bytes]:
        return asyncio.run(self.posts.post(path, body))

    def close(self) -> None:
        self.posts.close()


TRANSPORTS = {"thread": JsonPosts.of, "loop": lambda *a, **k: (lambda p: p and OnLoop(p))(LoopPosts.of(*a, **k))}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request):
    return TRANSPORTS[request.param]


def posts_to(server: Any, transport: Any, *, timeout: float = 10.0) -> Any:
    host, port = server.server_address[:2]
    posts = transport(f"http://{host}:{port}", {"Authorization": "Bearer t"}, timeout=timeout, connect=5.0)
    assert posts is not None
    return posts


def test_call_requests_share_one_kept_connection(echo, transport):
    posts = posts_to(echo, transport)
    try:
        answers = [posts.post("/api/v1/internal/calls", {"n": n, "text": "é"}) for n in range(5)]
    finally:
        posts.close()
    assert [(status, json.loads(body)) for status, body in answers] == [(200, {"n": n, "text": "é"}) for n in range(5)]
    assert echo.connections == 1
    assert [(p, a) for p, a, _ in echo.seen] == [("/api/v1/internal/calls", "Bearer t")] * 5


def test_a_kept_connection_the_server_closed_is_replaced_once_and_the_request_sent_on_a_new_one(echo, transport):
    echo.drop = True
    posts = posts_to(echo, transport)
    try:
        assert [posts.post("/x", {"n": n})[0] for n in range(3)] == [200, 200, 200]
    finally:
        posts.close()
    assert [b for _, _, b in echo.seen] == [{"n": 0}, {"n": 1}, {"n": 2}]  # each sent once, none lost
    assert echo.connections == 3


def test_a_stopped_server_is_not_sent_to_and_a_silent_one_times_out(transport):
    with socket.socket() as held:  # a port nobody listens on
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    posts = transport(f"http://127.0.0.1:{port}", {}, timeout=1.0, connect=1.0)
    assert posts is not None
    with pytest.raises(NotSent):
        posts.post("/x", {})
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        posts = transport("http://127.0.0.1:%d" % silent.getsockname()[1], {}, timeout=0.5, connect=1.0)
        assert posts is not None
        with pytest.raises(OSError) as raised:
            posts.post("/x", {})
        assert not isinstance(raised.value, NotSent)  # it may have been sent: the caller decides to retry


def test_only_a_plain_http_server_url_is_carried_on_the_standard_library(transport):
    for url in ("https://127.0.0.1:8443", "http://127.0.0.1", "http://127.0.0.1:80/prefix", "unix:///x"):
        assert transport(url, {}, timeout=1, connect=1) is None, url
    assert transport("http://[::1]:8080", {}, timeout=1, connect=1) is not None


def _answering(*answers: bytes) -> tuple[socket.socket, threading.Thread, list[bytes]]:
    """A server on 127.0.0.1 that reads one request per answer on one connection and sends the answer as
    given, a few bytes at a time (so the reader sees a head and a body split anywhere)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for answer in answers:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                got.append(body)
                for i in range(0, len(answer), 7):
                    conn.sendall(answer[i:i + 7])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread, got


def test_on_the_loop_a_chunked_answer_is_read_whole_and_an_answer_without_a_length_is_no_answer():
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
               b"4\r\n{\"a\"\r\n6;x=1\r\n:\"\xc3\xa9\"}\r\n0\r\nX-Trailer: 1\r\n\r\n")
    plain = b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}"
    unknown = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}"
    listener, thread, got = _answering(chunked, plain, unknown)
    with listener:
        posts = OnLoop(LoopPosts.of("http://127.0.0.1:%d" % listener.getsockname()[1], {}, timeout=5.0,
                                    connect=5.0))
        try:
            assert posts.post("/x", {"n": 1}) == (200, '{"a":"é"}'.encode())
            assert posts.post("/x", {"n": 2}) == (409, b"{}")  # the same connection, kept
            with pytest.raises(OSError) as raised:
                posts.post("/x", {"n": 3})
            assert not isinstance(raised.value, NotSent)
        finally:
            posts.close()
        thread.join(10)
    assert [json.loads(b) for b in got] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_on_the_loop_an_answer_that_ends_early_or_is_not_http_is_no_answer():
    for answer in (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}", b"SSH-2.0-OpenSSH\r\n\r\n"):
        listener, thread, got = _answering(answer)
        with listener:
            posts = OnLoop(LoopPosts.of("http://127.0.0.1:%d" % listener.getsockname()[1], {}, timeout=5.0,
                                        connect=5.0))
            try:
                with pytest.raises(OSError) as raised:
                    posts.post("/x", {})
                assert not isinstance(raised.value, NotSent), answer
            finally:
                posts.close()
            thread.join(10)
        assert got == [b"{}"]


# --- listing a waiting call: the store's write off the event loop ----------------------------------------


class _Asked:
    """governance.db's lock in this process, telling when a thread other than its holder asks for it."""

    def __init__(self) -> None:
        self.lock, self.asked, self.holder = threading.RLock(), threading.Event(), None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self.holder is not None and self.holder != threading.get_ident():
            self.asked.set()
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def test_the_server_answers_others_while_a_waiting_call_is_being_listed(home, monkeypatch):
    """The store's write of a pending decision waits for governance.db (held here, as a long write would
    hold it); the server's event loop answers other requests meanwhile, and the listing completes after."""
    from apollia_nb.governance import store

    lock = _Asked()
    monkeypatch.setitem(store._PATH_LOCKS, str(home.governance_db), lock)
    pending = {"run_id": "run-p", "task_id": "task-p", "agent": "clerk", "tool": "write_file", "family": "write",
               "arguments": {"path": "x.txt"}, "answers": ["once", "refuse"], "reason": "asks", "line": 6,
               "call_id": "call-1"}
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as http:
        listed: list[httpx.Response] = []
        with lock:
            lock.holder = threading.get_ident()
            adding = threading.Thread(target=lambda: listed.append(
                http.post("/api/v1/internal/pending-decisions", json=pending)))
            adding.start()
            assert lock.asked.wait(30)  # the listing waits for the store now
            with httpx.Client(base_url=srv.url, timeout=10) as other:
                assert other.get("/api/v1/health").status_code == 200  # not held up by it
            assert not listed
            lock.holder = None
        adding.join(30)
        assert listed and listed[0].status_code == 201, listed
        decision = listed[0].json()
        assert decision["status"] == "pending" and decision["tool"] == "write_file"
        assert [d["id"] for d in http.get("/api/v1/internal/pending-decisions").json()] == [decision["id"]]


def test_a_body_that_is_not_json_is_refused_before_anything_is_sent(echo, transport):
    posts = posts_to(echo, transport)
    try:
        for bad in ({"x": float("nan")}, {"x": float("inf")}, {"x": object()}):
            with pytest.raises((ValueError, TypeError)):
                posts.post("/x", bad)
    finally:
        posts.close()
    assert echo.seen == [] and echo.connections == 0
