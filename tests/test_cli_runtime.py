"""`apollia-os run | agents | pending | demo`, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apollia_nb.cli import main
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def run_cli(*args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    return subprocess.run([*APOLLIA, *args], capture_output=True, text=True, input=stdin, env=env, timeout=120)


@pytest.fixture
def clerk_file(tmp_path):
    path = tmp_path / "clerk.toml"
    path.write_text(manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]},
                                    {"text": "Wrote it."}] * 3))
    return path


def test_register_list_and_stop_an_agent(home, clerk_file, capsys):
    assert main(["agents", "register", str(clerk_file), "--home", str(home.path)]) == 0
    assert "registered clerk: active" in capsys.readouterr().out
    assert main(["agents", "list", "--json", "--home", str(home.path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(a["name"], a["state"]) for a in listed] == [("clerk", "active")]
    assert main(["agents", "stop", "clerk", "--home", str(home.path)]) == 0
    assert "clerk: stopped" in capsys.readouterr().out


def test_a_broken_manifest_names_the_key_and_line_and_registers_nothing(home, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "clerk"\n[tools]\nrequird = ["x"]\n')
    assert main(["agents", "register", str(bad), "--home", str(home.path)]) == 3
    err = capsys.readouterr().err
    assert "MANIFEST_INVALID" in err and ":3" in err and "requird" in err
    assert not home.runtime_db.exists()


def test_unattended_run_stops_at_the_first_question_and_pending_decide_resumes_it(home, clerk_file):
    assert run_cli("agents", "register", str(clerk_file), home=home.path).returncode == 0
    out = run_cli("run", "clerk", "Write out.txt", "--unattended", "--json", home=home.path)
    assert out.returncode == 0, out.stderr
    task = json.loads(out.stdout)
    assert task["status"] == "waiting"
    pending = json.loads(run_cli("pending", "list", "--json", home=home.path).stdout)
    assert [p["tool"] for p in pending] == ["write_file"]
    bad = run_cli("pending", "decide", pending[0]["id"], "perhaps", home=home.path)
    assert bad.returncode == 3 and "BAD_ANSWER" in bad.stderr
    unknown = run_cli("pending", "decide", "pd-nope", "once", home=home.path)
    assert unknown.returncode == 3 and "UNKNOWN_DECISION" in unknown.stderr
    done = run_cli("pending", "decide", pending[0]["id"], "once", "--json", home=home.path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["decision"]["answer"] == "once"
    assert result["task"]["status"] == "completed" and result["task"]["id"] == task["id"]
    assert json.loads(run_cli("pending", "list", "--json", home=home.path).stdout) == []


def test_an_attended_run_asks_at_the_terminal(home, clerk_file):
    assert run_cli("agents", "register", str(clerk_file), home=home.path).returncode == 0
    out = run_cli("run", "clerk", "Write out.txt", home=home.path, stdin="maybe\nonce\n")
    assert out.returncode == 0, out.stderr
    assert "wants to call write_file (write)" in out.stdout
    assert "please answer one of: once, always, refuse" in out.stdout
    assert "completed" in out.stdout


def test_an_attended_run_at_the_end_of_input_leaves_the_decision_pending(home, clerk_file):
    assert run_cli("agents", "register", str(clerk_file), home=home.path).returncode == 0
    out = run_cli("run", "clerk", "Write out.txt", home=home.path, stdin="")
    assert out.returncode == 1, out.stderr
    assert "end of input: no answer given" in out.stderr and "the decision stays pending" in out.stderr
    assert "Traceback" not in out.stderr
    [pending] = json.loads(run_cli("pending", "list", "--json", home=home.path).stdout)
    assert pending["tool"] == "write_file" and f"apollia-os pending decide {pending['id']} " in out.stderr
    decided = run_cli("pending", "decide", pending["id"], "once", home=home.path)
    assert decided.returncode == 0 and "completed" in decided.stdout, decided.stdout + decided.stderr


def test_run_for_an_unknown_agent_is_a_clear_error(home):
    out = run_cli("run", "ghost", "boo", home=home.path)
    assert out.returncode == 3 and "UNKNOWN_AGENT" in out.stderr


def test_demo_tells_the_story_and_ends_verified_and_identical(tmp_path):
    out = subprocess.run([*APOLLIA, "demo", "--home", str(tmp_path / "fresh")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Governance asked before write_file" in out.stdout
    assert "The task is completed" in out.stdout
    assert "Journal verified: True" in out.stdout
    assert ": identical" in out.stdout


def test_demo_refuses_a_home_that_is_not_fresh(home, capsys):
    (home.path / "something").write_text("x")
    assert main(["demo", "--home", str(home.path)]) == 3
    assert "fresh home" in capsys.readouterr().err


def test_audit_replay_exits_0_identical_2_incomplete_3_unknown(home, clerk_file):
    assert run_cli("agents", "register", str(clerk_file), home=home.path).returncode == 0
    waiting = json.loads(run_cli("run", "clerk", "Write", "--unattended", "--json", home=home.path).stdout)
    out = run_cli("audit", "replay", waiting["run_id"], home=home.path)
    assert out.returncode == 2 and out.stdout.startswith("incomplete")  # suspended: no seal yet
    pending = json.loads(run_cli("pending", "list", "--json", home=home.path).stdout)
    run_cli("pending", "decide", pending[0]["id"], "once", home=home.path)
    out = run_cli("audit", "replay", waiting["run_id"], "--json", home=home.path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["verdict"] == "identical"
    unknown = run_cli("audit", "replay", "run-nope", home=home.path)
    assert unknown.returncode == 3 and "UNKNOWN_RUN" in unknown.stderr


def test_with_a_server_running_agent_commands_and_pending_go_through_the_server(home, clerk_file):
    from apollia_nb.api.server import ServerThread
    from apollia_nb.sdk import Client

    with ServerThread(home.path, port=0) as server:
        client = Client(server.url, server.token)
        client.register_agent(clerk_file.read_text())
        task = client.submit("clerk", "Write out.txt", watched=False)
        client.wait(task.id, until="settled", timeout=30)
        listed = run_cli("agents", "list", "--json", home=home.path)
        assert listed.returncode == 0, listed.stderr
        assert [a["name"] for a in json.loads(listed.stdout)] == ["clerk"]
        pending = json.loads(run_cli("pending", "list", "--json", home=home.path).stdout)
        assert [p["tool"] for p in pending] == ["write_file"]
        done = run_cli("pending", "decide", pending[0]["id"], "once", home=home.path)
        assert done.returncode == 0, done.stderr
        assert f"task {task.id} (clerk): completed" in done.stdout  # the server's task, settled
        assert client.wait(task.id, until="finished", timeout=30).status == "completed"
