"""The ``scripted`` model: deterministic answers from per-role queues.

It is the embedded default, so agents, tests and teaching notebooks run offline
and give the same journal every time. Each role (planner, actor, critic) has a
queue of entries consumed in order; an empty queue falls back to a function
(when built with :meth:`ScriptedModel.from_function`) and then to the defaults:
the planner plans one step (the goal: the last user message), the critic
passes, the actor ends its step with the text ``"Done."``.

A model is one playthrough of its script. The runtime plays the script from
the beginning for every task and every chat session: it asks the agent's model
for :meth:`ScriptedModel.fresh` copy per run, and records the copy's
:meth:`~ScriptedModel.state` with the run, so a run resumed after a restart
continues where it stopped.

Entries are validated when the model is built, and an entry that is wrong
raises ``ManifestInvalid`` naming its key, e.g. ``model.script.actor[0].tool_calls[1].name``.
"""

from __future__ import annotations

import copy
import inspect
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apollia_nb.errors import BadInput, ManifestInvalid, ModelPermanent, ModelTransient

from .base import (
    PLAN_TOOL,
    ROLES,
    VERDICT_TOOL,
    Message,
    ModelResponse,
    StreamEvent,
    ToolCallRequest,
    ToolSpec,
    check_keys,
    check_role,
    field_value,
    response_events,
)

__all__ = ["ScriptedModel", "ScriptEntry", "parse_entry", "DEFAULT_ACTOR_TEXT"]

DEFAULT_ACTOR_TEXT = "Done."

_ENTRY_KEYS: dict[str, tuple[str, ...]] = {
    "planner": ("steps", "error", "message"),
    "actor": ("text", "tool_calls", "error", "message"),
    "critic": ("verdict", "reasons", "error", "message"),
}
_CALL_KEYS = ("name", "arguments", "id")


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class ScriptEntry:
    """One validated turn of a role. ``error`` is ``"transient"``/``"permanent"`` or None."""

    role: str
    steps: tuple[str, ...] = ()
    text: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()
    verdict: str = "pass"
    reasons: tuple[str, ...] = ()
    error: str | None = None
    message: str | None = None


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ManifestInvalid(f"{where}[{i}]: must be a string, got {item!r}")
    return tuple(value)


def parse_entry(role: str, entry: Mapping[str, Any], where: str) -> ScriptEntry:
    """Validate one script entry of ``role``; errors name ``where`` plus the key."""
    if not isinstance(entry, Mapping):
        raise ManifestInvalid(f"{where}: must be a table, got {entry!r}")
    check_keys(entry, _ENTRY_KEYS[role], where)
    error = field_value(entry, "error", "str", where, None)
    message = field_value(entry, "message", "str", where, None)
    if error is not None:
        if error not in ("transient", "permanent"):
            raise ManifestInvalid(f'{where}.error: must be "transient" or "permanent", got {error!r}')
        extra = [k for k in entry if k not in ("error", "message")]
        if extra:
            raise ManifestInvalid(f"{where}.{extra[0]}: an error entry takes only error and message")
        return ScriptEntry(role=role, error=error, message=message)
    if message is not None:
        raise ManifestInvalid(f"{where}.message: only an error entry takes a message")
    if role == "planner":
        steps = _str_list(field_value(entry, "steps", "list", where), f"{where}.steps")
        if not steps or not all(s.strip() for s in steps):
            raise ManifestInvalid(f"{where}.steps: must be a non-empty list of non-empty strings")
        return ScriptEntry(role=role, steps=steps)
    if role == "critic":
        verdict = field_value(entry, "verdict", "str", where)
        if verdict not in ("pass", "fail"):
            raise ManifestInvalid(f'{where}.verdict: must be "pass" or "fail", got {verdict!r}')
        reasons = _str_list(field_value(entry, "reasons", "list", where, []), f"{where}.reasons")
        return ScriptEntry(role=role, verdict=verdict, reasons=reasons)
    if "text" not in entry and "tool_calls" not in entry:
        raise ManifestInvalid(f"{where}: an actor entry needs text, tool_calls or error")
    text = field_value(entry, "text", "str", where, "")
    calls = []
    for i, call in enumerate(field_value(entry, "tool_calls", "list", where, [])):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, Mapping):
            raise ManifestInvalid(f"{at}: must be a table with name and arguments, got {call!r}")
        check_keys(call, _CALL_KEYS, at)
        name = field_value(call, "name", "str", at)
        if not name:
            raise ManifestInvalid(f"{at}.name: must not be empty")
        arguments = field_value(call, "arguments", "table", at, {})
        call_id = field_value(call, "id", "str", at, None)
        calls.append(ScriptedCall(name=name, arguments=copy.deepcopy(dict(arguments)), id=call_id))
    return ScriptEntry(role=role, text=text, tool_calls=tuple(calls))


def parse_script(script: Mapping[str, Any], where: str) -> dict[str, list[ScriptEntry]]:
    """The ``[model.script]`` table: ``planner``, ``actor`` and ``critic`` arrays of tables."""
    if not isinstance(script, Mapping):
        raise ManifestInvalid(f"{where}: must be a table with planner, actor and critic arrays")
    check_keys(script, ROLES, where)
    queues: dict[str, list[ScriptEntry]] = {}
    for role in ROLES:
        entries = field_value(script, role, "list", where, [])
        queues[role] = [parse_entry(role, e, f"{where}.{role}[{i}]") for i, e in enumerate(entries)]
    return queues


Entry = Mapping[str, Any] | ModelResponse
ScriptFunction = Callable[[str, Sequence[Message], Sequence[ToolSpec]], Any]


def _last_user_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role == "user" and message.content.strip():
            return message.content.strip()
    raise ModelPermanent("scripted planner: no user message to take the goal from")


class ScriptedModel:
    """Deterministic provider: per-role queues, then an optional function, then defaults.

    ``ScriptedModel(planner=[{"steps": [...]}], actor=[...], critic=[...])`` takes
    entries in the manifest's shape (dicts) or ready :class:`ModelResponse` values.
    Tool call ids are ``call-<role>-<turn>-<i>`` (turn counts that role's turns
    from 1, ``i`` the call's position from 1) unless an entry gives its own ``id``.
    """

    name = "scripted"

    def __init__(
        self,
        planner: Sequence[Entry] = (),
        actor: Sequence[Entry] = (),
        critic: Sequence[Entry] = (),
        *,
        function: ScriptFunction | None = None,
        where: str = "script",
    ) -> None:
        given = {"planner": planner, "actor": actor, "critic": critic}
        self._queues: dict[str, deque[ScriptEntry | ModelResponse]] = {}
        for role in ROLES:
            items = given[role]
            if isinstance(items, Mapping | str):
                raise ManifestInvalid(f"{where}.{role}: must be a list of entries")
            self._queues[role] = deque(
                e if isinstance(e, ModelResponse) else parse_entry(role, e, f"{where}.{role}[{i}]")
                for i, e in enumerate(items)
            )
        self._function = function
        self._turns = dict.fromkeys(ROLES, 0)
        self._script = {role: tuple(queue) for role, queue in self._queues.items()}

    def fresh(self) -> ScriptedModel:
        """A new playthrough of the same script (and function), from its first entry."""
        model = ScriptedModel(function=self._function)
        for role in ROLES:
            model._queues[role].extend(self._script[role])
        model._script = dict(self._script)
        return model

    @classmethod
    def from_function(cls, fn: ScriptFunction) -> ScriptedModel:
        """A model that asks ``fn(role, messages, tools)`` for every turn.

        ``fn`` (sync or async) returns an entry dict of the role's shape, a
        :class:`ModelResponse`, or None for the role's default answer.
        """
        return cls(function=fn)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "model") -> ScriptedModel:
        """Build from a manifest's ``[model]`` table (``provider = "scripted"``)."""
        check_keys(table, ("provider", "script"), where)
        queues = parse_script(field_value(table, "script", "table", where, {}), f"{where}.script")
        model = cls()
        for role, entries in queues.items():
            model._queues[role].extend(entries)
        model._script = {role: tuple(queue) for role, queue in model._queues.items()}
        return model

    def remaining(self, role: str) -> int:
        """How many scripted entries of ``role`` are still queued."""
        check_role(role)
        return len(self._queues[role])

    def state(self) -> dict[str, dict[str, int]]:
        """How far each role has got: JSON-ready, for :meth:`restore` after a restart."""
        return {"turns": dict(self._turns)}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Skip the turns a previous incarnation of this model already answered.

        Only for a fresh model built from the same script: each role's queue is
        advanced by the number of turns recorded in ``state``.
        """
        turns = state.get("turns", {}) if isinstance(state, Mapping) else None
        if not isinstance(turns, Mapping):
            raise BadInput("scripted model state must be {'turns': {role: count}}")
        if any(self._turns.values()):
            raise BadInput("restore() needs a model that has not answered yet")
        counts = {role: turns.get(role, 0) for role in ROLES}
        for role, count in counts.items():
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise BadInput(f"scripted model state: turns.{role} must be a count, got {count!r}")
        for role, count in counts.items():
            for _ in range(min(count, len(self._queues[role]))):
                self._queues[role].popleft()
            self._turns[role] = count

    async def complete(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> ModelResponse:
        check_role(role)
        self._turns[role] += 1
        turn = self._turns[role]
        item: ScriptEntry | ModelResponse | None
        if self._queues[role]:
            item = self._queues[role].popleft()
        elif self._function is not None:
            item = await self._ask_function(role, messages, tools, turn)
        else:
            item = None
        if isinstance(item, ModelResponse):
            return item
        return self._respond(role, item, messages, turn)

    async def stream(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        response = await self.complete(role, messages, tools)
        for event in response_events(response):
            yield event

    async def _ask_function(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec], turn: int
    ) -> ScriptEntry | ModelResponse | None:
        assert self._function is not None
        result = self._function(role, tuple(messages), tuple(tools))
        if inspect.isawaitable(result):
            result = await result
        if result is None or isinstance(result, ModelResponse):
            return result
        return parse_entry(role, result, f"function result ({role} turn {turn})")

    def _respond(self, role: str, entry: ScriptEntry | None, messages: Sequence[Message], turn: int) -> ModelResponse:
        if entry is not None and entry.error is not None:
            what = entry.message or f"scripted {entry.error} failure ({role} turn {turn})"
            raise (ModelTransient if entry.error == "transient" else ModelPermanent)(what)

        def call_id(i: int) -> str:
            return f"call-{role}-{turn}-{i}"

        if role == "planner":
            steps = entry.steps if entry is not None else (_last_user_text(messages),)
            call = ToolCallRequest(call_id(1), PLAN_TOOL.name, {"steps": list(steps)})
            return ModelResponse(text="", tool_calls=(call,), stop_reason="tool_calls")
        if role == "critic":
            verdict, reasons = (entry.verdict, entry.reasons) if entry is not None else ("pass", ())
            call = ToolCallRequest(call_id(1), VERDICT_TOOL.name, {"verdict": verdict, "reasons": list(reasons)})
            return ModelResponse(text="", tool_calls=(call,), stop_reason="tool_calls")
        if entry is None:
            return ModelResponse(text=DEFAULT_ACTOR_TEXT, stop_reason="stop")
        calls = tuple(
            ToolCallRequest(c.id or call_id(i), c.name, copy.deepcopy(c.arguments))
            for i, c in enumerate(entry.tool_calls, 1)
        )
        return ModelResponse(text=entry.text, tool_calls=calls, stop_reason="tool_calls" if calls else "stop")
