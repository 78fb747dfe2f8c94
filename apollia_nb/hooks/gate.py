"""Decide another agent's call on a home, and wait on the inbox when governance asks.

``answer_hook(rt, tool, raw)`` is the whole of it, for the command form (a process that owns
the home) and for ``POST /api/v1/hooks/{tool}`` (the server that does): read the tool's hook
input, find (or register) the agent of that tool and project, map the call to ours
(``mapping.py``), resolve its file against the project as our file tools do
(``runtime/paths.py``: a path outside the project or into the home is refused), decide it with
the same ``decide()`` and snapshot our own calls get, journal the decision (durable before the
answer), and answer in the tool's format (``codecs.py``).

An asked call opens a pending decision (listed by ``GET /pending-decisions``, ``apollia-os
pending list``, the panel and the notebook's cards) and waits for it up to ``ask_timeout_secs``;
unanswered, it is answered ``refuse`` by ``timeout`` and the call is denied. A home this process
owns for the length of one hook has nobody else to answer, so there the wait is zero. A refusal
journals a ``tool_result`` with status ``refused``; an allowed call's result is journaled when the
tool reports it (``PostToolUse``, ``after…``). An answer approves the one hook call its card shows,
once, until its ``expires_at``: an approval that has ended by the time the hook takes it (or that
was taken already) denies the call, journaled ``approval_refused`` with ``why`` as a run's approved
call is. Every entry carries ``source`` (the tool) and
``source_tool`` (its own name for the call). Anything that fails on the way denies (fail closed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import uuid
from typing import Any

import anyio

from apollia_nb.errors import ApolliaError, Conflict, UnknownAgent
from apollia_nb.governance.decision import Call, Decision, Outcome, decide
from apollia_nb.hooks.codecs import (
    HookEvent,
    MalformedHook,
    Reply,
    Verdict,
    load,
    malformed_reply,
    parse,
    reply,
)
from apollia_nb.hooks.mapping import Mapped, hook_settings, map_call
from apollia_nb.runtime.governed import capped_output, commit_entries, known_secrets, shown_call, unbound_approval
from apollia_nb.runtime.paths import code_places, resolve_tool_path

__all__ = ["answer_hook", "agent_name", "run_id_of", "combine"]

_NAME_PART = re.compile(r"[^a-z0-9_-]+")
_RUN_PART = re.compile(r"[^A-Za-z0-9_.-]+")
_SEVERITY = {Outcome.ALLOW: 0, Outcome.ASK: 1, Outcome.REFUSE: 2}


def agent_name(tool: str, project: str, *, salted: bool = False) -> str:
    """The agent of ``tool`` working in ``project``: ``<tool>_<project folder name>`` (agent names are
    ``[a-z0-9_-]+``); ``salted`` adds the first 8 hex digits of the folder's path's SHA-256, for a
    second project whose folder has the name of one registered already."""
    base = os.path.basename(os.path.normpath(project)) or "root"
    slug = _NAME_PART.sub("-", base.lower()).strip("-")[:48] or "project"
    name = f"{tool}_{slug}"
    if salted:
        name += "-" + hashlib.sha256(os.path.realpath(project).encode()).hexdigest()[:8]
    return name


def run_id_of(tool: str, session: str) -> str:
    """The run an external agent's session is journaled under: ``hook-<tool>-<session>``."""
    return f"hook-{tool}-{_RUN_PART.sub('_', session)[:80] or 'session'}"


def combine(ours: Decision, own: Decision | None) -> Decision:
    """Our tool's decision and the decision by the tool's own name (a rule may name either): a
    refusal by policy or a deny rule of either refuses; else an allow of either allows; else ours."""
    if own is None or ours.outcome is Outcome.REFUSE:
        return ours
    if own.outcome is Outcome.REFUSE and own.line in (1, 2):
        return own
    if ours.outcome is Outcome.ALLOW:
        return ours
    if own.outcome is Outcome.ALLOW and own.line == 4:  # an allow rule naming the tool's own name
        return own
    return ours


async def answer_hook(rt: Any, tool: str, raw: bytes | str | dict[str, Any], *, served: bool) -> Reply:
    """The tool's answer to one hook call on the home ``rt`` owns; never raises (a failure denies).

    ``served``: this process serves the home, so a person can answer an asked call while it waits."""
    data: Any = None
    try:
        data = raw if isinstance(raw, dict) else load(raw)
        event = parse(tool, data)
    except MalformedHook as exc:
        return malformed_reply(tool, f"apollia: malformed hook input: {exc.message}", data)
    try:
        if event.phase == "other":
            return Reply({})
        settings = hook_settings(_config_text(rt.home.config_path), tool)
        agent = await _agent_for(rt, tool, event.project)
        if event.phase == "after":
            await _journal_result(rt, agent, event, settings)
            return Reply({})
        verdict = await _decide(rt, agent, event, settings, wait=settings.ask_timeout_secs if served else 0.0,
                                served=served)
        return reply(event, verdict)
    except ApolliaError as exc:
        if event.phase == "after":  # the call ran already: nothing to block; the gap shows in the journal
            return Reply({}, stderr=f"apollia: the result was not journaled: {exc.code}: {exc.message}")
        return malformed_reply(tool, f"apollia denied the call: {exc.code}: {exc.message}", data)
    except Exception as exc:  # noqa: BLE001 - fail closed: whatever went wrong denies
        if event.phase == "after":
            return Reply({}, stderr=f"apollia: the result was not journaled: {type(exc).__name__}: {exc}")
        return malformed_reply(tool, f"apollia denied the call: it could not be decided "
                                     f"({type(exc).__name__}: {exc})", data)


#: ``apollia.toml`` as last read: ``{path: (checked at, (mtime_ns, size), parsed)}``; its ``stat()`` is
#: looked at again at most every ``CONFIG_RECHECK_SECS``, and the file read again when it changed.
_read_config: dict[str, tuple[float, tuple[int, int] | None, dict[str, Any]]] = {}
CONFIG_RECHECK_SECS = 1.0


def _config_text(path: Any) -> dict[str, Any]:
    """``apollia.toml`` as it is now, within a second (a hook reads ``[hooks]`` changes without a restart); a
    file that does not read is ``BAD_INPUT`` (the hook denies, and reads it again on its next call)."""
    import time

    from apollia_nb.config import load_config

    now = time.monotonic()
    held = _read_config.get(str(path))
    if held is not None and now - held[0] < CONFIG_RECHECK_SECS:
        return held[2]
    try:
        st = os.stat(path)
    except FileNotFoundError:
        _read_config[str(path)] = (now, None, {})
        return {}
    key = (st.st_mtime_ns, st.st_size)
    if held is not None and held[1] == key:
        _read_config[str(path)] = (now, key, held[2])
        return held[2]
    raw = load_config(path).raw
    _read_config[str(path)] = (now, key, raw)
    return raw


async def _agent_for(rt: Any, tool: str, project: str) -> Any:
    """The agent of ``tool`` in ``project``, registered on first use (its workspace is the project)."""
    from apollia_nb.runtime.states import ProcessState

    if not project or not os.path.isabs(project):
        raise MalformedHook(f"the hook input's project folder must be an absolute path, got {project!r}")
    real = os.path.realpath(project)
    for salted in (False, True):
        name = agent_name(tool, project, salted=salted)
        for _ in range(50):
            try:
                agent = rt.agent(name)
            except UnknownAgent:
                try:
                    agent = await rt.register_agent(_manifest(name, tool, real))
                except Conflict as exc:
                    if "being registered" not in exc.message:
                        raise
                    await anyio.sleep(0.02)  # another hook of this agent registers it now: take that one
                    continue
            break
        else:
            raise Conflict(f"agent {name!r} could not be registered: another registration did not finish")
        if os.path.realpath(agent.workspace) != real:
            continue  # another project of that folder name has it: this one gets the salted name
        if agent.state.state not in (ProcessState.ACTIVE, ProcessState.DEGRADED):
            raise Conflict(f"agent {name!r} is {agent.state.state.value}: its calls are denied until it is "
                           f"started again (POST /api/v1/agents/{name}/start)")
        return agent
    raise Conflict(f"no agent name is free for {tool} in {real}")


def _manifest(name: str, tool: str, project: str) -> str:
    return (f"name = {json.dumps(name)}\n"
            f"description = {json.dumps(f'{tool} working in {project}, governed through its hooks')}\n"
            f"[workspace]\nroot = {json.dumps(project)}\n")


def _call_id(event: HookEvent) -> str:
    return event.call_id or f"hook-{uuid.uuid4().hex[:12]}"


async def _decide(rt: Any, agent: Any, event: HookEvent, settings: Any, *, wait: float, served: bool) -> Verdict:
    mapped = map_call(settings, event.native, event.tool_input, mcp_families=rt.config.mcp_servers,
                      mcp_server=event.mcp_server)
    view = rt.governance.view()
    secrets = known_secrets(rt, agent)
    run_id = run_id_of(event.tool, event.session)
    base = _call_id(event)
    decided: list[tuple[Mapped, Decision, dict[str, Any], str]] = []
    drafts: list[tuple[str, dict[str, Any]]] = []
    for i, m in enumerate(mapped):
        call_id = base if i == 0 else f"{base}.{i + 1}"
        shown = shown_call(None, m.arguments, secrets)
        decision, path = _decision_of(rt, agent, m, view)
        if shown.secrets:
            decision = dataclasses.replace(decision, reason=shown.text(decision.reason))
        payload = {
            "call_id": call_id, "tool": m.tool, "family": m.family, "arguments": shown.arguments,
            "outcome": decision.outcome.value, "line": decision.line,
            "answers": [a.value for a in decision.answers], "reason": decision.reason,
            "connection": m.connection, **({"path": path} if path is not None else {}),
            "source": event.tool, "source_tool": m.native,
        }
        drafts.append(("decision", payload))
        if decision.outcome is Outcome.REFUSE:
            drafts.append(_refused_result(call_id, m, event))
        decided.append((m, decision, shown.arguments, call_id))
    await commit_entries(rt, run_id, agent, drafts)  # durable before the tool hears the answer

    worst = max(decided, key=lambda d: _SEVERITY[d[1].outcome])
    if worst[1].outcome is Outcome.REFUSE:
        return Verdict("deny", f"apollia refused {worst[0].native}: {worst[1].reason}")
    # standing: allowed by an allow rule or a standing consent, or answered always (each of its calls)
    standing = all(d.outcome is Outcome.ASK or d.line in (4, 5) for _, d, _, _ in decided)
    left = wait
    answered: list[str] = []
    for m, decision, shown_arguments, call_id in decided:
        if decision.outcome is not Outcome.ASK:
            continue
        started = anyio.current_time()
        card, answer, by, why = await _ask(rt, agent, run_id, call_id, m, decision, shown_arguments,
                                           max(left, 0.0), served)
        left -= anyio.current_time() - started
        if answer == "refuse":
            await commit_entries(rt, run_id, agent, [_refused_result(call_id, m, event)])
            return Verdict("deny", f"apollia: {m.native} was refused by {by}" + (f": {why}" if why else ""))
        void = _taken(rt, card, event, m)
        if void is not None:  # used already, ended, or given for another call than the card shows
            await commit_entries(rt, run_id, agent, [void[0], _refused_result(call_id, m, event)])
            return Verdict("deny", f"apollia: {m.native} was not carried out: {void[1]}")
        standing = standing and answer == "always"
        answered.append(f"answered {answer} by {by}")
    first = decided[0][0]
    why = "; ".join(answered) if answered else decided[0][1].reason
    return Verdict("allow", f"apollia allowed {first.native}: {why}", standing=standing,
                   rule=_claude_rule(first) if standing else None)


def _decision_of(rt: Any, agent: Any, m: Mapped, view: Any) -> tuple[Decision, str | None]:
    """``decide()`` on the mapped call, with its file resolved as our file tools resolve it; a path they
    would refuse (outside the project, into the home) is refused here, line 0, with their reason."""
    from apollia_nb.governance.decision import Family

    paths = None
    relative = None
    if m.path is not None:
        try:
            resolved = resolve_tool_path(agent.workspace, m.path, home=rt.home.path)
        except ApolliaError as exc:
            return Decision(Outcome.REFUSE, 0, reason=f"{exc.code}: {exc.message}"), None
        paths, relative = resolved.names, resolved.relative
    family = Family(m.family) if m.family is not None else None
    call = Call(agent=agent.name, tool=m.tool, family=family, arguments=m.arguments, connection=m.connection,
                paths=paths, shell=m.shell,
                code_places=code_places() if paths is not None and family is Family.WRITE else None)
    ours = decide(call, view)
    own = decide(dataclasses.replace(call, tool=m.native), view) if m.native and m.native != m.tool else None
    return combine(ours, own), relative


def _taken(rt: Any, card: Any, event: HookEvent, m: Mapped) -> tuple[tuple[str, dict[str, Any]], str] | None:
    """Take the approval of ``card`` for its one hook call: None when it holds (it is used now, and no other
    call may take it); else the ``approval_refused`` entry saying why it does not (``used``, ``expired``,
    ``stale``) and the words, as a run's approved call is refused (``governed.unbound_approval``)."""
    unbound = unbound_approval(rt, card)
    if unbound is None:
        card.used = True
        return None
    why, words = unbound
    return ("approval_refused", {"call_id": card.call_id, "decision_id": card.id, "why": why, "reason": words,
                                 "answered_by": card.answered_by, "digest": card.digest,
                                 **({"expires_at": card.expires_at} if card.expires_at else {}),
                                 "source": event.tool, "source_tool": m.native}), words


async def _ask(rt: Any, agent: Any, run_id: str, call_id: str, m: Mapped, decision: Decision,
               shown_arguments: dict[str, Any], timeout: float, served: bool) -> tuple[Any, str, str, str]:
    """Open the pending decision and wait for its answer up to ``timeout`` seconds; then refuse it.
    Returns the card, its answer, who gave it and why."""
    card = rt.open_decision(agent=agent, run_id=run_id, call_id=call_id, tool=m.tool, family=m.family,
                            arguments=shown_arguments, decision=decision)
    try:
        if timeout > 0:
            with anyio.move_on_after(timeout):
                await card.wait()
    except BaseException:  # cancelled (the hook's request ended first): nobody waits for this answer any more
        if card.waiting:
            with anyio.CancelScope(shield=True):
                try:
                    rt.answer(card.id, "refuse", by="system", reason="the hook that asked has ended")
                except ApolliaError:
                    pass
        raise
    if card.waiting:
        why = ("unanswered within the hook's ask timeout" if served else
               "nobody can answer while the hook holds the home: serve it (`apollia-os serve`) to answer "
               "asked calls from the inbox")
        try:
            rt.answer(card.id, "refuse", by="timeout", reason=why)
        except Conflict:
            why = ""  # answered elsewhere at this moment: that answer stands
        with anyio.move_on_after(5):
            await card.wait()
        if card.waiting:
            return card, "refuse", "timeout", why
        return card, str(card.answer_value), str(card.answered_by), why
    return card, str(card.answer_value), str(card.answered_by), ""


def _refused_result(call_id: str, m: Mapped, event: HookEvent) -> tuple[str, dict[str, Any]]:
    from apollia_nb.runtime.governed import NULL_DIGEST

    return ("tool_result", {"call_id": call_id, "tool": m.tool, "status": "refused", "error_code": "REFUSED",
                            "output": None, "output_digest": NULL_DIGEST, "source": event.tool,
                            "source_tool": m.native})


def _claude_rule(m: Mapped) -> dict[str, Any]:
    """Claude Code's permission rule for a standing allow: the tool, and for a command its exact text."""
    if m.native == "Bash" and isinstance(m.arguments.get("command"), str):
        return {"toolName": "Bash", "ruleContent": m.arguments["command"]}
    return {"toolName": m.native}


async def _journal_result(rt: Any, agent: Any, event: HookEvent, settings: Any) -> None:
    """A call the tool reports as run (or failed): its ``tool_result``, with the tool's output as journaled."""
    native = {"afterShellExecution": "beforeShellExecution", "afterFileEdit": "Write"}.get(event.event, event.native)
    if event.tool == "cursor" and event.event == "afterFileEdit":
        from apollia_nb.hooks.mapping import Mapped as _M

        mapped = [_M(tool="write_file", family="write", arguments={"path": event.tool_input.get("file_path")},
                     native="afterFileEdit")]
    else:
        mapped = map_call(settings, native, event.tool_input, mcp_families=rt.config.mcp_servers,
                          mcp_server=event.mcp_server)
    shown = shown_call(None, {"output": event.response}, known_secrets(rt, agent))
    kept, digest, _ = capped_output(shown.arguments["output"])
    await commit_entries(rt, run_id_of(event.tool, event.session), agent, [(
        "tool_result",
        {"call_id": _call_id(event), "tool": mapped[0].tool, "status": "error" if event.failed else "ok",
         **({"error_code": "TOOL_ERROR"} if event.failed else {}),
         "output": kept, "output_digest": digest, "source": event.tool, "source_tool": mapped[0].native},
    )])
