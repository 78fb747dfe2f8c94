"""Four eyes: the organisation policy can require, per family or tool, that a call is approved by a
person other than the one who started the run (``four_eyes = true``) or by N distinct people
(``approvers = N``). A card says who may answer it; a self-approval is refused ``FORBIDDEN`` and
journaled; with N approvers the card waits for N distinct people, and any refusal ends it."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import Forbidden, PolicyRefused
from apollia_nb.governance.approvals import Requirement, local_person, refusal, requirement
from apollia_nb.governance.policy import keygen, parse_policy, policy_to_dict, sign
from apollia_nb.runtime import Runtime
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest
from test_notebook_panel import WAIT, ask, open_panel

OWNER = "four-eyes-owner-" + "f" * 32
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])
FOUR_EYES = b'[approvals.families.write]\nfour_eyes = true\n'
TWO = b'[approvals.tools.write_file]\napprovers = 2\n'


def _deposit(home: Any, policy: bytes) -> None:
    """A signed organisation policy the home trusts."""
    root = home.path
    root.mkdir(parents=True, exist_ok=True)
    key = root.parent / "org.key"
    _, public = keygen(key)
    (root / "policy").mkdir(exist_ok=True)
    (root / "policy" / "organisation.toml").write_bytes(policy)
    sign(root / "policy" / "organisation.toml", key)
    (root / "apollia.toml").write_text(f'[policy]\ntrusted_keys = ["{public}"]\n')


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _people(owner: httpx.Client, **roles: list[str]) -> dict[str, str]:
    tokens = {}
    for name, held in roles.items():
        made = owner.post("/people", json={"name": name, "roles": held})
        assert made.status_code == 201, made.text
        tokens[name] = made.json()["token"]
    return tokens


def _until(fetch: Any, ok: Any) -> Any:
    deadline = time.monotonic() + 60
    while not ok(value := fetch()):
        assert time.monotonic() < deadline, value
        time.sleep(0.05)
    return value


def _pending(client: httpx.Client, task: dict[str, Any]) -> dict[str, Any]:
    [p] = _until(lambda: [p for p in client.get("/pending-decisions").json() if p["task_id"] == task["id"]], bool)
    return p


def _entries(client: httpx.Client, run_id: str, kind: str) -> list[dict[str, Any]]:
    got = client.get("/audit/entries", params={"run_id": run_id, "limit": 1000}).json()["entries"]
    return [e["payload"] for e in got if e["kind"] == kind]


# --- the policy's [approvals] -----------------------------------------------------------------------


def test_the_policy_says_who_must_approve_per_family_and_tool_and_the_strictest_applies():
    policy = parse_policy(b'[refuse]\nfamilies = ["send"]\n'
                          b'[approvals.families.write]\nfour_eyes = true\n'
                          b'[approvals.tools."mcp:crm/delete"]\napprovers = 3\n'
                          b'[approvals.tools.write_file]\napprovers = 2\nfour_eyes = false\n')
    assert requirement(policy.approvals, "write_file", "write") == Requirement(four_eyes=True, approvers=2)
    assert requirement(policy.approvals, "delete_file", "write") == Requirement(four_eyes=True, approvers=1)
    assert requirement(policy.approvals, "mcp:crm/delete", None) == Requirement(four_eyes=False, approvers=3)
    assert requirement(policy.approvals, "read_file", "read").plain
    assert policy_to_dict(policy)["approvals"] == {
        "families": {"write": {"four_eyes": True, "approvers": 1}},
        "tools": {"mcp:crm/delete": {"four_eyes": False, "approvers": 3},
                  "write_file": {"four_eyes": False, "approvers": 2}}}
    assert parse_policy(b'[refuse]\ntools = []\n').approvals == ()
    assert "approvals" not in policy_to_dict(parse_policy(b""))


@pytest.mark.parametrize("text, why", [
    (b'[approvals.families.write]\napprovers = 0\n', "approvers must be a whole number from 1 to 10"),
    (b'[approvals.families.write]\napprovers = 11\n', "approvers must be a whole number from 1 to 10"),
    (b'[approvals.families.write]\napprovers = true\n', "approvers must be a whole number from 1 to 10"),
    (b'[approvals.families.write]\napprovers = "2"\n', "approvers must be a whole number from 1 to 10"),
    (b'[approvals.families.write]\napprovers = 1.5\n', "approvers must be a whole number from 1 to 10"),
    (b'[approvals.families.write]\nfour_eyes = "yes"\n', "four_eyes must be true or false"),
    (b'[approvals.families.write]\nfour_eye = true\n', "unknown key 'four_eye' in [approvals.families.write]"),
    (b'[approvals.families.writes]\nfour_eyes = true\n', "unknown family 'writes'"),
    (b'[approvals.family.write]\nfour_eyes = true\n', "unknown key 'family' in [approvals]"),
    (b'[approvals]\nfamilies = ["write"]\n', "[approvals] families must be a table of tables"),
    (b'[approvals]\ntools = { write_file = true }\n', "[approvals.tools.write_file] must be a table"),
    (b'approvals = 2\n', "'approvals' must be a table"),
])
def test_an_approvals_table_that_does_not_read_refuses_the_whole_policy_saying_what_is_wrong(text, why):
    with pytest.raises(PolicyRefused) as info:
        parse_policy(text + b'[refuse]\nfamilies = ["send"]\n')
    assert why in info.value.message


def test_who_may_not_approve_and_why():
    both = Requirement(four_eyes=True, approvers=2)
    assert "four eyes" in refusal(both, started_by="ann", by="ann", approved_by=[])
    assert "approved this already" in refusal(both, started_by="ann", by="bob", approved_by=["bob"])
    assert refusal(both, started_by="ann", by="bob", approved_by=[]) is None
    assert refusal(Requirement(approvers=2), started_by="ann", by="ann", approved_by=[]) is None
    # The home's owner is one person, with the owner token (owner) or as the local user who owns the home.
    me = local_person()
    assert "four eyes" in refusal(both, started_by="owner", by=me, approved_by=[], local=me)
    assert "four eyes" in refusal(both, started_by=me, by="owner", approved_by=[], local=me)
    assert "approved this already" in refusal(both, started_by="ann", by="owner", approved_by=[me], local=me)


# --- over REST ------------------------------------------------------------------------------------


def test_the_person_who_started_the_run_may_not_approve_its_call_another_may(home):
    _deposit(home, FOUR_EYES)
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = _people(owner, ann=["runner", "approver"], bob=["approver"])
        with _client(srv.url, tokens["ann"]) as ann, _client(srv.url, tokens["bob"]) as bob:
            assert ann.post("/agents", json={"manifest": WRITER}).status_code == 201
            task = ann.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
            pending = _pending(bob, task)
            assert pending["may_answer"] == {
                "roles": ["approver"], "four_eyes": True, "started_by": "ann", "excluded": ["ann"], "approvers": 1,
                "approved_by": [], "approvals_needed": 1}
            for body in ({"answer": "once"}, {"answer": "always"}, {"answer": "once", "by": "bob"},
                         {"answer": "once", "digest": pending["digest"]}):
                mine = ann.post("/pending-decisions/decide", json={"id": pending["id"], **body})
                assert mine.status_code == 403, mine.text
                assert mine.json()["code"] == "FORBIDDEN" and "four eyes" in mine.json()["message"]
                assert "ann started this run" in mine.json()["message"]
            assert not (home.path.parent / "work" / "a.txt").exists()
            assert bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"}).status_code == 200
            done = _until(lambda: ann.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "completed")
            assert done["started_by"] == "ann"
            refused = _entries(owner, task["run_id"], "answer_refused")
            answers = _entries(owner, task["run_id"], "answer")
    assert len(refused) == 4
    assert {(r["person"], r["by_role"], r["auth"], r["code"]) for r in refused} == {
        ("ann", "runner+approver", "token", "FORBIDDEN")}
    assert [(a["answered_by"], a["by_role"], a["digest"]) for a in answers] == [("bob", "approver", pending["digest"])]
    assert (home.path.parent / "work" / "a.txt").read_text() == "one"


def test_the_starter_may_still_refuse_and_a_refusal_ends_the_card(home):
    _deposit(home, FOUR_EYES)
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = _people(owner, ann=["runner", "approver"])
        with _client(srv.url, tokens["ann"]) as ann:
            assert ann.post("/agents", json={"manifest": WRITER}).status_code == 201
            task = ann.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
            pending = _pending(ann, task)
            assert ann.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "refuse"}).status_code == 200
            done = _until(lambda: ann.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "failed")
            assert done["error"]["code"] == "REFUSED"


def test_a_run_the_owner_token_started_is_not_approved_with_the_owner_token_whatever_by_it_names(home):
    _deposit(home, FOUR_EYES)
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = _people(owner, bob=["approver"])
        assert owner.post("/agents", json={"manifest": WRITER}).status_code == 201
        task = owner.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
        pending = _pending(owner, task)
        assert pending["may_answer"]["excluded"] == ["owner"]
        self_approval = owner.post("/pending-decisions/decide",
                                   json={"id": pending["id"], "answer": "once", "by": "bob"})
        assert self_approval.status_code == 403 and self_approval.json()["code"] == "FORBIDDEN"
        with _client(srv.url, tokens["bob"]) as bob:
            assert bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"}).status_code == 200
        _until(lambda: owner.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "completed")


def test_two_approvers_the_card_waits_for_two_distinct_people_and_survives_a_restart(home):
    _deposit(home, TWO)
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = _people(owner, ann=["runner"], bob=["approver"], carol=["approver"])
        with _client(srv.url, tokens["ann"]) as ann, _client(srv.url, tokens["bob"]) as bob:
            assert ann.post("/agents", json={"manifest": WRITER}).status_code == 201
            task = ann.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
            pending = _pending(bob, task)
            assert pending["may_answer"]["approvals_needed"] == 2
            first = bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
            assert first.status_code == 200 and first.json()["status"] == "pending"
            assert first.json()["may_answer"]["approved_by"] == ["bob"]
            assert first.json()["may_answer"]["approvals_needed"] == 1
            assert _pending(bob, task)["may_answer"]["excluded"] == ["bob"]
            assert ann.get(f"/tasks/{task['id']}").json()["status"] == "waiting"
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:  # a restart
        with _client(srv.url, tokens["bob"]) as bob, _client(srv.url, tokens["carol"]) as carol:
            assert _pending(bob, task)["may_answer"]["approved_by"] == ["bob"]
            again = bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
            assert again.status_code == 403 and "approved this already" in again.json()["message"]
            last = carol.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
            assert last.status_code == 200 and last.json()["status"] == "answered"
            _until(lambda: owner.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "completed")
            approvals = _entries(owner, task["run_id"], "approval")
            answers = _entries(owner, task["run_id"], "answer")
            refused = _entries(owner, task["run_id"], "answer_refused")
    assert [(a["by"], a["by_role"], a["approved_by"], a["needed"]) for a in approvals] == [
        ("bob", "approver", ["bob"], 2)]
    assert [(a["answered_by"], a["approved_by"]) for a in answers] == [("carol", ["bob", "carol"])]
    assert [(r["person"], r["code"]) for r in refused] == [("bob", "FORBIDDEN")]


def test_two_approvers_one_refusal_ends_the_card(home):
    _deposit(home, TWO)
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = _people(owner, ann=["runner"], bob=["approver"], carol=["approver"])
        with _client(srv.url, tokens["ann"]) as ann, _client(srv.url, tokens["bob"]) as bob, \
                _client(srv.url, tokens["carol"]) as carol:
            assert ann.post("/agents", json={"manifest": WRITER}).status_code == 201
            task = ann.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
            pending = _pending(bob, task)
            assert bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"}).status_code == 200
            assert carol.post("/pending-decisions/decide",
                              json={"id": pending["id"], "answer": "refuse"}).status_code == 200
            done = _until(lambda: ann.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "failed")
            assert done["error"]["code"] == "REFUSED"
            late = bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
            assert late.status_code == 409
    assert not (home.path.parent / "work" / "a.txt").exists()


# --- in a kernel ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_in_a_kernel_the_local_owner_started_the_run_and_may_not_approve_it(home):
    _deposit(home, FOUR_EYES)
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        [card] = handle.pending
        assert card.to_dict()["may_answer"]["excluded"] == [local_person()]
        for by in ("user", "bob"):
            with pytest.raises(Forbidden) as info:
                card.answer("once", by=by)
            assert "four eyes" in info.value.message
        assert len(rt.journal.entries(run_id=handle.run_id, kinds=["answer_refused"])) == 2
        card.answer("refuse", by="user")
        assert (await handle).status == "failed"


def test_the_panel_says_who_you_are_and_why_you_may_not_approve_the_run_you_started(home, ip):
    _deposit(home, FOUR_EYES)  # governance reads the new policy on its next snapshot
    ip.run_cell_magic("apollia", "agent", WRITER)
    task = ip.run_cell_magic("apollia", "task clerk", "Write a.txt").join(WAIT, settled=True)
    p, comm = open_panel(ip)
    data = ask(p, comm, "s1", op="snapshot")["data"]
    assert data["me"] == {"name": local_person(), "role": "owner of this home", "auth": "local"}
    [item] = [i for i in data["inbox"] if i.get("kind") == "card"]
    assert item["may_answer"]["excluded"] == [local_person()]
    assert item["you"]["answers"] == ["refuse"]
    assert item["you"]["why"].startswith(f"Four eyes: you ({local_person()}) started this run")
    refused = ask(p, comm, "a1", op="answer", card_id=item["id"], answer="once")
    assert refused["ok"] is False and refused["error"]["code"] == "FORBIDDEN", refused
    assert ask(p, comm, "a2", op="answer", card_id=item["id"], answer="refuse")["ok"] is True
    assert task.join(WAIT).status == "failed"



def test_a_run_started_with_the_owner_token_is_not_approved_by_the_local_owner_either(home):
    _deposit(home, FOUR_EYES)
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        assert owner.post("/agents", json={"manifest": WRITER}).status_code == 201
        task = owner.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
        pending = _pending(owner, task)
    # Nobody serves the home now: the CLI owns it, as the local user, who is the owner.
    cli = [sys.executable, "-m", "apollia_nb", "pending", "decide", "--home", str(home.path), pending["id"]]
    mine = subprocess.run([*cli, "once"], capture_output=True, text=True, timeout=120)
    assert mine.returncode != 0 and "FORBIDDEN" in mine.stderr + mine.stdout and "four eyes" in mine.stderr + mine.stdout
    refused = subprocess.run([*cli, "refuse"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 0, refused.stderr
