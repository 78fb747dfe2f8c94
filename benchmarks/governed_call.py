"""Cost per governed tool call, beside pydantic-ai calling a plain tool in the same process.

Run: ``.venv/bin/python benchmarks/governed_call.py [--sizes 50 400] [--repeats 5] [--profile]
[--floor] [--served | --served-only | --telemetry [--interval S]] [--home-root DIR]``

Ours: the real ``Runtime`` on a fresh temporary home per repetition. A
scripted agent plans one step, makes N turns of one call each to a tool of
family ``read`` (decided ``allow`` without asking), ends its step with text,
and the critic passes. Every call journals ``model_response``, ``decision`` and
``tool_call`` in one commit before the tool runs, and ``tool_result`` in the
next (handed over as the tool returns, committed before anything later of the
run).
Timed from ``submit`` to the finished task (runtime open/close and agent
registration excluded); the task must be ``completed`` with N ``tool_result``
entries in its run.

Ours is also given as CPU time per call, every thread of the process (the
event loop, the journal's writer, the tool's worker) over the same span: the
work a call costs, which a busy machine inflates less than the wall time.

Theirs: pydantic-ai's ``FunctionModel`` answering one ``ToolCallPart`` per
turn for N turns, then a ``TextPart``; the tool is a plain function. Timed
around ``await agent.run(...)``. Skipped, with a message, when pydantic-ai is
not installed (``pip install pydantic-ai-slim``).

LangGraph: a ``StateGraph`` of a model node answering one tool call per turn
for N turns (then text) and the prebuilt ``ToolNode``, compiled with a
``SqliteSaver`` checkpointer on a file (WAL, ``synchronous=FULL``: every
checkpoint synced, as durable as our journal). Timed around ``graph.invoke``.
Skipped when ``langgraph`` and ``langgraph-checkpoint-sqlite`` are not installed.

All figures are wall time per call: the run's time divided by N, the median
of ``--repeats`` runs, ours and each peer in turn so all see the same
machine. Each of our calls makes two durable commits (each a synced record of
``journal.log``), so our figure follows the disk's sync time;
``--home-root /dev/shm`` shows the cost without it. ``--profile`` also runs
ours once at the largest size under cProfile (event-loop thread, sorted by
cumulative time) and times the journal's writer thread (sequencing and
signing, the log's write and sync, any wait for a copy when the log is full)
and its copier thread (the batched copies into ``journal.db``, made while the
writer goes on committing), which cProfile does not see.

``--served`` adds the same task in a client of a served home beside it on an owned home, alternating
in one run: ``apollia-os serve`` (a subprocess of the same interpreter, importing the same tree) owns a
fresh home and this process's ``Runtime`` is its client, whose every call is decided and journaled by the
server over HTTP on 127.0.0.1; the ratio's target is at most 2x. ``--served-only`` measures only that.

``--telemetry`` measures only ours with the OpenTelemetry export on (``[telemetry]`` in the home's
``apollia.toml``, spans sent over OTLP/HTTP to a receiver on 127.0.0.1 in a process of its own) against
off, alternating in one run, each going first half the time: wall time from submit to the finished
task (what a call waits), CPU time from submit through the runtime's close (every span's derivation, encoding and export, the last included), and the journal's
copies into ``journal.db`` per task on and off (telemetry takes the entries from the journal's observer
hook, so it should add none); the target is at most 5 % more per call. It also gives the exporter
thread's own CPU per call (``TelemetryExporter.cpu_seconds``: deriving, encoding and sending), which
a busy machine blurs less than the difference of two runs.

``--floor`` shows what the journal's two fixed costs take of a call: ours at
the first size, alternating four ways in one process — as it is; with the
log's ``fdatasync`` skipped; with every Ed25519 signature replaced by 64 zero
bytes; with both. The last three write journals nobody could trust (they are
thrown away with their temporary homes); they only measure. What is left when
both are skipped is the runtime's own work and its thread hand-offs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apollia_nb.runtime import Runtime
from apollia_nb.runtime.tools import ToolDef

AGENT = "bench"


def read_note(key: str) -> str:
    """Read a note by its key."""
    return f"note {key}"


# --------------------------------------------------------------------------- ours


def manifest_text(n: int, workspace: Path) -> str:
    """An agent whose actor makes N calls of ``read_note``, one per turn, then ends with text."""
    lines = [
        f'name = "{AGENT}"', 'description = "benchmark agent"', 'instructions = "Read the notes."', "",
        "[model]", 'provider = "scripted"',
    ]
    for i in range(n):
        lines += ["[[model.script.actor]]", f'tool_calls = [{{ name = "read_note", arguments = {{ key = "k{i}" }} }}]']
    lines += ["[[model.script.actor]]", 'text = "All notes read."']
    lines += ["[workspace]", f"root = {json.dumps(str(workspace))}", "[budget]", f"max_steps = {2 * n + 10}"]
    return "\n".join(lines) + "\n"


HOME_ROOT: str | None = None  # where temporary homes are made (None: the system's temp directory)


def cpu_seconds() -> float:
    """CPU time of this process so far, every thread (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """CPU time of another process so far, every thread (user and system), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def ours_once(n: int, *, around: Callable[[Callable[[], Any]], Any] | None = None,
                    runtime_hook: Callable[[Runtime], None] | None = None,
                    cpu: list[float] | None = None, journal_format: str | None = None) -> float:
    """One task of N allowed calls on a fresh home; seconds from submit to the finished task
    (and, into ``cpu``, the process's CPU seconds over the same span, every thread). ``journal_format``:
    the home's journal is made in that entry format first ("1": payloads hashed whole)."""
    with tempfile.TemporaryDirectory(prefix="apollia-bench-", dir=HOME_ROOT) as tmp:
        root = Path(tmp)
        if journal_format is not None:
            from apollia_nb.home import Home
            from apollia_nb.journal import Journal

            Journal.open(Home.at(root / "home"), entry_format=journal_format).close()
        async with Runtime(root / "home") as rt:
            tool = ToolDef.from_function(read_note, family="read")
            await rt.register_agent(manifest_text(n, root / "workspace"), tools=[tool])
            if runtime_hook is not None:
                runtime_hook(rt)

            async def task() -> Any:
                return await (await rt.submit(AGENT, "Read every note"))

            c0, t0 = cpu_seconds(), time.perf_counter()
            handle = await (around(task) if around is not None else task())
            elapsed = time.perf_counter() - t0
            if cpu is not None:
                cpu.append(cpu_seconds() - c0)
            if handle.status != "completed":
                raise SystemExit(f"ours: the task ended {handle.status}: {handle.error}")
            kinds = [e.kind for e in rt.journal.entries(run_id=handle.run_id)]
            if kinds.count("tool_result") != n:
                raise SystemExit(f"ours: {kinds.count('tool_result')} tool_result entries, expected {n}")
            decisions = [json.loads(e.payload) for e in rt.journal.entries(run_id=handle.run_id)
                         if e.kind == "decision"]
            if any(d["outcome"] != "allow" for d in decisions):
                raise SystemExit("ours: a call was not decided allow")
    return elapsed


async def served_once(n: int, *, cpu: list[float] | None = None, server_cpu: list[float] | None = None) -> float:
    """``ours_once`` in a client of a served home: ``apollia-os serve`` (a subprocess of this interpreter,
    importing the same tree) owns a fresh home, this process's ``Runtime`` is its client; seconds from
    submit to the finished task (and, into ``cpu`` and ``server_cpu``, the client's and the server's CPU
    seconds over the same span, every thread of each)."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory(prefix="apollia-bench-served-", dir=HOME_ROOT) as tmp:
        root = Path(tmp)
        server = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve", "--home", str(root / "home"),
                                   "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if server.stdout is None or not server.stdout.readline():
                raise SystemExit(f"apollia-os serve did not start: {server.stderr.read() if server.stderr else ''}")
            async with Runtime(root / "home") as rt:
                if rt.mode != "client":
                    raise SystemExit("served: the runtime did not become the server's client")
                tool = ToolDef.from_function(read_note, family="read")
                await rt.register_agent(manifest_text(n, root / "workspace"), tools=[tool])
                c0, s0, t0 = cpu_seconds(), process_cpu_seconds(server.pid), time.perf_counter()
                handle = await (await rt.submit(AGENT, "Read every note"))
                elapsed = time.perf_counter() - t0
                if cpu is not None:
                    cpu.append(cpu_seconds() - c0)
                if server_cpu is not None:
                    server_cpu.append(process_cpu_seconds(server.pid) - s0)
                if handle.status != "completed":
                    raise SystemExit(f"served: the task ended {handle.status}: {handle.error}")
                kinds = [e.kind for e in rt.journal.entries(run_id=handle.run_id)]
                if kinds.count("tool_result") != n or kinds.count("decision") != n:
                    raise SystemExit(f"served: {kinds.count('tool_result')} tool_result entries, expected {n}")
        finally:
            server.terminate()
            server.wait(timeout=60)
    return elapsed


async def served(sizes: list[int], repeats: int) -> None:
    """A governed call in a client of a served home beside one on an owned home, alternating in one run."""
    import apollia_nb

    print(f"\nserved vs owned (apollia_nb from {Path(apollia_nb.__file__).parent}; the server imports the same); "
          f"median of {repeats} runs; CPU (client + server, every thread of each) and wall ms per call")
    await ours_once(sizes[0])
    await served_once(sizes[0])
    for n in sizes:
        owned_ms, served_ms, owned_cpu, client_cpu, server_cpu = [], [], [], [], []
        for _ in range(repeats):
            owned_ms.append(await ours_once(n, cpu=owned_cpu) / n * 1000)
            served_ms.append(await served_once(n, cpu=client_cpu, server_cpu=server_cpu) / n * 1000)
        o, c = statistics.median(owned_ms), statistics.median(served_ms)
        oc = statistics.median(owned_cpu) / n * 1000
        cc, sc = statistics.median(client_cpu) / n * 1000, statistics.median(server_cpu) / n * 1000
        print(f"  N={n:<4} CPU ms per call: owned {oc:.3f}  served {cc + sc:.3f} (client {cc:.3f} + server {sc:.3f})"
              f"  served/owned {(cc + sc) / oc:.2f}x (target <= 2x: {'met' if (cc + sc) / oc <= 2 else 'NOT met'})")
        print(f"         wall ms per call: owned {o:.3f}  served {c:.3f}  served/owned {c / o:.2f}x"
              f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        print(f"         runs (wall): owned " + " ".join(f"{x:.3f}" for x in owned_ms)
              + " | served " + " ".join(f"{x:.3f}" for x in served_ms))
        print(f"         runs (CPU ms per call): owned " + " ".join(f"{x / n * 1000:.3f}" for x in owned_cpu)
              + " | served " + " ".join(f"{(a + b) / n * 1000:.3f}" for a, b in zip(client_cpu, server_cpu)))


# --------------------------------------------------------------------------- theirs


def pydantic_ai_version() -> str | None:
    try:
        import pydantic_ai
    except ImportError:
        return None
    return getattr(pydantic_ai, "__version__", "?")


async def theirs_once(n: int) -> float:
    """pydantic-ai: N turns of one tool call each, then text; seconds for ``agent.run``."""
    from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart, UsageLimits
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    turns = 0
    tool_runs = 0

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal turns
        turns += 1
        if turns <= n:
            return ModelResponse(parts=[ToolCallPart("read_note", {"key": f"k{turns - 1}"})])
        return ModelResponse(parts=[TextPart("All notes read.")])

    agent = Agent(FunctionModel(model), instructions="Read the notes.")

    @agent.tool_plain
    def read_note(key: str) -> str:
        """Read a note by its key."""
        nonlocal tool_runs
        tool_runs += 1
        return f"note {key}"

    t0 = time.perf_counter()
    result = await agent.run("Read every note", usage_limits=UsageLimits(request_limit=None))
    elapsed = time.perf_counter() - t0
    if result.output != "All notes read." or tool_runs != n:
        raise SystemExit(f"theirs: output {result.output!r} after {tool_runs} tool runs, expected {n}")
    return elapsed


def langgraph_version() -> str | None:
    try:
        import importlib.metadata

        import langgraph.checkpoint.sqlite  # noqa: F401
        import langgraph.prebuilt  # noqa: F401
    except ImportError:
        return None
    return importlib.metadata.version("langgraph")


async def langgraph_once(n: int) -> float:
    """LangGraph: a model node and a prebuilt ``ToolNode`` in a loop, checkpointed durably by
    ``SqliteSaver`` into a file (WAL, ``synchronous=FULL``); seconds for ``graph.invoke``."""
    import sqlite3

    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    turns = 0
    tool_runs = 0

    @tool
    def read_note(key: str) -> str:
        """Read a note by its key."""
        nonlocal tool_runs
        tool_runs += 1
        return f"note {key}"

    def model(state: MessagesState) -> dict[str, Any]:
        nonlocal turns
        turns += 1
        if turns <= n:
            call = {"name": "read_note", "args": {"key": f"k{turns - 1}"}, "id": f"c{turns}", "type": "tool_call"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="All notes read.")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([read_note]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    with tempfile.TemporaryDirectory(prefix="apollia-bench-langgraph-", dir=HOME_ROOT) as tmp:
        conn = sqlite3.connect(str(Path(tmp) / "checkpoints.sqlite"), check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # each checkpoint synced: durable like our journal
            graph = builder.compile(checkpointer=SqliteSaver(conn))
            config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * n + 10}
            t0 = time.perf_counter()
            result = graph.invoke({"messages": [HumanMessage("Read every note")]}, config)
            elapsed = time.perf_counter() - t0
        finally:
            conn.close()
    if result["messages"][-1].content != "All notes read." or tool_runs != n:
        raise SystemExit(f"langgraph: {tool_runs} tool runs, expected {n}")
    return elapsed


#: The peers, each timed only when installed: (label, version lookup, one run).
PEERS: list[tuple[str, Callable[[], str | None], Callable[[int], Any]]] = [
    ("pydantic-ai", pydantic_ai_version, theirs_once),
    ("LangGraph+SqliteSaver", langgraph_version, langgraph_once),
]


# --------------------------------------------------------------------------- measuring


async def per_call_ms(n: int, repeats: int, peers: list[tuple[str, Callable[[int], Any]]]) -> dict[str, list[float]]:
    """Ours and each peer in turn, repeat after repeat, so all see the same machine; ms per call."""
    await ours_once(n)  # warm-up: imports, first DuckDB open, pydantic schema building
    for _, once in peers:
        await once(n)
    runs: dict[str, list[float]] = {"ours": [], **{label: [] for label, _ in peers}}
    cpu: list[float] = []
    for _ in range(repeats):
        runs["ours"].append(await ours_once(n, cpu=cpu) / n * 1000)
        for label, once in peers:
            runs[label].append(await once(n) / n * 1000)
    runs["ours CPU"] = [c / n * 1000 for c in cpu]
    return runs


async def measure(sizes: list[int], repeats: int) -> None:
    peers: list[tuple[str, Callable[[int], Any]]] = []
    for label, version, once in PEERS:
        found = version()
        if found is None:
            print(f"{label} is not installed: not compared (see benchmarks/README.md).")
        else:
            print(f"{label} {found}")
            peers.append((label, once))
    print(f"homes under {HOME_ROOT or tempfile.gettempdir()}; median of {repeats} runs per size; "
          "wall time per call in ms\n")
    medians: dict[int, dict[str, float]] = {}
    for n in sizes:
        runs = await per_call_ms(n, repeats, peers)
        medians[n] = {label: statistics.median(r) for label, r in runs.items()}
        for label, r in runs.items():
            print(f"  {label:<22} N={n:<4} runs: " + " ".join(f"{x:.3f}" for x in r))
    print()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("ours, CPU per call (every thread of the process, ms): "
          + ", ".join(f"N={n} {medians[n]['ours CPU']:.3f}" for n in sizes)
          + f"; load average {load:.2f} (wall figures follow the machine's load, CPU less so)\n")
    first = sizes[0]
    labels = ["ours", *(label for label, _ in peers)]
    print(f"{'N':>5}  " + "  ".join(f"{label:>22}" for label in labels)
          + "".join(f"  {'ours/' + label:>26}" for label in labels[1:]) + f"  {f'ours / ours@{first}':>15}")
    for n in sizes:
        m = medians[n]
        print(f"{n:5d}  " + "  ".join(f"{m[label]:22.3f}" for label in labels)
              + "".join(f"  {m['ours'] / m[label]:26.2f}" for label in labels[1:])
              + f"  {m['ours'] / medians[first]['ours']:15.2f}")
    fast = all(medians[n]["ours"] <= 0.5 for n in sizes)
    print(f"\ntarget ours <= 0.5 ms per call at every size: {'met' if fast else 'NOT met'}")
    if "pydantic-ai" in labels:
        ratio = medians[first]["ours"] / medians[first]["pydantic-ai"]
        print(f"target ours <= 0.2x pydantic-ai at N={first}: {'met' if ratio <= 0.2 else 'NOT met'} ({ratio:.2f}x)")
    if len(sizes) > 1:
        print(f"flatness, ours at N={sizes[-1]} / ours at N={first}: "
              f"{medians[sizes[-1]]['ours'] / medians[first]['ours']:.2f}")


#: Functions shown on their own after the top of the profile: the parts of one governed call.
FOCUS = (r"\((decide|view|_unmsg|_msg|tool_specs|deepcopy|save_task|_exec|_notify|governed_call"
         r"|run_approved_call|invoke|run_sync|append_async|_submit|_model|complete|order_arguments"
         r"|_capped|for_model|_item)\)")


async def profile(n: int, top: int) -> None:
    """cProfile of the event-loop thread, plus the journal writer's and copier's own time."""
    writer: dict[str, list[float]] = {"sequence (hash+sign)": [], "commit (log write+sync)": [],
                                      "wait for a copy (log full)": [], "copier: copy into journal.db": []}

    def hook(rt: Runtime) -> None:
        journal = rt.journal

        def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    writer[label].append(time.perf_counter() - t0)
            return wrapper

        journal._sequence = timed("sequence (hash+sign)", journal._sequence)  # type: ignore[method-assign]
        journal._tail.write = timed("commit (log write+sync)", journal._tail.write)  # type: ignore[method-assign]
        journal._insert = timed("copier: copy into journal.db", journal._insert)  # type: ignore[method-assign]
        drain = journal._drain
        timed_drain = timed("wait for a copy (log full)", drain)
        journal._drain = lambda: (timed_drain() if threading.current_thread() is journal._thread  # type: ignore[method-assign]
                                  else drain())

    profiler = cProfile.Profile()

    async def around(task: Callable[[], Any]) -> Any:
        profiler.enable()
        try:
            return await task()
        finally:
            profiler.disable()

    elapsed = await ours_once(n, around=around, runtime_hook=hook)
    print(f"\nprofile of ours, N={n}: {elapsed * 1000:.0f} ms under cProfile ({elapsed / n * 1000:.3f} ms/call)")
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(top)
    print(out.getvalue().rstrip())
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.print_stats(FOCUS)
    print("\nselected functions, by cumulative time:")
    print("   ncalls  tottime  percall  cumtime  percall filename:lineno(function)")
    print(out.getvalue().split("filename:lineno(function)", 1)[-1].strip("\n").rstrip())
    print(f"\njournal writer and copier threads, N={n} (not in the profile above):")
    for label, times in writer.items():
        total = sum(times)
        mean = total / len(times) * 1e6 if times else 0.0
        print(f"  {label:<28} {len(times):5d} calls  {total * 1000:8.1f} ms total  {mean:7.1f} µs each"
              f"  ({total / n * 1000:.3f} ms per governed call)")


FLOOR_WAYS = ("as it is", "no fdatasync", "no signatures", "neither")


async def floor(n: int, repeats: int) -> None:
    """Ours at N calls, four ways in turn (see the module): what the sync and the signatures cost."""
    from apollia_nb.journal import tail
    from apollia_nb.journal.keys import JournalKey

    datasync, sign = tail._datasync, JournalKey.sign

    def unsigned(self: JournalKey, message: bytes) -> bytes:
        return bytes(64)

    def unsynced(fd: int) -> None:
        return None

    runs: dict[str, list[float]] = {way: [] for way in FLOOR_WAYS}
    try:
        for i in range(repeats + 1):  # the first round warms up
            for way in FLOOR_WAYS:
                tail._datasync = unsynced if way in ("no fdatasync", "neither") else datasync  # type: ignore[assignment]
                JournalKey.sign = unsigned if way in ("no signatures", "neither") else sign  # type: ignore[method-assign]
                elapsed = await ours_once(n)
                if i:
                    runs[way].append(elapsed / n * 1000)
    finally:
        tail._datasync, JournalKey.sign = datasync, sign  # type: ignore[assignment, method-assign]
    m = {way: statistics.median(r) for way, r in runs.items()}
    print(f"\nfloor, ours at N={n}, median of {repeats} runs each way, ms per call "
          "(the last three ways write journals nobody could trust; they only measure):")
    for way in FLOOR_WAYS:
        print(f"  {way:<14} {m[way]:.3f}   runs: " + " ".join(f"{x:.3f}" for x in runs[way]))
    print(f"  the log's fdatasync: {m['as it is'] - m['no fdatasync']:.3f} ms a call; the signatures: "
          f"{m['as it is'] - m['no signatures']:.3f} ms; everything else (the runtime's own work, "
          f"two thread hand-offs, the task's fixed cost spread over its calls): {m['neither']:.3f} ms")


_SINK = """
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
received = []
class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        received.append(len(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
httpd = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
print(httpd.server_address[1], flush=True)
sys.stdin.read()
print(json.dumps(received), flush=True)
"""


def _otlp_sink() -> tuple[str, Callable[[], None], list[int]]:
    """An OTLP/HTTP receiver on 127.0.0.1 in a process of its own (a collector is never in the agent's
    process, so its CPU is not counted) that counts the bytes it is sent and answers 200."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", _SINK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None and process.stdin is not None
    port = int(process.stdout.readline())
    received: list[int] = []

    def stop() -> None:
        out, _ = process.communicate("", timeout=30)
        received.extend(json.loads(out.strip().splitlines()[-1]))

    return f"http://127.0.0.1:{port}", stop, received


async def telemetry_once(n: int, endpoint: str | None, cpu: list[float], copies: list[int] | None = None,
                         interval: float | None = None, exporter_cpu: list[float] | None = None) -> float:
    """Ours at N calls with ``[telemetry]`` on (spans sent to ``endpoint``) or off (None): the wall
    seconds from submit to the finished task, into ``cpu`` the process's CPU seconds from submit
    through closing the runtime, so every span's derivation, encoding and export is counted, and
    into ``copies`` the journal's copies into ``journal.db`` during the task."""
    with tempfile.TemporaryDirectory(prefix="apollia-bench-otel-", dir=HOME_ROOT) as tmp:
        root = Path(tmp)
        (root / "home").mkdir()
        if endpoint is not None:
            (root / "home" / "apollia.toml").write_text(
                f'[telemetry]\nenabled = true\nendpoint = "{endpoint}"\n'  # the default interval unless given
                + (f"interval_secs = {interval}\n" if interval is not None else ""))
        rt = Runtime(root / "home")
        await rt.__aenter__()
        try:
            assert (rt.telemetry is not None) == (endpoint is not None)
            tool = ToolDef.from_function(read_note, family="read")
            await rt.register_agent(manifest_text(n, root / "workspace"), tools=[tool])
            k0 = rt.journal.stats["imports"]
            c0, t0 = cpu_seconds(), time.perf_counter()
            handle = await (await rt.submit(AGENT, "Read every note"))
            elapsed = time.perf_counter() - t0
            if copies is not None:
                copies.append(rt.journal.stats["imports"] - k0)
            if handle.status != "completed":
                raise SystemExit(f"telemetry: the task ended {handle.status}: {handle.error}")
        finally:
            exporter_of = rt.telemetry
            await rt.__aexit__(None, None, None)
        cpu.append(cpu_seconds() - c0)
        if exporter_cpu is not None and exporter_of is not None:
            exporter_cpu.append(exporter_of.cpu_seconds)
    return elapsed


async def telemetry(sizes: list[int], repeats: int, interval: float | None = None) -> None:
    """A governed call with the OpenTelemetry export on and off, alternating in one run."""
    endpoint, stop, received = _otlp_sink()
    try:
        print("\ntelemetry on vs off (spans of every run, step, turn and call sent over OTLP/HTTP to a "
              "receiver on 127.0.0.1; wall: submit to the finished task; CPU: every thread from submit through the "
              "runtime's close, the last export included), median of "
              f"{repeats} runs:")
        for n in sizes:
            wall: dict[str, list[float]] = {"off": [], "on": []}
            cpu: dict[str, list[float]] = {"off": [], "on": []}
            copies: dict[str, list[int]] = {"off": [], "on": []}
            exporter: list[float] = []
            for i in range(repeats + 1):  # the first round warms up
                for way in ("off", "on") if i % 2 else ("on", "off"):  # each goes first half the time
                    c: list[float] = []
                    k: list[int] = []
                    x: list[float] = []
                    elapsed = await telemetry_once(n, endpoint if way == "on" else None, c, k, interval, x)
                    if i:
                        exporter += [v / n * 1000 for v in x]
                        copies[way] += k
                        wall[way].append(elapsed / n * 1000)
                        cpu[way].append(c[0] / n * 1000)
            w = {k: statistics.median(v) for k, v in wall.items()}
            u = {k: statistics.median(v) for k, v in cpu.items()}
            print(f"  N={n:<4} wall ms per call: off {w['off']:.3f}  on {w['on']:.3f}  "
                  f"({(w['on'] / w['off'] - 1) * 100:+.1f} %, target <= +5 %: "
                  f"{'met' if w['on'] <= w['off'] * 1.05 else 'NOT met'})")
            print(f"         CPU ms per call:  off {u['off']:.3f}  on {u['on']:.3f}  "
                  f"({(u['on'] / u['off'] - 1) * 100:+.1f} %)")
            print(f"         the exporter's thread alone (deriving, encoding, sending): "
                  f"{statistics.median(exporter):.3f} ms CPU per call")
            print(f"         copies into journal.db per task: off {statistics.median(copies['off']):g}  "
                  f"on {statistics.median(copies['on']):g}")
            print("         CPU runs:  off " + " ".join(f"{x:.3f}" for x in cpu["off"])
                  + " | on " + " ".join(f"{x:.3f}" for x in cpu["on"]))
            print("         wall runs: off " + " ".join(f"{x:.3f}" for x in wall["off"])
                  + " | on " + " ".join(f"{x:.3f}" for x in wall["on"]))
    finally:
        stop()
    print(f"  the receiver (a process of its own) took {len(received)} export requests, {sum(received)} bytes; "
          f"load average {os.getloadavg()[0]:.2f}")


async def formats(sizes: list[int], repeats: int) -> None:
    """Ours on a journal of format 2 (salted commitments per payload field, what a home made now
    writes) against format 1 (payloads hashed whole), alternating in one run; and the CPU an entry's
    payload takes to be made ready for the journal (``store._item``: validated, and in format 2
    salted and committed, in the caller's thread), per call, which is where the commitments cost."""
    from apollia_nb.journal import store

    spent = [0.0]
    item = store._item

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return item(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - started

    print(f"\njournal format 2 vs 1, median of {repeats} runs, CPU (every thread) and wall ms per call")
    await ours_once(sizes[0])
    store._item = timed
    try:
        for n in sizes:
            figures: dict[str, tuple[list[float], list[float], list[float]]] = {"1": ([], [], []), "2": ([], [], [])}
            for i in range(repeats):
                for fmt in ("1", "2") if i % 2 == 0 else ("2", "1"):  # each goes first half the time
                    cpu, wall, items = figures[fmt]
                    spent[0] = 0.0
                    wall.append(await ours_once(n, cpu=cpu, journal_format=fmt) / n)
                    cpu[-1] /= n
                    items.append(spent[0] / n)
            (c1, w1, i1), (c2, w2, i2) = (tuple(map(statistics.median, f)) for f in figures.values())
            print(f"N={n}: format 1 CPU {c1 * 1e3:.3f} wall {w1 * 1e3:.3f} | format 2 CPU {c2 * 1e3:.3f} "
                  f"wall {w2 * 1e3:.3f} | ratio CPU {c2 / c1:.3f} wall {w2 / w1:.3f}")
            print(f"       entries made ready (store._item) per call: format 1 {i1 * 1e6:.1f} us, format 2 "
                  f"{i2 * 1e6:.1f} us CPU: the commitments {(i2 - i1) / c1 * 100:+.1f} % of a format 1 call")
    finally:
        store._item = item
    print(f"load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 400], help="calls per task (default 50 400)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per size (median taken)")
    parser.add_argument("--profile", action="store_true", help="also profile ours at the largest size")
    parser.add_argument("--top", type=int, default=25, help="profile lines to print")
    parser.add_argument("--floor", action="store_true",
                        help="also show what the log's sync and the signatures cost a call (first size)")
    parser.add_argument("--interval", type=float, default=None,
                        help="with --telemetry: [telemetry] interval_secs (default: the home's default, 1 s)")
    parser.add_argument("--home-root", default=None,
                        help="directory for the temporary homes (default: the system temp directory; "
                             "/dev/shm takes the disk's fsync out of the figures)")
    parser.add_argument("--served", action="store_true",
                        help="also a call in a client of a home served by apollia-os serve beside an owned home")
    parser.add_argument("--served-only", action="store_true", help="only the served vs owned figure")
    parser.add_argument("--formats", action="store_true",
                        help="only ours on a journal of format 2 (salted commitments) vs format 1, alternating")
    parser.add_argument("--telemetry", action="store_true",
                        help="only the figure with [telemetry] on vs off, alternating in one run (needs apollia-nb[otel])")
    args = parser.parse_args()
    global HOME_ROOT
    HOME_ROOT = args.home_root
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        parser.error("sizes and repeats must be positive")
    sizes = sorted(args.sizes)

    async def run() -> None:
        if args.formats:
            await formats(sizes, args.repeats)
            return
        if args.telemetry:
            await telemetry(sizes, args.repeats, args.interval)
            return
        if args.served_only:
            await served(sizes, args.repeats)
            return
        await measure(sizes, args.repeats)
        if args.served:
            await served(sizes, args.repeats)
        if args.floor:
            await floor(sizes[0], args.repeats)
        if args.profile:
            await profile(sizes[-1], args.top)

    asyncio.run(run())


if __name__ == "__main__":
    main()
