"""People of a served home: personal tokens, kept hashed, revoked and rotated at once, journaled without them.

A real ``apollia-os serve`` subprocess serves a home on 127.0.0.1 (port 0); people are added with the
CLI as users add them, and their tokens are used over real HTTP and by the CLI (``$APOLLIA_TOKEN``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
OWNER_TOKEN = "owner-token-" + "o" * 32


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return {**env, **extra}


def cli(home: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = _env(APOLLIA_TOKEN=token) if token else _env()
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, env=env,
                          cwd=home.parent, timeout=180)


@contextlib.contextmanager
def serving(home: Path) -> Iterator[tuple[str, list[str]]]:
    """``apollia-os serve`` on ``home``; yields its /api/v1 URL and, once it stopped, holds its stderr lines."""
    (home.parent / "work").mkdir(exist_ok=True)
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0", "--token", OWNER_TOKEN],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            cwd=home.parent / "work")
    err: list[str] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline(), proc.stderr.read() if proc.stderr else ""
        info = json.loads((home / "server.json").read_text())
        yield info["url"] + "/api/v1", err
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        err.extend(stderr.splitlines())


def person(home: Path, name: str, *roles: str) -> str:
    out = cli(home, "people", "add", name, *[a for r in roles for a in ("--role", r)])
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert len(token) >= 43 and "\n" not in token
    return token


def journal_of(home: Path) -> list:
    """Every entry of the home's journal, read once its server has stopped."""
    from apollia_nb.home import Home
    from apollia_nb.journal import Journal

    with Journal.open(Home.at(home)) as journal:
        return journal.entries()


def _files_holding(root: Path, secret: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and secret.encode() in path.read_bytes():
            found.append(str(path))
    return found


def test_people_are_added_listed_rotated_and_revoked_on_a_served_home_and_no_token_is_ever_kept(tmp_path):
    home = tmp_path / "home"
    with serving(home) as (url, stderr):
        alice = person(home, "alice", "auditor", "approver")
        bob = person(home, "bob", "runner")
        with httpx.Client(base_url=url, timeout=30) as http:
            def get(token: str, path: str) -> httpx.Response:
                return http.get(path, headers={"Authorization": f"Bearer {token}"})

            assert get(alice, "/audit/verify").status_code == 200
            assert get(alice, "/governance/rules").status_code == 200  # an auditor reads, and changes nothing
            refused = http.put("/governance/developer-mode", json={"enabled": True},
                               headers={"Authorization": f"Bearer {alice}"})
            assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
            assert "'rules'" in refused.json()["message"] and alice not in refused.text
            assert get(bob, "/people").json()["code"] == "FORBIDDEN"

            listed = cli(home, "people", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            people = {p["name"]: p for p in json.loads(listed.stdout)}
            assert people["alice"]["roles"] == ["approver", "auditor"] and people["bob"]["roles"] == ["runner"]
            assert people["alice"]["created_by"] == "owner" and not people["alice"]["revoked"]
            assert alice not in listed.stdout and "hash" not in listed.stdout

            rotated = cli(home, "people", "rotate", "alice")
            assert rotated.returncode == 0, rotated.stderr
            alice2 = rotated.stdout.strip()
            assert alice2 != alice
            old = get(alice, "/audit/verify")  # the next request with the old token
            assert old.status_code == 401 and old.json()["code"] == "UNAUTHORIZED" and alice not in old.text
            assert get(alice2, "/audit/verify").status_code == 200

            assert cli(home, "people", "revoke", "bob").returncode == 0
            assert get(bob, "/agents").status_code == 401
            again = cli(home, "people", "revoke", "bob")
            assert again.returncode == 3 and "CONFLICT" in again.stderr
            assert cli(home, "people", "rotate", "nobody").returncode == 3
            dup = cli(home, "people", "add", "alice", "--role", "admin")
            assert dup.returncode == 3 and "CONFLICT" in dup.stderr
            bad = cli(home, "people", "add", "owner", "--role", "admin")
            assert bad.returncode == 3 and "BAD_INPUT" in bad.stderr
            listed = json.loads(cli(home, "people", "list", "--json").stdout)
            assert {p["name"]: p["revoked"] for p in listed} == {"alice": False, "bob": True}
            assert next(p for p in listed if p["name"] == "alice")["rotated_at"] is not None
    for token in (alice, alice2, bob):
        assert _files_holding(home, token) == []
        assert not [line for line in stderr if token in line]


def test_the_journal_records_who_added_revoked_and_rotated_people_never_their_token(tmp_path):
    home = tmp_path / "home"
    with serving(home) as (url, _):
        admin = person(home, "root", "admin")
        carol = cli(home, "people", "add", "carol", "--role", "rules", token=admin)  # a person who is admin
        assert carol.returncode == 0, carol.stderr
        assert cli(home, "people", "rotate", "carol", token=admin).returncode == 0
        assert cli(home, "people", "revoke", "carol").returncode == 0  # the owner
    people = [(e.kind, json.loads(e.payload)) for e in journal_of(home) if e.kind.startswith("person_")]
    assert people == [
        ("person_added", {"name": "root", "roles": ["admin"], "by": "owner", "by_role": "admin", "auth": "owner"}),
        ("person_added", {"name": "carol", "roles": ["rules"], "by": "root", "by_role": "admin", "auth": "token"}),
        ("person_rotated", {"name": "carol", "roles": ["rules"], "by": "root", "by_role": "admin", "auth": "token"}),
        ("person_revoked", {"name": "carol", "roles": ["rules"], "by": "owner", "by_role": "admin", "auth": "owner"}),
    ]
    assert not _files_holding(tmp_path, carol.stdout.strip())


def test_a_person_with_auditor_verifies_from_the_cli_and_is_refused_governance_changes(tmp_path):
    home = tmp_path / "home"
    with serving(home):
        auditor = person(home, "audrey", "auditor")
        verified = cli(home, "audit", "verify", token=auditor)
        assert verified.returncode == 0, verified.stderr
        for command in (["rules", "list"], ["people", "list"], ["consents", "list"]):  # reads: an auditor's
            out = cli(home, *command, token=auditor)
            assert out.returncode == 0, (command, out.stderr)
        for command in (["rules", "add", "bash_executor", "--effect", "allow", "--prefix", "ls"], ["devmode", "on"],
                        ["people", "add", "mallory", "--role", "admin"], ["consents", "revoke", "clerk", "write"]):
            out = cli(home, *command, token=auditor)
            assert out.returncode in (1, 3) and "FORBIDDEN" in out.stdout + out.stderr, (command, out.stderr)
            assert auditor not in out.stdout + out.stderr
        policy = cli(home, "policy", "check", token=auditor)  # the snapshot is a read: an auditor's too
        assert policy.returncode == 0 and "policy: none" in policy.stdout, policy.stdout + policy.stderr
        runner = person(home, "rob", "runner")
        policy = cli(home, "policy", "check", token=runner)  # governance's state is not theirs: refused
        assert policy.returncode in (1, 3) and "FORBIDDEN" in policy.stdout + policy.stderr, policy
        assert runner not in policy.stdout + policy.stderr
        wrong = cli(home, "audit", "verify", token="not-a-token-" + "x" * 32)
        assert wrong.returncode == 3 and "UNAUTHORIZED" in wrong.stderr


def test_a_persons_changes_are_journaled_as_that_person_whatever_by_the_body_names(tmp_path):
    home = tmp_path / "home"
    with serving(home) as (url, _):
        rules = person(home, "rita", "rules")
        with httpx.Client(base_url=url, timeout=30) as http:
            def send(token: str, method: str, path: str, body: dict) -> httpx.Response:
                return http.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})

            added = send(rules, "POST", "/governance/rules", {"tool": "bash_executor", "effect": "deny",
                                                               "prefix": "rm", "by": "mallory"})
            assert added.status_code == 201, added.text
            assert added.json()["created_by"] == "rita"
            mode = send(rules, "PUT", "/governance/developer-mode", {"enabled": True, "by": "mallory"})
            assert mode.status_code == 200 and mode.json()["changed_by"] == "rita"
            removed = send(rules, "POST", "/internal/governance/rules/remove", {"id": added.json()["id"],
                                                                                 "by": "mallory"})
            assert removed.status_code == 200, removed.text
            owner = send(OWNER_TOKEN, "PUT", "/governance/developer-mode", {"enabled": False, "by": "bob"})
            assert owner.json()["changed_by"] == "bob"  # the owner's clients name who acts through them
    by = [(e.kind, *(json.loads(e.payload).get(k) for k in ("by", "by_role", "auth"))) for e in journal_of(home)
          if e.kind in ("rule_added", "rule_removed", "devmode_changed")]
    assert by == [("rule_added", "rita", "rules", "token"), ("devmode_changed", "rita", "rules", "token"),
                  ("rule_removed", "rita", "rules", "token"), ("devmode_changed", "bob", "admin", "owner")]


def test_a_persons_retry_with_the_same_key_is_answered_once_even_after_a_rotation_and_keys_are_per_person(tmp_path):
    home = tmp_path / "home"
    with serving(home) as (url, _):
        rita, sam = person(home, "rita", "rules"), person(home, "sam", "rules")
        body = {"tool": "bash_executor", "effect": "deny", "prefix": "rm"}
        with httpx.Client(base_url=url, timeout=30) as http:
            def add(token: str, body: dict = body) -> httpx.Response:
                return http.post("/governance/rules", json=body, headers={
                    "Authorization": f"Bearer {token}", "Idempotency-Key": "rule-once"})

            first, again = add(rita), add(rita)
            assert first.status_code == again.status_code == 201, (first.text, again.text)
            assert again.json()["id"] == first.json()["id"] and again.headers.get("Idempotent-Replayed") == "true"
            rotated = cli(home, "people", "rotate", "rita")
            assert rotated.returncode == 0, rotated.stderr
            after = add(rotated.stdout.strip())
            assert after.json()["id"] == first.json()["id"] and after.headers.get("Idempotent-Replayed") == "true"
            assert add(rita).status_code == 401  # the old token, revoked by the rotation, finds nothing
            theirs = add(sam, {**body, "prefix": "rmdir"})  # the same key from someone else: a request of its own
            assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
            assert theirs.headers.get("Idempotent-Replayed") is None
    added = [json.loads(e.payload)["by"] for e in journal_of(home) if e.kind == "rule_added"]
    assert added == ["rita", "sam"]


def test_people_on_a_home_nobody_serves_are_managed_by_its_owner(tmp_path):
    home = tmp_path / "home"
    token = person(home, "dora", "approver")
    listed = json.loads(cli(home, "people", "list", "--json").stdout)
    assert [(p["name"], p["roles"], p["created_by"]) for p in listed] == [("dora", ["approver"], "owner")]
    assert _files_holding(home, token) == []
    unknown = cli(home, "people", "add", "eve", "--role", "superuser")
    assert unknown.returncode == 3 and "BAD_INPUT" in unknown.stderr


@pytest.mark.parametrize("roles", [[], ["runner", "root"], "admin"])
def test_a_person_needs_known_roles(tmp_path, roles):
    from apollia_nb.errors import BadInput
    from apollia_nb.governance.people import validate_roles

    with pytest.raises(BadInput):
        validate_roles(roles)
