"""`apollia-os serve` as a user runs it: a real subprocess, server.json, signals, the home's lock."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from apollia_nb.sdk import Client, errors
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]}])


def start(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start `serve` and read its one line (printed once it listens).

    It runs in a folder beside the home: agents' workspaces (root ".") are there, never around the home.
    """
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, cwd=work)
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, line


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=60)
    finally:
        proc.stdout.close()
        proc.stderr.close()


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def home_dir(tmp_path) -> Path:
    return tmp_path / "home"


def test_serve_advertises_itself_in_server_json_and_sigterm_shuts_down_cleanly(home_dir, monkeypatch):
    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    proc, line = start(home_dir)
    try:
        path = home_dir / "server.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        info = json.loads(path.read_text())
        assert set(info) == {"url", "token", "pid"} and info["pid"] == proc.pid
        assert info["url"].startswith("http://127.0.0.1:") and not info["url"].endswith(":0")
        assert info["url"] in line and info["token"] not in line  # the token is not printed
        assert len(info["token"]) >= 40  # generated: secrets.token_urlsafe(32)

        with Client.from_home(home_dir) as api:
            assert api.health().status == "ok"
            api.register_agent(WRITER)
            sub = api.submit("clerk", "Write out.txt")
            assert api.wait(sub.id).status == "waiting"
            [pending] = api.pending()
            assert pending.task_id == sub.id
        with pytest.raises(errors.Unauthorized):
            Client(info["url"], "wrong").agents()
    finally:
        code = stop(proc)
    assert code == 0
    assert not (home_dir / "server.json").exists()
    verified = cli("audit", "verify", home=home_dir)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("ok:")
    listed = cli("pending", "list", "--json", home=home_dir)  # the suspended run was kept
    assert [p["task_id"] for p in json.loads(listed.stdout)] == [sub.id]


def test_a_second_owner_is_refused_with_home_locked_naming_the_first(home_dir):
    proc, _ = start(home_dir)
    try:
        second = subprocess.run([*APOLLIA, "serve", "--home", str(home_dir), "--port", "0"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 3
        assert "HOME_LOCKED" in second.stderr and f"process {proc.pid}" in second.stderr
        assert json.loads((home_dir / "server.json").read_text())["pid"] == proc.pid  # untouched
    finally:
        assert stop(proc, signal.SIGINT) == 0
    assert not (home_dir / "server.json").exists()


def test_the_token_comes_from_the_flag_else_the_environment_and_is_printed_only_on_request(home_dir):
    proc, line = start(home_dir, "--print-token", env={"APOLLIA_TOKEN": "from-env"})
    try:
        assert "token from-env" in line
        assert json.loads((home_dir / "server.json").read_text())["token"] == "from-env"
    finally:
        assert stop(proc) == 0
    proc, line = start(home_dir, "--token", "from-flag", "--json", env={"APOLLIA_TOKEN": "from-env"})
    try:
        printed = json.loads(line)
        assert set(printed) == {"url", "pid"}
        with Client(printed["url"], "from-flag") as api:
            assert api.agents() == []
    finally:
        assert stop(proc) == 0


def test_binding_beyond_loopback_needs_allow_remote(home_dir):
    refused = subprocess.run([*APOLLIA, "serve", "--home", str(home_dir), "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3 and "BAD_INPUT" in refused.stderr and "--allow-remote" in refused.stderr
    assert not (home_dir / "server.json").exists()
    proc, line = start(home_dir, "--host", "0.0.0.0", "--allow-remote")
    try:
        url = json.loads((home_dir / "server.json").read_text())["url"]
        assert url.startswith("http://127.0.0.1:")  # what a client on this machine dials
        with Client.from_home(home_dir) as api:
            assert api.health().status == "ok"
    finally:
        assert stop(proc) == 0


def test_create_app_over_a_home_opens_the_runtime_in_its_lifespan_and_closes_it(tmp_path):
    import asyncio
    import threading

    import httpx

    from apollia_nb.api.app import create_app
    from apollia_nb.api.server import _uvicorn_server
    from apollia_nb.home import Home, OwnerLock

    home = Home.at(tmp_path / "lifespan-home")
    app = create_app(home=home.path, token="t")
    listening = threading.Event()
    ports: list[int] = []

    def on_listening(port: int) -> None:
        ports.append(port)
        listening.set()

    server = _uvicorn_server(app, host="127.0.0.1", port=0, log_level="warning", on_listening=on_listening,
                             install_signal_handlers=False)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()))
    thread.start()
    try:
        assert listening.wait(60)
        with pytest.raises(errors.HomeLocked):
            OwnerLock(home).acquire()  # the app's runtime owns the home while it serves
        r = httpx.get(f"http://127.0.0.1:{ports[0]}/api/v1/agents", headers={"Authorization": "Bearer t"})
        assert r.status_code == 200 and r.json() == []
    finally:
        server.should_exit = True
        thread.join(60)
    assert not thread.is_alive() and app.state.runtime is None
    OwnerLock(home).acquire().release()  # closed on shutdown: the home is free again
