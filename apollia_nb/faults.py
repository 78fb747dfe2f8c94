"""Named fault points: crash a process at an exact place, for crash tests.

Code that acknowledges something (an answer, a submission, a suspension) marks
the windows where a crash matters with ``point("name")``. A point does nothing
unless the environment variable ``APOLLIA_FAULT`` names it when the process
starts::

    APOLLIA_FAULT=decide.after_commit:kill apollia-os serve --home ...

``NAME:kill`` sends the process SIGKILL at that point (no cleanup, no flush:
what is committed is all the next process finds); ``NAME:raise`` raises
``FaultInjected`` there; ``NAME:full`` raises the ``OSError`` of a full disk
(``ENOSPC``) there, as the write that follows the point would. Several points
are separated by commas. The variable
is read once, at import: an unset variable costs one dictionary test per point.

The points (see docs/runtime.md):

* ``answer.after_journal`` — an answer is journaled, governance.db not yet written (``full``: it refuses it);
* ``answer.after_commit`` — the answer is stored, its ``always`` consent or rule not yet;
* ``answer.before_resume`` — the answer is fully recorded, its run not yet resumed;
* ``answer.after_key`` — ``POST /pending-decisions/decide`` with an ``Idempotency-Key``: the key (taken while the
  answer waited for its group) is committed, the answer not yet journaled;
* ``decide.after_commit`` — ``POST /pending-decisions/decide``: recorded, the 200 not yet sent;
* ``decide.after_response`` — the 200 was sent, the run has not resumed;
* ``resume.after_running`` — a resumed run journaled ``task_status running``, its call not yet made;
* ``submit.after_commit`` — a task is recorded, the run not started and the submission not answered;
* ``suspend.before_record`` — a run opened its pending decision, its suspension not yet recorded;
* ``suspend.after_record`` — a suspension is recorded, nobody told yet.
* ``run.after_seal`` — a run's ``run_seal`` is journaled, its row in runtime.db not yet written.
* ``journal.before_frontier`` — committed entries are being copied into journal.db, their
  head and Merkle frontier not yet written (one transaction: a crash commits neither).
* ``journal.after_copy`` — the copier committed a copy into journal.db; the log still holds those
  entries (and whatever the writer committed meanwhile), and the copy is not yet counted as done.
* ``journal.after_piece`` — a copy into journal.db larger than one piece committed a piece (its entries and
  the frontier of that prefix); the later pieces are only in the log.
* ``route.before_settle`` — a writing REST route carried out its request; the rows it changed in runtime.db
  are not yet confirmed committed (``full``: runtime.db refuses them), its key's answer not yet recorded;
* ``calls.after_commit`` — ``POST /internal/calls``: a client's call is decided and journaled, its answer not yet sent;
* ``idempotency.before_finish`` — a writing REST route's request is carried out and durable, the answer of
  its ``Idempotency-Key`` not yet recorded (``full``: runtime.db refuses that answer);
* ``verify.signature_worker`` — a journal verification's signature worker has started, checked nothing yet
  (the verification checks its signatures in process and says so in the report's notes).
* ``scrub.before_rename`` — a DuckDB file's compacted copy is written and synced beside it
  (``journal.db.scrub``), not yet renamed over it (``journal/scrub.py``; ``full``: it is refused, the old file kept);
* ``scrub.after_rename`` — the compacted copy replaced the file, the folder not yet synced;
* ``scrub.log_before_rename`` — ``journal.log``'s rewrite is written and synced beside it, not yet renamed over it;
* ``scrub.log_after_rename`` — the rewrite replaced ``journal.log``, the folder not yet synced.
"""

from __future__ import annotations

import errno
import os
import signal

__all__ = ["ENV", "FaultInjected", "point", "parse"]

ENV = "APOLLIA_FAULT"
_ACTIONS = ("kill", "raise", "full")


class FaultInjected(RuntimeError):
    """Raised at a fault point armed with ``raise``."""


def parse(value: str) -> dict[str, str]:
    """``"a:kill,b:raise"`` → ``{"a": "kill", "b": "raise"}``; an unknown action is an error."""
    armed: dict[str, str] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, action = item.partition(":")
        action = action.strip() or "kill"
        if action not in _ACTIONS:
            raise ValueError(f"{ENV}: {item!r}: the action must be one of {', '.join(_ACTIONS)}")
        armed[name.strip()] = action
    return armed


_ARMED = parse(os.environ.get(ENV, ""))


def point(name: str) -> None:
    """A named place where a test may crash this process (see the module's text)."""
    if not _ARMED:
        return
    action = _ARMED.get(name)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise FaultInjected(f"fault point {name}")
    elif action == "full":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"fault point {name}")
