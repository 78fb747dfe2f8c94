"""The CLI and the auditor on a served home work as on an owned one.

A home is owned by one process: the CLI itself, or a real `apollia-os serve` subprocess whose clients
the commands then are. Each command runs as a user runs it (a subprocess) on both kinds of home, and
must print the same thing (ids, times, hashes and counts normalised) with the same exit status. One
server is started for the module.

A server that has stopped and left its ``server.json`` behind is ``SERVER_NOT_RUNNING`` saying to
start the server (or remove the stale file), from the CLI, a client ``Runtime`` and the SDK.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from apollia_nb.errors import ServerNotRunning
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime

APOLLIA = [sys.executable, "-m", "apollia_nb"]

HOLDER = textwrap.dedent("""
    import sys
    from apollia_nb.home import Home, OwnerLock
    lock = OwnerLock(Home.at(sys.argv[1])).acquire()
    print("holding", flush=True)
    sys.stdin.read()
""")


def cli(home: Path, *args: str, cwd: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, input=stdin,
                          env=env, cwd=cwd, timeout=180)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


@contextlib.contextmanager
def holding(home: Path) -> Iterator[int]:
    """Another live process owns ``home`` (its owner lock) and serves nothing; yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def advertise(home: Path, pid: int, port: int) -> None:
    (home / "server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "token": "t" * 43,
                                                  "pid": pid}))


def made(tmp: Path) -> Path:
    home = tmp / "home"
    out = cli(home, "agents", "list")
    assert out.returncode == 0, out.stderr
    return home


def assert_not_running(out: subprocess.CompletedProcess[str], why: str) -> None:
    assert out.returncode == 3, out.stdout + out.stderr
    line = out.stderr.strip()
    assert "\n" not in line and line.startswith("error: SERVER_NOT_RUNNING: the server is not running"), line
    assert why in line and "start `apollia-os serve`" in line.lower() and "remove the stale server.json" in line
    assert "INTEGRITY_FAILURE" not in line and "Traceback" not in out.stderr


# --- a server that is not running ---------------------------------------------------------------------


@pytest.mark.parametrize("command", [["runs", "list"], ["agents", "list"], ["audit", "verify"], ["rules", "list"],
                                     ["pending", "list"], ["audit", "checkpoint"]])
def test_a_stale_server_json_while_another_process_holds_the_home_says_the_server_is_not_running(
        tmp_path, command):
    home = made(tmp_path)
    with holding(home) as pid:
        advertise(home, pid, closed_port())  # the holder advertises itself, and nothing listens there
        assert_not_running(cli(home, *command), "refuses connections")
        advertise(home, dead_pid(), closed_port())  # a server that stopped; another process holds the home
        out = cli(home, *command)
        assert_not_running(out, "has stopped")
        assert f"owned by process {pid}" in out.stderr


def test_a_stale_server_json_on_a_home_nobody_holds_lets_the_command_own_it(tmp_path):
    home = made(tmp_path)
    advertise(home, dead_pid(), closed_port())
    for command in (["runs", "list"], ["audit", "verify"], ["agents", "list"]):
        out = cli(home, *command)
        assert out.returncode == 0, out.stderr


def test_a_client_runtime_finding_a_stopped_server_is_server_not_running(tmp_path):
    home = made(tmp_path)

    async def open_it() -> None:
        async with Runtime(home):
            pass

    with holding(home) as pid:
        advertise(home, pid, closed_port())
        with pytest.raises(ServerNotRunning, match="the server is not running.*refuses connections"):
            anyio.run(open_it)
        advertise(home, dead_pid(), closed_port())
        with pytest.raises(ServerNotRunning, match="has stopped.*remove the stale server.json"):
            anyio.run(open_it)


def test_the_sdk_from_a_stale_server_json_is_server_not_running(tmp_path):
    from apollia_nb.sdk import AsyncClient, Client, errors

    home = made(tmp_path)
    advertise(home, dead_pid(), closed_port())
    with pytest.raises(errors.ServerNotRunning, match="has stopped.*Start `apollia-os serve`"):
        Client.from_home(home)
    with pytest.raises(errors.ServerNotRunning, match="has stopped"):
        AsyncClient.from_home(home)
    advertise(home, os.getpid(), closed_port())  # alive, and nothing listens at its address
    with pytest.raises(errors.ServerNotRunning, match="refuses connections"):
        Client.from_home(home)
    assert issubclass(errors.ServerNotRunning, errors.HomeLocked)


def start_server(home: Path, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    assert proc.stdout.readline(), proc.stderr.read()
    return proc


def stop_server(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()


def test_a_client_runtime_whose_server_stops_is_told_the_server_is_not_running(tmp_path):
    home = made(tmp_path)
    server = start_server(home, tmp_path)

    async def main() -> None:
        async with Runtime(home) as rt:
            assert rt.mode == "client"
            rt.journal.append("note", {"text": "before"})
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
            with pytest.raises(ServerNotRunning, match="nothing was sent.*the server is not running"):
                rt.journal.append("note", {"text": "after"})
            view = rt.governance.view()
            assert not view.readable  # governance fails closed, as before

    try:
        anyio.run(main)
    finally:
        stop_server(server)
    assert Home.at(home).server_json.exists()  # left behind by the killed server: the stale file
