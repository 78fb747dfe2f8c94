"""Approvals bound to the action: what exactly a person approved, until when, and who may approve.

Pure: values in, values out; the runtime (``runtime/runtime.py``, ``runtime/governed.py``) reads
the clock, the policy and the journal and hands them here.

* **The digest of what was shown.** A card shows a call: its tool, its arguments as shown (the parts
  its schema marks sensitive and every known secret redacted), its agent, run, call and card id.
  ``action_digest`` is the SHA-256 of the canonical JSON of exactly those (``sha256:<hex>``); the
  answer's journal entry carries it (``digest``), so an auditor can recompute it from the ``decision``
  entry and check that what was approved is what ran. A plan approval digests the plan's steps, its
  task, run and agent (``plan_digest``). An answer may name the digest it answers: another one is
  refused (``STALE_APPROVAL``), since the person saw something else.
* **Single use, with an expiry.** An approval answers one card, and a card is one call: it is never
  carried over to another call (a retry of the call asks again). It may carry an expiry
  (``expires_in`` seconds or ``expires_at``): a call that would run after it is refused, and the
  refusal is journaled.
* **Four eyes and several approvers.** The organisation policy may require, per family or tool, that
  the approval comes from a person other than the one who started the run (``four_eyes = true``), or
  from N distinct people (``approvers = N``); ``requirement`` reads what applies to a call, ``refusal``
  says why a person may not approve, ``may_answer`` what a card shows of who may answer it. A refusal
  needs one person with the role: any deny ends the card.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from apollia_nb.errors import BadInput

__all__ = ["Requirement", "APPROVING", "OWNER", "local_person", "person_key", "action_digest", "plan_digest", "requirement", "refusal", "may_answer",
           "expiry", "expired", "MAX_EXPIRY_SECS"]

#: Answers that approve (a refusal is not an approval).
APPROVING = frozenset({"once", "always"})
#: The longest expiry an approval may carry (one year).
MAX_EXPIRY_SECS = 366 * 24 * 3600.0


def _digest(value: dict[str, Any]) -> str:
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=str).encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def action_digest(*, decision_id: str, run_id: str, agent: str, tool: str, call_id: str | None,
                  arguments: Any) -> str:
    """The digest of a call as its card shows it (``arguments``: as shown, redacted)."""
    return _digest({"card": decision_id, "run_id": run_id, "agent": agent, "tool": tool,
                    "call_id": call_id or "", "arguments": arguments})


def plan_digest(*, task_id: str, run_id: str, agent: str, steps: Sequence[str]) -> str:
    """The digest of a plan as shown for approval: its steps in order, its task, run and agent."""
    return _digest({"task_id": task_id, "run_id": run_id, "agent": agent, "steps": list(steps)})


@dataclass(frozen=True)
class Requirement:
    """Who must approve a call: another person than the run's starter (``four_eyes``), and how many
    distinct people (``approvers``)."""

    four_eyes: bool = False
    approvers: int = 1

    @property
    def plain(self) -> bool:
        return not self.four_eyes and self.approvers <= 1


def requirement(approvals: Sequence[tuple[str, str, bool, int]], tool: str, family: str | None) -> Requirement:
    """What the policy's approval entries (``(kind, name, four_eyes, approvers)``, kind ``tool`` or
    ``family``) require of a call of ``tool`` in ``family``: every entry that names either applies,
    the strictest wins."""
    four, count = False, 1
    for kind, name, four_eyes, approvers in approvals:
        if (kind == "tool" and name == tool) or (kind == "family" and family is not None and name == family):
            four = four or four_eyes
            count = max(count, approvers)
    return Requirement(four, count)


#: The home's owner, as the owner token names them.
OWNER = "owner"


def person_key(name: str | None, local: str | None) -> str | None:
    """One name per person, for four eyes: the home's owner acts as the local user (``local``: in the
    kernel or CLI that owns the home) or with the owner token (``owner``); both are the owner."""
    return OWNER if name is not None and name in (OWNER, local) else name


def refusal(req: Requirement, *, started_by: str | None, by: str, approved_by: Sequence[str],
            local: str | None = None) -> str | None:
    """Why ``by`` may not approve (None: they may). ``approved_by``: who approved the card already;
    ``local``: the local user, who is the home's owner (``person_key``)."""
    if req.four_eyes and started_by is not None and person_key(by, local) == person_key(started_by, local):
        return (f"four eyes: {by} started this run and may not approve its calls; "
                "another person with the approver role must")
    if person_key(by, local) in {person_key(a, local) for a in approved_by}:
        return f"{by} approved this already; {req.approvers} distinct people must approve it"
    return None


def may_answer(req: Requirement, *, started_by: str | None, approved_by: Sequence[str]) -> dict[str, Any]:
    """What a card shows of who may answer it."""
    excluded = sorted({*([started_by] if req.four_eyes and started_by else []), *approved_by})
    return {"roles": ["approver"], "four_eyes": req.four_eyes, "started_by": started_by,
            "excluded": excluded, "approvers": req.approvers, "approved_by": list(approved_by),
            "approvals_needed": max(req.approvers - len(approved_by), 0)}


def _utc_iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat().replace("+00:00", "Z")


def expiry(now: float, *, expires_in: Any = None, expires_at: Any = None) -> str | None:
    """When an approval given at ``now`` (epoch seconds) ends, as UTC ISO text, or None: it does not.
    ``expires_in``: seconds from now; ``expires_at``: an ISO 8601 time with its offset. Not both;
    one in the past, not positive or more than a year away is ``BAD_INPUT``."""
    if expires_in is not None and expires_at is not None:
        raise BadInput("give expires_in or expires_at, not both")
    if expires_in is not None:
        if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or not math.isfinite(expires_in) \
                or expires_in <= 0:
            raise BadInput(f"expires_in must be a positive number of seconds, not {expires_in!r}")
        if expires_in > MAX_EXPIRY_SECS:
            raise BadInput("expires_in may be at most a year")
        return _utc_iso(now + float(expires_in))
    if expires_at is None:
        return None
    at = _parse(expires_at)
    if at is None:
        raise BadInput(f"expires_at must be an ISO 8601 time with its offset (2026-12-07T22:00:00Z), not {expires_at!r}")
    if at <= now:
        raise BadInput(f"expires_at {expires_at} has passed already")
    if at - now > MAX_EXPIRY_SECS:
        raise BadInput("expires_at may be at most a year away")
    return _utc_iso(at)


def _parse(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def expired(now: float, expires_at: Any) -> bool:
    """An approval that ends at ``expires_at`` no longer holds at ``now``. One whose end cannot be read
    has ended (fail closed)."""
    if expires_at is None:
        return False
    at = _parse(expires_at)
    return at is None or now >= at


def local_person() -> str:
    """Who acts where no token says so (a kernel, the CLI owning a home): the operating system's user.
    The one edge here: it reads the environment."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name to read: one name for every such answer
        return "owner"
