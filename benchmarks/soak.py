"""Soak: a steady load on ``apollia-os serve`` for minutes; is memory flat, is latency flat?

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--clients 4] [--agents 2] [--calls 3]
                                        [--diagnose FILE [--tracemalloc [--baseline MINUTE]]]

Starts ``apollia-os serve --port 0`` on a fresh home (its own process) and
registers a fixed set of agents once: ``reader-K`` agents whose tasks make
``--calls`` ``list_dir`` calls and complete, and ``writer-K`` agents whose tasks
make ``--calls - 1`` ``list_dir`` calls and one ``write_file`` of a fixed 1 KB
to a fixed file (one per client), which asks: the task is unattended, so it
suspends, and the client that submitted it answers ``once`` over
``POST /pending-decisions/decide`` and waits until it completes. Every tool
output has the same size from the first minute to the last, and no agent is
added after the start, so whatever grows is the server's.

The agents' model is the scripted provider driven by a function (the server
process is ``apollia-os serve`` started through this script, which installs that
function for agents whose manifest has no script). Each client loops: submit,
wait until settled, answer if it waits, wait until finished, until the time is
up; then the server is stopped with SIGTERM.

Prints per minute: the server's RSS (``VmRSS`` from ``/proc/PID/status``),
p50/p99 of ``POST /tasks`` and of ``POST /pending-decisions/decide`` (ms), tasks
completed, journal entries (total), the home's size per entry. Then a verdict
against the targets: RSS after warm-up within +20 % from minute 5 to the end,
and decide p99 in the last minute within 1.5x of minute 5's (minute 5 is the
warm-up mark; runs shorter than 10 minutes take half the run instead).

``--diagnose FILE`` has the server append, every minute, what each of its
DuckDB databases holds in memory (``duckdb_memory()``) to FILE; with
``--tracemalloc`` also the Python allocations that grew since minute 1 (by
line, by traceback, by object type): the way to find what accumulates.
``tracemalloc`` slows the server several times over, so its latencies are not
comparable with a run without it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKEN = "soak-token"
CONTENT = "x" * 1024
GOAL_PREFIX = "soak"


# --- the server process (this script re-run with --serve-child) --------------------------------------


def soak_turn(role: str, messages: Sequence[Any], tools: Sequence[Any]) -> dict[str, Any] | None:
    """The agents' model: the goal says how many ``list_dir`` calls and which file to write.

    Goal ``soak lists=N write=PATH`` (``write=`` optional). The actor counts the tool
    results already in its step's history and asks for the next call; then ends the step.
    The planner and critic take the scripted defaults (one step, pass).
    """
    if role != "actor":
        return None
    goal = next(m.content for m in messages if m.role == "user")
    words = dict(w.split("=", 1) for w in goal.split("\n", 1)[0].split() if "=" in w)
    lists, write = int(words.get("lists", "0")), words.get("write")
    done = sum(1 for m in messages if m.role == "tool")
    if done < lists:
        return {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
    if write and done == lists:
        return {"tool_calls": [{"name": "write_file", "arguments": {"path": write, "content": CONTENT}}]}
    return None


def _install_model() -> None:
    import apollia_nb.runtime.models as models
    from apollia_nb.runtime.models.scripted import ScriptedModel

    original = models.build_model

    def build_model(table: Any, **kwargs: Any) -> Any:
        if table.get("provider", "scripted") == "scripted" and not table.get("script"):
            return ScriptedModel.from_function(soak_turn)
        return original(table, **kwargs)

    models.build_model = build_model


def _duckdb_memory() -> list[str]:
    """What each of the server's DuckDB databases holds in memory (``duckdb_memory()``), and its settings."""
    import gc

    from apollia_nb.runtime.runtime import Runtime

    lines = []
    for rt in [o for o in gc.get_objects() if isinstance(o, Runtime)]:
        cons = {"journal.db": rt.journal._con, "runtime.db": rt.records._con}
        governance = getattr(rt.governance, "_keeper", None)
        if governance is not None:
            cons["governance.db"] = governance
        for name, con in cons.items():
            try:
                cur = con.cursor()
                try:
                    used = cur.execute("SELECT sum(memory_usage_bytes), sum(temporary_storage_bytes) "
                                       "FROM duckdb_memory()").fetchone()
                    tags = cur.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory() "
                                       "WHERE memory_usage_bytes > 0 ORDER BY 2 DESC LIMIT 4").fetchall()
                    limit = cur.execute("SELECT current_setting('memory_limit')").fetchone()[0]
                finally:
                    cur.close()
                top = ", ".join(f"{t} {b / 2**20:.1f}" for t, b in tags)
                lines.append(f"{name}: {used[0] / 2**20:.1f} MiB in memory (limit {limit}; {top})")
            except Exception as exc:  # a connection busy or closed: say so, go on
                lines.append(f"{name}: not read ({type(exc).__name__}: {exc})")
    return lines


def _malloc_heaps() -> str:
    """glibc's ``malloc_info``: how many heaps (arenas), what they hold from the system, what is mmapped."""
    import ctypes
    import re

    libc = ctypes.CDLL("libc.so.6")
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryFile() as out:
        stream = libc.fdopen(os.dup(out.fileno()), b"w")
        if not stream:
            return ""
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        out.seek(0)
        text = out.read().decode()
    tail = text[text.rindex("</heap>"):] if "</heap>" in text else text
    system = re.search(r'<system type="current" size="(\d+)"', tail)
    mmapped = re.search(r'<total type="mmap" count="(\d+)" size="(\d+)"', tail)
    free = re.search(r'<total type="rest" count="\d+" size="(\d+)"', tail)
    return (f"heaps {text.count('<heap ')} holding {int(system.group(1)) / 2**20 if system else 0:.1f} MiB "
            f"(free in them {int(free.group(1)) / 2**20 if free else 0:.1f}), "
            f"mmapped {int(mmapped.group(2)) / 2**20 if mmapped else 0:.1f} MiB in {mmapped.group(1) if mmapped else 0}")


def _process_memory() -> str:
    """The process's resident memory by kind, the allocator's view (glibc ``mallinfo2``: in use, free but
    kept; ``malloc_info``: its heaps), Python's blocks, threads."""
    import ctypes
    import gc

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    text = " ".join(f"{k} {int(status[k].split()[0]) / 1024:.1f}" for k in ("VmRSS", "RssAnon", "RssFile")
                    if k in status) + " MiB; "
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
        text += (f"malloc in use {(info.uordblks + info.hblkhd) / 2**20:.1f} MiB, "
                 f"free kept {info.fordblks / 2**20:.1f} MiB, {_malloc_heaps()}; ")
    except (OSError, AttributeError, ValueError):
        pass
    return (f"{text}python blocks {sys.getallocatedblocks()}, objects {len(gc.get_objects())}, "
            f"threads {threading.active_count()}")


def _install_diagnostics(path: Path, trace: bool, baseline: int = 1) -> None:
    """On SIGUSR1: DuckDB's memory per database and, with ``trace``, the allocations that grew.

    The ``baseline``-th signal (one a minute) takes the baseline, so what fills up while the
    server warms up (the finished tasks it keeps, the idempotency keys) can be left out. The signal only wakes a thread that does the
    work: a snapshot taken inside the handler could wait on a lock the interrupted code holds."""
    import gc
    import tracemalloc
    from collections import Counter

    if trace:
        tracemalloc.start(8)
    state: dict[str, Any] = {}
    wake = threading.Event()

    def dump() -> None:
        with path.open("a") as out:
            out.write(f"== {time.strftime('%H:%M:%S')}  {_process_memory()}\n")
            for line in _duckdb_memory():
                out.write(f"   {line}\n")
            if not trace:
                return
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            counts = Counter(type(o).__qualname__ for o in gc.get_objects())
            state["signals"] = state.get("signals", 0) + 1
            if state["signals"] < baseline:
                return
            if "snap" not in state:
                state["snap"], state["types"] = snap, counts
                out.write("   (tracemalloc baseline)\n")
                return
            out.write(f"-- growth since the baseline (traced now {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MiB)\n")
            for stat in snap.compare_to(state["snap"], "lineno")[:25]:
                out.write(f"{stat.size_diff / 1024:10.1f} KiB {stat.count_diff:+8d}  {stat.traceback}\n")
            out.write("-- by traceback (top 5)\n")
            for stat in snap.compare_to(state["snap"], "traceback")[:5]:
                out.write(f"{stat.size_diff / 1024:10.1f} KiB {stat.count_diff:+8d}\n")
                for line in stat.traceback.format()[-12:]:
                    out.write(f"      {line}\n")
            out.write("-- objects by type (growth)\n")
            grown = sorted(((counts[t] - state["types"].get(t, 0), t) for t in counts), reverse=True)[:20]
            for diff, name in grown:
                out.write(f"{diff:+10d}  {name}\n")

    def dumper() -> None:
        while True:
            wake.wait()
            wake.clear()
            try:
                dump()
            except Exception as exc:
                with path.open("a") as out:
                    out.write(f"   diagnostics failed: {type(exc).__name__}: {exc}\n")

    threading.Thread(target=dumper, name="soak-diagnostics", daemon=True).start()
    signal.signal(signal.SIGUSR1, lambda signum, frame: wake.set())


def _install_duckdb_settings(settings: str) -> None:
    """``SET`` each ``name=value`` of ``settings`` (``;``-separated) on every DuckDB connection opened."""
    import duckdb

    connect = duckdb.connect
    statements = [f"SET {item.strip()}" for item in settings.split(";") if item.strip()]

    def connect_with_settings(*args: Any, **kwargs: Any) -> Any:
        con = connect(*args, **kwargs)
        for statement in statements:
            con.execute(statement)
        return con

    duckdb.connect = connect_with_settings


def serve_child(argv: list[str]) -> int:
    _install_model()
    if os.environ.get("SOAK_DUCKDB_SET"):
        _install_duckdb_settings(os.environ["SOAK_DUCKDB_SET"])
    diagnose = os.environ.get("SOAK_DIAGNOSE")
    if diagnose:
        _install_diagnostics(Path(diagnose), trace=os.environ.get("SOAK_TRACEMALLOC") == "1",
                             baseline=int(os.environ.get("SOAK_BASELINE", "1")))
    from apollia_nb.cli import main

    return main(["serve", *argv])


# --- the load -----------------------------------------------------------------------------------------


def _manifest(name: str, workspace: Path, max_steps: int) -> str:
    return "\n".join([f'name = "{name}"', 'description = "soak"', 'instructions = "Work."', "", "[model]",
                      'provider = "scripted"', "[workspace]", f"root = {json.dumps(str(workspace))}",
                      "[budget]", f"max_steps = {max_steps}"]) + "\n"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for PID {pid}")


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


@dataclass
class Minute:
    minute: int
    rss_kib: int
    submit_ms: list[float]
    decide_ms: list[float]
    completed: int
    entries: int
    home_bytes: int

    def line(self) -> str:
        per_entry = self.home_bytes / self.entries if self.entries else float("nan")
        return (f"min {self.minute:3d}  rss {self.rss_kib / 1024:7.1f} MB  "
                f"submit p50 {percentile(self.submit_ms, 50):6.1f} p99 {percentile(self.submit_ms, 99):7.1f} ms  "
                f"decide p50 {percentile(self.decide_ms, 50):6.1f} p99 {percentile(self.decide_ms, 99):7.1f} ms  "
                f"done {self.completed:5d}  entries {self.entries:7d}  home {per_entry:6.0f} B/entry")


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    submit_ms: list[float] = field(default_factory=list)
    decide_ms: list[float] = field(default_factory=list)
    completed: int = 0
    not_completed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def take(self) -> tuple[list[float], list[float], int]:
        with self.lock:
            out = (self.submit_ms, self.decide_ms, self.completed)
            self.submit_ms, self.decide_ms, self.completed = [], [], 0
            return out


def client_loop(url: str, index: int, agents: list[str], calls: int, stop: threading.Event, tally: Tally) -> None:
    from apollia_nb.sdk import Client

    with Client(url, TOKEN, timeout=120) as api:
        n = 0
        while not stop.is_set():
            agent = agents[(index + n) % len(agents)]
            n += 1
            writes = agent.startswith("writer")
            goal = f"{GOAL_PREFIX} lists={calls - 1 if writes else calls}" + (f" write=out-{index}.txt" if writes else "")
            try:
                t0 = time.perf_counter()
                sub = api.submit(agent, goal)
                submitted = (time.perf_counter() - t0) * 1000
                task = api.wait(sub.id, until="settled", timeout=120)
                decided = None
                if task.status == "waiting":
                    mine = [p for p in api.pending() if p.task_id == sub.id]
                    if not mine:
                        raise RuntimeError(f"{sub.id} waits, but no pending decision names it")
                    t0 = time.perf_counter()
                    api.decide(mine[0].id, "once", by="soak")
                    decided = (time.perf_counter() - t0) * 1000
                    task = api.wait(sub.id, until="finished", timeout=120)
                with tally.lock:
                    tally.submit_ms.append(submitted)
                    if decided is not None:
                        tally.decide_ms.append(decided)
                    if task.status == "completed":
                        tally.completed += 1
                    else:
                        tally.not_completed.append(f"{sub.id}: {task.status} {task.error}")
            except Exception as exc:  # counted, reported at the end; the soak goes on
                with tally.lock:
                    tally.errors.append(f"{type(exc).__name__}: {exc}")
                if len(tally.errors) > 50:
                    return


def count_entries(api: Any, since: int | None, total: int) -> tuple[int | None, int]:
    """Page forward from ``since`` (at most 200 pages a minute): the journal's entry count so far."""
    for _ in range(200):
        page = api.entries(since_seq=since, limit=1000)
        if page.entries:
            since, total = page.entries[-1].seq, page.entries[-1].seq
        if page.next_since_seq is None:
            break
    return since, total


def verdict(minutes: list[Minute]) -> tuple[bool, str]:
    if len(minutes) < 2:
        return False, "VERDICT: too short to judge (needs 2 minutes or more)"
    mark = 5 if len(minutes) >= 10 else max(1, len(minutes) // 2)
    base = minutes[mark - 1]
    peak = max(m.rss_kib for m in minutes[mark - 1:])
    rss_ratio = peak / base.rss_kib
    base_p99, last_p99 = percentile(base.decide_ms, 99), percentile(minutes[-1].decide_ms, 99)
    p99_ratio = last_p99 / base_p99 if base_p99 == base_p99 and base_p99 > 0 else float("nan")
    rss_ok, p99_ok = rss_ratio <= 1.20, p99_ratio <= 1.5
    text = (f"VERDICT: {'PASS' if rss_ok and p99_ok else 'FAIL'} — RSS minute {mark} {base.rss_kib / 1024:.1f} MB, "
            f"highest after {peak / 1024:.1f} MB ({(rss_ratio - 1) * 100:+.1f} %, target <= +20 %: "
            f"{'ok' if rss_ok else 'over'}); decide p99 minute {mark} {base_p99:.1f} ms, last minute "
            f"{last_p99:.1f} ms ({p99_ratio:.2f}x, target <= 1.5x: {'ok' if p99_ok else 'over'})")
    return rss_ok and p99_ok, text


def run_soak(minutes: int, clients: int, agents_per_kind: int, calls: int, diagnose: Path | None = None,
             trace: bool = False, baseline: int = 1) -> int:
    from apollia_nb.sdk import Client

    with tempfile.TemporaryDirectory(prefix="apollia-soak-") as scratch:
        base = Path(scratch)
        home = base / "home"
        env = {**os.environ, "APOLLIA_TOKEN": TOKEN}
        if diagnose is not None:
            env["SOAK_DIAGNOSE"] = str(diagnose)
            env["SOAK_TRACEMALLOC"] = "1" if trace else "0"
            env["SOAK_BASELINE"] = str(baseline)
        proc = subprocess.Popen([sys.executable, __file__, "--serve-child", "--home", str(home), "--port", "0",
                                 "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=env, cwd=base)
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            proc.wait(timeout=60)
            raise RuntimeError("the server did not start")
        url = json.loads(line)["url"]
        print(f"server PID {proc.pid} at {url}; {clients} clients, {2 * agents_per_kind} agents, "
              f"{calls} tool calls per task, {minutes} min", flush=True)
        tally, stop, rows = Tally(), threading.Event(), []
        try:
            with Client(url, TOKEN, timeout=120) as api:
                names = []
                for kind in ("reader", "writer"):
                    for k in range(agents_per_kind):
                        workspace = base / "workspaces" / f"{kind}-{k}"
                        workspace.mkdir(parents=True)
                        for i in range(8):  # what list_dir lists: fixed, with the writers' files
                            (workspace / f"file-{i}.txt").write_text(CONTENT)
                        api.register_agent(_manifest(f"{kind}-{k}", workspace, max_steps=calls + 10))
                        names.append(f"{kind}-{k}")
                agents = [n for pair in zip(names[:agents_per_kind], names[agents_per_kind:]) for n in pair]
                threads = [threading.Thread(target=client_loop, args=(url, i, agents, calls, stop, tally),
                                            name=f"soak-client-{i}", daemon=True) for i in range(clients)]
                started = time.monotonic()
                for t in threads:
                    t.start()
                since, total = None, 0
                for minute in range(1, minutes + 1):
                    time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
                    submit_ms, decide_ms, completed = tally.take()
                    rss = rss_kib(proc.pid)
                    try:
                        since, total = count_entries(api, since, total)
                    except Exception as exc:  # the server is gone or stuck: report and stop
                        print(f"min {minute:3d}  the server did not answer: {type(exc).__name__}: {exc}")
                        tally.errors.append(f"sampler: {exc}")
                        break
                    rows.append(Minute(minute, rss, submit_ms, decide_ms, completed, total, tree_bytes(home)))
                    print(rows[-1].line(), flush=True)
                    if diagnose is not None:
                        proc.send_signal(signal.SIGUSR1)  # minute 1: the baseline; then growth since it
                stop.set()
                for t in threads:
                    t.join(timeout=180)
        finally:
            stop.set()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        ok, text = verdict(rows)
        print(text)
        if tally.errors or tally.not_completed:
            print(f"PROBLEMS: {len(tally.errors)} client errors, {len(tally.not_completed)} tasks not completed; "
                  + "; ".join((tally.errors + tally.not_completed)[:5]))
            return 1
        return 0 if ok else 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve-child"]:
        return serve_child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--agents", type=int, default=2, help="agents of each kind (reader, writer)")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per task")
    parser.add_argument("--diagnose", type=Path, default=None, metavar="FILE",
                        help="the server appends DuckDB's memory per database to FILE every minute")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="with --diagnose: also the Python allocations that grew since the baseline")
    parser.add_argument("--baseline", type=int, default=1, metavar="MINUTE",
                        help="with --tracemalloc: the minute whose allocations are the baseline (default 1)")
    args = parser.parse_args(argv)
    if args.tracemalloc and args.diagnose is None:
        parser.error("--tracemalloc needs --diagnose FILE")
    if args.minutes < 1 or args.clients < 1 or args.agents < 1 or args.calls < 1:
        parser.error("--minutes, --clients, --agents and --calls must be at least 1")
    if args.baseline < 1 or args.baseline > args.minutes:
        parser.error("--baseline must be a minute of the run")
    return run_soak(args.minutes, args.clients, args.agents, args.calls, args.diagnose, args.tracemalloc,
                    args.baseline)


if __name__ == "__main__":
    raise SystemExit(main())
