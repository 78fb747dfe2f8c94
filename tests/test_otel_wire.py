"""The OTLP the exporter writes and how it sends it: spans encoded by hand (runtime/otlp.py) read back
by opentelemetry-proto exactly as the OpenTelemetry SDK's own encoding of the same span; requests to a
real OTLP/HTTP receiver on 127.0.0.1 that answers errors, closes connections, wants headers and gzip;
what is lost and counted when a collector refuses or spans pile up."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from apollia_nb.journal.store import Journal  # noqa: E402
from apollia_nb.runtime.telemetry import TelemetryConfig, TelemetryExporter  # noqa: E402


class Collector:
    """An OTLP/HTTP receiver: answers ``statuses`` in turn (then 200), keeps every request's headers
    and decoded spans; ``hang_up`` closes each connection after its answer without saying so."""

    def __init__(self, statuses: list[int] | None = None, hang_up: bool = False) -> None:
        self.statuses = list(statuses or [])
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                collector.connections += 1

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                status = collector.statuses.pop(0) if collector.statuses else 200
                collector.requests.append({"path": self.path, "headers": dict(self.headers), "status": status,
                                           "request": request,
                                           "spans": [s for rs in request.resource_spans
                                                     for ss in rs.scope_spans for s in ss.spans]})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if hang_up:
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def taken(self) -> list[Any]:
        return [s for r in self.requests if 200 <= r["status"] < 300 for s in r["spans"]]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def collector():
    made: list[Collector] = []

    def make(**kwargs: Any) -> Collector:
        made.append(Collector(**kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _calls(journal: Any, n: int, prefix: str = "c") -> None:
    for i in range(n):
        journal.append("decision", {"call_id": f"{prefix}{i}", "tool": "read_note", "outcome": "allow", "line": 3},
                       agent="clerk")
        journal.append("tool_result", {"call_id": f"{prefix}{i}", "status": "ok"}, agent="clerk")


def _exporter(journal: Any, url: str, **kwargs: Any) -> TelemetryExporter:
    return TelemetryExporter(journal, TelemetryConfig(enabled=True, endpoint=url, interval_secs=60), **kwargs)


# --- the encoding --------------------------------------------------------------------------------


def _sdk_request(spans: list[Any]) -> ExportTraceServiceRequest:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans)


@pytest.mark.parametrize("attributes, error", [
    ({"gen_ai.operation.name": "execute_tool", "apollia.journal.seq": 7, "apollia.decision.line": 0}, None),
    ({"s": "é" * 300, "neg": -5, "big": 2 ** 62, "yes": True, "no": False, "f": 1.5, "z": 0.0,
      "list": ["tool_calls", "stop"], "tuple": ("a",), "empty": ""}, "REFUSED"),
    ({}, "x" * 200),
])
def test_a_span_encoded_by_hand_reads_back_as_the_sdk_s_encoding_of_the_same_span(attributes, error):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

    from apollia_nb.runtime.otlp import encode_request, encode_request_frame, encode_span

    resource = {"service.name": "apollia-nb", "service.version": "1", "apollia.journal.origin": "o", "n": 3}
    trace, span, parent = bytes(range(1, 17)), bytes(range(20, 28)), bytes(range(40, 48))
    ours = ExportTraceServiceRequest()
    for _ in range(2):  # the second time, the repeated values come from the encoder's table
        ours.ParseFromString(encode_request(encode_request_frame(resource, "apollia_nb", "1"), [
            encode_span(trace, span, parent, "execute_tool read_note", 10**18, 10**18 + 5, attributes, error),
            encode_span(trace, parent, None, "invoke_agent clerk", 10**18 - 1, 10**18 + 9, attributes, None)]))

    def context(sid: bytes) -> Any:
        return SpanContext(int.from_bytes(trace, "big"), int.from_bytes(sid, "big"), is_remote=False,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED))

    sdk_resource, scope = Resource(resource), InstrumentationScope("apollia_nb", "1")
    theirs = _sdk_request([
        ReadableSpan("execute_tool read_note", context=context(span), parent=context(parent),
                     resource=sdk_resource, attributes=attributes, instrumentation_scope=scope,
                     status=Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET),
                     start_time=10**18, end_time=10**18 + 5),
        ReadableSpan("invoke_agent clerk", context=context(parent), parent=None, resource=sdk_resource,
                     attributes=attributes, instrumentation_scope=scope, status=Status(StatusCode.UNSET),
                     start_time=10**18 - 1, end_time=10**18 + 9)])
    assert ours == theirs


def test_attribute_values_that_repeat_or_never_repeat_encode_the_same_every_time():
    from apollia_nb.runtime.otlp import encode_request, encode_request_frame, encode_span

    frame = encode_request_frame({"service.name": "x"}, "apollia_nb", "1")
    for i in range(300):  # past the point where a key whose values keep changing stops being kept
        attributes = {"gen_ai.tool.name": "read_note", "apollia.journal.seq": i, "hash": f"{i:064x}",
                      "flag": i % 2 == 0, "one": 1, "true": True}
        request = ExportTraceServiceRequest()
        request.ParseFromString(encode_request(frame, [encode_span(b"t" * 16, b"s" * 8, None, "n", 1, 2,
                                                                   attributes)]))
        [span] = request.resource_spans[0].scope_spans[0].spans
        got = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
        assert got == attributes
        assert span.attributes[4].value.WhichOneof("value") == "int_value"  # 1 is not True
        assert span.attributes[5].value.WhichOneof("value") == "bool_value"


# --- sending ---------------------------------------------------------------------------------------


def test_a_collector_that_refuses_loses_that_request_s_spans_counted_and_takes_the_next(home, collector):
    c = collector(statuses=[413, 400])
    with Journal.open(home) as journal:
        tel = _exporter(journal, c.url)
        for batch in range(3):
            _calls(journal, 4, prefix=f"b{batch}-")
            tel.poll()
            tel.flush()
        tel.close()
    assert [r["status"] for r in c.requests] == [413, 400, 200]  # not retried, no call kept waiting
    assert tel.lost == 8 and tel.sent == 4
    assert sorted(s.attributes[2].value.string_value for s in c.taken()) == [f"b2-{i}" for i in range(4)]


def test_a_collector_that_says_later_is_tried_again_twice_then_its_spans_are_lost(home, collector):
    c = collector(statuses=[503, 429, 200, 502, 504, 503])
    with Journal.open(home) as journal:
        tel = _exporter(journal, c.url)
        _calls(journal, 3, prefix="a")
        tel.poll()
        assert tel.flush() == 3 and tel.lost == 0  # 503, 429, then taken
        _calls(journal, 2, prefix="b")
        tel.poll()
        assert tel.flush() == 0 and tel.lost == 2  # 502, 504, 503: given up
        tel.close()
    assert [r["status"] for r in c.requests] == [503, 429, 200, 502, 504, 503]
    assert sorted(s.attributes[2].value.string_value for s in c.taken()) == ["a0", "a1", "a2"]


def test_a_collector_that_hangs_up_after_each_answer_still_gets_every_request(home, collector):
    c = collector(hang_up=True)
    with Journal.open(home) as journal:
        tel = _exporter(journal, c.url)
        for batch in range(4):
            _calls(journal, 2, prefix=f"b{batch}-")
            tel.poll()
            assert tel.flush() == 2
        tel.close()
    assert len(c.requests) == 4 and c.connections >= 4 and tel.lost == 0


def test_requests_are_batched_up_to_max_batch_spans(home, collector):
    c = collector()
    with Journal.open(home) as journal:
        tel = _exporter(journal, c.url, max_batch=7)
        _calls(journal, 20)
        tel.poll()
        assert tel.flush() == 20
        tel.close()
    assert [len(r["spans"]) for r in c.requests] == [7, 7, 6]


def test_the_batch_and_the_pending_cap_come_from_the_otel_bsp_variables(home, collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "10")
    with Journal.open(home) as journal:
        tel = _exporter(journal, c.url)
        _calls(journal, 12)
        tel.poll()
        tel.close()
    assert [len(r["spans"]) for r in c.requests] == [4, 4, 2] and tel.lost == 2


def test_spans_past_max_pending_are_lost_and_counted_never_kept(home, collector):
    c = collector()
    with Journal.open(home) as journal:
        tel = _exporter(journal, c.url, max_pending=5)
        _calls(journal, 20)
        tel.poll()  # twenty spans end; five may wait for a request
        tel.close()
    assert tel.lost == 15 and tel.sent == 5
    assert [s.attributes[2].value.string_value for s in c.taken()] == [f"c{i}" for i in range(15, 20)]


def test_the_otel_variables_set_the_endpoint_headers_compression_and_resource(home, collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.url + "/custom/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret,x-team=a%20b")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    with Journal.open(home) as journal:
        tel = TelemetryExporter(journal, TelemetryConfig(enabled=True, interval_secs=60))
        _calls(journal, 3)
        tel.close()
    [request] = c.requests
    assert request["path"] == "/custom/traces"  # the traces endpoint is taken as it is
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["x-api-key"] == "s3cret" and headers["x-team"] == "a b"
    assert headers["content-encoding"] == "gzip" and headers["content-type"] == "application/x-protobuf"
    resource = {a.key: a.value.string_value for a in request["request"].resource_spans[0].resource.attributes}
    assert resource["deployment.environment"] == "test" and resource["service.name"] == "apollia-nb"
    assert len(request["spans"]) == 3


def test_the_general_endpoint_variable_gets_v1_traces_added(home, collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.url + "/base/")
    with Journal.open(home) as journal:
        tel = TelemetryExporter(journal, TelemetryConfig(enabled=True, interval_secs=60))
        _calls(journal, 1)
        tel.close()
    assert [r["path"] for r in c.requests] == ["/base/v1/traces"]


def test_a_collector_that_never_answers_keeps_closing_short_and_loses_the_spans(home, monkeypatch):
    import socket
    import time

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    with socket.socket() as silent:  # takes connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        with Journal.open(home) as journal:
            tel = _exporter(journal, f"http://127.0.0.1:{silent.getsockname()[1]}")
            _calls(journal, 5)
            started = time.monotonic()
            tel.close(timeout=1.0)
            assert time.monotonic() - started < 5
            assert tel.sent == 0
            journal.append("decision", {"call_id": "after", "tool": "t", "outcome": "allow"})  # the journal goes on


def test_the_entry_time_is_read_the_same_as_isoformat_reads_it():
    from datetime import datetime

    from apollia_nb.runtime.telemetry import _ns

    for ts in ["2026-12-07T10:00:00.000000Z", "2026-12-07T10:00:00.999999Z", "1970-01-01T00:00:00.000001Z",
               "2026-12-31T23:59:59.123456Z", "2027-01-01T00:00:00.000000Z", "2026-12-07T10:00:00Z",
               "2026-12-07T10:00:00.5Z", "2026-12-07T10:00:00.123456+00:00"]:
        parsed = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        assert _ns(ts) == int(parsed.timestamp()) * 1_000_000_000 + parsed.microsecond * 1000, ts


def test_a_payload_nested_past_the_parser_s_depth_is_skipped_and_the_rest_still_gives_spans():
    from types import SimpleNamespace

    from apollia_nb.runtime.telemetry import SpanDeriver

    def entry(seq: int, kind: str, payload: bytes) -> Any:
        return SimpleNamespace(seq=seq, ts="2026-12-07T10:00:00.000000Z", run_id=None, agent="a", kind=kind,
                               payload=payload, hash=bytes(32))

    deep = b'{"call_id":"x","tool":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    moves = SpanDeriver().feed([
        entry(1, "decision", deep),
        entry(2, "decision", b'{"call_id":"ok","tool":"t","outcome":"allow"}'),
        entry(3, "tool_result", b'{"call_id":"ok","status":"ok"}'),
    ])
    assert [getattr(m, "name", None) for m in moves][:1] == ["execute_tool t"] and len(moves) == 2


def test_an_https_collector_is_trusted_by_the_certificate_variable_and_refused_without_it(home, tmp_path,
                                                                                       collector, monkeypatch):
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    c = collector()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    c.httpd.socket = context.wrap_socket(c.httpd.socket, server_side=True)
    url = c.url.replace("http://", "https://")
    with Journal.open(home) as journal:
        untrusted = _exporter(journal, url)
        _calls(journal, 2, prefix="u")
        untrusted.close()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
        trusted = _exporter(journal, url)
        _calls(journal, 3, prefix="t")
        trusted.close()
    assert untrusted.sent == 0 and untrusted.lost == 2
    assert trusted.sent == 3 and sorted(s.attributes[2].value.string_value for s in c.taken()) == ["t0", "t1", "t2"]


def test_grpc_sends_the_header_variable_as_metadata_and_delivers_gzip_compressed(home, monkeypatch):
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    seen: list[tuple[dict[str, str], int]] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            seen.append((dict(context.invocation_metadata()),
                         sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=s3cret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    try:
        with Journal.open(home) as journal:
            tel = TelemetryExporter(journal, TelemetryConfig(enabled=True, endpoint=f"http://127.0.0.1:{port}",
                                                             protocol="grpc", interval_secs=60))
            _calls(journal, 4)
            tel.close(timeout=10)
    finally:
        server.stop(None)
    [(metadata, spans)] = seen
    assert metadata["x-api-key"] == "s3cret" and metadata["user-agent"].startswith("apollia-nb") and spans == 4
    assert tel.sent == 4


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_endpoint_variable_that_is_no_url_stops_the_exporter_naming_it(home, monkeypatch, variable):
    from apollia_nb.errors import BadInput

    monkeypatch.setenv(variable, "http://127.0.0.1:99999")
    with Journal.open(home) as journal:
        with pytest.raises(BadInput, match="OTLP endpoint"):
            TelemetryExporter(journal, TelemetryConfig(enabled=True, interval_secs=60))
        journal.append("decision", {"call_id": "c", "tool": "t", "outcome": "allow"})  # nothing was left hooked


@pytest.mark.parametrize("insecure, delivered", [("true", True), (None, False), ("false", False)])
def test_grpc_to_an_endpoint_without_a_scheme_is_plain_text_only_when_insecure_says_so(home, monkeypatch,
                                                                                       insecure, delivered):
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got: list[int] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            got.append(sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    if insecure is not None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", insecure)
    try:
        with Journal.open(home) as journal:
            tel = TelemetryExporter(journal, TelemetryConfig(enabled=True, protocol="grpc", interval_secs=60))
            _calls(journal, 2)
            tel.close(timeout=10)
    finally:
        server.stop(None)
    assert (got == [2], tel.sent, tel.lost) == ((True, 2, 0) if delivered else (False, 0, 2))
