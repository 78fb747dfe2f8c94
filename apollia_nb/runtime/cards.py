"""Waiting decisions ("cards"): a question to a person, answerable by click or from code.

A card mirrors one row of the pending-decisions table. A watched run awaits its
card (a plain await: no budget is consumed); an unattended run suspends and is
resumed by the runtime when the answer arrives. Either way the answer goes
through ``Runtime.answer`` so it is validated, journaled and applied once.

A card is a server's own request (``request``: its question, ``elicitation/create``,
or its model call, ``sampling/createMessage``) only when the code that received
that request over the server's connection opened it; a tool call is never one,
whatever its tool is named.

What a person gives a server's question (its form's values) is kept twice: in
clear for the server that asked (``delivered_values``, nowhere else) and as
shown everywhere else (``values``: in ``to_dict()``, so on every widget, the side
panel, the REST API's events, the journal's ``answer``). The shown form is made
here, once, by ``shown_values``: a field the form marks sensitive (``"writeOnly":
true`` or ``"format": "password"``, at any depth) reads ``"[redacted]"``, and a
configured token (``token_env``) reads ``[redacted: VAR]`` wherever it appears.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.capabilities import Answering

__all__ = ["Card", "CHAT_CARD_TIMEOUT_SECS", "REDACTED", "QUESTION", "MODEL_CALL", "sensitive", "redact_sensitive"]

#: An unanswered card in a conversation resolves to ``refuse`` after exactly this long.
#: Fixed in code, not configurable.
CHAT_CARD_TIMEOUT_SECS = 300.0
#: What a sensitive value reads wherever it is shown or journaled.
REDACTED = "[redacted]"
#: A card's ``request`` when it is a server's question (elicitation), or its model call (sampling).
QUESTION = "elicitation/create"
MODEL_CALL = "sampling/createMessage"


def sensitive(schema: Any) -> bool:
    """A JSON Schema marks its value sensitive: ``"writeOnly": true`` or ``"format": "password"``, on
    itself or on any of its ``anyOf``/``oneOf``/``allOf`` branches."""
    if not isinstance(schema, Mapping):
        return False
    if schema.get("writeOnly") is True or schema.get("format") == "password":
        return True
    return any(isinstance(branches, list) and any(sensitive(b) for b in branches)
               for branches in (schema.get("anyOf"), schema.get("oneOf"), schema.get("allOf")))


def redact_sensitive(schema: Any, value: Any) -> Any:
    """``value`` with each part its schema marks sensitive replaced by ``"[redacted]"``: the value itself,
    an object's properties (and ``additionalProperties``), an array's items, at any depth."""
    if sensitive(schema):
        return REDACTED
    schema = schema if isinstance(schema, Mapping) else {}
    if isinstance(value, Mapping):
        props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        extra = schema.get("additionalProperties")
        return {k: redact_sensitive(props.get(k, extra), v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_sensitive(schema.get("items"), v) for v in value]
    return value


def redact_schema(schema: Any) -> Any:
    """A schema as shown: what it offers as a sensitive value (``default``, ``examples``) reads
    ``"[redacted]"``, at any depth; the rest as given."""
    if isinstance(schema, list):
        return [redact_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: redact_schema(v) for k, v in schema.items()}
    if sensitive(schema):
        for key in ("default", "examples"):
            if key in out:
                out[key] = REDACTED
    return out


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
    #: ``QUESTION`` or ``MODEL_CALL`` when a server's connection asked; set by the code that received it.
    request: str | None = None
    _runtime: "Answering | None" = field(default=None, repr=False)
    _event: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _shown: dict[str, Any] | None = field(default=None, repr=False)
    _given: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def waiting(self) -> bool:
        return self.answer_value is None

    @property
    def takes_values(self) -> bool:
        """A server's question in form mode: answered ``once`` with the form's values."""
        return self.request == QUESTION and self.arguments.get("mode", "form") != "url"

    @property
    def values(self) -> dict[str, Any] | None:
        """The values given to a server's question with ``once``, as shown (``shown_values``)."""
        return self._shown

    @values.setter
    def values(self, given: dict[str, Any] | None) -> None:
        self._given = given
        self._shown = self.shown_values(given)

    @property
    def delivered_values(self) -> dict[str, Any] | None:
        """The values in clear: only for the server whose question this card is."""
        return self._given

    def shown_values(self, given: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``given`` as shown and journaled: the form's sensitive fields and configured tokens redacted."""
        if given is None:
            return None
        from apollia_nb.runtime.outputs import redact, secret_values

        shown = redact_sensitive(self.arguments.get("requestedSchema"), dict(given))
        return dict(redact(shown, secret_values(getattr(self._runtime, "config", None))))

    def answer(self, answer: str, by: str = "user", reason: str | None = None,
               values: dict[str, Any] | None = None) -> "Card":
        """Answer this card (``once``, ``always`` or ``refuse`` — only those on offer).

        A server's question (``mcp:<server>/elicitation/create``, ``request`` set) is
        answered ``once`` with ``values``, the form's fields (checked against the form:
        ``BAD_ANSWER``); they reach the server, and are shown redacted (``shown_values``).

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
            "request": self.request,
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
