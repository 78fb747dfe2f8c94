"""A ``runtime.db`` that lost acknowledged changes with its write-ahead log refuses to start, naming them.

Real processes, real files: a child acknowledges something (an agent registered, a session opened, a memory
saved, a batch recorded, an ``Idempotency-Key`` answered) and is killed with SIGKILL right after (by itself,
or at a fault point of ``apollia-os serve``); the home's ``runtime.db.wal`` is then removed or cut, so
``runtime.db`` opens as it was at its last checkpoint. Only tasks are rebuilt from the journal
(test_runtime_wal_loss.py); the loss of anything else is ``HOME_FILE_ROLLED_BACK`` with the way on.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from apollia_nb.errors import HomeFileRolledBack
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest
from test_acknowledged_durable import Served, cli
from test_runtime_wal_loss import REGISTER, _child, _lose_wal

KEEPER = manifest("keeper", actor=[{"tool_calls": [call("memory_save", key="colour", value="green")]},
                                   {"text": "Saved."}])

#: What each child acknowledges before it kills itself, and the words the refusal names it by.
ACKNOWLEDGED = {
    "agent": (f"await rt.register_agent({manifest('late', actor=[{'text': 'Hi.'}])!r})",
              "agent registrations"),
    "session": ('rt.sessions.open("sayer")\nawait rt.committed()', "chat sessions"),
    "memory": (f"await rt.register_agent({KEEPER!r})\nhandle = await rt.submit('keeper', 'Keep it')\nawait handle\n"
               "assert handle.status == 'completed', handle.error", "agents' memory"),
    "batch": ("await rt.batch('clerk', [{'n': 1}, {'n': 2}], goal='Write item {n}', concurrency=1)",
              "batches"),
}


@pytest.fixture
def places(tmp_path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    return tmp_path / "home", work


def _acknowledged_then_killed(body: str, home: Path, work: Path) -> None:
    assert _child(REGISTER, home, work).returncode == 0  # closed: its agents are checkpointed
    killed = _child(body + "\nos.kill(os.getpid(), signal.SIGKILL)", home, work)
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def _cut_wal(home: Path) -> None:
    wal = home / "runtime.db.wal"
    size = wal.stat().st_size
    assert size > 0
    with open(wal, "r+b") as f:
        f.truncate(size // 2)


@pytest.mark.anyio
@pytest.mark.timeout(240)
@pytest.mark.parametrize("what, lose", [*((what, _lose_wal) for what in sorted(ACKNOWLEDGED)), ("agent", _cut_wal)])
async def test_a_runtime_db_that_lost_what_it_acknowledged_with_its_wal_refuses_to_start_naming_it(
        places, what, lose):
    home, work = places
    body, words = ACKNOWLEDGED[what]
    _acknowledged_then_killed(body, home, work)
    lose(home)  # removed, or cut in half
    with pytest.raises(HomeFileRolledBack) as refused:
        await Runtime.open(home)
    message = refused.value.message
    assert refused.value.code == "HOME_FILE_ROLLED_BACK" and words in message, message
    assert "runtime.db.wal" in message and "home repair --new-runtime-db" in message
    with pytest.raises(HomeFileRolledBack):  # refused again: nothing was changed by the refusal
        await Runtime.open(home)


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_a_wal_kept_whole_after_a_kill_loses_nothing_and_starts(places):
    home, work = places
    _acknowledged_then_killed(ACKNOWLEDGED["memory"][0], home, work)
    async with Runtime(home) as rt:  # the log is replayed: everything acknowledged is there
        assert {a.name for a in rt.agents()} >= {"keeper", "sayer", "clerk"}
        assert rt.records.memory_get("keeper") == {"colour": "green"}


@pytest.mark.timeout(240)
def test_a_refused_runtime_db_is_replaced_on_purpose_by_home_repair_and_the_home_starts(places):
    home, work = places
    _acknowledged_then_killed(ACKNOWLEDGED["agent"][0], home, work)
    _lose_wal(home)
    listed = cli("agents", "list", home=home, work=work)
    assert listed.returncode == 3 and "HOME_FILE_ROLLED_BACK" in listed.stderr, listed.stdout + listed.stderr
    repaired = cli("home", "repair", "--new-runtime-db", home=home, work=work)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert [p.name for p in home.glob("runtime.db.damaged-*")] != []
    listed = cli("agents", "list", "--json", home=home, work=work)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stdout + listed.stderr


@pytest.mark.timeout(240)
def test_a_served_home_that_lost_an_idempotency_keys_answer_refuses_to_start(places):
    home, work = places
    srv = Served(home, work, fault="submit.after_commit:kill")
    rule = {"tool": "bash_executor", "effect": "deny", "prefix": "rm"}
    assert srv.api.post("/governance/rules", json=rule, headers={"Idempotency-Key": "k-1"}).status_code == 201
    assert srv.api.post("/agents", json={"manifest": REGISTER_SAYER}).status_code == 201
    with pytest.raises(httpx.TransportError):  # killed once the task is recorded, before its 202
        srv.api.post("/tasks", json={"agent": "sayer", "goal": "Say it"})
    assert srv.died() == -signal.SIGKILL
    _lose_wal(home)
    started = cli("serve", "--port", "0", home=home, work=work)  # refuses at once: it never listens
    assert started.returncode == 3 and "HOME_FILE_ROLLED_BACK" in started.stderr, started.stdout + started.stderr
    assert "Idempotency-Key answers" in started.stderr


REGISTER_SAYER = manifest("sayer", actor=[{"text": "Said."}])
