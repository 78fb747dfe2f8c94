"""REST API under load: many unattended tasks from concurrent clients, every decision answered over HTTP.

    .venv/bin/python benchmarks/api_load.py [--tasks 200] [--clients 16]

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

Prints: submission rate, tasks settled per second, the p50/p99 latency of
``decide``, end-to-end tasks per second. ``tests/test_api_load.py`` runs a small
version of it and asserts the outcomes.
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

    def percentile(self, p: float) -> float:
        values = sorted(self.decide_latencies)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]

    def lines(self) -> list[str]:
        writers = sum(1 for a in self.agents.values() if a == "writer")
        return [
            f"tasks {self.tasks} ({self.tasks - writers} complete on their own, {writers} wait on a person), "
            f"{self.clients} concurrent clients",
            f"submit:  {self.tasks / self.submit_secs:8.1f} tasks/s  ({self.submit_secs:.2f} s)",
            f"settle:  {self.tasks / self.settle_secs:8.1f} tasks/s  (every task completed or waiting, "
            f"{self.settle_secs:.2f} s from the first submission)",
            f"decide:  {writers / self.decide_secs:8.1f} decisions/s, latency p50 {self.percentile(50) * 1000:.1f} ms, "
            f"p99 {self.percentile(99) * 1000:.1f} ms",
            f"overall: {self.tasks / self.total_secs:8.1f} tasks/s end to end ({self.total_secs:.2f} s)",
            f"journal: {self.verify_entries} entries, verify over the API {'ok' if self.verify_ok else 'FAILED'}, "
            f"offline {'ok' if self.offline_verify_ok else 'FAILED'}; runs with a problem: {len(self.run_problems)}",
        ]


def _serve(home: Path, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "APOLLIA_TOKEN": TOKEN}
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


def run_load(tasks: int = 200, clients: int = 16, root: Path | None = None) -> LoadReport:
    with tempfile.TemporaryDirectory(prefix="apollia-load-") as scratch:
        base = root or Path(scratch)
        home, workspace = base / "home", base / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        writers_n = tasks // 2
        proc, url = _serve(home, base)
        try:
            with Client(url, TOKEN, timeout=120) as api:
                api.register_agent(reader_manifest(tasks - writers_n, workspace))
                api.register_agent(writer_manifest(writers_n, workspace))

                agents_order = ["reader" if i % 2 == 0 else "writer" for i in range(tasks)]
                started = time.perf_counter()
                subs = _in_parallel(clients, url, list(enumerate(agents_order)),
                                    lambda c, item: c.submit(item[1], f"Task {item[0]}"))
                submit_secs = time.perf_counter() - started
                agents = {s.id: a for s, a in zip(subs, agents_order)}
                run_ids = {s.id: s.run_id for s in subs}

                settled = _in_parallel(clients, url, [s.id for s in subs], lambda c, tid: c.wait(tid))
                settle_secs = time.perf_counter() - started
                statuses_settled = {t.id: t.status for t in settled}

                pending = api.pending()
                latencies: list[float] = []
                lat_lock = threading.Lock()

                def decide(client: Client, decision_id: str) -> None:
                    t0 = time.perf_counter()
                    client.decide(decision_id, "once", by="load")
                    elapsed = time.perf_counter() - t0
                    with lat_lock:
                        latencies.append(elapsed)

                d0 = time.perf_counter()
                _in_parallel(clients, url, [p.id for p in pending], decide)
                decide_secs = time.perf_counter() - d0

                final = _in_parallel(clients, url, [s.id for s in subs],
                                     lambda c, tid: c.wait(tid, until="finished"))
                total_secs = time.perf_counter() - started
                report = LoadReport(
                    tasks=tasks, clients=clients, submit_secs=submit_secs, settle_secs=settle_secs,
                    decide_secs=decide_secs, total_secs=total_secs, decide_latencies=latencies,
                    statuses_settled=statuses_settled, statuses_final={t.id: t.status for t in final},
                    agents=agents, pending_before=len(pending), pending_after=len(api.pending()),
                )
                writers = {tid for tid, a in agents.items() if a == "writer"}
                report.run_problems = check_runs(api, run_ids, writers)
                verified = api.verify()
                report.verify_ok, report.verify_entries = verified.ok, verified.entries
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
        return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    report = run_load(args.tasks, args.clients)
    print("\n".join(report.lines()))
    wrong = [tid for tid, status in report.statuses_final.items() if status != "completed"]
    if wrong or report.run_problems or not (report.verify_ok and report.offline_verify_ok):
        print(f"PROBLEMS: {len(wrong)} tasks not completed; " + "; ".join(report.run_problems[:5]))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
