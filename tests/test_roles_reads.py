"""An auditor reads everything governance shows and changes nothing, over real HTTP on 127.0.0.1.

Each read of governance's state (consents, rules, developer mode, the policy, waiting decisions, people,
agents and runs) names the roles that may use it in the one route table: the role it is for and
``auditor``. A refusal names every role the route accepts; the OpenAPI document's ``x-apollia-role`` is
the role's name for a route one role opens and the list of names for a route several do. Every change
stays one role's: an auditor's write is 403 ``FORBIDDEN`` and leaves the state as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from runtime_helpers import call, manifest

from apollia_nb.api.deps import API_PREFIX
from apollia_nb.api.roles import ROLE_EXTENSION, ROUTE_ROLES
from apollia_nb.api.server import ServerThread
from apollia_nb.home import Home

OWNER = "reads-owner-" + "r" * 32
#: The POST routes that read (a verification, a replay, SQL, a proof): the auditor's own.
READING_POSTS = {"/audit/replay/{run_id}", "/internal/journal/verify", "/internal/journal/sql",
                 "/internal/journal/inclusion-proof"}
#: The GET routes only a runtime running agents uses (the owner's clients): not a person's read.
RUNTIME_GETS = {"/internal/answers"}


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url + API_PREFIX, headers={"Authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str, dict[str, str]]]:
    """A served home with a run waiting on a card, a standing consent for 8h, a rule, and one person per role."""
    base = tmp_path_factory.mktemp("reads")
    home = Home.at(base / "home")
    (base / "work").mkdir()  # the agent writes here, never where the run started
    turns: list[dict[str, Any]] = []
    for i in range(2):
        turns += [{"tool_calls": [call("write_file", path=f"f{i}.txt", content="x")]}, {"text": "Done."}]
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = {}
        for role in ("runner", "approver", "rules", "auditor"):
            made = owner.post("/people", json={"name": f"p-{role}", "roles": [role]})
            assert made.status_code == 201, made.text
            tokens[role] = made.json()["token"]
        written = manifest(actor=turns, workspace=str(base / "work"))
        assert owner.post("/agents", json={"manifest": written}).status_code == 201
        assert owner.post("/tasks", json={"agent": "clerk", "goal": "Write"}).status_code == 202
        card = _pending(owner, 1)[0]
        answered = owner.post("/pending-decisions/decide", json={"id": card["id"], "answer": "once"})
        assert answered.status_code == 200, answered.text
        assert owner.post("/tasks", json={"agent": "clerk", "goal": "Write again"}).status_code == 202
        _pending(owner, 1)
        with _client(srv.url, tokens["rules"]) as rules:
            granted = rules.post("/internal/governance/consents",
                                 json={"agent": "archivist", "family": "send", "by": "someone",
                                       "until": "2999-01-01T00:00:00Z"})
            assert granted.status_code in (200, 201), granted.text
            added = rules.post("/governance/rules", json={"tool": "bash_executor", "effect": "allow", "prefix": "ls"})
            assert added.status_code in (200, 201), added.text
        yield home, srv.url, tokens


def _pending(client: httpx.Client, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while len(pending := client.get("/pending-decisions").json()) < n:
        assert time.monotonic() < deadline, pending
        time.sleep(0.05)
    return pending


READS = ["/governance/consents", "/governance/rules", "/governance/developer-mode", "/governance/policy",
         "/internal/governance/snapshot", "/pending-decisions", "/internal/pending-decisions", "/people",
         "/agents", "/agents/clerk", "/tasks", "/sessions", "/batches"]


@pytest.mark.parametrize("path", READS)
def test_an_auditor_reads_what_the_writing_role_reads(served, path):
    _, url, tokens = served
    writer = {"/people": None, "/pending-decisions": "approver", "/internal/pending-decisions": "approver",
              "/agents": "runner", "/agents/clerk": "runner", "/tasks": "runner", "/sessions": "runner",
              "/batches": "runner"}.get(path, "rules")
    with _client(url, tokens["auditor"]) as auditor, _client(url, tokens[writer] if writer else OWNER) as other:
        seen = auditor.get(path)
        assert seen.status_code == 200, seen.text
        assert seen.json() == other.get(path).json()


def test_the_auditor_sees_each_consent_with_who_gave_it_and_when_it_ends(served):
    _, url, tokens = served
    with _client(url, tokens["auditor"]) as auditor:
        [consent] = auditor.get("/governance/consents").json()
    assert (consent["agent"], consent["family"], consent["granted_by"], consent["state"]) == (
        "archivist", "send", "p-rules", "in force")
    assert consent["until"].startswith("2999-01-01")


def test_consents_list_from_the_cli_with_an_auditors_token(served):
    home, _, tokens = served
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_HOME"}
    env["APOLLIA_TOKEN"] = tokens["auditor"]
    listed = subprocess.run([sys.executable, "-m", "apollia_nb", "consents", "list", "--json", "--home", str(home.path)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(r["agent"], r["granted_by"]) for r in json.loads(listed.stdout)] == [("archivist", "p-rules")]
    env["APOLLIA_TOKEN"] = tokens["runner"]
    refused = subprocess.run([sys.executable, "-m", "apollia_nb", "consents", "list", "--home", str(home.path)],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "FORBIDDEN" in refused.stderr
    assert "p-runner has runner" in refused.stderr and tokens["runner"] not in refused.stderr


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/governance/rules", {"tool": "bash_executor", "effect": "allow", "prefix": "rm"}),
    ("DELETE", "/governance/consents/archivist/send", None),
    ("POST", "/internal/governance/consents", {"agent": "clerk", "family": "write", "by": "x"}),
    ("POST", "/internal/governance/consents/revoke", {"agent": "archivist", "family": "send", "by": "x"}),
    ("PUT", "/governance/developer-mode", {"enabled": True}),
    ("POST", "/pending-decisions/decide", {"id": "x", "answer": "once"}),
    ("POST", "/people", {"name": "mallory", "roles": ["admin"]}),
    ("POST", "/people/p-rules/revoke", {}),
    ("POST", "/agents/clerk/stop", {}),
    ("POST", "/tasks", {"agent": "clerk", "goal": "x"}),
])
def test_an_auditors_change_is_forbidden_naming_the_role_and_changes_nothing(served, method, path, body):
    _, url, tokens = served
    with _client(url, tokens["auditor"]) as auditor, _client(url, OWNER) as owner:
        before = [owner.get(p).json() for p in ("/governance/consents", "/governance/rules", "/people",
                                                "/governance/developer-mode", "/tasks")]
        refused = auditor.request(method, path, json=body)
        assert refused.status_code == 403, refused.text
        error = refused.json()
        assert error["code"] == "FORBIDDEN" and "p-auditor has auditor" in error["message"]
        assert "needs the role '" in error["message"] and "' or '" not in error["message"]  # a change: one role
        assert tokens["auditor"] not in refused.text
        after = [owner.get(p).json() for p in ("/governance/consents", "/governance/rules", "/people",
                                               "/governance/developer-mode", "/tasks")]
    assert after == before


@pytest.mark.parametrize(("role", "path", "named"), [
    ("runner", "/governance/consents", "'rules' or 'auditor'"),
    ("approver", "/governance/rules", "'rules' or 'auditor'"),
    ("rules", "/pending-decisions", "'approver' or 'auditor'"),
    ("rules", "/people", "'admin' or 'auditor'"),
    ("approver", "/tasks", "'runner' or 'auditor'"),
])
def test_a_refused_read_names_every_role_it_accepts(served, role, path, named):
    _, url, tokens = served
    with _client(url, tokens[role]) as client:
        refused = client.get(path)
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
    assert f"GET {API_PREFIX}{path} needs the role {named}; p-{role} has {role}" == refused.json()["message"]


def test_every_read_of_a_persons_view_is_open_to_the_auditor_and_no_change_is():
    """The class, over the whole table: each GET a person may use takes ``auditor``; no change does."""
    for (method, path), roles in ROUTE_ROLES.items():
        if roles is None:
            continue
        if method == "GET" and path not in RUNTIME_GETS:
            assert "auditor" in roles, (method, path, roles)
        elif method != "POST" or path not in READING_POSTS:
            assert "auditor" not in roles, (method, path, roles)
        assert roles.count("auditor") <= 1 and len(set(roles)) == len(roles)


def test_the_openapi_role_is_a_name_for_one_role_and_a_list_for_several(served):
    _, url, _ = served
    doc = httpx.get(url + API_PREFIX + "/openapi.json", timeout=60).json()
    ops = doc["paths"]
    assert ops[API_PREFIX + "/governance/consents"]["get"][ROLE_EXTENSION] == ["rules", "auditor"]
    assert ops[API_PREFIX + "/governance/rules"]["post"][ROLE_EXTENSION] == "rules"
    assert ops[API_PREFIX + "/audit/verify"]["get"][ROLE_EXTENSION] == "auditor"
    assert ops[API_PREFIX + "/health"]["get"][ROLE_EXTENSION] is None
    assert "Needs the role `rules` or `auditor`" in ops[API_PREFIX + "/governance/consents"]["get"]["description"]


@pytest.mark.parametrize(("role", "command", "words"), [
    ("rules", ("consents", "list", "--json"), '"granted_by": "p-rules"'),
    ("rules", ("rules", "list"), "bash_executor"),
    ("rules", ("devmode",), "developer mode: off"),
    ("approver", ("pending", "list"), "write_file"),
    ("runner", ("agents", "list"), "clerk"),
])
def test_each_role_reads_its_own_state_from_the_cli_of_a_served_home(served, role, command, words):
    """The CLI opens the served home's journal (its head) before anything: every role may, or no person
    but an auditor could use the CLI at all."""
    home, url, tokens = served
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_HOME"}
    env["APOLLIA_TOKEN"] = tokens[role]
    done = subprocess.run([sys.executable, "-m", "apollia_nb", *command, "--home", str(home.path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert words in done.stdout
    with _client(url, tokens[role]) as client:
        head = client.get("/internal/journal/head")
        assert head.status_code == 200 and set(head.json()) >= {"origin", "public_key"}
        assert client.post("/internal/journal/sql", json={"sql": "SELECT 1"}).status_code == 403  # no entry
