"""One governed tool call: decide, journal, ask or run — the same path for tasks and chat.

Order of events for a call, each journaled before what it allows:
``decision`` → (``answer`` when a person was asked) → ``tool_call`` → the tool
runs → ``tool_result``. A refused call gets a ``tool_result`` with status
``refused`` and the tool never runs. An unknown tool or bad arguments get an
error result the model can read; they never reach the tool.

A file tool's path is resolved here, by the tool's own resolver, before anything
is decided: the deny rules see the file the tool would act on (``Call.paths``),
and the decision records the path as asked (in ``arguments``) and as resolved
(``path``). A ``write`` call also carries where this process imports or runs code
(``Call.code_places``, ``paths.code_places``): a write there is asked every time. A path the tool would refuse (outside the workspace, into the home,
empty) ends the call at once with the tool's error, like a bad argument;
whatever cannot be resolved is never allowed.

A tool source that carries its own requests (an MCP server asking a person, reporting
progress) goes through the same path with the public functions here: ``governed_request``
(decide, journal, ask), ``commit_entries`` (append its entries, durable on return),
``capped_output`` (a result as journaled, with the digest of the whole) and ``run_of`` (the
task run or chat session a run id belongs to).

A call's arguments are shown (decided on screen, journaled, on its card, in the pending decision)
only as ``shown_call`` makes them, once per call: each part the tool's schema marks sensitive
(``"writeOnly": true``, ``"format": "password"``, at any depth; worked out once per tool) reads
``"[redacted]"``, and each secret the runtime knows (``known_secrets``: configured tokens, the agent's
model key, the server's token) ``[redacted: VAR]`` wherever it appears; a sensitive value repeated
elsewhere in the call (another argument, the decision's reason, the tool's result or error) reads
``[redacted: <argument>]``. ``decide()`` sees the call in clear (a deny rule on a sensitive argument
still refuses it); only the tool's body receives the clear arguments. A card keeps them in memory
only: a card answered after the process that opened it ended cannot carry out a call whose
arguments were redacted (``INTERRUPTED``), since the clear value is kept nowhere.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import os
import posixpath
import time
import uuid
import weakref
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio

from apollia_nb.errors import ApolliaError, Conflict
from apollia_nb.governance.decision import Call, Decision, Family, Outcome, decide
from apollia_nb.journal.subjects import call_subjects, runtime_subject_secret, subject_arguments, subjects_field
from apollia_nb.runtime.cards import sensitive_plan, sensitive_texts, shown_arguments
from apollia_nb.runtime.outputs import MIN_SECRET, redact, secret_values
from apollia_nb.runtime.paths import code_places

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.agents import Agent
    from apollia_nb.runtime.cards import Card
    from apollia_nb.runtime.capabilities import GovernedHost

__all__ = ["CallResult", "CallScope", "current_call", "governed_call", "governed_request", "run_approved_call",
           "Mode", "OUTPUT_CAP", "NULL_DIGEST", "capped_output", "commit_entries", "run_of", "known_secrets",
           "unbound_approval", "shown_call", "shown_tool_calls", "forget_sensitive_parts", "lost_call"]

Mode = Literal["watched", "unattended", "chat"]

#: The digest of a result with no output (``null``): refused and skipped calls.
NULL_DIGEST = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"

#: Outputs larger than this (in canonical JSON characters) are cut in the journal; the digest is of the whole.
OUTPUT_CAP = 16_384


#: ``json.dumps(output, default=str, ensure_ascii=False)``, its encoder made once.
_FOR_MODEL = json.JSONEncoder(ensure_ascii=False, default=str)


@dataclass
class CallResult:
    call_id: str
    tool: str
    status: Literal["ok", "error", "refused", "waiting"]
    output: Any = None
    error_code: str | None = None
    error_message: str | None = None
    decision: Decision | None = None
    card: "Card | None" = None
    arguments: dict[str, Any] = field(default_factory=dict)

    def for_model(self) -> str:
        """What the model reads as the tool's result."""
        if self.status == "ok":
            return _FOR_MODEL.encode(self.output)
        if self.status == "refused":
            return json.dumps({"refused": True, "reason": self.error_message})
        return json.dumps({"error": self.error_code, "message": self.error_message})


@dataclass(frozen=True)
class CallScope:
    """The approved call a tool body runs for: what a federated tool needs to tie a server's
    request (for input, for a model call) back to the run that caused it."""

    rt: "GovernedHost"
    agent: "Agent"
    run_id: str
    call_id: str
    tool: str


#: Set while an approved call's tool body runs (``run_approved_call``); None elsewhere.
current_call: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("apollia_current_call", default=None)


def capped_output(output: Any, digest: str | None = None) -> tuple[Any, str, bool]:
    """The output as journaled (cut past ``OUTPUT_CAP``) and the digest of the whole
    (``digest``: the one ``invoke`` computed already for this very output)."""
    from apollia_nb.runtime.tools import canonical_json, text_digest

    text = canonical_json(output)
    if digest is None:
        digest = text_digest(text)
    if len(text) > OUTPUT_CAP:
        return {"truncated": True, "size": len(text), "head": text[:OUTPUT_CAP]}, digest, True
    return output, digest, False


#: What the server's token is read from when ``apollia-os serve`` is not given one (``api.server.TOKEN_ENV``).
_SERVER_TOKEN_ENV = "APOLLIA_TOKEN"
#: The key variable each model provider reads when its ``[model]`` table names none.
_MODEL_KEY_DEFAULTS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}

#: Each tool's sensitive parts, worked out once per tool (``forget_sensitive_parts`` when its schema
#: changes), by the tool's identity: ``{id: (weak reference to the tool, parts)}``.
_parts: dict[int, tuple["weakref.ref[Any]", Any]] = {}


def _sensitive_parts(tooldef: Any) -> Any:
    held = _parts.get(id(tooldef))
    if held is not None and held[0]() is tooldef:
        return held[1]
    found = sensitive_plan(tooldef.parameters)
    key = id(tooldef)
    _parts[key] = (weakref.ref(tooldef, lambda _ref: _parts.pop(key, None)), found)
    return found


def forget_sensitive_parts(tooldef: Any) -> None:
    """The tool's schema changed in place (a server listed it anew): its sensitive parts are read again."""
    _parts.pop(id(tooldef), None)


def known_secrets(rt: Any, agent: Any = None) -> dict[str, str]:
    """Every secret the runtime knows now, ``{value: variable}``: the tokens configured for hosts and
    MCP servers (``token_env``), the agent's model key (``api_key_env`` or its provider's default)
    and the server's token (``$APOLLIA_TOKEN``); each read from the environment at this moment."""
    found = secret_values(getattr(rt, "config", None))
    model = getattr(getattr(agent, "manifest", None), "model", None)
    names = [_SERVER_TOKEN_ENV]
    if isinstance(model, dict):
        key_env = model.get("api_key_env", _MODEL_KEY_DEFAULTS.get(str(model.get("provider"))))
        if isinstance(key_env, str) and key_env:
            names.append(key_env)
    for name in names:
        value = os.environ.get(name)
        if value and len(value) >= MIN_SECRET and value not in found:
            found[value] = name
    return found


@dataclass(frozen=True)
class ShownCall:
    """A call's arguments as shown (``arguments``), and every text that must not be shown with it
    (``secrets``: the known secrets and the call's own sensitive values, ``{text: what it reads as}``)."""

    arguments: dict[str, Any]
    secrets: dict[str, str]

    def text(self, value: Any) -> Any:
        """A text or JSON value of this call (a reason, an output) with no secret of it in clear."""
        return redact(value, self.secrets)


def shown_call(tooldef: Any, arguments: dict[str, Any], secrets: dict[str, str]) -> ShownCall:
    """``arguments`` of a call to ``tooldef`` as shown, once: the one place a call's arguments are
    redacted (``cards.shown_arguments``). A tool with nothing sensitive and no secret among its
    arguments is shown with the very arguments given."""
    parts = _sensitive_parts(tooldef) if tooldef is not None else None
    if parts is None and not secrets:
        return ShownCall(arguments, secrets)
    own = {text: where for text, where in sensitive_texts(parts, arguments) if len(text) >= MIN_SECRET}
    every = {**secrets, **{text: where for text, where in own.items() if text not in secrets}}
    if parts is None and not every:
        return ShownCall(arguments, every)
    shown = shown_arguments(parts, arguments, every)
    return ShownCall(shown, every)


def shown_tool_calls(rt: Any, agent: Any, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A model turn's calls (``{call_id, name, arguments}``) as its ``model_response`` entry journals
    them: each call's arguments as ``shown_call`` shows them (by its tool's schema, when the agent has
    that tool; the known secrets always)."""
    secrets = known_secrets(rt, agent)
    tools = getattr(agent, "tools", None)
    out = []
    for tc in listed:
        args = tc.get("arguments")
        if not isinstance(args, dict):
            out.append(tc)
            continue
        try:
            tooldef = tools.get(tc.get("name")) if tools is not None else None
        except ApolliaError:
            tooldef = None  # an unknown tool: the call gets an error result; its secrets are still hidden
        shown = shown_call(tooldef, args, secrets).arguments
        out.append(tc if shown is args else {**tc, "arguments": shown})
    return out


async def governed_call(
    rt: "GovernedHost",
    agent: "Agent",
    *,
    run_id: str,
    call_id: str,
    name: str,
    arguments: dict[str, Any],
    mode: Mode,
    grants: frozenset[str] = frozenset(),
    task_id: str | None = None,
    session_id: str | None = None,
    waiting_hook: Any = None,
    prefix: Sequence[tuple[str, dict[str, Any]]] = (),
) -> CallResult:
    """Decide one call and carry the decision out (or park it when nobody watches).

    ``prefix``: entries that must be durable together with the decision (the model
    response that asked for this call); they are committed in the same transaction.
    """
    from apollia_nb.runtime.tools import order_arguments

    secrets = known_secrets(rt, agent)
    try:
        tooldef = agent.tools.get(name)
        ordered = order_arguments(tooldef, arguments)
        path = resolved_path(tooldef, ordered)
        aliases = argument_aliases(tooldef, ordered)
    except ApolliaError as exc:
        return await _stopped_short(rt, agent, run_id, call_id, name, arguments, exc, prefix=prefix,
                                    shown=shown_call(None, arguments, secrets))
    shown = shown_call(tooldef, ordered, secrets)

    family = tooldef.family.value if tooldef.family is not None else None
    call = Call(
        agent=agent.name, tool=name, family=tooldef.family, arguments=ordered,
        connection=tooldef.connection, run_grants=frozenset(grants),  # type: ignore[arg-type]  # Family is a str enum
        paths=path.names if path is not None else None, shell=tooldef.shell, aliases=aliases,
        code_places=_code_places(agent) if path is not None and tooldef.family is Family.WRITE else None,
    )
    served = getattr(rt.journal, "served_calls", None)  # a served home's client (runtime/remote.py)
    view = rt.governance.view() if served is None else served.view()
    decision = decide(call, view)  # on the clear arguments: redaction never weakens a rule
    if shown.secrets:  # the reason may quote an argument: shown without its secrets
        decision = dataclasses.replace(decision, reason=shown.text(decision.reason))
    decided_payload: dict[str, Any] = {
        "call_id": call_id, "tool": name, "family": family, "arguments": shown.arguments,
        "outcome": decision.outcome.value, "line": decision.line,
        "answers": [a.value for a in decision.answers], "reason": decision.reason,
        "connection": tooldef.connection,
        **({"path": path.relative} if path is not None else {}),
        **({"hints": tooldef.annotations} if tooldef.annotations else {}),
    }
    decided_payload.update(subjects_field("decision", subject_tags(rt, tooldef, ordered), decided_payload))
    decided = ("decision", decided_payload)
    if served is not None:  # its server decides again, on its own snapshot, and commits what follows here
        decision, decided = await served.decide(call, decided, prefix, run_id=run_id, agent=agent.name,
                                                secrets=shown.secrets)
    if decision.outcome is Outcome.REFUSE:
        return await _refused(rt, agent, run_id, call_id, name, shown.arguments, decision.reason, decision,
                              prefix=[*prefix, decided])
    if decision.outcome is Outcome.ALLOW:
        return await run_approved_call(rt, agent, run_id=run_id, call_id=call_id, name=name,
                                       arguments=ordered, decision=decision, prefix=[*prefix, decided],
                                       checked=True, shown=shown)
    await commit_entries(rt, run_id, agent, [*prefix, decided])

    card = await rt.open_card_async(
        agent=agent, run_id=run_id, call_id=call_id, tool=name, family=family, arguments=shown.arguments,
        decision=decision, task_id=task_id, session_id=session_id,
        hints=tooldef.annotations or None,
    )
    card.keep_call_arguments(ordered)  # in this process's memory only: for the tool, once answered
    if path is not None:
        card.path = path.relative
    if mode == "unattended":
        return CallResult(call_id, name, "waiting", decision=decision, card=card, arguments=shown.arguments)
    if waiting_hook is not None:
        await waiting_hook(card)
    if mode == "chat":
        from apollia_nb.runtime.cards import CHAT_CARD_TIMEOUT_SECS

        with anyio.move_on_after(rt.chat_card_timeout if rt.chat_card_timeout is not None else CHAT_CARD_TIMEOUT_SECS):
            await card.wait()
        if card.waiting:
            try:
                rt.answer(card.id, "refuse", by="timeout", reason="unanswered for 5 minutes")
            except Conflict:
                await card.wait()  # answered elsewhere at the same moment: that answer stands
    else:
        await card.wait()
        if card.waiting:  # released unanswered: the run stops watching and suspends, the card stays pending
            return CallResult(call_id, name, "waiting", decision=decision, card=card, arguments=shown.arguments)
    return await continue_after_answer(rt, agent, card, decision=decision)


def subject_tags(rt: Any, tooldef: Any, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The keyed digests of the data subjects a call is about (``journal.subjects``): the values of
    the arguments its schema marks ``"x-apollia-subject": true`` or ``[subjects.tools]`` names. The
    home's subject key is made at the first call that has one."""
    config = getattr(rt, "config", None)
    mapping = getattr(config, "subject_arguments", None) or {}
    names = subject_arguments(tooldef.name, tooldef.parameters, mapping)
    if not names or not any(arguments.get(n) not in (None, "", []) for n in names):
        return ()
    home = getattr(rt, "home", None)
    secret = runtime_subject_secret(home.keys_dir) if home is not None else None
    return call_subjects(secret, names, arguments) if secret is not None else ()


def _code_places(agent: "Agent") -> Any:
    """Where this process imports or runs code, and the agent's workspace when it was registered
    from its working folder (``[workspace] root = "."``: a notebook's folder, which its kernel imports from)."""
    manifest = getattr(agent, "manifest", None)
    root = getattr(manifest, "workspace_root", None)
    own = agent.workspace if isinstance(root, str) and posixpath.normpath(root) == "." else None
    return code_places(own)


def resolved_path(tooldef: Any, ordered: dict[str, Any]) -> Any:
    """The file a file tool's first argument resolves to (a ``ToolPath``), or None for other tools.

    Raises the tool's own error for a path it would refuse; any other failure to
    resolve becomes a permanent tool error: never a call decided on a guess.
    """
    from apollia_nb.runtime.tools import classify_error

    if tooldef.resolve_path is None or not tooldef.parameter_names:
        return None
    first = tooldef.parameter_names[0]
    if first not in ordered:
        return None  # the call does not bind: the tool refuses it with BAD_ARGUMENT
    try:
        return tooldef.resolve_path(ordered[first])
    except Exception as exc:
        raise classify_error(exc, tool=tooldef.name) from None


def argument_aliases(tooldef: Any, ordered: dict[str, Any]) -> tuple[str, ...]:
    """What deny rules see besides the first argument (``Call.aliases``).

    The other spellings of the first argument the tool's parser reads
    (``ToolDef.aliases``), and the text of every argument the tool did not declare:
    a tool whose schema admits any argument (``additionalProperties``) would
    otherwise let the agent choose which one comes first. A failure is a permanent
    tool error: never a call decided on a guess.
    """
    from apollia_nb.runtime.tools import classify_error

    from apollia_nb.errors import BadArgument
    from apollia_nb.governance.decision import leaf_texts

    declared = tooldef.parameter_names
    texts: list[str] = []
    for key, value in ordered.items():
        if key not in declared:
            found = leaf_texts(value)
            if found is None:
                raise BadArgument(f"{tooldef.name}: the argument {key!r} is too large or nested too deep to decide on")
            texts += [key, *found]
    if tooldef.aliases is None or not declared or declared[0] not in ordered:
        return tuple(texts)
    try:
        return (*tooldef.aliases(ordered[declared[0]]), *texts)
    except Exception as exc:
        raise classify_error(exc, tool=tooldef.name) from None


async def continue_after_answer(
    rt: "GovernedHost", agent: "Agent", card: "Card", *, decision: Decision | None = None
) -> CallResult:
    """Carry out an answered card: ``once``/``always`` run the call, ``refuse`` refuses it.

    A file tool's path is resolved again first: the answer was given for the file it
    named then. When it now names another file (a link changed while the card
    waited, or the card outlived a restart), an organisation policy or a deny rule
    that refuses the new file refuses the call, and so does a new file that is asked
    about every time (where code runs, in ``.git``): the answer did not cover it.
    """
    if card.answer_value == "refuse":
        why = f"refused by {card.answered_by}"
        return await _refused(rt, agent, card.run_id, card.call_id, card.tool, card.arguments, why, decision)
    unbound = unbound_approval(rt, card)
    tooldef = agent.tools.get(card.tool)
    arguments = card.call_arguments
    recomputed = shown_call(tooldef, arguments, known_secrets(rt, agent))
    if unbound is None and arguments is not card.arguments and recomputed.arguments != card.arguments:
        unbound = ("changed", "the call's arguments are not those its approval was given for")
    if unbound is not None:
        why, words = unbound
        void = ("approval_refused", {"call_id": card.call_id, "decision_id": card.id, "why": why, "reason": words,
                                     "answered_by": card.answered_by, "digest": card.digest,
                                     **({"expires_at": card.expires_at} if card.expires_at else {})})
        return await _refused(rt, agent, card.run_id, card.call_id, card.tool, card.arguments, words, decision,
                              prefix=[void])
    card.used = True
    shown = ShownCall(card.arguments, recomputed.secrets)
    if arguments is card.arguments and _has_redaction(arguments):
        # Opened by a process that has ended: the clear value was kept nowhere, the call cannot be made.
        return await lost_call(rt, agent, run_id=card.run_id, call_id=card.call_id, name=card.tool,
                               arguments=card.arguments)
    try:
        path = resolved_path(tooldef, arguments)
    except ApolliaError as exc:
        return await _stopped_short(rt, agent, card.run_id, card.call_id, card.tool, arguments, exc, shown=shown)
    if path is not None and path.relative != card.path:
        again = decide(Call(agent=agent.name, tool=card.tool, family=tooldef.family, arguments=arguments,
                            connection=tooldef.connection, paths=path.names, shell=tooldef.shell,
                            code_places=_code_places(agent) if tooldef.family is Family.WRITE else None),
                       rt.governance.view())
        # Refused by policy or a deny rule; or a file asked about every time (where code runs, .git),
        # which the answer, given for another file, does not cover.
        if (again.outcome is Outcome.REFUSE and again.line in (1, 2)) or (
                again.outcome is Outcome.ASK and again.line == 5):
            why = shown.text(f"the path now resolves to {path.relative!r}: {again.reason}")
            if again.outcome is Outcome.ASK:
                why += f"; the answer was given for {card.path!r}"
            return await _refused(rt, agent, card.run_id, card.call_id, card.tool, card.arguments, why, again)
    return await run_approved_call(rt, agent, run_id=card.run_id, call_id=card.call_id, name=card.tool,
                                   arguments=arguments, decision=decision, shown=shown)


def unbound_approval(rt: Any, card: "Card") -> tuple[str, str] | None:
    """Why an approval no longer carries out its card's call, as ``(used|expired|stale, words)``, or None:
    it does. It is used once; it holds until its ``expires_at``; and it was given for what the card
    shows (its ``digest``)."""
    from apollia_nb.governance.approvals import expired

    if card.used:
        return "used", f"the approval given by {card.answered_by} was used already, for call {card.call_id}"
    clock = getattr(rt, "clock", None)
    if card.expires_at is not None and expired(clock() if clock is not None else time.time(), card.expires_at):
        return "expired", f"the approval given by {card.answered_by} expired at {card.expires_at}"
    if card.approved_digest is not None and card.approved_digest != card.digest:
        return "stale", (f"the approval given by {card.answered_by} was for {card.approved_digest}, and the card "
                         f"now shows {card.digest}")
    return None


async def lost_call(rt: "GovernedHost", agent: "Agent", *, run_id: str, call_id: str, name: str,
                    arguments: dict[str, Any], prefix: Sequence[tuple[str, dict[str, Any]]] = ()) -> CallResult:
    """A call the model asked for in a process that has ended, whose arguments held sensitive values
    (kept in clear by that process alone): never decided, never run, ``INTERRUPTED``."""
    from apollia_nb.errors import Interrupted

    lost = Interrupted(f"{name}: the call's arguments held sensitive values, kept only by the process "
                       "that asked; it has ended, so the call cannot be carried out")
    return await _stopped_short(rt, agent, run_id, call_id, name, arguments, lost, prefix=prefix,
                                shown=ShownCall(arguments, {}))


def _has_redaction(value: Any) -> bool:
    """Some text of ``value`` reads as redacted (``[redacted]``, ``[redacted: …]``)."""
    if isinstance(value, str):
        return "[redacted" in value
    if isinstance(value, dict):
        return any(_has_redaction(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_redaction(v) for v in value)
    return False


async def _stopped_short(rt: "GovernedHost", agent: "Agent", run_id: str, call_id: str, name: str,
                         arguments: dict[str, Any], exc: ApolliaError,
                         prefix: Sequence[tuple[str, dict[str, Any]]] = (), *, shown: ShownCall) -> CallResult:
    """A call that never reached its tool (unknown tool, bad arguments, a path the tool refuses)."""
    await commit_entries(rt, run_id, agent, [*prefix, (
        "tool_result",
        {"call_id": call_id, "tool": name, "status": "error", "error_code": exc.code,
         "output": None, "output_digest": NULL_DIGEST},
    )])
    return CallResult(call_id, name, "error", error_code=exc.code, error_message=shown.text(exc.message),
                      arguments=shown.arguments)


async def commit_entries(rt: "GovernedHost", run_id: str, agent: "Agent",
                         drafts: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Append entries in one transaction; durable when this returns."""
    from apollia_nb.journal.store import Draft

    await rt.journal.append_many_async([Draft(kind, payload, run_id, agent.name) for kind, payload in drafts])


def _committer(rt: "GovernedHost", run_id: str, agent: "Agent",
               drafts: Sequence[tuple[str, dict[str, Any]]]) -> Any:
    """``commit_entries`` as a blocking function, for a worker thread: durable when it returns."""
    from apollia_nb.journal.store import Draft

    journal, name = rt.journal, agent.name
    items = [Draft(kind, payload, run_id, name) for kind, payload in drafts]
    return lambda: journal.append_many(items)


async def _refused(rt: "GovernedHost", agent: "Agent", run_id: str, call_id: str, name: str,
                   arguments: dict[str, Any], reason: str, decision: Decision | None,
                   prefix: Sequence[tuple[str, dict[str, Any]]] = ()) -> CallResult:
    await commit_entries(rt, run_id, agent, [*prefix, (
        "tool_result",
        {"call_id": call_id, "tool": name, "status": "refused", "error_code": "REFUSED",
         "output": None, "output_digest": NULL_DIGEST},
    )])
    return CallResult(call_id, name, "refused", error_code="REFUSED", error_message=reason,
                      decision=decision, arguments=arguments)


async def run_approved_call(
    rt: "GovernedHost", agent: "Agent", *, run_id: str, call_id: str, name: str,
    arguments: dict[str, Any], decision: Decision | None = None,
    prefix: Sequence[tuple[str, dict[str, Any]]] = (), checked: bool = False, shown: ShownCall | None = None,
) -> CallResult:
    """Journal ``tool_call`` (durable, with ``prefix``), run the tool under its breaker and timeout,
    journal the result (``append_soon``: committed before anything later of the run).

    ``checked``: ``arguments`` are what ``order_arguments`` made of the model's for this
    tool in this very call (not a card's, which may have outlived a change of the tool).
    ``shown``: the call as ``shown_call`` showed it when it was decided (made here when not given);
    the tool alone receives ``arguments``, the journal and the result have ``shown``."""
    from apollia_nb.runtime.outputs import redacted_outcome
    from apollia_nb.runtime.tools import invoke, is_async_body

    tooldef = agent.tools.get(name)
    if shown is None:
        shown = shown_call(tooldef, arguments, known_secrets(rt, agent))
    tags = subject_tags(rt, tooldef, arguments)
    called: dict[str, Any] = {"call_id": call_id, "tool": name, "arguments": shown.arguments}
    drafts = [*prefix, ("tool_call", {**called, **subjects_field("tool_call", tags, called)})]
    before = None
    if is_async_body(tooldef.fn):
        await commit_entries(rt, run_id, agent, drafts)
    else:
        # Committed in the worker thread that runs the body, just before it: the body starts
        # once the entries are durable, without a hand-off back to the event loop between.
        before = _committer(rt, run_id, agent, drafts)
    scope = current_call.set(CallScope(rt, agent, run_id, call_id, name))
    try:
        outcome = await invoke(tooldef, arguments, breakers=rt.breakers, before=before, checked=checked)
    finally:
        current_call.reset(scope)
    invoked = outcome
    outcome = redacted_outcome(outcome, shown.secrets)  # no known secret, no sensitive argument reaches journal or model
    # The result records what already happened: handed to the journal's writer, which
    # commits it at once and before any later entry of the run, while the run goes on
    # (the next model turn depends on no durable entry; the next tool call waits for its own).
    if outcome.status == "ok":
        # The digest invoke computed is of this output unless redaction changed it.
        kept, digest, _ = capped_output(outcome.output, outcome.output_digest if outcome is invoked else None)
        result: dict[str, Any] = {"call_id": call_id, "tool": name, "status": "ok", "output": kept,
                                  "output_digest": digest}
        rt.journal.append_soon("tool_result", {**result, **subjects_field("tool_result", tags, result)},
                               run_id=run_id, agent=agent.name)
        return CallResult(call_id, name, "ok", output=outcome.output, decision=decision, arguments=shown.arguments)
    err: ApolliaError | None = outcome.error
    code = outcome.error_code or (err.code if err else "TOOL_ERROR")
    message = err.message if err else code
    failed: dict[str, Any] = {"call_id": call_id, "tool": name, "status": "error", "error_code": code,
                              "output": {"message": message}, "output_digest": capped_output({"message": message})[1]}
    rt.journal.append_soon("tool_result", {**failed, **subjects_field("tool_result", tags, failed)},
                           run_id=run_id, agent=agent.name)
    return CallResult(call_id, name, "error", error_code=code, error_message=message,
                      decision=decision, arguments=shown.arguments)


async def governed_request(
    rt: "GovernedHost", scope: CallScope, *, tool: str, family: Any, arguments: dict[str, Any],
    connection: str | None, hints: dict[str, Any] | None = None, decided: Decision | None = None,
    timeout_secs: float | None = None, request: str | None = None, fields: dict[str, Any] | None = None,
) -> tuple[str, Decision, "Card | None"]:
    """Decide a request a tool's connection makes during a call (a server's model call, its question).

    Journals the ``decision`` (durable), then asks when governance says so: a card
    of the run, waited on by the request (the call that caused it is still in
    flight, whatever the mode). ``decided``: a decision made already (a question to a
    person is always asked). ``request``: what the server asks (``cards.QUESTION``,
    ``cards.MODEL_CALL``), marked on the card. Returns the request's own call id, the decision and
    the card; the decision's outcome is ``refuse`` when refused or answered
    ``refuse`` (the card says by whom), ``allow`` otherwise. Nothing is run here.
    ``fields``: more of the ``decision`` entry's payload (another agent's call: its ``source``).
    """

    agent = scope.agent
    call_id = new_id("req")
    fam = Family(family) if family is not None else None
    decision = decided if decided is not None else decide(
        Call(agent=agent.name, tool=tool, family=fam, arguments=arguments, connection=connection),
        rt.governance.view())
    await commit_entries(rt, scope.run_id, agent, [(
        "decision",
        {"call_id": call_id, "tool": tool, "family": fam.value if fam else None, "arguments": arguments,
         "outcome": decision.outcome.value, "line": decision.line, "answers": [a.value for a in decision.answers],
         "reason": decision.reason, "connection": connection, "caused_by": scope.call_id,
         **({"hints": hints} if hints else {}), **(fields or {})},
    )])
    if decision.outcome is not Outcome.ASK:
        return call_id, decision, None
    run, session_id = run_of(rt, scope.run_id)
    task_id = getattr(run, "id", None) if session_id is None else None
    card = await rt.open_card_async(agent=agent, run_id=scope.run_id, call_id=call_id, tool=tool,
                                     family=fam.value if fam else None, arguments=arguments, decision=decision,
                                     task_id=task_id, session_id=session_id, hints=hints, request=request)
    shown = _show_waiting(run, card)
    try:
        from apollia_nb.runtime.cards import CHAT_CARD_TIMEOUT_SECS

        limit = timeout_secs if timeout_secs is not None else CHAT_CARD_TIMEOUT_SECS
        with anyio.move_on_after(limit):
            while card.waiting:
                await card.wait()
                if card.waiting:  # released (nobody watches any more): the call is in flight, it waits on
                    card._event = anyio.Event()
        if card.waiting:
            try:
                rt.answer(card.id, "refuse", by="timeout", reason=f"unanswered for {limit:g} s")
            except Conflict:
                pass  # answered elsewhere at the same moment: that answer stands
            await card.wait()
    finally:
        if card.waiting:  # the call ended first (cancelled): nobody may answer a question no longer asked
            with anyio.CancelScope(shield=True):
                try:
                    rt.answer(card.id, "refuse", by="system", reason="the call that asked has ended")
                except ApolliaError:
                    pass
        if shown:
            await _show_waiting_done(run, card)
    if card.answer_value == "refuse":
        return call_id, Decision(Outcome.REFUSE, decision.line, reason=f"refused by {card.answered_by}"), card
    return call_id, Decision(Outcome.ALLOW, decision.line, reason=f"answered {card.answer_value} by "
                             f"{card.answered_by}"), card


def run_of(rt: "GovernedHost", run_id: str) -> tuple[Any, str | None]:
    """The task run (or chat session id) that ``run_id`` belongs to."""
    for run in list(getattr(rt, "_runs", {}).values()):
        if run.r.run_id == run_id:
            return run, None
    sessions = getattr(rt, "sessions", None)
    for session in list(getattr(sessions, "_sessions", {}).values()) if sessions is not None else []:
        if getattr(session, "r", {}).get("run_id") == run_id:
            return None, session.id
    return None, None


def _show_waiting(run: Any, card: Any) -> bool:
    """A task whose in-flight call waits on a person shows as waiting (its call goes on once answered).

    Derived, not written: the card is among the record's ``asking`` (never saved), so the record's
    status stays ``running``, which is what a restart must find (a call was in flight: the run is
    interrupted and its open decisions are closed), not a parked run."""
    if run is None or run.r.finished:
        return False
    run.r.asking.add(card.id)
    run.rt.events.notify(run)
    return True


async def _show_waiting_done(run: Any, card: Any) -> None:
    run.r.asking.discard(card.id)
    run.rt.events.notify(run)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
