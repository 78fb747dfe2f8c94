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

A tool call's card is shown the same way: its ``arguments`` are the call's as shown
(``shown_arguments``: the parts the tool's schema marks sensitive and every known secret
redacted), made once where the call is captured (``runtime.governed``); the clear arguments
stay in this process's memory for the tool alone (``call_arguments``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.capabilities import Answering

__all__ = ["Card", "CHAT_CARD_TIMEOUT_SECS", "REDACTED", "QUESTION", "MODEL_CALL", "SensitiveParts", "SensitivePlan", "sensitive",
           "redact_sensitive", "sensitive_plan", "sensitive_texts", "shown_arguments"]

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


# --- a tool's arguments: which parts its schema marks sensitive, worked out once per schema ---------

#: How many ``$ref`` hops, and how deep a schema, are read before what is left is taken as sensitive.
_SCHEMA_DEPTH = 64


@dataclass(frozen=True)
class SensitivePlan:
    """Where a tool's arguments hold sensitive values: a compiled, pruned copy of its schema.

    ``props``: a property's own plan; ``extra``: the plan of any property not named
    (``additionalProperties``, ``patternProperties``); ``items`` / ``prefix``: an array's items,
    all or by position. A plan of ``True`` is a value that is sensitive as a whole; a ``str``
    names a ``$ref`` target, read from ``SensitiveParts.refs`` (a recursive schema); a ``tuple``
    holds plans that all apply."""

    props: Mapping[str, Any] = field(default_factory=dict)
    extra: Any = None
    items: Any = None
    prefix: tuple[Any, ...] = ()


@dataclass(frozen=True)
class SensitiveParts:
    """What ``sensitive_plan`` finds in a tool's arguments' schema: the plan of the whole (``True``,
    a ``SensitivePlan``, a reference) and the plan of each ``$ref`` target it reads (``refs``)."""

    root: Any
    refs: Mapping[str, Any] = field(default_factory=dict)


def _merge(a: Any, b: Any) -> Any:
    """Two plans of one value (``anyOf`` branches): sensitive wherever either says so."""
    if a is None or b is None:
        return a if b is None else b
    if a is True or b is True:
        return True
    if not isinstance(a, SensitivePlan) or not isinstance(b, SensitivePlan):
        # A reference (resolved while walking: a recursive schema) beside another plan: both apply.
        both = (*(a if isinstance(a, tuple) else (a,)), *(b if isinstance(b, tuple) else (b,)))
        return tuple(dict.fromkeys(both))
    props = {**a.props, **{k: _merge(a.props.get(k), v) for k, v in b.props.items()}}
    width = max(len(a.prefix), len(b.prefix))
    prefix = tuple(_merge(a.prefix[i] if i < len(a.prefix) else a.items, b.prefix[i] if i < len(b.prefix) else b.items)
                   for i in range(width))
    return SensitivePlan(props, _merge(a.extra, b.extra), _merge(a.items, b.items), prefix)


def sensitive_plan(schema: Any) -> SensitiveParts | None:
    """The parts of a value ``schema`` marks sensitive (``"writeOnly": true``, ``"format": "password"``)
    at any depth — properties, additional properties, array items, through ``anyOf``/``oneOf``/``allOf``
    and local ``$ref`` (``#/...``) — or None when it marks none (a tool's arguments are then shown as given).

    Pure; worked out once per tool. A reference that points outside the schema, to nothing, or only
    to itself, and a schema nested past reading, cannot be told safe: its value counts as sensitive."""
    refs: dict[str, Any] = {}

    def target(ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node: Any = schema
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def plan(node: Any, depth: int) -> Any:
        if depth > _SCHEMA_DEPTH:
            return True
        if not isinstance(node, Mapping):
            return None
        if node.get("writeOnly") is True or node.get("format") == "password":
            return True
        out: Any = None
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str) or target(ref) is None:
                return True
            if ref not in refs:
                refs[ref] = "pending"
                refs[ref] = plan(target(ref), depth + 1)
            found = refs[ref]
            out = ref if found == "pending" or isinstance(found, (SensitivePlan, str)) else found
            if out is True:
                return True
        for key in ("anyOf", "oneOf", "allOf", "then", "else"):
            found_branches = node.get(key)
            branches: list[Any] = found_branches if isinstance(found_branches, list) else \
                [found_branches] if found_branches is not None else []
            for branch in branches:
                out = _merge(out, plan(branch, depth + 1))
                if out is True:
                    return True
        props = node.get("properties")
        named = {k: p for k, p in ((k, plan(v, depth + 1)) for k, v in props.items()) if p is not None} \
            if isinstance(props, Mapping) else {}
        extra = plan(node.get("additionalProperties"), depth + 1)
        patterns = node.get("patternProperties")
        for sub in patterns.values() if isinstance(patterns, Mapping) else ():
            extra = _merge(extra, plan(sub, depth + 1))
        items = node.get("items")
        given = node.get("prefixItems")
        positional: list[Any] = given if isinstance(given, list) else items if isinstance(items, list) else []
        prefix = tuple(plan(p, depth + 1) for p in positional)
        every = plan(items, depth + 1) if isinstance(items, Mapping) else None
        if named or extra is not None or every is not None or any(p is not None for p in prefix):
            out = _merge(out, SensitivePlan(named, extra, every, prefix if any(p is not None for p in prefix) else ()))
        return out

    found = plan(schema, 0)
    if found is None:
        return None
    clean = {ref for ref, p in refs.items() if p is None}
    grew = True
    while grew:  # references whose plans mark nothing but clean references are clean too
        grew = False
        for ref, p in refs.items():
            if ref not in clean and _only_refs(p, clean):
                clean.add(ref)
                grew = True
    if _only_refs(found, clean):
        return None  # a recursive schema with nothing sensitive in it
    return SensitiveParts(found, dict(refs))


def _only_refs(plan: Any, clean: set[str]) -> bool:
    """A plan that marks nothing but references known to mark nothing."""
    if plan is None:
        return True
    if isinstance(plan, str):
        return plan in clean
    if isinstance(plan, tuple):
        return all(_only_refs(p, clean) for p in plan)
    if plan is True:
        return False
    return all(_only_refs(p, clean) for p in (*plan.props.values(), plan.extra, plan.items, *plan.prefix))


def _apply(plan: Any, value: Any, refs: Mapping[str, Any], hops: int = 0) -> Any:
    while isinstance(plan, str):  # a reference: its plan, read now (a recursive schema)
        hops += 1
        plan = refs.get(plan, True) if hops <= _SCHEMA_DEPTH else True
    if plan is None:
        return value
    if plan is True:
        return REDACTED
    if isinstance(plan, tuple):  # two references of one value: both apply
        for each in plan:
            value = _apply(each, value, refs, hops)
        return value
    if isinstance(value, Mapping):
        return {k: _apply(plan.props[k] if k in plan.props else plan.extra, v, refs, hops) for k, v in value.items()}
    if isinstance(value, list):
        return [_apply(plan.prefix[i] if i < len(plan.prefix) else plan.items, v, refs, hops)
                for i, v in enumerate(value)]
    return value


def sensitive_texts(plan: SensitiveParts | None, arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The texts at the sensitive parts of ``arguments`` (each a string, or the strings inside a
    sensitive object or list), with where each was (``password``, ``creds.key``): what must not be
    repeated elsewhere either (the reason, the result)."""
    if plan is None:
        return []
    found: list[tuple[str, str]] = []

    def texts(value: Any, where: str) -> None:
        if isinstance(value, str):
            found.append((value, where))
        elif isinstance(value, Mapping):
            for k, v in value.items():
                texts(v, f"{where}.{k}")
        elif isinstance(value, list):
            for v in value:
                texts(v, where)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append((repr(value), where))

    def walk(p: Any, value: Any, where: str, hops: int) -> None:
        while isinstance(p, str):
            hops += 1
            p = plan.refs.get(p, True) if hops <= _SCHEMA_DEPTH else True
        if p is None:
            return
        if p is True:
            texts(value, where)
        elif isinstance(p, tuple):
            for each in p:
                walk(each, value, where, hops)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(p.props[k] if k in p.props else p.extra, v, f"{where}.{k}" if where else str(k), hops)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(p.prefix[i] if i < len(p.prefix) else p.items, v, where, hops)

    walk(plan.root, dict(arguments), "", 0)
    return found


def shown_arguments(plan: SensitiveParts | None, arguments: dict[str, Any],
                    secrets: Mapping[str, str]) -> dict[str, Any]:
    """A tool call's arguments as decided on screen and journaled: each part its schema marks sensitive
    (``plan``, from ``sensitive_plan``) reads ``"[redacted]"``, each known secret (``{value: name}``)
    ``[redacted: name]`` wherever it appears. With nothing to redact, ``arguments`` itself."""
    if plan is None and not secrets:
        return arguments
    from apollia_nb.runtime.outputs import redact

    shown = _apply(plan.root, arguments, plan.refs) if plan is not None else arguments
    if not isinstance(shown, dict):  # the arguments as a whole are sensitive
        shown = {key: REDACTED for key in arguments}
    return dict(redact(shown, secrets)) if secrets else shown


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
    #: When the approval given ends (ISO 8601, UTC), and the digest it was given for (``approvals.py``).
    expires_at: str | None = None
    approved_digest: str | None = None
    #: The call this approval carried out: an approval is used once (``governed.continue_after_answer``).
    used: bool = False
    _runtime: "Answering | None" = field(default=None, repr=False)
    _event: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _shown: dict[str, Any] | None = field(default=None, repr=False)
    _given: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _call_arguments: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def waiting(self) -> bool:
        return self.answer_value is None

    @property
    def digest(self) -> str:
        """The digest of the call as this card shows it: what an answer approves (``governance/approvals.py``)."""
        from apollia_nb.governance.approvals import action_digest

        return action_digest(decision_id=self.id, run_id=self.run_id, agent=self.agent, tool=self.tool,
                             call_id=self.call_id, arguments=self.arguments)

    @property
    def may_answer(self) -> dict[str, Any] | None:
        """Who may answer this card (roles, the person excluded, approvals still needed), as its runtime
        reads the policy now; None when it cannot say."""
        reader = getattr(self._runtime, "may_answer", None)
        if reader is None:
            return None
        try:
            return reader(self)  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - shown as unknown; answering checks again
            return None

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

    def keep_call_arguments(self, arguments: dict[str, Any]) -> None:
        """The call's arguments in clear, for its tool alone once answered; ``arguments`` (what every
        surface shows and the pending decision keeps) are the shown ones. Held in memory only."""
        self._call_arguments = arguments

    @property
    def call_arguments(self) -> dict[str, Any]:
        """The arguments the tool receives when this card is answered ``once``/``always``: the clear
        ones this process kept, else ``arguments`` (a card opened before a restart keeps only those)."""
        return self._call_arguments if self._call_arguments is not None else self.arguments

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
               values: dict[str, Any] | None = None, *, digest: str | None = None, expires_in: Any = None,
               expires_at: Any = None, lasting: str | None = None) -> "Card":
        """Answer this card (``once``, ``always`` or ``refuse`` — only those on offer).

        A server's question (``mcp:<server>/elicitation/create``, ``request`` set) is
        answered ``once`` with ``values``, the form's fields (checked against the form:
        ``BAD_ANSWER``); they reach the server, and are shown redacted (``shown_values``).

        Answering again with the answer it already has changes nothing and returns
        the card (a click and a cell that both say ``once``); another answer is a
        ``Conflict`` that says who answered what, and when.

        ``digest``: the card's digest as shown (another is ``STALE_APPROVAL``); ``expires_in``
        (seconds) or ``expires_at`` (ISO 8601): when the approval ends (``governance/approvals.py``).
        ``lasting`` ("8h"; with ``always``): how long the standing consent lasts (default: until revoked)."""
        if self._runtime is None:
            raise RuntimeError("card is not attached to a runtime")
        if self.answer_value is not None:
            if answer == self.answer_value:
                return self
            from apollia_nb.errors import Conflict

            raise Conflict(f"already answered {self.answer_value} by {self.answered_by} at {self.answered_at}")
        terms: dict[str, Any] = {k: v for k, v in (("digest", digest), ("expires_in", expires_in),
                                                   ("expires_at", expires_at), ("lasting", lasting))
                                  if v is not None}
        if values is not None:
            self._runtime.answer(self.id, answer, by=by, reason=reason, values=values, **terms)
        else:
            self._runtime.answer(self.id, answer, by=by, reason=reason, **terms)
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
            "digest": self.digest,
            "may_answer": self.may_answer,
            "expires_at": self.expires_at,
        }

    def __repr__(self) -> str:
        state = f"answered {self.answer_value!r} by {self.answered_by}" if self.answer_value else "waiting"
        return (
            f"<Card {self.id} {self.agent}→{self.tool} ({self.family or 'unclassified'}) "
            f"line {self.line}, answers {'/'.join(self.answers)}: {state}>"
        )
