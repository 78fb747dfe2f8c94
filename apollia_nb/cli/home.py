"""``apollia-os home repair``: replace a lost or damaged file of the home on purpose, journaled.

A home refuses to start when a file its journal records is missing or cannot
be opened (``HOME_FILE_MISSING``, ``HOME_FILE_CORRUPT``, ``HOME_KEY_MISMATCH``).
The first remedy is always to restore the file from a backup. When there is
none, one of these makes the loss explicit and records it in the journal:

``--new-runtime-db``
    an empty ``runtime.db`` (registered agents, tasks and sessions are gone);
    the waiting decisions of the lost tasks are answered ``refuse``, journaled.
``--new-governance-db``
    an empty ``governance.db`` (fine rules, standing consents, developer mode
    and pending decisions are gone); until then governance fails closed.
``--archive-journal``
    the journal and its key are moved to ``archive/journal-<time>/`` and a new
    chain starts with a new key, its first entry naming the archived chain's
    head. This is the only way to a new key: a new key is never put on an old
    chain, because entries it signed could not be told from forged ones.
``--lost-entries``
    the journal holds fewer entries than it acknowledged (``JOURNAL_TRUNCATED``:
    ``journal.log`` cut, or a stored checkpoint larger than what is left). Alone
    it only says what is lost (which seqs, which runs) and changes nothing; with
    ``--yes`` it records the loss in the journal — one signed ``entry_lost``
    entry for each seq known lost, then a ``home_repaired`` entry naming the
    range, the cut and the checkpoints that covered lost entries — so no seq is
    ever given twice and ``audit verify`` shows the loss, then the home starts.

A damaged file is moved aside (``<name>.damaged-<time>``), never deleted or
overwritten. Every repair owns the home (``HOME_LOCKED`` while another
process does) and refuses when there is nothing to repair.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from apollia_nb.cli.common import emit

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    home = sub.add_parser("home", help="the home's files: repair one that is missing or damaged")
    hsub = home.add_subparsers(dest="home_command", metavar="ACTION", required=True)
    p = hsub.add_parser("repair", parents=[common],
                        help="replace a missing or damaged file on purpose (journaled); restore a backup if you have one")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--new-runtime-db", action="store_true",
                      help="start an empty runtime.db (agents, tasks and sessions are lost)")
    what.add_argument("--new-governance-db", action="store_true",
                      help="start an empty governance.db (rules, consents, developer mode, pending decisions are lost)")
    what.add_argument("--archive-journal", action="store_true",
                      help="move the journal and its key to archive/ and start a new chain with a new key")
    what.add_argument("--lost-entries", action="store_true",
                      help="the journal holds fewer entries than it acknowledged: say what is lost; "
                           "with --yes, record the loss in the journal so the home starts again")
    p.add_argument("--yes", action="store_true",
                   help="with --lost-entries: record the loss (without it, nothing is changed)")
    p.add_argument("--by", default=None, help="who makes the repair (default: the user name)")
    p.set_defaults(handler=_repair)


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _move_aside(path: Path) -> Path | None:
    """Rename ``path`` (and its DuckDB ``.wal``) to ``<name>.damaged-<time>``; None if absent."""
    if not path.exists() and not path.is_symlink():
        return None
    target = path.with_name(f"{path.name}.damaged-{_stamp()}")
    os.rename(path, target)
    wal = path.with_name(path.name + ".wal")
    if wal.exists():
        os.rename(wal, target.with_name(target.name + ".wal"))
    return target


def _repair(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home
    from apollia_nb.cli.common import who as _who

    with open_home(args) as backend:
        home = backend.home
        if not home.path.is_dir():
            from apollia_nb.errors import NotFound

            raise NotFound(f"no home at {home.path}")
        if args.yes and not args.lost_entries:
            from apollia_nb.errors import BadInput

            raise BadInput("--yes confirms --lost-entries; the other repairs need no confirmation")
        with backend.exclusive("`home repair`"):  # a served home: HOME_LOCKED, naming the server to stop
            if args.lost_entries:
                data = _lost_entries(home, _who(args), confirmed=args.yes)
            elif args.archive_journal:
                data = _archive_journal(home, _who(args))
            elif args.new_runtime_db:
                data = _new_runtime_db(home, _who(args))
            else:
                data = _new_governance_db(home, _who(args))
    emit(args, data, data["text"])
    return 0


def _new_runtime_db(home: Any, by: str) -> dict[str, Any]:
    from apollia_nb.errors import BadInput, HomeFileCorrupt
    from apollia_nb.journal import Journal
    from apollia_nb.journal.accounting import REPAIRED, read_home_record
    from apollia_nb.runtime.records import open_records

    journal = Journal.open(home)
    try:
        record = read_home_record(journal)
        if home.runtime_db.exists():
            try:
                open_records(home).close()
            except HomeFileCorrupt as exc:
                problem = exc.message
            else:
                raise BadInput(f"{home.runtime_db} opens: nothing to repair")
        elif record.runtime_db:
            problem = f"{home.runtime_db} is missing"
        else:
            raise BadInput(f"the journal records no runtime.db for {home.path}: nothing to repair "
                           "(the next start creates it)")
        moved = _move_aside(home.runtime_db)
        journal.append(REPAIRED, {"file": "runtime.db", "action": "new", "by": by, "problem": problem,
                                  "moved_to": str(moved) if moved else None})
        open_records(home).close()
        refused = _refuse_orphans(home, journal, record, by)
    finally:
        journal.close()
    kept = f"; the damaged file is {moved}" if moved else ""
    orphans = f"; refused {len(refused)} waiting decision(s) of lost tasks" if refused else ""
    return {"file": str(home.runtime_db), "action": "new", "moved_to": str(moved) if moved else None,
            "refused_decisions": refused,
            "text": f"started an empty {home.runtime_db} (journaled){kept}{orphans}"}


def _refuse_orphans(home: Any, journal: Any, record: Any, by: str) -> list[str]:
    """Answer ``refuse`` the waiting decisions of tasks that were in the lost ``runtime.db``.

    Their runs cannot resume, so nothing should stay listed as waiting for them.
    Each answer is journaled with its run first, as the runtime does. Skipped
    when governance cannot be read (it fails closed; nothing runs).
    """
    from apollia_nb.errors import GovernanceUnreadable
    from apollia_nb.governance.store import GovernanceStore

    store = GovernanceStore.open(home, journal, record=record)
    reason = "runtime.db was started empty by `apollia-os home repair`: the task is gone"
    done: list[str] = []
    try:
        waiting = [p for p in store.pending() if p.task_id is not None]
    except GovernanceUnreadable:
        return done
    finally:
        store.close()
    for p in waiting:
        journal.append("answer", {"call_id": p.call_id, "decision_id": p.id, "answer": "refuse",
                                  "answered_by": by, "reason": reason}, run_id=p.run_id, agent=p.agent)
        store.answer_pending(p.id, "refuse", by=by, reason=reason)
        done.append(p.id)
    return done


def _new_governance_db(home: Any, by: str) -> dict[str, Any]:
    from apollia_nb.errors import BadInput
    from apollia_nb.governance.store import GovernanceStore
    from apollia_nb.journal import Journal
    from apollia_nb.journal.accounting import read_home_record

    journal = Journal.open(home)
    try:
        record = read_home_record(journal)
        store = GovernanceStore(home, journal=journal, expect_db=record.governance_db,
                                expect_db_id=record.governance_id)
        problem = store.db_problem()
        if problem is None:
            raise BadInput(f"{home.governance_db} is the home's and reads: nothing to repair")
        moved = _move_aside(home.governance_db)
        store_id = store.replace_db(by=by, moved_to=moved)
    finally:
        journal.close()
    kept = f"; the old file is {moved}" if moved else ""
    return {"file": str(home.governance_db), "action": "new", "id": store_id, "problem": problem,
            "moved_to": str(moved) if moved else None,
            "text": f"started an empty {home.governance_db} (journaled; no rules, consents or developer mode){kept}"}


def _old_head(path: Path) -> dict[str, Any]:
    """The archived chain's head, read without writing (empty when it cannot be read)."""
    import duckdb

    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return {}
    try:
        row = con.execute("SELECT seq, hash, key_id FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    except duckdb.Error:
        return {}
    finally:
        con.close()
    return {"old_seq": int(row[0]), "old_head": bytes(row[1]).hex(), "old_key_id": row[2]} if row else {}


def _archive_journal(home: Any, by: str) -> dict[str, Any]:
    from apollia_nb.errors import BadInput
    from apollia_nb.governance.store import GovernanceStore
    from apollia_nb.journal import Journal
    from apollia_nb.journal.accounting import FILE_CREATED, REPAIRED
    from apollia_nb.journal.tail import tail_path

    db = home.journal_db
    files = [db, db.with_name(db.name + ".wal"), tail_path(db),
             home.keys_dir / "journal.key", home.keys_dir / "journal.pub"]
    present = [p for p in files if p.exists() or p.is_symlink()]
    if not present:
        raise BadInput(f"{home.path} has no journal or journal key: nothing to archive")
    head = _old_head(db) if db.exists() else {}
    dest = home.path / "archive" / f"journal-{_stamp()}"
    dest.mkdir(parents=True, exist_ok=False)
    for path in present:
        os.rename(path, dest / path.name)
    journal = Journal.open(home)  # a new chain with a new key
    try:
        journal.append(REPAIRED, {"action": "archive_journal", "archived_to": str(dest), "by": by, **head})
        if home.runtime_db.exists():
            journal.append(FILE_CREATED, {"file": "runtime.db"})
        GovernanceStore.open(home, journal).close()  # records governance.db as it is
        key_id = journal.key_id
    finally:
        journal.close()
    return {"archived_to": str(dest), "files": [p.name for p in present], "key_id": key_id, **head,
            "text": f"archived {', '.join(p.name for p in present)} to {dest}; a new journal starts with key "
                    f"{key_id} (its first entry names the archived chain)"}


def _runs_of_runtime_db(home: Any) -> dict[str, dict[str, str]]:
    """The runs ``runtime.db`` records (tasks and chat sessions), by run id, read without writing;
    empty when it is missing or cannot be read (it is a witness here, not needed)."""
    import json

    import duckdb

    if not home.runtime_db.exists():
        return {}
    runs: dict[str, dict[str, str]] = {}
    try:
        con = duckdb.connect(str(home.runtime_db), read_only=True)
    except duckdb.Error:
        return {}
    try:
        for table, what in (("tasks", "task"), ("sessions", "session")):
            try:
                rows = con.execute(f"SELECT id, record FROM {table}").fetchall()
            except duckdb.Error:
                continue
            for ident, record in rows:
                try:
                    run_id = json.loads(record).get("run_id")
                except (ValueError, AttributeError):
                    continue
                if isinstance(run_id, str):
                    runs[run_id] = {"run_id": run_id, what: str(ident)}
    finally:
        con.close()
    return runs


def _lost_entries(home: Any, by: str, *, confirmed: bool) -> dict[str, Any]:
    """Say what the journal lost (which seqs, which runs); with ``confirmed``, record it and let the home start."""
    from apollia_nb.errors import BadInput, NotFound
    from apollia_nb.journal import Journal
    from apollia_nb.journal.store import examine_loss

    if not home.journal_db.exists():
        raise NotFound(f"no journal at {home.journal_db}")
    loss = examine_loss(home.journal_db)
    if not loss["problems"]:
        raise BadInput(f"the journal in {home.path} holds every entry it acknowledged: nothing to repair")
    recorded = _runs_of_runtime_db(home)
    kept = set(loss["kept_runs"])
    runs = sorted(
        [{"run_id": r, "lost": "its end (no run_seal kept)"} for r in loss["open_runs"]]
        + [{**info, "lost": "all of it (runtime.db records it, the journal keeps none of its entries)"}
           for r, info in recorded.items() if r not in kept],
        key=lambda run: run["run_id"])
    lost = loss["lost"]
    said = [f"the journal keeps entries 1..{loss['kept']}"]
    if lost:
        witnesses = []
        if loss["checkpoints"]:
            witnesses.append(f"stored checkpoint(s) of size {', '.join(map(str, loss['checkpoints']))} covered them")
        if loss["cut_seen"]:
            witnesses.append(f"the cut record of journal.log still shows entry {loss['cut_seen']}")
        said.append(f"entries {lost[0]}..{lost[1]} were acknowledged and are gone ({'; '.join(witnesses)})")
    if loss["cut"]:
        said.append(f"journal.log was cut after entry {loss['cut_after']}: entries committed after the cut, "
                    "beyond those, left no trace and cannot be counted")
    if runs:
        said.append("runs that lost entries: " + "; ".join(f"{r['run_id']} ({r['lost']})" for r in runs))
    data: dict[str, Any] = {"action": "lost_entries", "kept": loss["kept"], "lost": lost, "cut": loss["cut"],
                            "cut_after": loss["cut_after"], "checkpoints": loss["checkpoints"], "runs": runs,
                            "problems": loss["problems"], "recorded": False}
    if not confirmed:
        data["text"] = ("\n".join(said) + "\nnothing was changed; to record this loss in the journal and start the "
                        f"home again, run `apollia-os home repair --lost-entries --yes --home {home.path}`")
        return data
    journal = Journal.open(home, record_loss={"by": by, "runs": runs})
    try:
        journal.checkpoint()
        head = journal.head()[0]
    finally:
        journal.close()
    markers = lost[1] - lost[0] + 1 if lost else 0
    data.update(recorded=True, record_seq=head,
                text="\n".join(said) + f"\nrecorded: {markers} `entry_lost` entr{'y' if markers == 1 else 'ies'} "
                     f"and the repair record at seq {head}; no seq is given twice, and `apollia-os audit verify` "
                     "shows the loss")
    return data
