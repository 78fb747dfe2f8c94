"""OpenTelemetry spans derived from the journal as it commits (``[telemetry]`` in apollia.toml).

Two parts:

``SpanDeriver`` (pure)
    Takes committed journal entries in seq order and returns span moves
    (``Open`` / ``Close`` values): ``invoke_agent`` for a run, one step span per
    stretch of the same model role (``plan`` for the planner, ``act`` for the
    actor, ``critic`` for the critic), ``chat`` per model turn and
    ``execute_tool`` per governed call (allowed, asked, refused), each carrying
    the seq and entry hash of the entry it comes from, so ``audit prove`` proves it.
    No clock, no I/O: times are the entries' own ``ts``.

``TelemetryExporter`` (the edge)
    Told each acknowledged group's entries by the journal's observer hook
    (``Journal.observe``: a bounded queue, nothing read back), a thread turns
    them into spans every ``interval_secs`` and feeds the OpenTelemetry SDK's
    batching span processor and its OTLP exporter (HTTP/protobuf or gRPC, set by
    the standard ``OTEL_*`` variables). It is never in a governed call's path: the
    hook only queues (or drops and counts, when full), and a collector that is
    down loses spans, never calls.

The attribute names follow the OpenTelemetry GenAI semantic conventions
(semantic-conventions-genai, status Development); the decision attributes are
``apollia.*`` (docs/evidence.md gives the mapping and the proposals they match).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from json.scanner import make_scanner
from typing import Any, NamedTuple

from apollia_nb.errors import BadInput
from apollia_nb.runtime.otlp import encode_request, encode_request_frame, encode_span

__all__ = ["Open", "Close", "SpanDeriver", "TelemetryConfig", "parse_telemetry", "TelemetryExporter",
           "DECISION_RULES", "start_telemetry"]

#: decide()'s lines by name (apollia.decision.rule): which of its six lines decided.
DECISION_RULES: dict[int, str] = {
    0: "governance_unreadable",
    1: "organisation_policy",
    2: "deny_rule",
    3: "reads_only",
    4: "execute",
    5: "consent",
    6: "ask",
}

_STEP_NAMES = {"planner": "plan", "actor": "act", "critic": "critic"}

#: The kinds spans are derived from (the rest is never read).
_READ_KINDS = ("agent_identity", "run_open", "run_seal", "model_response", "decision", "answer", "tool_result")
_READ_SET = frozenset(_READ_KINDS)

#: JSON's own scanner (what ``json.loads`` runs, without its wrapper): a value and where it ends
_DECODER = json.JSONDecoder()
_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(_DECODER)  # type: ignore[arg-type]  # stub: a context


class Open(NamedTuple):
    """Start a span ``key`` under ``parent`` (None: a root span) at ``start_ns``."""

    key: tuple[Any, ...]
    parent: tuple[Any, ...] | None
    name: str
    start_ns: int
    attributes: dict[str, Any]


class Close(NamedTuple):
    """End span ``key`` at ``end_ns``, adding ``attributes``; ``error`` marks its status an error.
    An ``end_ns`` below zero only adds the attributes (the span stays open)."""

    key: tuple[Any, ...]
    end_ns: int
    attributes: dict[str, Any]
    error: str | None = None


_TOOL_CALLS = ("tool_calls",)  # gen_ai.response.finish_reasons of a turn that calls tools
_NO_ATTRIBUTES: dict[str, Any] = {}  # shared by the moves that add none (never changed)


_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS" → its nanoseconds since the epoch (a few, reused)


def _ns(ts: str) -> int:
    """An entry's ``ts`` (``YYYY-MM-DDTHH:MM:SS.ffffffZ``, UTC) in nanoseconds since the epoch."""
    if len(ts) == 27 and ts[19] == "." and ts[26] == "Z" and ts[20:26].isdigit():
        second = _SECONDS.get(ts[:19])
        if second is None:
            if len(_SECONDS) > 64:
                _SECONDS.clear()
            second = _SECONDS[ts[:19]] = int(datetime.fromisoformat(ts[:19] + "+00:00").timestamp()) * 1_000_000_000
        return second + int(ts[20:26]) * 1000
    parsed = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return int(parsed.timestamp()) * 1_000_000_000 + parsed.microsecond * 1000


def _proof(entry: Any, prefix: str = "apollia.journal") -> dict[str, Any]:
    return {f"{prefix}.seq": int(entry.seq), f"{prefix}.entry_hash": bytes(entry.hash).hex()}


@dataclass
class _Run:
    agent: str | None
    last_ns: int
    step: tuple[Any, ...] | None = None
    step_role: str | None = None
    steps: int = 0
    calls: dict[str, tuple[Any, ...]] = field(default_factory=dict)


class SpanDeriver:
    """Entries in, span moves out. Keeps only what open spans need (pure)."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._models: dict[str, dict[str, Any]] = {}  # agent → its manifest's model table
        self._loose: dict[str, tuple[Any, ...]] = {}  # call id → execute_tool span outside a run
        self._asked: dict[tuple[Any, ...], int] = {}  # execute_tool span → the ask's time

    def feed(self, entries: Iterable[Any]) -> list[Open | Close]:
        moves: list[Open | Close] = []
        scan = _scan
        for entry in entries:
            raw = entry.payload
            try:
                payload = scan(raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw), 0)[0]
            except (ValueError, StopIteration, RecursionError):  # not JSON, or nested past the parser's depth
                continue
            if not isinstance(payload, dict):
                continue
            moves.extend(self._one(entry, payload))
        return moves

    def _run(self, entry: Any, at: int, moves: list[Open | Close], payload: Mapping[str, Any]) -> _Run:
        run = self._runs.get(entry.run_id)
        if run is None:
            run = self._runs[entry.run_id] = _Run(entry.agent, at)
            attrs = {"gen_ai.operation.name": "invoke_agent", "apollia.run.id": entry.run_id,
                     "gen_ai.conversation.id": entry.run_id, **_proof(entry)}
            if entry.agent:
                attrs["gen_ai.agent.name"] = attrs["gen_ai.agent.id"] = entry.agent
            if entry.kind == "run_open":
                for key in ("run_kind", "task_id"):
                    if isinstance(payload.get(key), str):
                        attrs[f"apollia.{key.replace('_', '.')}"] = payload[key]
            model = self._models.get(entry.agent or "")
            if model and isinstance(model.get("provider"), str):
                attrs["gen_ai.provider.name"] = model["provider"]
            name = f"invoke_agent {entry.agent}" if entry.agent else "invoke_agent"
            moves.append(Open(("run", entry.run_id), None, name, at, attrs))
        return run

    def _close_step(self, run: _Run, moves: list[Open | Close]) -> None:
        if run.step is not None:
            moves.append(Close(run.step, run.last_ns, _NO_ATTRIBUTES))
            run.step = run.step_role = None

    def _one(self, entry: Any, payload: dict[str, Any]) -> list[Open | Close]:
        moves: list[Open | Close] = []
        at = _ns(entry.ts)
        kind = entry.kind
        if kind == "agent_identity":
            identity = payload.get("identity")
            if isinstance(identity, dict) and isinstance(identity.get("model"), dict) and entry.agent:
                self._models[entry.agent] = identity["model"]
            return moves
        if entry.run_id is None:
            if kind in ("decision", "answer", "tool_result"):
                moves.extend(self._call(entry, payload, at, None, None))
            return moves
        run = self._run(entry, at, moves, payload)
        if kind == "model_response":
            role = str(payload.get("role") or "actor")
            if role != run.step_role:
                self._close_step(run, moves)
                run.steps += 1
                run.step = ("step", entry.run_id, run.steps)
                run.step_role = role
                step = _STEP_NAMES.get(role, role)
                attrs = {"apollia.step": step, "apollia.role": role, **_proof(entry)}
                if step == "plan":
                    attrs["gen_ai.operation.name"] = "plan"
                moves.append(Open(run.step, ("run", entry.run_id), step, run.last_ns, attrs))
            moves.extend(self._chat(entry, payload, run, at))
        elif kind in ("decision", "answer", "tool_result"):
            moves.extend(self._call(entry, payload, at, run, ("run", entry.run_id)))
        elif kind == "run_seal":
            for key in list(run.calls.values()):
                moves.append(Close(key, at, _NO_ATTRIBUTES))
            self._close_step(run, moves)
            run.last_ns = at
            status = payload.get("status")
            error = payload.get("error") if isinstance(payload.get("error"), dict) else None
            attrs = {"apollia.run.status": str(status), "apollia.journal.seal_seq": int(entry.seq),
                     "apollia.journal.seal_hash": bytes(entry.hash).hex()}
            code = str(error.get("code")) if error else None
            if code:
                attrs["error.type"] = code
            moves.append(Close(("run", entry.run_id), at, attrs, code))
            del self._runs[entry.run_id]
            return moves
        run.last_ns = max(run.last_ns, at)
        return moves

    def _chat(self, entry: Any, payload: Mapping[str, Any], run: _Run, at: int) -> list[Open | Close]:
        model = self._models.get(entry.agent or "") or {}
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "apollia.role": str(payload.get("role")),
                                 **_proof(entry)}
        if isinstance(payload.get("turn"), int):
            attrs["apollia.turn"] = payload["turn"]
        if isinstance(model.get("provider"), str):
            attrs["gen_ai.provider.name"] = model["provider"]
        name = model.get("name") or model.get("model")
        if isinstance(name, str):
            attrs["gen_ai.request.model"] = name
        given = payload.get("usage")
        usage: dict[str, Any] = given if isinstance(given, dict) else {}
        for ours, theirs in (("gen_ai.usage.input_tokens", ("input_tokens", "prompt_tokens")),
                             ("gen_ai.usage.output_tokens", ("output_tokens", "completion_tokens"))):
            for word in theirs:
                if isinstance(usage.get(word), int):
                    attrs[ours] = usage[word]
                    break
        calls = payload.get("tool_calls")
        if isinstance(calls, list) and calls:
            attrs["gen_ai.response.finish_reasons"] = _TOOL_CALLS
        key = ("chat", entry.run_id, int(entry.seq))
        span_name = f"chat {name}" if isinstance(name, str) else "chat"
        return [Open(key, run.step, span_name, run.last_ns, attrs), Close(key, at, _NO_ATTRIBUTES)]

    def _call(self, entry: Any, payload: Mapping[str, Any], at: int, run: _Run | None,
              parent: tuple[Any, ...] | None) -> list[Open | Close]:
        call_id = payload.get("call_id")
        if not isinstance(call_id, str):
            return []
        calls = run.calls if run is not None else self._loose
        if run is not None and run.step is not None:
            parent = run.step
        if entry.kind == "decision":
            if call_id in calls:  # a call decided twice (a server's request re-decided): keep the first
                return []
            key = ("tool", entry.run_id, call_id, int(entry.seq))
            calls[call_id] = key
            line = payload.get("line")
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": str(payload.get("tool")),
                "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function",
                "apollia.decision.outcome": str(payload.get("outcome")),
                "apollia.decision.reason": str(payload.get("reason", "")),
                **_proof(entry)}
            if isinstance(line, int):
                attrs["apollia.decision.line"] = line
                attrs["apollia.decision.rule"] = DECISION_RULES.get(line, str(line))
            if payload.get("family") is not None:
                attrs["apollia.decision.family"] = str(payload["family"])
            for extra in ("source", "source_tool", "connection"):
                if isinstance(payload.get(extra), str):
                    attrs[f"apollia.call.{extra}"] = payload[extra]
            if entry.agent:
                attrs["gen_ai.agent.name"] = entry.agent
            if payload.get("outcome") == "ask":
                self._asked[key] = at
            return [Open(key, parent, f"execute_tool {payload.get('tool')}", at, attrs)]
        key_or_none = calls.get(call_id)
        if key_or_none is None:
            return []
        key = key_or_none
        if entry.kind == "answer":
            asked = self._asked.pop(key, at)
            attrs = {"apollia.decision.answer": str(payload.get("answer")),
                     "apollia.decision.answered_by": str(payload.get("answered_by")),
                     "apollia.decision.wait_ms": max(0, (at - asked) // 1_000_000),
                     **_proof(entry, "apollia.journal.answer")}
            # an answer is told on the span when it closes: keep it on the call's key
            calls[call_id] = key
            return [Close(key, -1, attrs)]  # -1: attributes only, the span stays open
        del calls[call_id]
        self._asked.pop(key, None)
        status = str(payload.get("status"))
        attrs = {"apollia.tool.status": status, **_proof(entry, "apollia.journal.result")}
        error = None
        if status != "ok":
            error = str(payload.get("error_code") or status.upper())
            attrs["error.type"] = error
        return [Close(key, at, attrs, error)]


# --- configuration ------------------------------------------------------------------

_PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True)
class TelemetryConfig:
    """``[telemetry]``: off unless ``enabled = true``; the rest falls back to the ``OTEL_*`` variables."""

    enabled: bool = False
    endpoint: str | None = None
    protocol: str | None = None
    service_name: str | None = None
    interval_secs: float = 1.0


def _bad_url(url: str) -> bool:
    """True when ``url`` has no host or a port that is not a number from 1 to 65535."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return True
    return not parts.hostname or port == 0


def parse_telemetry(raw: Mapping[str, Any], where: str = "apollia.toml") -> TelemetryConfig:
    """Validate ``[telemetry]``: unknown keys and wrong types are ``BAD_INPUT`` naming the key."""
    table = raw.get("telemetry")
    if table is None:
        return TelemetryConfig()
    if not isinstance(table, dict):
        raise BadInput(f"{where}: [telemetry] must be a table")
    known = {"enabled", "endpoint", "protocol", "service_name", "interval_secs"}
    for key in table:
        if key not in known:
            raise BadInput(f"{where}: [telemetry] has no key {key!r} (known: {', '.join(sorted(known))})")
    enabled = table.get("enabled", False)
    if not isinstance(enabled, bool):
        raise BadInput(f"{where}: [telemetry] enabled must be true or false")
    endpoint = table.get("endpoint")
    if endpoint is not None and (not isinstance(endpoint, str)
                                 or not endpoint.lower().startswith(("http://", "https://"))
                                 or _bad_url(endpoint)):
        raise BadInput(f"{where}: [telemetry] endpoint must be an http:// or https:// URL")
    protocol = table.get("protocol")
    if protocol is not None and protocol not in _PROTOCOLS:
        raise BadInput(f"{where}: [telemetry] protocol must be one of {', '.join(_PROTOCOLS)}")
    service = table.get("service_name")
    if service is not None and (not isinstance(service, str) or not service):
        raise BadInput(f"{where}: [telemetry] service_name must be a non-empty string")
    interval = table.get("interval_secs", 1.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= 60:
        raise BadInput(f"{where}: [telemetry] interval_secs must be a number above 0 and at most 60")
    return TelemetryConfig(enabled, endpoint, protocol, service, float(interval))


# --- the edge: the transports and the thread --------------------------------------------

#: a request's spans stop before this many bytes (collectors' gRPC receivers take 4 MiB by default)
_MAX_REQUEST_BYTES = 1 << 20
_DEFAULT_TIMEOUT = 10.0  # seconds, as the OpenTelemetry SDK reads OTEL_EXPORTER_OTLP_TIMEOUT
_TRACE_SERVICE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _env(name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    env = os.environ
    return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or None


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def _timeout() -> float:
    try:
        value = float(_env("TIMEOUT") or _DEFAULT_TIMEOUT)
    except ValueError:
        return _DEFAULT_TIMEOUT
    return value if value > 0 else _DEFAULT_TIMEOUT


def _headers() -> dict[str, str]:
    raw = _env("HEADERS")
    if not raw:
        return {}
    from opentelemetry.util.re import parse_env_headers

    return {k.lower(): v for k, v in parse_env_headers(raw, liberal=True).items()}


def _compression() -> str:
    value = (_env("COMPRESSION") or "none").strip().lower()
    return value if value in ("gzip", "deflate") else "none"


#: OTLP/HTTP answers that say "later" (the OTLP specification's retryable codes)
_RETRYABLE = frozenset((429, 502, 503, 504))
_RETRIES = 2  # a request is tried at most this many more times, 0.25 s, then 0.5 s later (or as asked, up to 2 s)


class _Retry(OSError):
    """The collector asks to be tried again (after ``delay`` seconds when it says)."""

    def __init__(self, message: str, delay: float | None) -> None:
        super().__init__(message)
        self.delay = delay


def _retry_after(value: str | None) -> float | None:
    try:
        return min(max(float(value), 0.0), 2.0) if value else None
    except ValueError:
        return None


class _HttpTransport:
    """OTLP/HTTP with a protobuf body (POST, ``Content-Type: application/x-protobuf``), one kept-alive
    connection, from the ``OTEL_EXPORTER_OTLP_*`` variables the OpenTelemetry SDK reads: the endpoint
    (the traces one as given, the general one with ``/v1/traces`` added), headers, timeout (seconds),
    compression (gzip, deflate), and for https the CA certificate and the client's key and certificate."""

    def __init__(self, endpoint: str | None) -> None:
        from urllib.parse import urlsplit

        if endpoint:
            endpoint = endpoint.rstrip("/")
            url = endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
        else:
            traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
            url = traces or base.rstrip("/") + "/v1/traces"
        if _bad_url(url):
            raise BadInput(f"the OTLP endpoint {url!r} is not an http:// or https:// URL with a host and a port "
                           "(from [telemetry] endpoint or the OTEL_EXPORTER_OTLP_*ENDPOINT variables)")
        parts = urlsplit(url)
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = _timeout()
        self._compression = _compression()
        self._headers = {"user-agent": "apollia-nb", **_headers(), "content-type": "application/x-protobuf"}
        if self._compression != "none":
            self._headers["content-encoding"] = self._compression
        self._context: Any = None
        if self._https:
            import ssl

            self._context = ssl.create_default_context(cafile=_env("CERTIFICATE"))
            cert, key = _env("CLIENT_CERTIFICATE"), _env("CLIENT_KEY")
            if cert:
                self._context.load_cert_chain(cert, key)
        self._connection: Any = None

    def __call__(self, body: bytes) -> None:
        import http.client

        if self._compression == "gzip":
            import gzip

            body = gzip.compress(body)
        elif self._compression == "deflate":
            import zlib

            body = zlib.compress(body)
        for attempt in (1, 2):  # a kept-alive connection the collector closed meanwhile: once more, afresh
            connection = self._connection
            if connection is None:
                connection = (http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                                          context=self._context) if self._https else
                              http.client.HTTPConnection(self._host, self._port, timeout=self._timeout))
                self._connection = connection
            try:
                connection.request("POST", self._path, body, self._headers)
                response = connection.getresponse()
                response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
                continue
            except BaseException:
                self.close()
                raise
            if response.will_close:
                self.close()
            if response.status in _RETRYABLE:
                delay = _retry_after(response.getheader("Retry-After"))
                raise _Retry(f"the collector answered {response.status}", delay)
            if not 200 <= response.status < 300:
                raise OSError(f"the collector answered {response.status}")
            return

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class _GrpcTransport:
    """OTLP over gRPC (``TraceService/Export``), the request's bytes passed as they are, from the
    same variables: endpoint (https: TLS; else ``OTEL_EXPORTER_OTLP_INSECURE`` decides when set, and
    without it http is plain text and no scheme TLS, as the SDK reads them), headers as metadata,
    timeout, gzip compression, the CA and client certificates."""

    def __init__(self, endpoint: str | None) -> None:
        from urllib.parse import urlsplit

        import grpc  # type: ignore[import-untyped]  # grpcio ships no type information

        given = endpoint or _env("ENDPOINT") or "http://localhost:4317"
        parts = urlsplit(given if "://" in given else f"//{given}")
        target = parts.netloc or given
        insecure = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_INSECURE") or os.environ.get("OTEL_EXPORTER_OTLP_INSECURE")
        if parts.scheme == "https":
            secure = True
        elif insecure is not None:  # as the SDK reads it: "true" is plain text, anything else TLS
            secure = insecure.strip().lower() != "true"
        else:
            secure = parts.scheme != "http"
        options = [("grpc.primary_user_agent", "apollia-nb")]
        compression = grpc.Compression.Gzip if _compression() == "gzip" else None
        if secure:
            def read(name: str) -> bytes | None:
                path = _env(name)
                if not path:
                    return None
                with open(path, "rb") as file:
                    return file.read()

            credentials = grpc.ssl_channel_credentials(read("CERTIFICATE"), read("CLIENT_KEY"),
                                                       read("CLIENT_CERTIFICATE"))
            self._channel = grpc.secure_channel(target, credentials, options=options, compression=compression)
        else:
            self._channel = grpc.insecure_channel(target, options=options, compression=compression)
        self.url = given
        self._export = self._channel.unary_unary(_TRACE_SERVICE_EXPORT)  # bytes in, bytes out
        self._metadata = tuple(_headers().items()) or None
        self._timeout = _timeout()

    def __call__(self, body: bytes) -> None:
        import grpc

        try:
            self._export(body, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise _Retry(f"the collector answered {error.code().name}", None) from None
            raise

    def close(self) -> None:
        self._channel.close()


def _transport(config: TelemetryConfig) -> Any:
    env = os.environ
    protocol = (config.protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol == "grpc":
        try:
            return _GrpcTransport(config.endpoint)
        except ImportError:
            raise BadInput("[telemetry] protocol grpc needs grpcio: pip install 'apollia-nb[otel]'") from None
    return _HttpTransport(config.endpoint)


class TelemetryExporter:
    """The journal's acknowledged entries, handed over by its observer hook (``Journal.observe``),
    turned into finished spans, encoded as OTLP protobuf and sent, all on one thread of its own.

    The hook only queues a reference to each group's entries, into a bounded queue (``queue_size``
    entries): it never waits and never raises into the journal's writer; when the queue is full the
    entries are dropped and counted (``dropped``), and the spans they would have given are lost, never
    a call. Nothing is read back from the journal, so no copy into ``journal.db`` is asked for; only
    ``since_seq`` below the head reads the entries before it once.

    Every ``interval_secs`` the thread takes the queue, derives the spans (``SpanDeriver``), encodes
    each span that ends into its protobuf bytes at once (``otlp.encode_span``: no SDK span objects),
    and sends them in one ``ExportTraceServiceRequest`` (``max_batch`` spans at most) with
    ``exporter`` (a callable given each request's bytes; by default OTLP/HTTP or gRPC from the
    configuration and the ``OTEL_*`` variables). A request the collector answers "later" is tried
    twice more; one that fails loses its spans (counted in ``lost``); spans wait for sending at most ``max_pending`` (the oldest are lost beyond).
    ``max_batch`` and ``max_pending`` default to ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` and
    ``OTEL_BSP_MAX_QUEUE_SIZE`` when set (else 4096 and 65,536). Span ids are derived from the
    journal's origin and the span's key: the trace id from the run, so a span's parent is known without
    keeping it, and the same entries always give the same ids."""

    def __init__(self, journal: Any, config: TelemetryConfig, *, since_seq: int | None = None,
                 exporter: Any = None, queue_size: int = 50_000, max_batch: int | None = None,
                 max_pending: int | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
        except ImportError:
            raise BadInput("[telemetry] enabled = true needs the OpenTelemetry packages: "
                           "pip install 'apollia-nb[otel]'") from None
        from apollia_nb import __version__

        self._origin = str(journal.origin)
        self._hasher = hashlib.sha256(f"{self._origin}\n".encode())
        attrs: dict[str, Any] = {"service.name": config.service_name or os.environ.get("OTEL_SERVICE_NAME")
                                 or "apollia-nb", "service.version": __version__,
                                 "apollia.journal.origin": self._origin}
        resource = Resource.create(attrs)  # OTEL_RESOURCE_ATTRIBUTES and the SDK's own, as the SDK merges them
        self._frame = encode_request_frame(dict(resource.attributes), "apollia_nb", __version__)
        self._send = exporter if exporter is not None else _transport(config)
        self._ids: dict[tuple[Any, ...], bytes] = {}  # span ids of the spans still open, and trace ids of runs
        self._journal = journal
        self._interval = config.interval_secs
        self._deriver = SpanDeriver()
        self._open: dict[tuple[Any, ...], tuple[Open, dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._capacity = max(1, int(queue_size))
        if max_batch is None:
            max_batch = _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 4096)
        if max_pending is None:
            max_pending = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 65_536)
        self._max_batch, self._max_pending = max(1, max_batch), max(1, max_pending)
        self._queue: deque[list[Any]] = deque()  # groups' entries: appended by the hook only, taken by poll only
        self._offered = 0  # entries the hook queued (written by the hook only)
        self._taken = 0  # entries poll took from the queue (written by poll only)
        self._pending: list[bytes] = []  # encoded spans waiting to be sent
        self.failures = 0  # reads of the entries before ``since_seq``'s head, and rounds, that failed
        self.dropped = 0  # entries the hook found no room for (their spans are lost)
        self.sent = 0  # spans the collector took
        self.lost = 0  # spans whose request failed, or that found no room to wait for one
        self.cpu_seconds = 0.0  # CPU time the thread took deriving, encoding and sending
        self._unobserve = journal.observe(self._offer)
        # Entries up to the head when the hook was set are read from the journal (``since_seq``
        # below it: once); the hook's entries at or below the cursor are skipped.
        head = int(journal.head()[0])
        self._cursor = head if since_seq is None else min(int(since_seq), head)
        self._backlog_end = head

    def _offer(self, entries: list[Any]) -> None:
        """The journal's hook (on its writer): queue a reference to the group, or drop and count it."""
        room = self._capacity - (self._offered - self._taken)  # only poll takes meanwhile: room only grows
        size = len(entries)
        if room < size:
            if room <= 0:
                self.dropped += size
                return
            self.dropped += size - room
            entries = entries[:room]
            size = room
        self._offered += size
        self._queue.append(entries)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="journal-telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        clock = time.thread_time
        while True:
            stopping = self._stop.wait(self._interval)  # once stopped: what was left when the hook stopped
            began = clock()
            try:
                self.poll()
                self.flush()
            except Exception:  # a fault of its own loses what it held then, never the thread (nor a call)
                self.failures += 1
            self.cpu_seconds += clock() - began
            if stopping:
                return

    def _backlog(self) -> list[Any]:
        try:
            read = self._journal.entries(since_seq=self._cursor, kinds=_READ_KINDS, limit=2000)
        except Exception:  # a journal that cannot be read now: tried again next time
            self.failures += 1
            return []
        read = [entry for entry in read if int(entry.seq) <= self._backlog_end]
        if len(read) < 2000 or not read:
            self._cursor = max(self._cursor, self._backlog_end)
        if read:
            self._cursor = max(self._cursor, int(read[-1].seq))
        return read

    def poll(self) -> int:
        """Turn the entries handed over since the last poll into spans, encoding those that end (sent
        by ``flush``); returns how many entries of the kinds spans come from were taken."""
        with self._lock:
            entries = self._backlog() if self._cursor < self._backlog_end else []
            if self._cursor >= self._backlog_end:
                queue, cursor, wanted, taken = self._queue, self._cursor, _READ_SET, 0
                for _ in range(len(queue)):
                    group = queue.popleft()
                    taken += len(group)
                    for entry in group:
                        if entry.kind in wanted and entry.seq > cursor:
                            entries.append(entry)
                self._taken += taken
            for move in self._deriver.feed(entries):
                self._apply(move)
            over = len(self._pending) - self._max_pending
            if over > 0:
                del self._pending[:over]
                self.lost += over
            return len(entries)

    def flush(self) -> int:
        """Send the spans encoded so far, ``max_batch`` a request; returns how many the collector took."""
        with self._send_lock:
            sent = 0
            while True:
                with self._lock:
                    pending, count, size = self._pending, 0, 0
                    for span in pending[:self._max_batch]:
                        size += len(span)
                        if size > _MAX_REQUEST_BYTES and count:
                            break
                        count += 1
                    batch = pending[:count]
                    del pending[:count]
                if not batch:
                    return sent
                body = encode_request(self._frame, batch)
                for attempt in range(_RETRIES + 1):
                    try:
                        self._send(body)
                    except _Retry as later:  # once closing, no wait: tried again at once
                        if attempt < _RETRIES:
                            self._stop.wait(later.delay if later.delay is not None else 0.25 * 2 ** attempt)
                            continue
                        self.lost += len(batch)
                    except Exception:  # a collector down, slow or refusing: these spans are lost, never a call
                        self.lost += len(batch)
                    else:
                        sent += len(batch)
                        self.sent += len(batch)
                    break

    def _id(self, key: tuple[Any, ...], size: int) -> bytes:
        hasher = self._hasher.copy()  # SHA-256 of "<origin>\n<key>"
        hasher.update(repr(key).encode())
        digest = hasher.digest()
        return digest[:size] if any(digest[:size]) else bytes(size - 1) + b"\x01"

    def _trace(self, key: tuple[Any, ...]) -> bytes:
        trace_key = ("run", key[1]) if key[1] is not None else key
        found = self._ids.get(trace_key + ("trace",))
        if found is None:
            found = self._id(trace_key, 16)
            if key[1] is not None:  # a run's: asked for by each of its spans until the run ends
                self._ids[trace_key + ("trace",)] = found
        return found

    def _span_id(self, key: tuple[Any, ...]) -> bytes:
        found = self._ids.get(key)
        if found is None:
            found = self._id(key, 8)
            if key[0] in ("run", "step"):  # parents: asked for by each child
                self._ids[key] = found
        return found

    def _apply(self, move: Open | Close) -> None:
        if isinstance(move, Open):  # its attributes are its own (the deriver keeps none): added to in place
            self._open[move.key] = (move, move.attributes)
            return
        held = self._open.get(move.key)
        if held is None:
            return
        opened, attributes = held
        if move.attributes:
            attributes.update(move.attributes)
        if move.end_ns < 0:
            return
        del self._open[move.key]
        key = opened.key
        self._pending.append(encode_span(
            self._trace(key), self._span_id(key),
            self._span_id(opened.parent) if opened.parent is not None else None,
            opened.name, opened.start_ns, max(move.end_ns, opened.start_ns), attributes, move.error))
        self._ids.pop(key, None)
        if key[0] == "run":
            self._ids.pop(key + ("trace",), None)

    def close(self, timeout: float = 3.0) -> None:
        """Stop the hook and the thread, turn what is left into spans and send them, within ``timeout``:
        a collector that does not answer keeps nothing waiting longer."""
        self._unobserve()
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:  # never started: the last poll and send on a thread of their own all the same
            thread = threading.Thread(target=self._run, name="journal-telemetry-close", daemon=True)
            thread.start()
        thread.join(timeout)
        if not thread.is_alive():
            closing = getattr(self._send, "close", None)
            if closing is not None:
                try:
                    closing()
                except Exception:
                    pass


def start_telemetry(journal: Any, raw: Mapping[str, Any], where: str = "apollia.toml") -> TelemetryExporter | None:
    """The owner's exporter when ``[telemetry] enabled = true`` (and ``OTEL_SDK_DISABLED`` is not true)."""
    config = parse_telemetry(raw, where)
    if not config.enabled or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = TelemetryExporter(journal, config)
    exporter.start()
    return exporter
