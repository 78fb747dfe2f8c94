"""Who is acting on governance in this request: the role and the way they authenticated, for the journal.

The REST API sets :data:`ACTING` once it has checked a request's token (``api.deps.check_role``), in the
request's own context; a governance change made while serving that request journals ``by_role`` and
``auth`` (``token`` for a person's token, ``owner`` for the owner's) beside its ``by``. Outside a request
(the CLI owning a home, a kernel) nothing is set and the entries are as they were.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["ACTING", "with_actor"]

#: ``(by, role, auth)`` of the request being served, or None.
ACTING: ContextVar[tuple[str, str, str] | None] = ContextVar("apollia_acting", default=None)


def with_actor(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with ``by_role`` and ``auth`` of the request being served, when it names who acts (``by``)."""
    acting = ACTING.get()
    if acting is None or "by" not in payload or "by_role" in payload:
        return payload
    _, role, auth = acting
    return {**payload, "by_role": role, "auth": auth}
