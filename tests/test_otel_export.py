"""OpenTelemetry export: spans of a governed run sent to a real OTLP/HTTP receiver on 127.0.0.1.

The receiver decodes ``ExportTraceServiceRequest`` protobuf with opentelemetry-proto; every
span's journal seq and entry hash are proven with ``apollia-os audit prove``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from apollia_nb.cli import main  # noqa: E402
from apollia_nb.errors import BadInput  # noqa: E402
from apollia_nb.runtime import Runtime  # noqa: E402
from runtime_helpers import call, manifest  # noqa: E402

pytestmark = pytest.mark.anyio


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.paths.append(self.path)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    receiver.resources.append({a.key: _value(a.value) for a in rs.resource.attributes})
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            receiver.spans.append({
                                "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex() or None,
                                "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                                "status": span.status.code,
                                "attrs": {a.key: _value(a.value) for a in span.attributes},
                            })
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _enable(home: Any, url: str, **extra: Any) -> None:
    home.path.mkdir(parents=True, exist_ok=True)
    lines = ["[telemetry]", "enabled = true", f'endpoint = "{url}"', "interval_secs = 0.05"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    home.config_path.write_text("\n".join(lines) + "\n")


async def _governed_run(rt: Any) -> Any:
    rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="test")
    await rt.register_agent(manifest(
        planner=[{"steps": ["look", "write"]}],
        actor=[{"tool_calls": [call("list_dir", path="."), call("write_file", path="a.txt", content="hi")]},
               {"tool_calls": [call("write_file", path="secrets/k", content="x")]}]))
    handle = await rt.submit("clerk", "Look, then write")
    await handle.settled()
    handle.pending[0].answer("once")
    return await handle


async def test_a_run_s_spans_reach_a_real_otlp_receiver_and_prove_against_the_journal(home, receiver, capsys):
    _enable(home, receiver.url)
    async with Runtime(home) as rt:
        task = await _governed_run(rt)
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        run_id = task.run_id
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert receiver.resources[0]["service.name"] == "apollia-nb"
    spans = [s for s in receiver.spans if s["trace"] == next(
        x["trace"] for x in receiver.spans if x["attrs"].get("apollia.run.id") == run_id)]
    by_id = {s["id"]: s for s in spans}
    [root] = [s for s in spans if s["parent"] is None]
    assert root["name"] == "invoke_agent clerk"
    assert root["attrs"]["gen_ai.operation.name"] == "invoke_agent"
    assert root["attrs"]["gen_ai.agent.name"] == "clerk" and root["attrs"]["apollia.run.status"] == "failed"
    assert root["attrs"]["error.type"] == "REFUSED" and root["status"] == 2  # STATUS_CODE_ERROR

    steps = [s for s in spans if s["parent"] == root["id"]]
    assert [s["name"] for s in sorted(steps, key=lambda s: s["start"])] == ["plan", "act"]
    plan = next(s for s in steps if s["name"] == "plan")
    assert plan["attrs"]["gen_ai.operation.name"] == "plan"
    chats = [s for s in spans if s["attrs"].get("gen_ai.operation.name") == "chat"]
    assert len(chats) == 3  # the planner's turn and two of the actor's
    assert all(by_id[c["parent"]]["name"] in ("plan", "act") for c in chats)
    assert all(c["attrs"]["gen_ai.provider.name"] == "scripted" for c in chats)

    tools = sorted((s for s in spans if s["attrs"].get("gen_ai.operation.name") == "execute_tool"),
                   key=lambda s: s["start"])
    assert [(t["attrs"]["gen_ai.tool.name"], t["attrs"]["apollia.decision.outcome"]) for t in tools] == [
        ("list_dir", "allow"), ("write_file", "ask"), ("write_file", "refuse")]
    assert all(by_id[t["parent"]]["name"] == "act" for t in tools)
    allowed, asked, refused = tools
    assert allowed["attrs"]["apollia.decision.line"] == 3 and allowed["attrs"]["apollia.decision.rule"] == "reads_only"
    assert allowed["attrs"]["apollia.decision.family"] == "read" and allowed["status"] != 2
    assert asked["attrs"]["apollia.decision.answer"] == "once"
    assert asked["attrs"]["apollia.decision.answered_by"] == "user"
    assert asked["attrs"]["apollia.decision.wait_ms"] >= 0 and asked["attrs"]["apollia.tool.status"] == "ok"
    assert refused["attrs"]["apollia.decision.rule"] == "deny_rule" and refused["attrs"]["apollia.decision.line"] == 2
    assert refused["attrs"]["error.type"] == "REFUSED" and refused["status"] == 2
    assert "apollia.decision.answer" not in refused["attrs"]
    for t in tools:
        assert t["start"] <= t["end"] and t["attrs"]["gen_ai.tool.call.id"]

    # Every span's seq and entry hash prove against the journal, with the CLI an auditor runs.
    capsys.readouterr()
    proven = 0
    for span in spans:
        for prefix in ("apollia.journal", "apollia.journal.result", "apollia.journal.answer"):
            seq = span["attrs"].get(f"{prefix}.seq")
            if seq is None:
                continue
            assert main(["audit", "prove", str(seq), "--home", str(home.path), "--json"]) == 0
            proof = json.loads(capsys.readouterr().out)
            assert proof["entry_hash"] == span["attrs"][f"{prefix}.entry_hash"]
            proven += 1
    assert proven >= len(spans) + 3  # every span, and the results and the answer of the calls


async def test_a_dead_collector_loses_spans_and_never_a_call(home):
    import socket

    with socket.socket() as s:  # a port nobody listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _enable(home, f"http://127.0.0.1:{port}")
    async with Runtime(home) as rt:
        assert rt.telemetry is not None
        task = await _governed_run(rt)
        assert task.error["code"] == "REFUSED"
        kinds = [e.kind for e in rt.journal.entries(run_id=task.run_id)]
        assert kinds.count("decision") == 3 and kinds[-1] == "run_seal"


async def test_telemetry_is_off_unless_enabled(home, receiver):
    home.path.mkdir(parents=True, exist_ok=True)
    home.config_path.write_text(f'[telemetry]\nendpoint = "{receiver.url}"\n')
    async with Runtime(home) as rt:
        assert rt.telemetry is None
        await _governed_run(rt)
    assert receiver.spans == []


@pytest.mark.parametrize("table, word", [
    ("enabled = 1", "enabled"),
    ('enabled = true\nendpoint = "ftp://x"', "endpoint"),
    ('enabled = true\nendpoint = "http://127.0.0.1:99999"', "endpoint"),
    ('enabled = true\nendpoint = "http://127.0.0.1:port"', "endpoint"),
    ('enabled = true\nendpoint = "http://:4318"', "endpoint"),
    ('enabled = true\nprotocol = "http/json"', "protocol"),
    ("enabled = true\ninterval_secs = 0", "interval_secs"),
    ("enabled = true\ninterval_secs = true", "interval_secs"),
    ('enabled = true\nservice_name = ""', "service_name"),
    ("enabled = true\nsampler = 1", "sampler"),
])
async def test_a_bad_telemetry_table_refuses_to_open_the_home_naming_the_key(home, table, word):
    home.path.mkdir(parents=True, exist_ok=True)
    home.config_path.write_text(f"[telemetry]\n{table}\n")
    with pytest.raises(BadInput, match=word):
        async with Runtime(home):
            pass
    async with Runtime(home.path.parent / "other"):  # nothing was left holding a home
        pass


async def test_otel_sdk_disabled_turns_it_off(home, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    _enable(home, receiver.url)
    async with Runtime(home) as rt:
        assert rt.telemetry is None


async def test_the_spans_go_over_grpc_when_the_protocol_says_so(home):
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    names: list[str] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            names.extend(s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        _enable(home, f"http://127.0.0.1:{port}", protocol="grpc")
        async with Runtime(home) as rt:
            await _governed_run(rt)
    finally:
        server.stop(None)
    assert "invoke_agent clerk" in names and names.count("execute_tool write_file") == 2


async def test_a_dead_collector_keeps_closing_the_home_short(home):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _enable(home, f"http://127.0.0.1:{port}")
    rt = Runtime(home)
    await rt.__aenter__()
    await _governed_run(rt)
    started = time.monotonic()
    await rt.__aexit__(None, None, None)
    assert time.monotonic() - started < 15  # the last export is given 3 s, never the exporter's retries


def _entry(seq: int, kind: str, payload: dict, run_id: str | None = "run-1", agent: str | None = "clerk",
           ts: str = "2026-12-07T10:00:00.000000Z") -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(seq=seq, ts=ts, run_id=run_id, agent=agent, kind=kind,
                           payload=json.dumps(payload).encode(), hash=bytes([seq]) * 32)


def test_the_deriver_reads_the_model_usage_and_a_hook_s_call_is_a_root_span():
    from apollia_nb.runtime.telemetry import Close, Open, SpanDeriver

    moves = SpanDeriver().feed([
        _entry(1, "agent_identity", {"identity": {"model": {"provider": "openai", "model": "gpt-x"}}}, run_id=None),
        _entry(2, "run_open", {"run_kind": "chat"}),
        _entry(3, "model_response", {"role": "actor", "turn": 1, "text": "", "tool_calls": [],
                                     "usage": {"prompt_tokens": 12, "completion_tokens": 5}}),
        _entry(4, "decision", {"call_id": "h1", "tool": "Bash", "outcome": "refuse", "line": 1, "family": "execute",
                               "reason": "policy", "source": "claude-code", "source_tool": "Bash"},
               run_id=None, agent="claude-code"),
        _entry(5, "tool_result", {"call_id": "h1", "tool": "Bash", "status": "refused", "error_code": "REFUSED"},
               run_id=None, agent="claude-code"),
        _entry(6, "run_seal", {"status": "completed", "entries": 2}),
    ])
    opened = {m.key: m for m in moves if isinstance(m, Open)}
    chat = next(m for m in opened.values() if m.attributes.get("gen_ai.operation.name") == "chat")
    assert chat.name == "chat gpt-x" and chat.attributes["gen_ai.request.model"] == "gpt-x"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 12 and chat.attributes["gen_ai.usage.output_tokens"] == 5
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    hook = next(m for m in opened.values() if m.attributes.get("gen_ai.tool.name") == "Bash")
    assert hook.parent is None and hook.attributes["apollia.call.source"] == "claude-code"
    assert hook.attributes["apollia.decision.rule"] == "organisation_policy"
    closed = [m for m in moves if isinstance(m, Close) and m.key == hook.key]
    assert closed[-1].error == "REFUSED"
    # every span opened is closed by the seal
    ends = {m.key for m in moves if isinstance(m, Close) and m.end_ns >= 0}
    assert set(opened) == ends


def test_an_entry_that_does_not_parse_is_skipped_not_fatal():
    from types import SimpleNamespace

    from apollia_nb.runtime.telemetry import SpanDeriver

    broken = SimpleNamespace(seq=1, ts="2026-12-07T10:00:00Z", run_id="r", agent="a", kind="decision",
                             payload=b"{not json", hash=bytes(32))
    listed = SimpleNamespace(seq=2, ts="2026-12-07T10:00:00Z", run_id="r", agent="a", kind="decision",
                             payload=b"[1]", hash=bytes(32))
    no_call = _entry(3, "decision", {"tool": "x", "outcome": "allow"})
    moves = SpanDeriver().feed([broken, listed, no_call])
    assert [getattr(m, "name", None) for m in moves] == ["invoke_agent clerk"]  # the run, and no call span


class _Kept:
    """A transport keeping the spans of each OTLP request it is given, decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def __call__(self, body: bytes) -> None:
        from types import SimpleNamespace

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans.extend(SimpleNamespace(
                    name=s.name, attributes={a.key: _value(a.value) for a in s.attributes},
                    status=SimpleNamespace(is_ok=s.status.code != 2)) for s in ss.spans)


def test_spans_come_from_the_entries_as_they_commit_and_never_force_a_copy_into_journal_db(home):
    from apollia_nb.journal.store import Journal
    from apollia_nb.runtime.telemetry import TelemetryConfig, TelemetryExporter

    kept = _Kept()
    with Journal.open(home) as journal:
        journal._core.idle = 3600.0  # the copier copies only when somebody asks (or a batch fills)
        before = journal.stats["imports"]
        tel = TelemetryExporter(journal, TelemetryConfig(enabled=True, interval_secs=60), exporter=kept)
        for i in range(20):
            journal.append("decision", {"call_id": f"c{i}", "tool": "read_note", "outcome": "allow", "line": 3},
                           agent="clerk")
            journal.append("tool_result", {"call_id": f"c{i}", "status": "ok" if i % 2 else "error"}, agent="clerk")
            journal.append("tool_args", {"call_id": f"c{i}"}, agent="clerk")  # a kind no span is made of
            assert tel.poll() == 2
        assert journal.stats["imports"] == before  # nothing was read back: no copy asked for
        tel.close()
        assert journal.stats["imports"] == before
        assert len(kept.spans) == 20 and tel.dropped == 0
        by_seq = {e.seq: e for e in journal.entries()}
        for span in kept.spans:
            entry = by_seq[span.attributes["apollia.journal.seq"]]
            assert entry.kind == "decision" and entry.hash.hex() == span.attributes["apollia.journal.entry_hash"]
            result = by_seq[span.attributes["apollia.journal.result.seq"]]
            assert result.kind == "tool_result" and json.loads(result.payload)["call_id"] == span.attributes[
                "gen_ai.tool.call.id"]
        assert sum(s.status.is_ok is False for s in kept.spans) == 10
        # the hook is gone once closed: later entries are not queued
        journal.append("decision", {"call_id": "late", "tool": "t", "outcome": "allow"})
        assert tel.poll() == 0


def test_telemetry_since_a_seq_reads_the_entries_before_the_hook_once_then_takes_the_rest_from_it(home):
    from apollia_nb.journal.store import Journal
    from apollia_nb.runtime.telemetry import TelemetryConfig, TelemetryExporter

    kept = _Kept()
    with Journal.open(home) as journal:
        for i in range(3):
            journal.append("decision", {"call_id": f"a{i}", "tool": "t", "outcome": "allow"})
            journal.append("tool_result", {"call_id": f"a{i}", "status": "ok"})
        journal.append("decision", {"call_id": "open", "tool": "t", "outcome": "allow"})
        tel = TelemetryExporter(journal, TelemetryConfig(enabled=True, interval_secs=60), since_seq=0, exporter=kept)
        journal.append("tool_result", {"call_id": "open", "status": "ok"})  # queued by the hook meanwhile
        assert tel.poll() == 8  # seven read back, one from the hook, none twice
        assert tel.poll() == 0
        tel.close()
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in kept.spans) == ["a0", "a1", "a2", "open"]


async def test_a_full_span_queue_drops_spans_and_never_slows_or_fails_a_governed_call(home):
    import anyio

    from apollia_nb.runtime.telemetry import TelemetryConfig, TelemetryExporter

    kept = _Kept()
    async with Runtime(home) as rt:
        assert rt.telemetry is None
        tel = TelemetryExporter(rt.journal, TelemetryConfig(enabled=True, interval_secs=0.01), exporter=kept,
                                queue_size=1)
        tel.start()
        tel._lock.acquire()  # the exporter's thread is stuck: nothing is taken from the queue
        try:
            await rt.register_agent(manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}] * 6))
            with anyio.fail_after(60):  # a hook that waited for room would hang the run here
                task = await (await rt.submit("clerk", "Look six times"))
            assert task.status == "completed"
            kinds = [e.kind for e in rt.journal.entries(run_id=task.run_id)]
            assert kinds.count("decision") == 6 and kinds.count("tool_result") == 6
            assert tel.dropped >= len([k for k in kinds if k in ("run_open", "model_response", "decision",
                                                                   "tool_result", "run_seal")]) - 1
            assert len(tel._queue) == 1
        finally:
            tel._lock.release()
        tel.close()
    assert tel.dropped > 0 and len(kept.spans) <= 1  # what one queued entry can give, nothing more
