"""REST API under load: many unattended tasks from concurrent clients, every decision answered over HTTP.

    .venv/bin/python benchmarks/api_load.py [--tasks 200] [--clients 16] [--rounds 1] [--baseline TREE] [--spy DIR]

Starts ``apollia-os serve --port 0`` on a fresh home (its own process), registers
two scripted agents — ``reader`` lists its workspace and completes, ``writer``
calls ``write_file`` and so waits on a person — and submits the tasks,
alternating the two, from ``--clients`` threads with the sync SDK. It waits
until every reader task is ``completed`` and every writer task ``waiting``,
answers every pending decision with ``POST /pending-decisions/decide`` from the
same threads, waits until every task is ``completed``, then checks that no
journal entry was lost (each task's run has ``run_open`` … ``run_seal``, the
seal counts the entries before it, a writer's run holds its answer) and that
the journal verifies, over the API and offline after the server stopped.

Prints: submission rate and the p50/p99 latency of a submission, tasks settled
per second, the p50/p99 latency of ``decide``, end-to-end tasks per second, and
the server's CPU seconds (every thread; the steadier figure on a busy machine), and the CPU seconds of
this process's client threads over the same time (they share the machine's cores with the server).
``--baseline TREE`` runs the same load on a server of another checkout (its
package first on ``PYTHONPATH``), alternating with this tree's, ``--rounds``
times each, and prints the medians side by side; each server is checked to
import the tree it stands for. ``--spy DIR`` records the server with py-spy during
each phase (``submit``, ``settle``, ``decide``, ``finish``), one file of collapsed stacks per phase and
run, every thread (``--spy-executable``: the py-spy to run). ``tests/test_api_load.py`` runs a small
version of it and asserts the outcomes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apollia_nb.sdk import Client

TOKEN = "load-token"


def _manifest(name: str, actor: list[str], workspace: Path, max_steps: int | None = None) -> str:
    lines = [f'name = "{name}"', 'description = "load"', 'instructions = "Work."', "", "[model]",
             'provider = "scripted"', *actor, "[workspace]", f"root = {json.dumps(str(workspace))}"]
    if max_steps is not None:
        lines += ["[budget]", f"max_steps = {max_steps}"]
    return "\n".join(lines) + "\n"


def reader_manifest(tasks: int, workspace: Path) -> str:
    """One ``list_dir`` turn, then the default text: every task plays the script from its start."""
    call = '[[model.script.actor]]\ntool_calls = [{ name = "list_dir", arguments = { path = "." } }]'
    return _manifest("reader", [call], workspace)


def writer_manifest(tasks: int, workspace: Path) -> str:
    """One ``write_file`` call per task (each task plays the script from its start) that waits on a person."""
    call = ('[[model.script.actor]]\ntool_calls = [{ name = "write_file", arguments = '
            '{ path = "out.txt", content = "load" } }]')
    return _manifest("writer", [call], workspace)


@dataclass
class LoadReport:
    tasks: int
    clients: int
    submit_secs: float
    settle_secs: float
    decide_secs: float
    total_secs: float
    decide_latencies: list[float]
    submit_latencies: list[float]
    statuses_settled: dict[str, str]          # task id → status once settled (before answers)
    statuses_final: dict[str, str]            # task id → status at the end
    agents: dict[str, str]                    # task id → agent
    pending_before: int
    pending_after: int
    run_problems: list[str] = field(default_factory=list)
    verify_ok: bool = False
    verify_entries: int = 0
    offline_verify_ok: bool = False
    offline_verify_output: str = ""
    server_cpu_secs: float = float("nan")
    client_cpu_secs: float = float("nan")  # this process (the clients' threads) from the first submission to the end
    server_package: str = ""

    def percentile(self, p: float, values: list[float] | None = None) -> float:
        values = sorted(self.decide_latencies if values is None else values)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]

    def figures(self) -> dict[str, float]:
        """The figures compared between trees: rates per second, latencies in ms, CPU seconds."""
        writers = sum(1 for a in self.agents.values() if a == "writer")
        return {
            "submit/s": self.tasks / self.submit_secs,
            "submit p50 ms": self.percentile(50, self.submit_latencies) * 1000,
            "submit p99 ms": self.percentile(99, self.submit_latencies) * 1000,
            "decide/s": writers / self.decide_secs,
            "decide p50 ms": self.percentile(50) * 1000,
            "decide p99 ms": self.percentile(99) * 1000,
            "tasks/s end to end": self.tasks / self.total_secs,
            "server CPU s": self.server_cpu_secs,
            "clients' CPU s": self.client_cpu_secs,
        }

    def lines(self) -> list[str]:
        writers = sum(1 for a in self.agents.values() if a == "writer")
        return [
            f"tasks {self.tasks} ({self.tasks - writers} complete on their own, {writers} wait on a person), "
            f"{self.clients} concurrent clients",
            f"submit:  {self.tasks / self.submit_secs:8.1f} tasks/s  ({self.submit_secs:.2f} s), latency p50 "
            f"{self.percentile(50, self.submit_latencies) * 1000:.1f} ms, "
            f"p99 {self.percentile(99, self.submit_latencies) * 1000:.1f} ms",
            f"settle:  {self.tasks / self.settle_secs:8.1f} tasks/s  (every task completed or waiting, "
            f"{self.settle_secs:.2f} s from the first submission)",
            f"decide:  {writers / self.decide_secs:8.1f} decisions/s, latency p50 {self.percentile(50) * 1000:.1f} ms, "
            f"p99 {self.percentile(99) * 1000:.1f} ms",
            f"overall: {self.tasks / self.total_secs:8.1f} tasks/s end to end ({self.total_secs:.2f} s); "
            f"server CPU {self.server_cpu_secs:.2f} s ({self.server_package}), the clients' {self.client_cpu_secs:.2f} s",
            f"journal: {self.verify_entries} entries, verify over the API {'ok' if self.verify_ok else 'FAILED'}, "
            f"offline {'ok' if self.offline_verify_ok else 'FAILED'}; runs with a problem: {len(self.run_problems)}",
        ]


def _server_env(tree: Path | None) -> dict[str, str]:
    env = {**os.environ, "APOLLIA_TOKEN": TOKEN}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def server_package(tree: Path | None, cwd: Path) -> str:
    """The package a server started as ``_serve`` starts it imports (its ``__init__.py``); checked
    against ``tree`` (None: the package this script imports)."""
    out = subprocess.run([sys.executable, "-c", "import apollia_nb; print(apollia_nb.__file__)"],
                         capture_output=True, text=True, env=_server_env(tree), cwd=cwd, check=True).stdout.strip()
    import apollia_nb

    expected = (tree / "apollia_nb" / "__init__.py") if tree is not None else Path(apollia_nb.__file__)
    if Path(out).resolve() != expected.resolve():
        raise RuntimeError(f"the server would import {out}, not {expected}")
    return str(Path(out).parent)


def _cpu_secs(pid: int) -> float:
    """CPU seconds (user + system, every thread) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(home: Path, cwd: Path, tree: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    env = _server_env(tree)
    proc = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve", "--home", str(home), "--port", "0",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise RuntimeError(f"the server did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, json.loads(line)["url"]


def _in_parallel(clients: int, url: str, items: Sequence[Any], work: Callable[[Client, Any], Any]) -> list[Any]:
    """``work(client, item)`` for every item, from ``clients`` threads, each with its own client."""
    local = threading.local()
    opened: list[Client] = []
    lock = threading.Lock()

    def run(item: Any) -> Any:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = Client(url, TOKEN, timeout=120)
            with lock:
                opened.append(client)
        return work(client, item)

    try:
        with ThreadPoolExecutor(max_workers=clients) as pool:
            return list(pool.map(run, items))
    finally:
        for client in opened:
            client.close()


def check_runs(api: Client, run_ids: dict[str, str], writers: set[str]) -> list[str]:
    """Every run whole: run_open first, run_seal last counting the entries before it; writers answered."""
    problems = []
    for task_id, run_id in run_ids.items():
        entries = list(api.iter_entries(run_id=run_id))
        kinds = [e.kind for e in entries]
        if not kinds or kinds[0] != "run_open":
            problems.append(f"{task_id}: the run does not start with run_open")
            continue
        if kinds[-1] != "run_seal" or kinds.count("run_seal") != 1:
            problems.append(f"{task_id}: the run does not end with one run_seal")
            continue
        if entries[-1].payload.get("entries") != len(entries) - 1:
            problems.append(f"{task_id}: the seal counts {entries[-1].payload.get('entries')}, "
                            f"the journal holds {len(entries) - 1}")
        if task_id in writers and kinds.count("answer") != 1:
            problems.append(f"{task_id}: {kinds.count('answer')} answers in the run")
        writes = [e for e in entries if e.kind == "tool_result" and e.payload.get("tool") == "write_file"]
        if task_id in writers and len(writes) != 1:
            problems.append(f"{task_id}: {len(writes)} write_file results in the run")
    return problems


class _Spy:
    """py-spy on the server, one profile (collapsed stacks, every thread) per phase of the load:
    ``DIR/<phase>.txt``. Nothing when ``directory`` is None."""

    def __init__(self, executable: str, directory: Path | None, pid: int) -> None:
        self.executable, self.directory, self.pid = executable, directory, pid
        self.proc: subprocess.Popen[bytes] | None = None

    def phase(self, name: str | None) -> None:
        if self.directory is None:
            return
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=60)
            self.proc = None
        if name is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                [self.executable, "record", "--pid", str(self.pid), "--rate", "100", "--format", "raw",
                 "--threads", "--nonblocking", "-o", str(self.directory / f"{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)  # py-spy attaches


def run_load(tasks: int = 200, clients: int = 16, root: Path | None = None, tree: Path | None = None,
             spy: Path | None = None, spy_executable: str = "py-spy") -> LoadReport:
    """The load on a fresh home, its server importing ``tree``'s package (None: this one's);
    ``spy``: a directory for a py-spy profile of the server per phase."""
    with tempfile.TemporaryDirectory(prefix="apollia-load-") as scratch:
        base = root or Path(scratch)
        home, workspace = base / "home", base / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        writers_n = tasks // 2
        package = server_package(tree, base)
        proc, url = _serve(home, base, tree)
        cpu = float("nan")
        profile = _Spy(spy_executable, spy, proc.pid)
        try:
            with Client(url, TOKEN, timeout=120) as api:
                api.register_agent(reader_manifest(tasks - writers_n, workspace))
                api.register_agent(writer_manifest(writers_n, workspace))

                agents_order = ["reader" if i % 2 == 0 else "writer" for i in range(tasks)]
                submit_latencies: list[float] = []
                lat_lock = threading.Lock()

                def submit(client: Client, item: tuple[int, str]) -> Any:
                    t0 = time.perf_counter()
                    sub = client.submit(item[1], f"Task {item[0]}")
                    elapsed = time.perf_counter() - t0
                    with lat_lock:
                        submit_latencies.append(elapsed)
                    return sub

                profile.phase("submit")
                started, cpu0 = time.perf_counter(), time.process_time()
                subs = _in_parallel(clients, url, list(enumerate(agents_order)), submit)
                submit_secs = time.perf_counter() - started
                agents = {s.id: a for s, a in zip(subs, agents_order)}
                run_ids = {s.id: s.run_id for s in subs}

                profile.phase("settle")
                settled = _in_parallel(clients, url, [s.id for s in subs], lambda c, tid: c.wait(tid))
                settle_secs = time.perf_counter() - started
                statuses_settled = {t.id: t.status for t in settled}

                pending = api.pending()
                latencies: list[float] = []

                def decide(client: Client, decision_id: str) -> None:
                    t0 = time.perf_counter()
                    client.decide(decision_id, "once", by="load")
                    elapsed = time.perf_counter() - t0
                    with lat_lock:
                        latencies.append(elapsed)

                profile.phase("decide")
                d0 = time.perf_counter()
                _in_parallel(clients, url, [p.id for p in pending], decide)
                decide_secs = time.perf_counter() - d0
                profile.phase("finish")

                final = _in_parallel(clients, url, [s.id for s in subs],
                                     lambda c, tid: c.wait(tid, until="finished"))
                total_secs = time.perf_counter() - started
                client_cpu = time.process_time() - cpu0
                profile.phase(None)
                report = LoadReport(
                    tasks=tasks, clients=clients, submit_secs=submit_secs, settle_secs=settle_secs,
                    decide_secs=decide_secs, total_secs=total_secs, decide_latencies=latencies,
                    submit_latencies=submit_latencies,
                    statuses_settled=statuses_settled, statuses_final={t.id: t.status for t in final},
                    agents=agents, pending_before=len(pending), pending_after=len(api.pending()),
                    client_cpu_secs=client_cpu,
                )
                writers = {tid for tid, a in agents.items() if a == "writer"}
                report.run_problems = check_runs(api, run_ids, writers)
                verified = api.verify()
                report.verify_ok, report.verify_entries = verified.ok, verified.entries
                cpu = _cpu_secs(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        offline = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", str(home)],
                                 capture_output=True, text=True, timeout=300)
        report.offline_verify_ok = offline.returncode == 0
        report.offline_verify_output = (offline.stdout + offline.stderr).strip()
        report.server_cpu_secs, report.server_package = cpu, package
        return report


def _problems(report: LoadReport) -> str | None:
    wrong = [tid for tid, status in report.statuses_final.items() if status != "completed"]
    if wrong or report.run_problems or not (report.verify_ok and report.offline_verify_ok):
        return f"PROBLEMS: {len(wrong)} tasks not completed; " + "; ".join(report.run_problems[:5])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree, alternating (medians printed)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a second checkout whose server runs the same load, alternating with this one's")
    parser.add_argument("--spy", type=Path, default=None,
                        help="a directory for py-spy profiles of the server, one per phase and run")
    parser.add_argument("--spy-executable", default="py-spy", help="the py-spy to run (default: on PATH)")
    args = parser.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline is not None:
        trees.insert(0, ("baseline", args.baseline.resolve()))
    runs: dict[str, list[LoadReport]] = {name: [] for name, _ in trees}
    failed = False
    for round_ in range(args.rounds):
        for name, tree in trees:
            spy = None if args.spy is None else args.spy / f"{'base' if tree else 'this'}-{round_ + 1}"
            report = run_load(args.tasks, args.clients, tree=tree, spy=spy, spy_executable=args.spy_executable)
            load = os.getloadavg()[0]
            print(f"--- {name}, round {round_ + 1} (load average {load:.1f})")
            print("\n".join(report.lines()))
            problems = _problems(report)
            if problems:
                print(problems)
                failed = True
            runs[name].append(report)
    if args.rounds > 1 or len(trees) > 1:
        names = [name for name, _ in trees]
        print(f"--- medians of {args.rounds} round(s): " + " | ".join(names))
        for figure in runs[names[0]][0].figures():
            values = [statistics.median(r.figures()[figure] for r in runs[name]) for name in names]
            ratio = f"  ({values[-1] / values[0]:.2f}x)" if len(values) > 1 and values[0] else ""
            print(f"{figure:>20}: " + " | ".join(f"{v:9.1f}" for v in values) + ratio)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
