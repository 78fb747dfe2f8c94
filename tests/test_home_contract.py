"""One contract, two homes: the same tests on the owner's stores and on a client of `apollia-os serve`.

``owner``: a ``Runtime`` owning a fresh home (``Journal``, ``GovernanceStore``).
``client``: a ``Runtime`` whose home is owned by a real ``apollia-os serve``
subprocess (``RemoteJournal``, ``RemoteGovernance``). Each test asks the
runtime's ``journal`` and ``governance`` the same thing and expects the same
answer, the same error class and the same stable code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from apollia_nb.errors import BadAnswer, BadInput, Conflict, NotFound, StorageFull, UnknownDecision, UnknownRule
from apollia_nb.governance.decision import Effect, Family
from apollia_nb.runtime import Runtime

pytestmark = pytest.mark.anyio

HOMES = ["owner", "client"]


@contextmanager
def serving(home: Path, **env: str) -> Iterator[Path]:
    """A real `apollia-os serve` owning ``home`` (with ``env`` added to its environment) until the block ends."""
    proc = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve", "--home", str(home), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=home.parent,
                            env={**os.environ, **env})
    try:
        assert proc.stdout is not None and proc.stdout.readline(), proc.stderr.read() if proc.stderr else ""
        yield home
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home owned by a real `apollia-os serve` (one for the module: each test uses its own run ids)."""
    with serving(tmp_path_factory.mktemp("served") / "home") as home:
        yield home


@pytest.fixture(params=HOMES)
def which(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_home(which: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    home = request.getfixturevalue("served") if which == "client" else tmp_path / "home"

    @asynccontextmanager
    async def opened() -> AsyncIterator[Runtime]:
        async with Runtime(home) as rt:
            assert rt.mode == which
            yield rt

    return opened


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def pending_of(rt: Runtime, run: str, tool: str = "write_file"):
    return rt.governance.add_pending(run, None, "clerk", tool, Family.WRITE, {"path": "a.txt"},
                                     ["once", "always", "refuse"], reason="needs a person", line=6,
                                     call_id="c1")


# --- the journal ----------------------------------------------------------------------------------


async def test_append_read_head(open_home) -> None:
    async with open_home() as rt:
        run = run_id()
        before, _ = rt.journal.head()
        entry = rt.journal.append("note", {"text": "one"}, run_id=run, agent="clerk")
        [second] = rt.journal.append_many([("note", {"text": "two"}, run, "clerk")])
        third = await rt.journal.append_async("other_note", {"n": 3}, run_id=run)
        assert (entry.seq, second.seq, third.seq) == (before + 1, before + 2, before + 3)
        assert rt.journal.head() == (third.seq, third.hash)
        assert second.prev_hash == entry.hash
        assert [e.seq for e in rt.journal.entries(run_id=run)] == [entry.seq, second.seq, third.seq]
        assert [e.data() for e in rt.journal.entries(run_id=run, kinds=["note"])] == [{"text": "one"},
                                                                                     {"text": "two"}]
        assert [e.seq for e in rt.journal.entries(since_seq=entry.seq, limit=1)] == [second.seq]
        assert rt.journal.entries(run_id=run, kinds=[]) == []
        assert rt.journal.get(second.seq) == second
        assert rt.journal.run_size(run) == 3
        assert rt.journal.sql("SELECT count(*) FROM entries WHERE run_id = ?", [run]) == [(3,)]


async def test_bad_input_is_refused_before_anything_is_written(open_home) -> None:
    async with open_home() as rt:
        head = rt.journal.head()
        for bad in (lambda: rt.journal.append("Not A Kind", {}), lambda: rt.journal.append("note", {"x": {1, 2}}),
                    lambda: rt.journal.append("note", {}, run_id=7)):  # type: ignore[arg-type]
            with pytest.raises(BadInput) as caught:
                bad()
            assert caught.value.code == "BAD_INPUT"
        assert rt.journal.head() == head
        with pytest.raises(NotFound) as missing:
            rt.journal.get(head[0] + 1000)
        assert missing.value.code == "NOT_FOUND"


async def test_checkpoints_cover_what_is_committed(open_home) -> None:
    async with open_home() as rt:
        entry = rt.journal.append("note", {"text": "covered"}, run_id=run_id())
        note = rt.journal.checkpoint()
        assert rt.journal.latest_checkpoint() == note
        size, _root, stored = rt.journal.checkpoints()[-1]
        assert stored == note and size >= entry.seq
        assert rt.journal.checkpoint() == note  # nothing new: the same checkpoint
        proof = rt.journal.inclusion_proof(entry.seq)
        assert proof.seq == entry.seq
        later = rt.journal.append("note", {"text": "after"}, run_id=run_id())
        grown = rt.journal.consistency_proof(entry.seq, later.seq)
        assert (grown.old_size, grown.new_size) == (entry.seq, later.seq)
        grown.verify()
        with pytest.raises(BadInput) as bad:
            rt.journal.consistency_proof(later.seq + 1, later.seq)
        assert bad.value.code == "BAD_INPUT"
        assert rt.journal.cosignatures() == []  # no [[journal.witnesses]]: nothing cosigned
        assert rt.verify().ok


async def test_a_run_is_sealed_in_one_go_counting_what_was_handed_over_before(open_home) -> None:
    """``seal_async``: the run's last entries and its seal, after everything handed over before (a
    result given with ``append_soon`` included), the seal counting the entries before it; then a
    signed checkpoint that covers the seal."""
    async with open_home() as rt:
        run = run_id()
        rt.journal.append("run_open", {"run_kind": "task"}, run_id=run, agent="clerk")
        rt.journal.append_soon("tool_result", {"call_id": "c1"}, run_id=run, agent="clerk")
        with pytest.raises(BadInput):
            await rt.journal.seal_async(run, "clerk", [], {"status": "completed", "entries": 99})
        with pytest.raises(BadInput):
            await rt.journal.seal_async(run, "clerk", [("Not A Kind", {})], {"status": "completed"})
        written, stored = await rt.journal.seal_async(
            run, "clerk", [("task_status", {"status": "completed"})], {"status": "completed"})
        assert [e.kind for e in written] == ["task_status", "run_seal"]
        assert [e.kind for e in rt.journal.entries(run_id=run)] == ["run_open", "tool_result", "task_status",
                                                                    "run_seal"]
        assert written[1].data() == {"status": "completed", "entries": 3}
        assert written[1].seq == written[0].seq + 1
        note = stored.result(timeout=30)
        size, _root, latest = rt.journal.checkpoints()[-1]
        assert latest == note and size >= written[1].seq
        assert not [m for m in rt.replay(run).missing if "seal" in m]  # replay finds the count right


async def test_a_full_disk_is_storage_full_and_nothing_is_recorded(which, tmp_path, monkeypatch) -> None:
    """``$APOLLIA_STORAGE_FAULT`` makes the owner's ``journal.log`` refuse writes (ENOSPC): in the
    runtime's own process for the owner, in the server's for a client."""
    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    home = tmp_path / "home"
    fault = {"APOLLIA_STORAGE_FAULT": "journal.log:ENOSPC"}
    async with Runtime(home) as rt:  # the home made, its files recorded, before the disk fills
        assert rt.mode == "owner"
    if which == "client":
        with serving(home, **fault):
            async with Runtime(home) as rt:
                assert rt.mode == "client"
                head = rt.journal.head()
                with pytest.raises(StorageFull) as full:
                    rt.journal.append("note", {"text": "lost"}, run_id=run_id())
                assert full.value.code == "STORAGE_FULL" and rt.journal.head() == head
        return
    async with Runtime(home) as rt:
        head = rt.journal.head()
        monkeypatch.setenv(*fault.popitem())
        with pytest.raises(StorageFull) as full:
            rt.journal.append("note", {"text": "lost"}, run_id=run_id())
        assert full.value.code == "STORAGE_FULL" and rt.journal.head() == head
        monkeypatch.delenv("APOLLIA_STORAGE_FAULT")


# --- governance -----------------------------------------------------------------------------------


async def test_pending_decisions_add_answer_first_answer_wins(open_home) -> None:
    async with open_home() as rt:
        run = run_id()
        added = pending_of(rt, run)
        assert added.status == "pending" and added.run_id == run and added.family is Family.WRITE
        assert [p.id for p in rt.governance.pending(run_id=run)] == [added.id]
        assert rt.governance.get_pending(added.id).arguments == {"path": "a.txt"}
        with pytest.raises(BadAnswer) as not_offered:
            rt.answer(added.id, "maybe", by="tester")
        assert not_offered.value.code == "BAD_ANSWER"
        assert rt.governance.get_pending(added.id).status == "pending"
        answered = rt.answer(added.id, "once", by="tester")
        assert (answered["status"], answered["answer"], answered["answered_by"]) == ("answered", "once", "tester")
        with pytest.raises(Conflict) as again:
            rt.answer(added.id, "refuse", by="someone else")
        assert again.value.code == "CONFLICT"
        stored = rt.governance.get_pending(added.id)
        assert (stored.status, stored.answer.value, stored.answered_by) == ("answered", "once", "tester")
        assert rt.governance.pending(run_id=run) == []
        assert [p.id for p in rt.governance.pending(None, run_id=run)] == [added.id]
        kinds = [e.kind for e in rt.journal.entries(run_id=run)]
        assert kinds.count("answer") == 1  # journaled once, by the first answer
        with pytest.raises(UnknownDecision) as unknown:
            rt.governance.get_pending("no-such-decision")
        assert unknown.value.code == "UNKNOWN_DECISION"


async def test_rules_and_consents_reach_the_view(open_home) -> None:
    async with open_home() as rt:
        agent = f"agent-{uuid.uuid4().hex[:8]}"
        rule = rt.governance.add_rule("shell", Effect.DENY, prefix="rm", agent=agent, by="tester")
        assert (rule.tool, rule.effect, rule.prefix, rule.agent) == ("shell", Effect.DENY, "rm", agent)
        assert rt.governance.get_rule(rule.id) == rule
        assert rule.id in [r.id for r in rt.governance.rules()]
        assert rule.id in [r.id for r in rt.governance.view().rules]
        consent = rt.governance.grant_consent(agent, Family.WRITE, by="tester")
        assert (consent.agent, consent.family) == (agent, Family.WRITE)
        assert (agent, Family.WRITE) in rt.governance.view().consents
        assert (agent, Family.WRITE) in [(c.agent, c.family) for c in rt.governance.consents()]

        rt.governance.revoke_consent(agent, Family.WRITE, by="tester")
        assert (agent, Family.WRITE) not in rt.governance.view().consents
        rt.governance.remove_rule(rule.id, by="tester")
        assert rule.id not in [r.id for r in rt.governance.view().rules]
        with pytest.raises(UnknownRule) as unknown:
            rt.governance.get_rule(rule.id)
        assert unknown.value.code == "UNKNOWN_RULE"
        with pytest.raises(BadInput) as bad:
            rt.governance.add_rule("shell", "perhaps", agent=agent, by="tester")
        assert bad.value.code == "BAD_INPUT"
        assert rt.governance.view().readable and rt.governance.policy_state().status
        assert rt.governance.developer_mode() is rt.governance.developer_mode_state().enabled
