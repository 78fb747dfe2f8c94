"""Tasks ``runtime.db`` acknowledged and then lost with its write-ahead log, found and rebuilt from the journal.

DuckDB keeps a commit in ``runtime.db.wal`` until a checkpoint copies it into
``runtime.db``. When the log is lost, every row committed since the last
checkpoint goes with it and the file still opens, as it was then. So the
journal keeps a record of every submission (``task_submitted``, appended by the
owner once the task's row is committed and before ``submit`` answers: its id,
run, agent, goal and how it was to run), and ``runtime.db`` keeps a mark: the
journal's head up to which every submitted task was found in it. At each start
the owner reads the ``task_submitted`` entries after the mark; one whose task
has no row was acknowledged and lost.

Each lost task gets its row again, rebuilt from its submission, and the
restart treats it as it treats every task it finds unfinished (``recovery`` in
``tasks.py``): a run the journal sealed takes the seal's status (and a
completed one its answer); one that was opened and not sealed fails
``INTERRUPTED`` (what it did is in the journal, its steps and its model's place
are not), and its decisions still pending are answered ``refuse`` by
``restart``; one never opened starts when it was unattended (it was queued) and
fails ``INTERRUPTED`` when it was watched, as after any restart. A lost task of
an agent whose registration was lost too (no row for the agent) cannot run
here: it fails ``INTERRUPTED`` naming the agent, its run is sealed, its
pending decisions are refused. The rebuild is journaled (``home_repaired``,
``action`` ``rebuilt_tasks``) and told as a warning; then the mark moves to the
head.

A home whose ``runtime.db`` was replaced on purpose (``home repair
--new-runtime-db``, journaled) or first made is read from that entry on: the
tasks before it belonged to another file. Submissions a client kernel makes to a
served home run in that kernel and are not journaled here (its tasks are not in
the server's ``runtime.db``), so the governance database's pending decisions
alone never make a task lost: a decision's ``task_id`` may be a client's.

``lost_submissions`` and ``rebuilt_record`` are pure; ``journal_submitted`` and
``rebuild_lost_tasks`` are the edges.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apollia_nb.errors import ApolliaError, Interrupted
from apollia_nb.runtime.states import TaskStatus
from apollia_nb.runtime.tasks import new_task_record

__all__ = ["SUBMITTED", "REBUILT", "LostTask", "lost_submissions", "rebuilt_record", "submitted_payload",
           "journal_submitted", "rebuild_lost_tasks"]

#: The journal entry of an acknowledged submission.
SUBMITTED = "task_submitted"
#: ``home_repaired``'s ``action`` when lost tasks were rebuilt.
REBUILT = "rebuilt_tasks"
#: The note a rebuilt task carries among its warnings.
NOTE = ("runtime.db lost this task's record with its write-ahead log; the record was rebuilt from the "
        "journal at the next start (what the run did is in the journal)")
_READ_KINDS = (SUBMITTED, "home_file_created", "home_repaired")


@dataclass(frozen=True)
class LostTask:
    """A submission the journal holds and ``runtime.db`` does not: the entry's seq, run and agent, its payload."""

    seq: int
    task_id: str
    run_id: str | None
    agent: str | None
    payload: Mapping[str, Any]


def submitted_payload(record: Mapping[str, Any]) -> dict[str, Any]:
    """A new task's record (as ``runtime.db`` stores it) → the ``task_submitted`` payload."""
    return {"task_id": record["id"], "run_id": record["run_id"], "goal": record["goal"],
            "watched": record["watched"], "grants": list(record["grants"]),
            "max_steps": record["budget"]["ceiling"], "approve_plan": record["approve_plan"],
            "warnings": list(record["warnings"]), "created_at": record["created_at"]}


def _starts_runtime_db(kind: str, payload: Mapping[str, Any]) -> bool:
    """An entry after which the home's ``runtime.db`` is a new file (made, or replaced on purpose)."""
    if payload.get("file") != "runtime.db":
        return False
    return kind == "home_file_created" or (kind == "home_repaired" and payload.get("action") == "new")


def lost_submissions(entries: Iterable[tuple[int, str, str | None, str | None, Mapping[str, Any]]],
                     missing: Callable[[list[str]], set[str]]) -> list[LostTask]:
    """Pure: the entries read after the mark (``(seq, kind, run_id, agent, payload)``, in seq order) and
    ``missing`` (the task ids given, those with no row) → the lost submissions, oldest first.

    A submission before the entry that made or replaced ``runtime.db`` belonged to another file."""
    found: dict[str, LostTask] = {}
    for seq, kind, run_id, agent, payload in entries:
        if _starts_runtime_db(kind, payload):
            found.clear()
        elif kind == SUBMITTED and isinstance(payload.get("task_id"), str):
            found[payload["task_id"]] = LostTask(seq, payload["task_id"], payload.get("run_id") or run_id,
                                                 agent, payload)
    gone = missing(list(found))
    return [lost for lost in found.values() if lost.task_id in gone]


def _submitted_fields(lost: LostTask) -> dict[str, Any] | None:
    """What ``new_task_record`` needs, read from the payload; None when a field does not read (an erased
    goal, a payload of another shape): such a task cannot run again."""
    p = lost.payload
    ceiling = p.get("max_steps")
    fields = {"goal": p.get("goal"), "watched": p.get("watched"), "grants": p.get("grants"),
              "approve_plan": p.get("approve_plan"), "warnings": p.get("warnings", []),
              "created_at": p.get("created_at")}
    if not (isinstance(lost.run_id, str) and isinstance(lost.agent, str) and isinstance(fields["goal"], str)
            and fields["goal"].strip() and isinstance(fields["watched"], bool)
            and isinstance(fields["approve_plan"], bool) and isinstance(fields["created_at"], str)
            and isinstance(fields["grants"], list) and all(isinstance(g, str) for g in fields["grants"])
            and isinstance(fields["warnings"], list) and all(isinstance(w, str) for w in fields["warnings"])
            and isinstance(ceiling, int) and not isinstance(ceiling, bool) and ceiling >= 1):
        return None
    return {**fields, "ceiling": ceiling}


def rebuilt_record(lost: LostTask, *, agent_known: bool, opened: bool, sealed: Mapping[str, Any] | None,
                   result: Any, at: str) -> tuple[dict[str, Any], str | None]:
    """Pure: a lost task's row again, and the reason it ends here (None: it does not, or it ended already).

    A run the journal sealed takes the seal's status (a completed one the actor's last answer,
    ``result``). A task that cannot be taken up ends ``failed`` ``INTERRUPTED`` with the reason: its
    submission does not read back, its agent was lost too, or its run was open (its steps and its
    model's place were in the lost record). A task never opened is ``pending`` as submitted: the
    restart's rules for a task it finds unfinished apply (unattended, it starts)."""
    fields = _submitted_fields(lost)
    why: str | None = None
    if fields is None:
        why = "runtime.db lost this task's record and its submission in the journal does not read back"
    elif not agent_known:
        why = (f"runtime.db lost this task's record and the registration of its agent {lost.agent!r} with it; "
               "register the agent again and submit the task again")
    elif opened:
        why = ("runtime.db lost this task's record while its run was open (its write-ahead log was lost): "
               "its steps and its model's place are gone; what the run did is in the journal")
    base = fields or {"goal": "", "watched": True, "grants": [], "approve_plan": False, "warnings": [],
                      "created_at": at, "ceiling": 1}
    record = new_task_record(task_id=lost.task_id, run_id=str(lost.run_id or ""), agent=str(lost.agent or ""),
                             goal=base["goal"], ceiling=base["ceiling"], watched=base["watched"],
                             grants=list(base["grants"]), approve_plan=base["approve_plan"],
                             warnings=[*base["warnings"], NOTE], created_at=base["created_at"])
    record["updated_at"] = at
    ended = TaskStatus.COMPLETED.value, TaskStatus.FAILED.value, TaskStatus.CANCELLED.value
    if sealed is not None and sealed.get("status") in ended:
        record.update(status=sealed["status"], error=sealed.get("error"), phase="done")
        if sealed["status"] == TaskStatus.COMPLETED.value:
            record["result"] = result
        return record, None
    if why is not None:
        record.update(status=TaskStatus.FAILED.value, error=Interrupted(why).to_dict(), phase="done")
    return record, why


def _payload(entry: Any) -> dict[str, Any]:
    try:
        value = json.loads(bytes(entry.payload).decode("utf-8"))
    except (ValueError, TypeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


# --- the edges ------------------------------------------------------------------------------------

async def journal_submitted(rt: Any, record: dict[str, Any]) -> None:
    """After the new task's row is committed, before ``submit`` answers: its ``task_submitted`` entry.

    The owner's only (a client's tasks live in its own process). When the journal refuses it, the row
    is written ``failed`` with the journal's error before the error is raised: the caller is told the
    task was not submitted, and no restart runs it."""
    if getattr(rt, "mode", "owner") != "owner":
        return
    try:
        await rt.journal.append_async(SUBMITTED, submitted_payload(record), agent=record["agent"])
    except BaseException as exc:
        error = exc if isinstance(exc, ApolliaError) else ApolliaError(f"{type(exc).__name__}: {exc}")
        failed = {**record, "status": TaskStatus.FAILED.value, "phase": "done", "updated_at": rt.now_iso(),
                  "error": {"code": error.code, "message": f"the submission could not be journaled: {error.message}"}}
        rt.records.save_task(failed, failed["updated_at"])
        raise


def _read_after_mark(rt: Any) -> tuple[list[tuple[int, str, str | None, str | None, dict[str, Any]]], int, str]:
    """The entries of ``_READ_KINDS`` after the mark (all of them when the mark is not this journal's),
    and the head they were read up to."""
    seq, digest = rt.journal.head()
    mark = rt.records.journal_mark()
    since = 0
    if mark is not None and 0 < mark[0] <= seq:
        at = rt.journal.entries(since_seq=mark[0] - 1, limit=1)
        if at and at[0].seq == mark[0] and bytes(at[0].hash).hex() == mark[1]:
            since = mark[0]
    rows = [(e.seq, e.kind, e.run_id, e.agent, _payload(e))
            for e in rt.journal.entries(since_seq=since, kinds=list(_READ_KINDS)) if e.seq <= seq]
    return rows, seq, bytes(digest).hex()


async def rebuild_lost_tasks(rt: Any) -> list[dict[str, Any]]:
    """At the owner's start, after its agents are registered and before its tasks are restored: find the
    tasks ``runtime.db`` lost (see the module), give each its row again, journal and tell the rebuild,
    and move the mark. Returns what was rebuilt (``task_id``, ``run_id``, ``agent``, ``found``)."""
    if getattr(rt, "mode", "owner") != "owner":
        return []
    entries, head, digest = _read_after_mark(rt)
    lost = lost_submissions(entries, rt.records.missing_tasks)
    rebuilt: list[dict[str, Any]] = []
    if lost:
        agents = {row["name"] for row in rt.records.agents()}
        missing_agents: set[str] = set()
        for task in lost:
            trace = rt.journal.entries(run_id=task.run_id, kinds=["run_open", "model_response", "run_seal"]) \
                if isinstance(task.run_id, str) else []
            kinds = [(e.kind, _payload(e)) for e in trace]
            seals = [p for k, p in kinds if k == "run_seal"]
            answers = [p.get("text") for k, p in kinds
                       if k == "model_response" and p.get("role") == "actor" and not p.get("tool_calls")]
            opened = any(k == "run_open" for k, _ in kinds)
            found = "sealed" if seals else "opened" if opened else "submitted"
            known = task.agent in agents
            record, why = rebuilt_record(task, agent_known=known, opened=opened,
                                         sealed=seals[-1] if seals else None,
                                         result=answers[-1] if answers else None, at=rt.now_iso())
            if not known and isinstance(task.agent, str):
                missing_agents.add(task.agent)
            if record["status"] != TaskStatus.PENDING.value:  # ends here: the run first, then the row (a
                # crash between leaves the row lost again, and the next start finds the run ended)
                await _close_run(rt, task, record, why or "its run ended before its record was lost",
                                 opened=opened, sealed=bool(seals))
            await _saved(rt, record)
            rebuilt.append({"task_id": task.task_id, "run_id": task.run_id, "agent": task.agent, "found": found,
                            "status": record["status"]})
        said = ", ".join(f"{r['task_id']} ({r['found']})" for r in rebuilt)
        gone = f"; agents whose registration was lost with it: {', '.join(sorted(missing_agents))}" \
            if missing_agents else ""
        problem = (f"runtime.db held no record of {len(rebuilt)} task(s) the journal records as submitted "
                   f"(its write-ahead log was lost){gone}")
        await rt.journal.append_async("home_repaired", {
            "file": "runtime.db", "action": REBUILT, "by": "restart", "problem": problem, "tasks": rebuilt,
            "agents_lost": sorted(missing_agents)})
        rt.events.emit("warning", f"{problem}; rebuilt from the journal: {said}")
    if any(kind == SUBMITTED for _, kind, _, _, _ in entries):  # else the mark vouches for as much already
        rt.records.keep_journal_mark(head, digest)
    return rebuilt


async def _saved(rt: Any, record: dict[str, Any]) -> None:
    import asyncio

    done = rt.records.save_task(record, record["updated_at"], acknowledged=True)
    await asyncio.wrap_future(done)


async def _close_run(rt: Any, task: LostTask, record: dict[str, Any], why: str, *, opened: bool,
                     sealed: bool) -> None:
    """A rebuilt task that ends here: its decisions still pending answered ``refuse`` by ``restart``
    (nothing waits for an answer no run would act on), then its run sealed when it was opened and not yet."""
    from apollia_nb.errors import GovernanceUnreadable

    if not isinstance(task.run_id, str):
        return
    try:
        still_open = rt.governance.pending(run_id=task.run_id)
    except GovernanceUnreadable:
        still_open = []  # fail closed: they stay listed, and an answer to one runs nothing (its task has ended)
    for p in still_open:
        try:
            rt.answer(p.id, "refuse", by="restart", reason=why)
        except ApolliaError as exc:
            rt.events.emit("warning", f"decision {p.id} of task {task.task_id}: {exc.message}")
    if opened and not sealed:
        error = record["error"]
        await rt.journal.seal_async(task.run_id, task.agent, [
            ("task_status", {"task_id": task.task_id, "status": record["status"], "error": error})],
            {"status": record["status"], "error": error})
