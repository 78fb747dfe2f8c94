"""A person's token, a JupyterHub user's token, a rotated-away and a revoked one appear nowhere but where
they are handed over: not in any file of the home (journal, logs, databases, in every form
``scan_home.find_everywhere`` knows), not in the server's log (at ``--log-level debug``), not in any
answer or error message the server or the CLI gives.

Every people route is exercised (add, list, rotate, revoke), with the paths that carry identity: a card
answered with ``always for 8h`` (a consent with a lifetime), an answer naming a stale digest, a plan
approved, refusals for a missing role, a revoked or rotated-away token, a token in the query string or
sent as ``by``, and a hub user's token on a home served with a real JupyterHub. The scan is checked to
find what it must (the owner token kept in ``server.json``; a token where a test put it on purpose), so
its silence means absence.
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
from typing import Any

import httpx
import pytest
from runtime_helpers import call, manifest
from scan_home import find_everywhere, find_in_bytes, needle_forms
from test_approvals_bound import _until

APOLLIA = [sys.executable, "-m", "apollia_nb"]
OWNER = "nowhere-owner-" + "n" * 32
PLANNED = manifest(planner=[{"steps": ["Write the file"]}],
                   actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."},
                          {"tool_calls": [call("write_file", path="b.txt", content="two")]}, {"text": "Done."}])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return {**env, **extra}


def _cli(home: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True,
                          env=_env(APOLLIA_TOKEN=token) if token else _env(), cwd=home.parent, timeout=180)


@contextlib.contextmanager
def _serving(home: Path, *extra: str) -> Iterator[tuple[str, list[str]]]:
    """``apollia-os serve --log-level debug`` on ``home``; yields its /api/v1 URL and, once it stopped, every
    line it wrote to stdout and stderr."""
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0", "--token", OWNER,
                             "--log-level", "debug", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=work)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first, proc.stderr.read() if proc.stderr else ""
        lines.append(first)
        yield json.loads((home / "server.json").read_text())["url"] + "/api/v1", lines
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        lines.extend(out.splitlines() + err.splitlines())


class Seen:
    """Every answer body and CLI output of a test, to search for tokens after."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def response(self, response: httpx.Response) -> httpx.Response:
        self.texts.append(f"{response.status_code} {dict(response.headers)} {response.text}")
        return response

    def run(self, done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
        self.texts.append(done.stdout + done.stderr)
        return done


def _assert_nowhere(home: Path, log: list[str], seen: Seen, secrets: dict[str, str]) -> None:
    for what, secret in secrets.items():
        assert find_everywhere(home, secret) == [], what
        assert not [line for line in log if secret in line], what
        assert not [text for text in seen.texts if secret in text], what


def test_personal_tokens_are_in_no_file_log_or_message_across_people_consents_and_approvals(tmp_path):
    home = tmp_path / "home"
    seen = Seen()
    with _serving(home) as (url, log):
        def client(token: str) -> httpx.Client:
            return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                trust_env=False)

        def ask(http: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response:
            return seen.response(http.request(method, path, **kw))

        with client(OWNER) as owner:
            tokens: dict[str, str] = {}
            for name, role in (("rob", "runner"), ("ann", "approver"), ("rita", "rules"), ("audrey", "auditor")):
                made = ask(owner, "POST", "/people", json={"name": name, "roles": [role]})
                assert made.status_code == 201, made.text
                tokens[name] = made.json()["token"]  # shown once, here: not searched in this answer
                seen.texts.pop()
            added = seen.run(_cli(home, "people", "add", "cy", "--role", "approver"))
            assert added.returncode == 0, added.stderr
            tokens["cy"] = added.stdout.strip()
            seen.texts.pop()
            assert ask(owner, "GET", "/people").status_code == 200
            assert seen.run(_cli(home, "people", "list", "--json")).returncode == 0
            rotated = ask(owner, "POST", "/people/rita/rotate")
            assert rotated.status_code == 200, rotated.text
            old_rita, tokens["rita"] = tokens["rita"], rotated.json()["token"]
            seen.texts.pop()
            assert ask(owner, "POST", "/people/cy/revoke").status_code == 200

        with client(tokens["rob"]) as rob, client(tokens["ann"]) as ann, client(tokens["rita"]) as rita, \
                client(tokens["audrey"]) as audrey:
            assert ask(rob, "POST", "/agents", json={"manifest": PLANNED}).status_code == 201
            planned = ask(rob, "POST", "/tasks", json={"agent": "clerk", "goal": "Write a", "approve_plan": True})
            assert planned.status_code == 202, planned.text
            task = _until(lambda: ask(rob, "GET", f"/tasks/{planned.json()['id']}").json(),
                          lambda t: t["awaiting_plan_approval"])
            assert ask(ann, "POST", f"/tasks/{task['id']}/plan/approve",
                       json={"digest": task["plan_digest"]}).status_code == 202
            [card] = _until(lambda: ask(ann, "GET", "/pending-decisions").json(), bool)
            stale = ask(ann, "POST", "/pending-decisions/decide",
                        json={"id": card["id"], "answer": "once", "digest": "sha256:" + "0" * 64})
            assert stale.status_code == 409 and stale.json()["code"] == "STALE_APPROVAL"
            forged = ask(ann, "POST", "/pending-decisions/decide",  # a token sent as who answers: ignored
                         json={"id": card["id"], "answer": "always", "for": "8h", "by": tokens["ann"]})
            assert forged.status_code == 200, forged.text
            [consent] = ask(audrey, "GET", "/governance/consents").json()
            assert consent["granted_by"] == "ann" and consent["until"] is not None
            assert ask(rita, "DELETE", "/governance/consents/clerk/write").status_code in (200, 204)
            # refusals: a role not held, a token in the query string, a revoked, a rotated-away, a bent one
            for http, method, path in ((rob, "PUT", "/governance/developer-mode"), (ann, "POST", "/people"),
                                       (audrey, "POST", "/governance/rules"), (rita, "GET", "/people/zz/x")):
                refused = ask(http, method, path, json={"enabled": True})
                assert refused.status_code in (403, 404, 405), refused.text
            for token in (old_rita, tokens["cy"], tokens["ann"] + "x", tokens["ann"][:-1]):
                with client(token) as stranger:
                    refused = ask(stranger, "GET", "/governance/consents", params={"token": token})
                    assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHORIZED"
            queried = seen.response(httpx.get(url + "/governance/consents", params={"token": tokens["rita"]},
                                              timeout=60, trust_env=False))
            assert queried.status_code == 401  # a token in the query string is no credential
            for token, command in ((tokens["audrey"], ("rules", "add", "bash_executor", "--effect", "allow")),
                                   (old_rita, ("consents", "list")), (tokens["cy"], ("audit", "verify")),
                                   (tokens["rob"], ("people", "list"))):
                assert seen.run(_cli(home, *command, token=token)).returncode != 0
        _until(lambda: ask(client(OWNER), "GET", f"/tasks/{task['id']}").json(), lambda t: t["status"] != "running")
        kept_for_owner = find_in_bytes((home / "server.json").read_bytes(), needle_forms(OWNER.encode()))

    secrets = {**{f"token of {k}": v for k, v in tokens.items()}, "rita's rotated-away token": old_rita}
    _assert_nowhere(home, log, seen, secrets)
    assert kept_for_owner  # the owner token was in server.json while serving (the owner's own file)
    # the scan finds what is there: a token put in the home on purpose
    (home / "exports").mkdir(exist_ok=True)
    (home / "exports" / "planted.json").write_text(json.dumps({"t": tokens["ann"]}))
    assert find_everywhere(home, tokens["ann"])


# --- a served home with a real JupyterHub ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from test_jupyterhub_identity import hub as hub_fixture

    yield from hub_fixture.__wrapped__(tmp_path_factory)  # type: ignore[attr-defined]


def test_hub_tokens_are_in_no_file_log_or_message_of_the_served_home(hub, tmp_path):
    from test_jupyterhub_identity import SERVICE

    home = tmp_path / "home"
    seen = Seen()
    ann, _ = hub.token("ann")
    bob, _ = hub.token("bob")
    stranger, stranger_id = hub.token("carol")
    with _serving(home, "--hub", hub.api, "--hub-service", SERVICE) as (url, log):
        for name, role in (("ann", "runner"), ("bob", "approver")):
            assert seen.run(_cli(home, "people", "add", name, "--role", role)).returncode == 0
            seen.texts.pop()  # a personal token is printed here; the hub tokens are searched below

        def client(token: str) -> httpx.Client:
            return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                trust_env=False)

        with client(ann) as as_ann, client(bob) as as_bob, client(stranger) as as_carol:
            assert seen.response(as_ann.post("/agents", json={"manifest": PLANNED})).status_code == 201
            assert seen.response(as_ann.post("/tasks", json={"agent": "clerk", "goal": "Write"})).status_code == 202
            [card] = _until(lambda: seen.response(as_bob.get("/pending-decisions")).json(), bool)
            refused = seen.response(as_ann.post("/pending-decisions/decide", json={"id": card["id"], "answer": "once"}))
            assert refused.status_code == 403
            answered = seen.response(as_bob.post("/pending-decisions/decide",
                                                 json={"id": card["id"], "answer": "always", "for": "1h",
                                                       "by": bob}))
            assert answered.status_code == 200, answered.text
            for path in ("/governance/consents", "/people", "/audit/verify"):
                assert seen.response(as_carol.get(path)).status_code == 403  # a hub user who is no person here
            hub.call("DELETE", f"/users/carol/tokens/{stranger_id}")
            assert seen.response(as_carol.get("/agents", params={"token": stranger})).status_code in (401, 403)
            for command in (("consents", "list"), ("audit", "verify")):
                seen.run(_cli(home, *command, token=ann))
    _assert_nowhere(home, log, seen, {"ann's hub token": ann, "bob's hub token": bob, "carol's hub token": stranger})
