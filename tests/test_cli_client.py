"""Every CLI command while `apollia-os serve` owns the home: the same output as on a home without a server.

One script of commands runs twice, as a user runs them (the CLI as a subprocess):
on a home nobody serves, and on a home a real `apollia-os serve` subprocess owns
(started in another folder than the one the commands run in). Ids, times,
hashes and paths are normalised; everything else printed, and every exit
status, must be the same. The journal commands also print counts that differ
(the server journals its own start), so their numbers are normalised too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from apollia_nb.governance.approvals import local_person
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
LISTER = manifest("lister", planner=[{"steps": ["look", "report"]}] * 2, actor=[{"text": "Reported."}] * 4)
CLERK = manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]}, {"text": "Wrote it."}] * 3)


class User:
    """Runs `apollia-os` commands in ``work`` on ``home``; records what each printed."""

    def __init__(self, home: Path, work: Path) -> None:
        self.home, self.work = home, work
        self.seen: list[tuple[str, int, str, str]] = []

    def __call__(self, *args: str, stdin: str = "", numbers: bool = False) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "APOLLIA_HOME": str(self.home)}
        env.pop("APOLLIA_TOKEN", None)
        out = subprocess.run([*APOLLIA, *args], capture_output=True, text=True, input=stdin, env=env,
                             cwd=self.work, timeout=120)
        self.seen.append((" ".join(args[:2]), out.returncode, self.norm(out.stdout, numbers),
                          self.norm(out.stderr, numbers)))
        return out

    def json(self, *args: str, **kw) -> object:
        out = self(*args, "--json", **kw)
        assert out.returncode in (0, 1), out.stderr
        return json.loads(out.stdout)

    def norm(self, text: str, numbers: bool) -> str:
        text = text.replace(str(self.work), "<WORK>").replace(str(self.home), "<HOME>")
        text = text.replace(str(self.home.parent), "<DIR>")
        text = re.sub(r"\b(task|run|pd|r|s)-[0-9a-f]{6,}\b", r"\1-<ID>", text)
        text = re.sub(r"\d{4}-\d\d-\d\d[T ][\d:.]+(Z|\+00:00)?", "<TIME>", text)
        text = re.sub(r"[0-9a-f]{64}", "<HASH>", text)
        text = re.sub(r"(apollia-nb/)[0-9a-f]+", r"\1<KEY>", text)
        text = re.sub(r"(apollia-nb/<KEY>)\+[0-9a-f]{8}\+[A-Za-z0-9+/]{44}", r"\1+<VKEY>", text)
        text = re.sub(r'"key_id": "[0-9a-f]{8}"', '"key_id": "<ID>"', text)
        # The home's owner is one person with two names: the local user where the CLI owns the home,
        # `owner` where it speaks to the server with the owner token (who started a run, say).
        text = re.sub(r'"started_by": "(owner|%s)"' % re.escape(local_person()), '"started_by": "<OWNER>"', text)
        text = re.sub(r'("\w+_base64": )"[A-Za-z0-9+/=]*"', r'\1"<B64>"', text)
        text = re.sub(r'"(note|checkpoint)": "[^"]*"', r'"\1": "<NOTE>"', text)
        text = re.sub(r"^extra [A-Za-z0-9+/=]+$", "extra <B64>", text, flags=re.M)
        text = re.sub(r"^— .*$|^[A-Za-z0-9+/]{40,}={0,2}$", "<SIG>", text, flags=re.M)
        if numbers:
            text = re.sub(r"\d+", "<N>", text)
            # Proofs between trees of other sizes hold another number of hashes: one line stands for a run.
            text = re.sub(r"^([ \t]*)(?:[ \t]*(?:<HASH>|<SIG>|\"<HASH>\",?)\n)+", r"\1<HASHES>\n", text, flags=re.M)
        return text


def script(user: User, tmp: Path) -> None:
    """What a user does with the CLI on a home: every command that can work with a server."""
    (user.work / "clerk.toml").write_text(CLERK)
    (user.work / "lister.toml").write_text(LISTER)
    user("agents", "register", "clerk.toml")
    user("agents", "register", "lister.toml", "--json")
    user("agents", "list")
    user("agents", "list", "--json")
    user("run", "ghost", "boo")
    rule = user.json("rules", "add", "bash_executor", "--effect", "deny", "--prefix", "rm", "--by", "alice")
    user("rules", "list")
    user("rules", "list", "--json")
    user("rules", "remove", "r-nope")
    user("devmode")
    user("devmode", "on", "--by", "alice")
    user("devmode", "--json")
    user("devmode", "off")
    waiting = user.json("run", "clerk", "Write out.txt", "--unattended")
    pending = user.json("pending", "list")
    user("pending", "list")
    user("pending", "decide", pending[0]["id"], "perhaps")
    user("pending", "decide", "pd-nope", "once")
    user("pending", "decide", pending[0]["id"], "once", "--json")
    user("pending", "list")
    asked = user("run", "clerk", "Write out.txt", stdin="maybe\nonce\n")
    assert asked.returncode == 0 and "please answer one of: once, always, refuse" in asked.stdout
    assert "completed" in asked.stdout
    unanswered = user("run", "clerk", "Write out.txt", stdin="")  # end of input: no answer, not a refusal
    assert unanswered.returncode == 1 and "the decision stays pending" in unanswered.stderr
    approved = user("run", "lister", "Look and report", "--approve-plan", stdin="y\n")
    assert approved.returncode == 0 and "completed" in approved.stdout and "result: Reported." in approved.stdout
    rejected = user("run", "lister", "Look and report", "--approve-plan", stdin="n\n")
    assert rejected.returncode == 1 and "REJECTED" in rejected.stdout
    user("consents", "list")
    user("run", "clerk", "Write out.txt", "--json", stdin="always\n")
    user("consents", "list")
    user("consents", "revoke", "clerk", "write", "--by", "alice")
    user("consents", "list", "--json")
    user("rules", "remove", rule["id"], "--by", "alice")
    user("policy", "check")
    user("policy", "check", "--json")
    user("audit", "replay", waiting["run_id"])
    user("audit", "replay", "run-nope")
    user("audit", "verify", numbers=True)
    user("audit", "checkpoint", "--out", str(tmp / "cp.txt"), numbers=True)
    user("audit", "verify", "--checkpoint", str(tmp / "cp.txt"), numbers=True)
    user("audit", "prove", "2", numbers=True)
    user("audit", "prove", "99999", numbers=True)
    user("audit", "export", str(tmp / "bundle"), numbers=True)
    user("audit", "verify", "--bundle", str(tmp / "bundle"), numbers=True)
    # What an auditor keeps and carries: the key, kept checkpoints and bundles, proofs against them.
    vkey = user.json("audit", "verifier-key", numbers=True)["verifier_key"]
    user("audit", "verifier-key", numbers=True)
    user("audit", "verify", "--key", vkey, numbers=True)
    user("audit", "verify", "--key", vkey.replace(vkey.split("+")[0], "apollia-nb/0000000000000000"))
    user("audit", "verify", "--key", "not-a-key")
    user("run", "clerk", "Write out.txt", "--unattended", numbers=True)  # the journal grows past the kept tree
    user("audit", "consistency", "--from", str(tmp / "cp.txt"), numbers=True)
    user("audit", "consistency", "--from", str(tmp / "bundle"), "--from", str(tmp / "cp.txt"), "--json",
         numbers=True)
    user("audit", "prove", "2", "--against", str(tmp / "cp.txt"), numbers=True)
    user("audit", "prove", "2", "--format", "tlog-proof", numbers=True)
    proof = user.json("audit", "prove", "2", "--format", "json", numbers=True)
    user.seen.pop()  # entry 2 is another entry on a served home (the server journals its start)
    assert proof["stored"]["seq"] == 2 and proof["leaf_index"] == 1 and proof["hashed_base64"]
    user("agents", "stop", "clerk")
    assert (user.work / "out.txt").read_text() == "hi"  # the workspace is where the command ran


def serve(home: Path, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    assert proc.stdout.readline(), proc.stderr.read()
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()
    proc.stderr.close()


def user_on(tmp: Path, name: str) -> User:
    (tmp / name / "work").mkdir(parents=True)
    return User(tmp / name / "home", tmp / name / "work")


def test_every_command_prints_the_same_with_and_without_a_server(tmp_path):
    alone = user_on(tmp_path, "alone")
    script(alone, tmp_path / "alone")

    served = user_on(tmp_path, "served")
    elsewhere = tmp_path / "served" / "server-cwd"
    elsewhere.mkdir()
    server = serve(served.home, elsewhere)
    try:
        script(served, tmp_path / "served")
        assert (served.home / "server.json").exists()  # the server owned the home all along
        assert not (elsewhere / "out.txt").exists()
    finally:
        stop(server)

    assert [s[:2] for s in served.seen] == [s[:2] for s in alone.seen]
    for mine, theirs in zip(served.seen, alone.seen):
        assert mine == theirs
    # What was done through the server is in the home's one chain, and it verifies once the server is gone.
    after = subprocess.run([*APOLLIA, "audit", "verify", "--home", str(served.home)], capture_output=True,
                           text=True, timeout=120)
    assert after.returncode == 0 and after.stdout.startswith("ok:"), after.stdout + after.stderr


def test_commands_that_need_the_home_to_themselves_say_so_while_it_is_served(tmp_path):
    user = user_on(tmp_path, "h")
    user("agents", "list")  # creates the home
    server = serve(user.home, user.work)
    try:
        for args in (["home", "repair", "--new-runtime-db"], ["policy", "remove"]):
            out = user(*args)
            assert out.returncode == 3
            line = out.stderr.strip()
            assert "\n" not in line and line.startswith("error: HOME_LOCKED: ")
            assert "stop the server" in line and "run `apollia-os serve`" not in line
    finally:
        stop(server)


def test_a_relative_workspace_is_sent_to_the_server_absolute(tmp_path):
    from apollia_nb.cli.backend import absolute_workspace
    from apollia_nb.runtime.manifest import parse_manifest

    def sent(text: str) -> tuple[str, str | None]:
        out, warning = absolute_workspace(text, parse_manifest(text), tmp_path)
        return parse_manifest(out).workspace_root, warning

    assert sent(manifest()) == (str(tmp_path), None)
    assert sent(manifest(workspace="notes")) == (str(tmp_path / "notes"), None)
    assert sent(manifest(workspace="/srv/notes")) == ("/srv/notes", None)
    inline = manifest().replace('[model]', 'workspace = { root = "notes" }\n[model]')
    root, warning = sent(inline)
    assert root == "notes" and "relative" in warning and "server" in warning
