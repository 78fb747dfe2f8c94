"""Waiting decisions ("cards"): a question to a person, answerable by click or from code.

A card mirrors one row of the pending-decisions table. A watched run awaits its
card (a plain await: no budget is consumed); an unattended run suspends and is
resumed by the runtime when the answer arrives. Either way the answer goes
through ``Runtime.answer`` so it is validated, journaled and applied once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.capabilities import Answering

__all__ = ["Card", "CHAT_CARD_TIMEOUT_SECS"]

#: An unanswered card in a conversation resolves to ``refuse`` after exactly this long.
#: Fixed in code, not configurable.
CHAT_CARD_TIMEOUT_SECS = 300.0


@dataclass(eq=False)
class Card:
    id: str
    run_id: str
    agent: str
    tool: str
    family: str | None
    arguments: dict[str, Any]
    answers: tuple[str, ...]
    reason: str
    line: int
    call_id: str
    created_at: str
    task_id: str | None = None
    session_id: str | None = None
    hints: dict[str, Any] | None = None
    path: str | None = None  # a file tool's path as resolved, relative to the workspace
    answer_value: str | None = None
    answered_by: str | None = None
    answered_at: str | None = None
    values: dict[str, Any] | None = None  # a server's question (elicitation): the form's values given with ``once``
    _runtime: "Answering | None" = field(default=None, repr=False)
    _event: anyio.Event = field(default_factory=anyio.Event, repr=False)

    @property
    def waiting(self) -> bool:
        return self.answer_value is None

    def answer(self, answer: str, by: str = "user", reason: str | None = None,
               values: dict[str, Any] | None = None) -> "Card":
        """Answer this card (``once``, ``always`` or ``refuse`` — only those on offer).

        A server's question (``mcp:<server>/elicitation/create``) is answered ``once``
        with ``values``, the form's fields (checked against the form: ``BAD_ANSWER``).

        Answering again with the answer it already has changes nothing and returns
        the card (a click and a cell that both say ``once``); another answer is a
        ``Conflict`` that says who answered what, and when."""
        if self._runtime is None:
            raise RuntimeError("card is not attached to a runtime")
        if self.answer_value is not None:
            if answer == self.answer_value:
                return self
            from apollia_nb.errors import Conflict

            raise Conflict(f"already answered {self.answer_value} by {self.answered_by} at {self.answered_at}")
        if values is not None:
            self._runtime.answer(self.id, answer, by=by, reason=reason, values=values)
        else:
            self._runtime.answer(self.id, answer, by=by, reason=reason)
        return self

    def _resolve(self, answer: str, by: str, at: str) -> None:
        self.answer_value = answer
        self.answered_by = by
        self.answered_at = at
        self._event.set()

    def _release(self) -> None:
        """Stop the watched run that awaits this card from waiting here: it suspends, the card stays pending."""
        self._event.set()

    async def wait(self) -> str | None:
        """The answer; None when the card was released unanswered (its run suspends)."""
        await self._event.wait()
        return self.answer_value

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "session_id": self.session_id,
            "agent": self.agent,
            "tool": self.tool,
            "family": self.family,
            "arguments": self.arguments,
            "answers": list(self.answers),
            "reason": self.reason,
            "line": self.line,
            "call_id": self.call_id,
            "created_at": self.created_at,
            "hints": self.hints,
            "path": self.path,
            "values": self.values,
            "answer": self.answer_value,
            "answered_by": self.answered_by,
            "answered_at": self.answered_at,
        }

    def __repr__(self) -> str:
        state = f"answered {self.answer_value!r} by {self.answered_by}" if self.answer_value else "waiting"
        return (
            f"<Card {self.id} {self.agent}→{self.tool} ({self.family or 'unclassified'}) "
            f"line {self.line}, answers {'/'.join(self.answers)}: {state}>"
        )
