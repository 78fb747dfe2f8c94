"""A home at 10k and at N entries (default 1M): what opening, auditing and querying it costs.

Run: ``.venv/bin/python benchmarks/journal_scale.py [--entries 1000000] [--keep DIR | --reuse DIR]``
and ``.venv/bin/python benchmarks/journal_scale.py --entries-10m [--keep DIR | --reuse DIR]``.

How the homes are built (``--entries`` mode): through the real ``Runtime`` on a home
on disk, the way a user's tasks fill it. One scripted agent (``bench``) whose actor
makes 50 calls of a ``read`` tool per task, one call per turn (every 25th call
raises, so ``tool_calls`` holds errors too), then ends with text; the critic passes.
Tasks are submitted 8 at a time (their commits share the journal's group commits)
until the journal holds the wanted number of entries. Each task adds about 209
entries (``run_open``, plan, per call ``model_response``/``decision``/``tool_call``/
``tool_result``, the step's and task's statuses, ``run_seal``).

Then each figure is taken in a fresh process (so nothing is cached in Python),
the home-holding ones one after the other:

* open: ``Journal.open`` + ``close``, ``Runtime`` open + close, and
  ``%load_ext apollia_nb`` in a fresh IPython kernel (median of 3; the kernel's own
  start is not counted). The first open after a build (or after the code changed
  the journal's format) may migrate the home; one unmeasured open runs first.
* RSS while appending: a ``Runtime`` on the home runs 40 more tasks (about
  8,400 entries) and samples its own ``VmRSS`` (so a reused home grows a little).
* ``audit verify`` and ``audit export`` as whole CLI commands (subprocesses),
  wall time and peak RSS (``getrusage(RUSAGE_CHILDREN)`` of a runner process that
  starts nothing else).
* the four views' typical grouped queries (median of 5 after one warm-up).
* the home's size on disk per entry.

``--entries-10m`` builds (or extends, or reuses) a home of 10,000,000 entries the
fastest honest way the journal's API allows: ``Journal.append_many_async`` in
batches of 20,000 realistic entries (``--batch``; the same kinds and payload shapes
a task writes: ``run_open``, per call ``model_response``/``decision``/``tool_call``/
``tool_result``, ``run_seal``), two batches handed to the writer at once so the next
is built while one is signed and committed; each entry sequenced, hash-chained and
Ed25519-signed as always, each batch one synced ``journal.log`` record and one copy
into ``journal.db`` (a batch of 1,000 a commit ran at 7,100 entries/s on a fresh
home, 20,000 at 15,400). Such a home has no ``runtime.db`` (nothing but the journal
was written), so ``apollia-os home repair --new-runtime-db`` (journaled) creates one
before the ``Runtime`` is opened. It reports open times (journal, runtime), ``audit
verify`` and ``audit export`` time and peak RSS, and the home's size per entry.

``--keep DIR`` builds the homes in DIR and keeps them; ``--reuse DIR`` measures the
homes DIR holds without building.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
AGENT = "bench"
CALLS = 50
CONCURRENCY = 8
APPEND_TASKS = 40
QUERIES = {
    "decisions": "SELECT tool, outcome, count(*) FROM decisions GROUP BY ALL ORDER BY ALL",
    "tool_calls": "SELECT tool, status, count(*) FROM tool_calls GROUP BY ALL ORDER BY ALL",
    "runs": "SELECT agent, status, count(*), sum(entries) FROM runs GROUP BY ALL ORDER BY ALL",
    "journal": "SELECT kind, count(*) FROM journal GROUP BY kind ORDER BY kind",
}


def read_note(key: str) -> str:
    """Read a note by its key."""
    if key.endswith("x"):
        raise ValueError(f"no note {key}")
    return f"note {key}"


def manifest_text(workspace: Path) -> str:
    lines = [
        f'name = "{AGENT}"', 'description = "scale benchmark agent"', 'instructions = "Read the notes."', "",
        "[model]", 'provider = "scripted"',
    ]
    for i in range(CALLS):
        key = f"k{i}x" if i % 25 == 24 else f"k{i}"
        lines += ["[[model.script.actor]]", f'tool_calls = [{{ name = "read_note", arguments = {{ key = "{key}" }} }}]']
    lines += ["[[model.script.actor]]", 'text = "All notes read."']
    lines += ["[workspace]", f"root = {json.dumps(str(workspace))}", "[budget]", f"max_steps = {2 * CALLS + 10}"]
    return "\n".join(lines) + "\n"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    def __init__(self, every: float = 0.25) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.samples.append(rss_mb())

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(rss_mb())


# --------------------------------------------------------------------------- building through the Runtime


async def run_tasks(home: Path, *, target: int | None = None, tasks: int | None = None,
                    progress: bool = False) -> dict[str, Any]:
    """Run tasks on the home until the journal holds ``target`` entries (or ``tasks`` tasks ran)."""
    from apollia_nb.runtime import Runtime
    from apollia_nb.runtime.tools import ToolDef

    workspace = home.parent / f"{home.name}-workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    done = 0
    t0 = time.perf_counter()
    with RssSampler() as rss:
        async with Runtime(home) as rt:
            if AGENT not in {a.name for a in rt.agents()}:
                await rt.register_agent(manifest_text(workspace), tools=[ToolDef.from_function(read_note, family="read")])
            start_head = rt.journal.head()[0]
            last_report = 0.0
            while True:
                head = rt.journal.head()[0]
                if target is not None and head >= target:
                    break
                if tasks is not None and done >= tasks:
                    break
                wave = CONCURRENCY if tasks is None else min(CONCURRENCY, tasks - done)
                handles = [await rt.submit(AGENT, "Read every note") for _ in range(wave)]
                for handle in handles:
                    finished = await handle
                    if finished.status != "completed":
                        raise SystemExit(f"a task ended {finished.status}: {finished.error}")
                done += wave
                if progress and time.perf_counter() - last_report > 30:
                    last_report = time.perf_counter()
                    print(f"  {head:,} entries, {done} tasks, {time.perf_counter() - t0:.0f} s, "
                          f"RSS {rss_mb():.0f} MB", file=sys.stderr, flush=True)
            end_head = rt.journal.head()[0]
    return {"tasks": done, "entries": end_head, "added": end_head - start_head,
            "seconds": time.perf_counter() - t0, "rss_max_mb": max(rss.samples),
            "rss_end_mb": rss.samples[-1]}


# --------------------------------------------------------------------------- building with append_many (10M)


def drafts_for_run(run_no: int, calls: int = CALLS) -> list[Any]:
    """The entries of one run of a task: the kinds and payload shapes the runtime writes."""
    from apollia_nb.journal.store import Draft

    run_id = f"run-{run_no:012x}"
    out = [Draft("run_open", {"run_kind": "task", "goal": "Read every note", "task_id": f"task-{run_no:012x}"},
                 run_id, AGENT)]
    for i in range(calls):
        call_id = f"call-{i}"
        key = f"k{i}x" if i % 25 == 24 else f"k{i}"
        out.append(Draft("model_response", {"role": "actor", "tool_calls": [
            {"id": call_id, "name": "read_note", "arguments": {"key": key}}], "usage": {"input": 120, "output": 18}},
            run_id, AGENT))
        out.append(Draft("decision", {"call_id": call_id, "tool": "read_note", "family": "read", "outcome": "allow",
                                      "line": None, "rule": None, "reason": "read is allowed"}, run_id, AGENT))
        out.append(Draft("tool_call", {"call_id": call_id, "tool": "read_note", "arguments": {"key": key}},
                         run_id, AGENT))
        if i % 25 == 24:
            result = {"call_id": call_id, "tool": "read_note", "status": "error", "error_code": "TOOL_FAILED",
                      "message": f"no note {key}"}
        else:
            result = {"call_id": call_id, "tool": "read_note", "status": "ok", "output": f"note {key}"}
        out.append(Draft("tool_result", result, run_id, AGENT))
    out.append(Draft("run_seal", {"status": "completed", "entries": len(out) + 1}, run_id, AGENT))
    return out


def build_appended(home: Path, target: int, batch_size: int = 20_000, in_flight: int = 2) -> dict[str, Any]:
    """Extend ``home`` to ``target`` entries with ``append_many_async`` batches of ``batch_size``.

    ``in_flight`` batches are handed to the writer at once, so the next batch is
    built while the writer signs and commits the previous one; each batch is one
    synced ``journal.log`` record and one copy into ``journal.db``.
    """
    from apollia_nb.home import Home
    from apollia_nb.journal.store import Journal

    async def fill(journal: Any) -> None:
        run_no = journal.head()[0] // (4 * CALLS + 2)
        submitted = journal.head()[0]
        batch: list[Any] = []
        pending: list[asyncio.Future[Any]] = []
        last = time.perf_counter()
        while submitted < target:
            while len(batch) < batch_size:
                run_no += 1
                batch.extend(drafts_for_run(run_no))
            take = min(batch_size, target - submitted)
            pending.append(asyncio.ensure_future(journal.append_many_async(batch[:take])))
            batch, submitted = batch[take:], submitted + take
            if len(pending) >= in_flight:
                await pending.pop(0)
            if time.perf_counter() - last > 30:
                last = time.perf_counter()
                print(f"  {journal.head()[0]:,} entries, {last - t0:.0f} s, "
                      f"{(journal.head()[0] - start) / (last - t0):,.0f} entries/s, RSS {rss_mb():.0f} MB",
                      file=sys.stderr, flush=True)
        await asyncio.gather(*pending)

    t0 = time.perf_counter()
    with RssSampler(1.0) as rss:
        with Journal.open(Home.at(home)) as journal:
            start = journal.head()[0]
            asyncio.run(fill(journal))
            entries = journal.head()[0]
    return {"entries": entries, "added": entries - start, "seconds": time.perf_counter() - t0,
            "rss_max_mb": max(rss.samples)}


# --------------------------------------------------------------------------- measuring (child processes)


def child(args: list[str]) -> dict[str, Any]:
    """Run this script as a child with ``args``; return the JSON it prints last."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, __file__, *args], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed_command(cmd: list[str]) -> dict[str, Any]:
    """Wall time and peak RSS of one CLI command, measured by a runner process that starts only it."""
    return child(["--child", "command", json.dumps(cmd)])


def child_main(what: str, arg: str) -> dict[str, Any]:
    if what == "command":
        cmd = json.loads(arg)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and every process it waited for
        return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime,
                "rc": proc.returncode,
                "tail": (proc.stdout + proc.stderr).strip().splitlines()[-3:]}
    home = Path(arg)
    if what == "journal-open":
        from apollia_nb.home import Home
        from apollia_nb.journal.store import Journal

        h = Home.at(home)
        t0 = time.perf_counter()
        journal = Journal.open(h)
        seconds = time.perf_counter() - t0
        entries = journal.head()[0]
        journal.close()
        return {"seconds": seconds, "entries": entries, "rss_mb": rss_mb()}
    if what == "runtime-open":
        from apollia_nb.runtime import Runtime

        async def main() -> dict[str, Any]:
            t0 = time.perf_counter()
            async with Runtime(home) as rt:
                seconds = time.perf_counter() - t0
                entries = rt.journal.head()[0]
            return {"seconds": seconds, "entries": entries, "rss_mb": rss_mb()}

        return asyncio.run(main())
    if what == "append":
        return asyncio.run(run_tasks(home, tasks=APPEND_TASKS))
    if what == "queries":
        from apollia_nb.home import Home
        from apollia_nb.journal.store import Journal

        with Journal.open(Home.at(home)) as journal:
            out: dict[str, Any] = {}
            for name, sql in QUERIES.items():
                journal.sql(sql)
                times = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    journal.sql(sql)
                    times.append((time.perf_counter() - t0) * 1000)
                out[name] = statistics.median(times)
        return out
    raise SystemExit(f"unknown child {what}")


def load_ext_ms(home: Path, runs: int = 3) -> float:
    """Median ``%load_ext apollia_nb`` time in fresh kernels on this home (the kernel's start excluded)."""
    from jupyter_client import KernelManager

    code = ("import time as _t\n_t0 = _t.perf_counter()\nget_ipython().run_line_magic('load_ext', 'apollia_nb')\n"
            "_ms = (_t.perf_counter() - _t0) * 1000\n")
    times = []
    env = dict(os.environ, APOLLIA_HOME=str(home), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for _ in range(runs + 1):
        km = KernelManager(kernel_name="python3")
        km.start_kernel(env=env, cwd=str(home.parent))
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            reply = kc.execute_interactive(code, timeout=120, output_hook=lambda m: None)
            if reply["content"]["status"] != "ok":
                raise SystemExit(f"%load_ext failed: {reply['content']}")
            value = kc.execute_interactive("print(repr(_ms))", timeout=30, output_hook=lambda m: captured.append(m))
            del value
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        texts = [m["content"].get("text", "") for m in captured if m["msg_type"] == "stream"]
        captured.clear()
        times.append(float("".join(texts).strip()))
    return statistics.median(times[1:])


captured: list[dict[str, Any]] = []


def home_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.rglob("*") if p.is_file())


def measure(home: Path, *, full: bool = True, runtime: bool | None = None,
            export: bool | None = None) -> dict[str, Any]:
    """Every figure (``full``), or the open and audit figures: ``runtime`` adds the ``Runtime`` open,
    ``export`` the ``audit export`` (both default to ``full``)."""
    cli = [sys.executable, "-m", "apollia_nb"]
    runtime = full if runtime is None else runtime
    export = full if export is None else export
    out: dict[str, Any] = {}
    first = child(["--child", "journal-open", str(home)])  # a migration, if any, is not measured
    out["first_open_s"] = first["seconds"]
    opens = [child(["--child", "journal-open", str(home)]) for _ in range(3)]
    out["entries"] = opens[-1]["entries"]
    out["journal_open_s"] = statistics.median(o["seconds"] for o in opens)
    if runtime:
        out["runtime_open_s"] = statistics.median(child(["--child", "runtime-open", str(home)])["seconds"]
                                                  for _ in range(3))
    if full:
        out["load_ext_ms"] = load_ext_ms(home)
        out["append"] = child(["--child", "append", str(home)])
    verify = timed_command([*cli, "audit", "verify", "--home", str(home)])
    out["verify"] = verify
    out["verify_entries_per_s"] = out["entries"] / verify["seconds"] if verify["rc"] == 0 else 0.0
    # What 2 idle cores allow: the command's CPU seconds (workers included) spread over both.
    out["verify_entries_per_s_2cores"] = out["entries"] / (verify["cpu_s"] / 2) \
        if verify["rc"] == 0 and verify["cpu_s"] else 0.0
    # The same command checking signatures with libsodium only: the baseline of the same run.
    strict = timed_command(["env", "APOLLIA_ED25519=libsodium", *cli, "audit", "verify", "--home", str(home)])
    out["verify_libsodium"] = strict
    out["verify_libsodium_entries_per_s"] = out["entries"] / strict["seconds"] if strict["rc"] == 0 else 0.0
    if export:
        with tempfile.TemporaryDirectory(prefix="scale-export-", dir=home.parent) as tmp:
            out["export"] = timed_command([*cli, "audit", "export", "--home", str(home),
                                           str(Path(tmp) / "bundle")])
    if full:
        out["queries_ms"] = child(["--child", "queries", str(home)])
    out["bytes_per_entry"] = home_bytes(home) / max(1, out["entries"])
    return out


# --------------------------------------------------------------------------- printing


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}{unit}" if value < 10 else f"{value:,.0f}{unit}"
    return f"{value:,}{unit}"


def table(names: list[str], results: list[dict[str, Any]]) -> str:
    rows: list[tuple[str, list[str]]] = [
        ("entries", [fmt(r["entries"]) for r in results]),
        ("first Journal.open (s; migrates an older home)", [fmt(r["first_open_s"]) for r in results]),
        ("Journal.open (s)", [fmt(r["journal_open_s"]) for r in results]),
    ]
    if "runtime_open_s" in results[0]:
        rows.append(("Runtime open (s)", [fmt(r["runtime_open_s"]) for r in results]))
    if "load_ext_ms" in results[0]:
        rows += [
            ("%load_ext apollia_nb (ms)", [fmt(r["load_ext_ms"]) for r in results]),
            ("RSS appending 40 tasks: max (MB)", [fmt(r["append"]["rss_max_mb"]) for r in results]),
        ]
    rows += [
        ("audit verify (s)", [fmt(r["verify"]["seconds"]) + ("" if r["verify"]["rc"] == 0 else " FAILED")
                              for r in results]),
        ("audit verify (entries/s)", [fmt(r["verify_entries_per_s"]) for r in results]),
        ("audit verify CPU (s, workers included)", [fmt(r["verify"]["cpu_s"]) for r in results]),
        ("  → entries/s its CPU allows on 2 idle cores", [fmt(r["verify_entries_per_s_2cores"]) for r in results]),
        ("audit verify peak RSS (MB)", [fmt(r["verify"]["peak_rss_mb"]) for r in results]),
        ("audit verify, libsodium only (entries/s)", [fmt(r["verify_libsodium_entries_per_s"]) for r in results]),
        ("audit verify, libsodium only, CPU (s)", [fmt(r["verify_libsodium"]["cpu_s"]) for r in results]),
        ("  → verify speed / libsodium only", [fmt(r["verify_entries_per_s"] / r["verify_libsodium_entries_per_s"])
                                               if r["verify_libsodium_entries_per_s"] else "-" for r in results]),
    ]
    if "export" in results[0]:
        rows += [
            ("audit export (s)", [fmt(r["export"]["seconds"]) + ("" if r["export"]["rc"] == 0 else " FAILED")
                                  for r in results]),
            ("audit export peak RSS (MB)", [fmt(r["export"]["peak_rss_mb"]) for r in results]),
        ]
    if "queries_ms" in results[0]:
        for name in QUERIES:
            rows.append((f"{name}: grouped query (ms)", [fmt(r["queries_ms"][name]) for r in results]))
    rows.append(("home size per entry (bytes)", [fmt(r["bytes_per_entry"]) for r in results]))
    width = max(len(label) for label, _ in rows)
    cols = [max(len(n), *(len(v[i]) for _, v in rows)) for i, n in enumerate(names)]
    lines = [" " * width + "  " + "  ".join(n.rjust(c) for n, c in zip(names, cols))]
    if len(results) == 2:
        lines[0] += "   ratio"
    for label, values in rows:
        line = label.ljust(width) + "  " + "  ".join(v.rjust(c) for v, c in zip(values, cols))
        if len(values) == 2:
            try:
                a, b = (float(v.replace(",", "").split()[0]) for v in values)
                line += f"  {b / a:6.2f}×" if a else ""
            except ValueError:
                pass
        lines.append(line)
    return "\n".join(lines)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries of the large home")
    parser.add_argument("--small", type=int, default=10_000, help="entries of the small home")
    parser.add_argument("--entries-10m", dest="ten_m", action="store_true",
                        help="build (or reuse) a 10,000,000-entry home with append_many; open, verify, RSS")
    parser.add_argument("--appended", type=int, default=10_000_000,
                        help="entries of the --entries-10m home (a smaller one builds faster; an existing "
                             "home is extended to this size)")
    parser.add_argument("--batch", type=int, default=20_000,
                        help="entries per append_many of the --entries-10m build (one synced record each)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--keep", type=Path, help="build the homes in DIR and keep them")
    group.add_argument("--reuse", type=Path, help="measure the homes DIR holds, without building")
    parser.add_argument("--build-only", action="store_true", help="build the homes, measure nothing")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_main(*args.child)))
        return

    base = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="apollia-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        if args.ten_m:
            home = base / "home-10m"
            if not args.reuse:
                built = build_appended(home, args.appended, args.batch)
                print(f"built {built['entries']:,} entries ({built['added']:,} added with append_many_async "
                      f"in batches of {args.batch:,}) in {built['seconds']:.0f} s, "
                      f"{built['added'] / max(built['seconds'], 1e-9):,.0f} entries/s "
                      f"(writer RSS max {built['rss_max_mb']:.0f} MB)", flush=True)
            if args.build_only:
                return
            if not (home / "runtime.db").exists():  # append_many writes the journal only
                subprocess.run([sys.executable, "-m", "apollia_nb", "home", "repair", "--new-runtime-db",
                                "--home", str(home)], check=True, capture_output=True)
                print("runtime.db created with `apollia-os home repair --new-runtime-db` (journaled)")
            result = measure(home, full=False, runtime=True, export=True)
            print(f"machine: {uptime()}")
            print(table([f"{result['entries']:,}"], [result]))
            return
        homes = [(f"{args.small // 1000}k", args.small), (f"{args.entries / 1e6:g}M", args.entries)]
        for name, n in homes:
            home = base / f"home-{name}"
            if not args.reuse:
                print(f"building {name} ({n:,} entries) through the Runtime in {home}", file=sys.stderr, flush=True)
                built = asyncio.run(run_tasks(home, target=n, progress=True))
                print(f"built {name}: {built['entries']:,} entries from {built['tasks']} tasks in "
                      f"{built['seconds']:.0f} s (RSS max {built['rss_max_mb']:.0f} MB)", flush=True)
        if args.build_only:
            return
        results = [measure(base / f"home-{name}") for name, _ in homes]
        print(f"machine: {uptime()}")
        print(table([name for name, _ in homes], results))
        print(json.dumps(results, indent=1), file=sys.stderr)
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
