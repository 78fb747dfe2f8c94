"""The README's "Using it", "From Python" and "From your product" run as written, on a fresh home,
in a fresh user's HOME, through the activated `.venv` — the way a newcomer pastes them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
# The two ids a reader copies from the output above them, as a script takes them.
PENDING_ID = "pd-1a2b3c"
RUN_ID = "run-4d5e6f"
FIRST = "python -c 'import json, sys; print(json.load(sys.stdin)[0][\"{key}\"])'"


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


@pytest.fixture
def user(tmp_path):
    """A user's environment: a fresh HOME, no APOLLIA_HOME, this checkout on PYTHONPATH."""
    if not (REPO / ".venv" / "bin" / "activate").exists():
        pytest.fail("the README's snippets need .venv (bash dev/test.sh creates it)")
    home = tmp_path / "user"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APOLLIA_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    return home, env


def bash(script: str, env: dict[str, str], *, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True, timeout=300)


def using_it(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    [script] = fenced(section("Using it"), "bash")
    assert script.count(PENDING_ID) == 1 and script.count(RUN_ID) == 1
    script = script.replace(PENDING_ID, f'"$(apollia-os pending list --json | {FIRST.format(key="id")})"')
    script = script.replace(RUN_ID, f'"$(apollia-os runs list --json | {FIRST.format(key="run_id")})"')
    return bash(script, env, cwd=REPO, stdin="once\n")


def test_using_it_and_from_python_run_as_written(user):
    home, env = user
    out = using_it(env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "registered clerk: active" in out.stdout
    assert "clerk wants to call write_file (write)" in out.stdout  # the attended run asked, once answered
    assert re.search(r"task task-\w+ \(clerk\): completed, steps \d+/\d+, run run-\w+", out.stdout)
    assert re.search(r"task task-\w+ \(clerk\): waiting", out.stdout)  # the unattended one stopped
    assert "pd-" in out.stdout and ": once by " in out.stdout  # pending decide answered it
    assert re.search(r"^run-\w+ +clerk +task +completed .* \d+ entries$", out.stdout, flags=re.M)  # runs list
    assert "entries verified" in out.stdout and "identical: run run-" in out.stdout
    assert re.search(r"│ write_file │ … │ ask +│ +6 │ once", out.stdout)  # the SQL one-liner's table
    desk = home / "clerk-desk"
    assert (desk / "summary.txt").read_text() == "Milk; call Ann."
    assert (home / ".apollia" / "journal.db").exists()

    [program] = [b for b in fenced(section("Using it"), "python") if "Runtime" in b]
    (desk / "summarise.py").write_text(program)
    ran = bash(f". {REPO}/.venv/bin/activate\ncd ~/clerk-desk\npython summarise.py", env, cwd=REPO)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip() == "completed"


def test_from_your_product_runs_as_written_against_a_real_server(user):
    home, env = user
    assert using_it(env).returncode == 0
    text = section("From your product")
    [serve] = fenced(text, "bash")
    [program] = fenced(text, "python")
    assert "--port 8765" in serve
    script = serve.replace("--port 8765", "--port 0")  # any free port here
    env = {**env, "APOLLIA_HOME": str(home / ".apollia")}
    server = subprocess.Popen(["bash", "-e", "-c", f". {REPO}/.venv/bin/activate\n{script}"], cwd=home, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (home / ".apollia" / "server.json").exists():
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read() if server.stdout else ""
            time.sleep(0.1)
        (home / "product.py").write_text(program)
        ran = bash(f". {REPO}/.venv/bin/activate\npython product.py", env, cwd=home)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout.strip() == "completed"
    finally:
        os.killpg(server.pid, signal.SIGINT)  # its own session: the bash and the server it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    runs = json.loads(bash(f". {REPO}/.venv/bin/activate\napollia-os runs list --json", env, cwd=home).stdout)
    assert [r["status"] for r in runs][-1] == "completed"
