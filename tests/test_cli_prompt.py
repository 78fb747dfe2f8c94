"""Ctrl+C at the attended prompt of `apollia-os run`: it stops at once, cleanly, and the decision stays
pending (answerable later with `apollia-os pending decide`). Through a real terminal (a pty) and SIGINT."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def cli(*args: str, home) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    return subprocess.run([*APOLLIA, *args], capture_output=True, text=True, env=env, timeout=120)


def read_until(fd: int, text: str, timeout: float = 60) -> str:
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        assert time.monotonic() < deadline, seen.decode(errors="replace")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


def drain(fd: int) -> str:
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            return out.decode(errors="replace")
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return out.decode(errors="replace")
        if not chunk:
            return out.decode(errors="replace")
        out += chunk


def test_ctrl_c_at_the_prompt_stops_at_once_and_leaves_the_decision_pending(home, tmp_path):
    (tmp_path / "clerk.toml").write_text(manifest(actor=[
        {"tool_calls": [call("write_file", path="out.txt", content="hi")]}, {"text": "Wrote it."}]))
    assert cli("agents", "register", str(tmp_path / "clerk.toml"), home=home.path).returncode == 0
    controller, terminal = pty.openpty()
    env = {**os.environ, "APOLLIA_HOME": str(home.path)}
    # As from a shell: SIGINT at its default (a pytest-xdist worker ignores it, and an ignored signal is inherited).
    proc = subprocess.Popen([*APOLLIA, "run", "clerk", "Write out.txt"], stdin=terminal, stdout=terminal,
                            stderr=terminal, env=env, close_fds=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(terminal)
    try:
        shown = read_until(controller, "answer: ")
        assert "wants to call write_file (write)" in shown
        proc.send_signal(signal.SIGINT)  # once: what Ctrl+C at the prompt sends
        assert proc.wait(timeout=30) == 130
        said = drain(controller)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    assert "Traceback" not in said and "KeyboardInterrupt" not in said
    assert "interrupted: no answer given" in said and "the decision stays pending" in said
    [pending] = json.loads(cli("pending", "list", "--json", home=home.path).stdout)
    assert pending["tool"] == "write_file"
    assert f"apollia-os pending decide {pending['id']} once|always|refuse" in said
    decided = cli("pending", "decide", pending["id"], "once", home=home.path)
    assert decided.returncode == 0 and "completed" in decided.stdout, decided.stdout + decided.stderr
    runs = json.loads(cli("runs", "list", "--json", home=home.path).stdout)
    assert [r["status"] for r in runs] == ["completed"]
