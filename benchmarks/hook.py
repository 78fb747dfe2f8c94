"""What a hook costs another agent's tool call: the command form and the HTTP form.

    .venv/bin/python benchmarks/hook.py [--calls 20] [--http-calls 400] [--concurrency 8]

Three measurements, each of an allowed call (Claude Code's ``PreToolUse`` for ``Read`` of a
file in the project: decided, journaled durably, answered ``allow``) and of a refused one
(``Bash`` ``rm -rf build`` under a deny rule):

* **command, owned home** — ``apollia-os hook claude-code`` as a process, from its start to its
  answer, on a home nobody serves (the process opens the home for the one call);
* **command, served home** — the same process on a home ``apollia-os serve`` owns (it forwards
  the input to the server);
* **HTTP** — ``POST /api/v1/hooks/claude-code`` on the served home, request to answer, from
  ``--concurrency`` threads at once (Claude Code's HTTP hooks).

Prints p50/p99 per form, each quoted against the tools' own limits: a command hook's default
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

import httpx

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


def http_form(url: str, token: str, project: Path, calls: int, concurrency: int, refused: bool) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()
    counter = iter(range(calls))
    expect = "deny" if refused else "allow"

    def worker() -> None:
        with httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                started = time.perf_counter()
                r = c.post("/hooks/claude-code", json=_input(project, 100_000 + i, refused))
                took = (time.perf_counter() - started) * 1000
                assert r.status_code == 200 and r.json()["hookSpecificOutput"]["permissionDecision"] == expect, r.text
                with lock:
                    times.append(took)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def _cpu_secs(pid: int) -> float:
    """The process's CPU seconds (user and system, every thread), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20, help="command-form calls per measurement")
    ap.add_argument("--http-calls", type=int, default=400, help="HTTP-form requests per measurement")
    ap.add_argument("--concurrency", type=int, default=8, help="concurrent HTTP hooks")
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
        _report("command, owned home, allowed", command_form(home, project, args.calls, "allow", False))
        _report("command, owned home, refused", command_form(home, project, args.calls, "deny", True))

        server = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_env())
        try:
            assert server.stdout is not None and server.stdout.readline()
            info = json.loads((home / "server.json").read_text())
            url, token = info["url"].rstrip("/"), info["token"]
            _report("command, served home, allowed", command_form(home, project, args.calls, "allow", False))
            http_form(url, token, project, 50, args.concurrency, False)  # warm
            for refused in (False, True):
                cpu = _cpu_secs(server.pid)
                ms = http_form(url, token, project, args.http_calls, args.concurrency, refused)
                _report(f"HTTP x{args.concurrency}, served, {'refused' if refused else 'allowed'}", ms)
                print(f"{'':<34} server CPU {(_cpu_secs(server.pid) - cpu) * 1000 / args.http_calls:.2f} ms a call "
                      f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
