"""What a hook costs another agent's tool call: the command form and the HTTP form.

    .venv/bin/python benchmarks/hook.py [--calls 20] [--http-calls 400] [--concurrency 8]
        [--clients processes|threads] [--rounds 1]

Three measurements, each of an allowed call (Claude Code's ``PreToolUse`` for ``Read`` of a
file in the project: decided, journaled durably, answered ``allow``) and of a refused one
(``Bash`` ``rm -rf build`` under a deny rule):

* **command, owned home** — ``apollia-os hook claude-code`` as a process, from its start to its
  answer, on a home nobody serves (the process opens the home for the one call);
* **command, served home** — the same process on a home ``apollia-os serve`` owns (it forwards
  the input to the server);
* **HTTP** — ``POST /api/v1/hooks/claude-code`` on the served home, request to answer, from
  ``--concurrency`` clients at once (Claude Code's HTTP hooks), each a process of its own with one
  kept connection (as each tool session sends its own hooks); ``--clients threads`` sends them from
  threads of this one process instead, where they also wait for each other's turn at the GIL (a
  thread that wants it waits up to ``sys.getswitchinterval()``, 5 ms, for each hand-over) — that wait
  is the benchmark's, not the server's.

Prints p50/p99 per form (and for the HTTP form the server's CPU a hook, and the clients'), each
quoted against the tools' own limits: a command hook's default
timeout in Claude Code and Codex (600 s) and the 120 s ``hook install`` writes. The target
for the HTTP form is p99 <= 20 ms with 8 concurrent hooks on a served home.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


APOLLIA = [sys.executable, "-m", "apollia_nb"]
TOOL_TIMEOUT_SECS = 600.0
INSTALLED_TIMEOUT_SECS = 120.0


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}


def _input(project: Path, i: int, refused: bool) -> dict[str, object]:
    tool, tool_input = (("Bash", {"command": "rm -rf build"}) if refused
                        else ("Read", {"file_path": str(project / "notes.txt")}))
    return {"session_id": "bench", "transcript_path": None, "cwd": str(project), "permission_mode": "default",
            "hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": tool_input, "tool_use_id": f"toolu_{i}"}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _report(name: str, ms: list[float]) -> None:
    p50, p99 = statistics.median(ms), _pct(ms, 0.99)
    print(f"{name:<34} n={len(ms):<4} p50 {p50:8.1f} ms  p99 {p99:8.1f} ms  "
          f"(p99 = {p99 / 10 / TOOL_TIMEOUT_SECS:.4f} % of 600 s, {p99 / 10 / INSTALLED_TIMEOUT_SECS:.3f} % of 120 s)")


def command_form(home: Path, project: Path, calls: int, expect: str, refused: bool) -> list[float]:
    out = []
    for i in range(calls):
        started = time.perf_counter()
        done = subprocess.run([*APOLLIA, "hook", "claude-code", "--home", str(home)],
                              input=json.dumps(_input(project, i, refused)), capture_output=True, text=True,
                              env=_env(), timeout=300)
        out.append((time.perf_counter() - started) * 1000)
        got = json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"]
        assert got == expect, (done.stdout, done.stderr)
    return out


def _hooks(url: str, token: str, project: Path, first: int, calls: int, refused: bool) -> list[float]:
    """``calls`` hooks one after another on one kept connection (the standard library's ``http.client``: a
    client that costs little CPU, so the figures are the server's more than this benchmark's); ms from
    request to answer of each."""
    import http.client
    from urllib.parse import urlsplit

    expect = "deny" if refused else "allow"
    parts = urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    out = []
    try:
        for i in range(first, first + calls):
            body = json.dumps(_input(project, i, refused))
            started = time.perf_counter()
            conn.request("POST", "/api/v1/hooks/claude-code", body=body, headers=headers)
            r = conn.getresponse()
            answer = r.read()
            out.append((time.perf_counter() - started) * 1000)
            got = json.loads(answer)["hookSpecificOutput"]["permissionDecision"] if r.status == 200 else None
            assert got == expect, answer
    finally:
        conn.close()
    return out


def _in_process(args: tuple[Any, ...]) -> tuple[list[float], float]:
    """``_hooks`` in a client process: its figures and the process's CPU seconds for them."""
    started = time.process_time()
    ms = _hooks(*args)
    return ms, time.process_time() - started


def http_form(url: str, token: str, project: Path, calls: int, concurrency: int, refused: bool,
              clients: str = "processes", cpu: list[float] | None = None) -> list[float]:
    """``calls`` hooks from ``concurrency`` clients at once (processes or threads); ms of each. ``cpu``: the
    clients' CPU seconds are appended to it."""
    share = [calls // concurrency + (1 if k < calls % concurrency else 0) for k in range(concurrency)]
    jobs = [(url, token, project, 100_000 + sum(share[:k]), share[k], refused) for k in range(concurrency)]
    if clients == "processes":
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(concurrency) as pool:
            done = pool.map(_in_process, jobs, chunksize=1)
    else:
        from concurrent.futures import ThreadPoolExecutor

        c0 = time.process_time()
        with ThreadPoolExecutor(concurrency) as pool:
            done = [(ms, 0.0) for ms in pool.map(lambda job: _hooks(*job), jobs)]
        done[0] = (done[0][0], time.process_time() - c0)
    if cpu is not None:
        cpu.append(sum(c for _, c in done))
    return [m for ms, _ in done for m in ms]


def _cpu_secs(pid: int) -> float:
    """The process's CPU seconds (user and system, every thread), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20, help="command-form calls per measurement")
    ap.add_argument("--http-calls", type=int, default=400, help="HTTP-form requests per measurement")
    ap.add_argument("--concurrency", type=int, default=8, help="concurrent HTTP hooks")
    ap.add_argument("--clients", choices=("processes", "threads"), default="processes",
                    help="where the concurrent HTTP hooks come from (default: a process each)")
    ap.add_argument("--rounds", type=int, default=1, help="HTTP-form measurements of each kind, alternating")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home, project = root / "home", root / "shop"
        project.mkdir()
        subprocess.run([*APOLLIA, "hook", "install", "claude-code", "--project", str(project), "--home", str(home)],
                       check=True, capture_output=True, env=_env())
        subprocess.run([*APOLLIA, "rules", "add", "bash_executor", "--effect", "deny", "--prefix", "rm",
                        "--home", str(home)], check=True, capture_output=True, env=_env())
        command_form(home, project, 1, "allow", False)  # registers the agent
        if args.calls:
            _report("command, owned home, allowed", command_form(home, project, args.calls, "allow", False))
            _report("command, owned home, refused", command_form(home, project, args.calls, "deny", True))

        server = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_env())
        try:
            assert server.stdout is not None and server.stdout.readline()
            info = json.loads((home / "server.json").read_text())
            url, token = info["url"].rstrip("/"), info["token"]
            if args.calls:
                _report("command, served home, allowed", command_form(home, project, args.calls, "allow", False))
            http_form(url, token, project, 50, args.concurrency, False, args.clients)  # warm
            for _ in range(args.rounds):
                for refused in (False, True):
                    cpu = _cpu_secs(server.pid)
                    clients_cpu: list[float] = []
                    load = os.getloadavg()[0]
                    ms = http_form(url, token, project, args.http_calls, args.concurrency, refused, args.clients,
                                   clients_cpu)
                    _report(f"HTTP x{args.concurrency} {args.clients}, served, {'refused' if refused else 'allowed'}",
                            ms)
                    print(f"{'':<34} server CPU {(_cpu_secs(server.pid) - cpu) * 1000 / args.http_calls:.2f} ms a "
                          f"call, clients {clients_cpu[0] * 1000 / args.http_calls:.2f} ms (load average "
                          f"{load:.1f}-{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
