"""Text and HTML for everything the notebook shows: pure functions of plain snapshots.

Widgets draw their parts with these, and every displayed object carries the
same text as its ``text/plain`` and ``text/html`` fallbacks, so a saved
notebook reads well where no widget runs (GitHub, nbviewer, nbval, a
terminal). Nothing here touches the runtime, the clock or the display: the
current time is a parameter (``now``, seconds since the epoch).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LONG_VALUE_CHARS",
    "TAIL_COLUMNS",
    "status_line",
    "status_html",
    "seconds_left",
    "countdown_text",
    "card_text",
    "card_html",
    "card_state_text",
    "arguments_html",
    "task_text",
    "task_html",
    "timeline_html",
    "decisions_html",
    "agent_text",
    "agent_html",
    "table_text",
    "table_html",
    "exchange_text",
    "exchange_html",
    "verify_text",
    "verify_html",
    "replay_text",
    "replay_html",
    "error_line",
    "short_hash",
]

LONG_VALUE_CHARS = 200
"""Argument values longer than this are shown folded (``<details>``) in HTML."""

TAIL_COLUMNS = ("seq", "ts", "run_id", "agent", "kind")
"""The columns of the journal's latest entries, as ``%apollia verify`` shows them."""

_STATUS_COLOURS = {
    "completed": "#1a7f37", "running": "#0969da", "waiting": "#9a6700", "pending": "#57606a",
    "failed": "#cf222e", "cancelled": "#57606a", "active": "#1a7f37", "degraded": "#9a6700",
    "processing": "#0969da", "paused": "#9a6700", "closed": "#57606a", "stopped": "#57606a",
    "stopping": "#9a6700", "initializing": "#57606a", "once": "#1a7f37", "always": "#1a7f37",
    "refuse": "#cf222e", "ok": "#1a7f37", "error": "#cf222e", "refused": "#cf222e",
    "identical": "#1a7f37", "diverged": "#cf222e", "incomplete": "#9a6700", "skipped": "#57606a",
}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def badge(word: str) -> str:
    colour = _STATUS_COLOURS.get(word, "#57606a")
    return (f'<span style="color:{colour};border:1px solid {colour};border-radius:4px;'
            f'padding:0 4px;font-size:90%">{_e(word)}</span>')


def _box(inner: str, kind: str) -> str:
    return (f'<div class="apollia-{kind}" style="border:1px solid #d0d7de;border-radius:6px;'
            f'padding:6px 10px;margin:2px 0">{inner}</div>')


def short_hash(hex_digest: str, n: int = 12) -> str:
    return hex_digest[:n]


def error_line(code: str, message: str) -> str:
    return f"{code}: {message}"


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


# --- the status line ------------------------------------------------------------------


def _policy_words(status: Mapping[str, Any]) -> str:
    state = status.get("policy", "none")
    if state == "refused":
        return f"policy refused ({status.get('policy_reason') or 'no reason given'})"
    return f"policy {state}"


def status_line(status: Mapping[str, Any]) -> str:
    """One line: home, journal head (seq and short hash), developer mode, policy state."""
    seq = status["journal_seq"]
    head = f"#{seq} {short_hash(status['journal_head'])}" if seq else "empty"
    mode = "on" if status["developer_mode"] else "off"
    line = (f"apollia: home {status['home']} · journal {head} · developer mode {mode} · "
            f"{_policy_words(status)}")
    if status.get("governance") == "fail closed" and status.get("policy") != "refused":
        # e.g. governance.db missing or replaced: the reason names the command that restores it
        line += f" · governance fail closed ({status.get('governance_reason') or 'no reason given'})"
    if status.get("mode") == "client":  # the home is owned by `apollia-os serve` (docs/shared-home.md)
        line += " · client of apollia-os serve"
    if status.get("witnesses"):
        line += " · " + _witness_words(status["witnesses"])
    return line


def _witness_words(witnesses: list[Mapping[str, Any]]) -> str:
    """``witnesses 1/2 up to date (w2: unreachable: ...)``: how many hold the newest checkpoint."""
    current = sum(1 for w in witnesses if not w.get("pending"))
    line = f"witnesses {current}/{len(witnesses)} up to date"
    late = [f"{w['key_name']}: {w['last_error']}" for w in witnesses if w.get("pending") and w.get("last_error")]
    return line + (f" ({'; '.join(late)})" if late else "")


def status_html(status: Mapping[str, Any]) -> str:
    return f'<code class="apollia-status">{_e(status_line(status))}</code>'


# --- time -----------------------------------------------------------------------------


def _epoch(iso: str) -> float:
    return _dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def seconds_left(created_at: str, now: float, timeout: float) -> float:
    """Seconds until a conversation card created at ``created_at`` resolves to ``refuse`` (≥ 0)."""
    return max(0.0, _epoch(created_at) + timeout - now)


def countdown_text(created_at: str, now: float, timeout: float) -> str:
    left = int(round(seconds_left(created_at, now, timeout)))
    if left <= 0:
        return "unanswered: refused when the time is up"
    return f"refused automatically in {left // 60}:{left % 60:02d} unless answered"


# --- consent cards --------------------------------------------------------------------


def _family(snap: Mapping[str, Any]) -> str:
    return snap.get("family") or "unclassified"


def card_state_text(snap: Mapping[str, Any]) -> str:
    """``answered once by alice at …`` or ``waiting (answers: once/always/refuse)``."""
    if snap.get("answer"):
        who = snap.get("answered_by") or "?"
        when = snap.get("answered_at") or "?"
        return f"answered {snap['answer']} by {who} at {when}"
    return "waiting (answers: " + "/".join(snap.get("answers") or ()) + ")"


def card_text(snap: Mapping[str, Any], *, now: float | None = None, timeout: float | None = None) -> str:
    lines = [
        f"Consent card {snap['id']}: {snap['agent']} → {snap['tool']} ({_family(snap)})",
        f"  asked by line {snap.get('line')}: {snap.get('reason') or ''}".rstrip(),
    ]
    for key, value in (snap.get("arguments") or {}).items():
        lines.append(f"  {key} = {_json(value)}")
    if snap.get("path") is not None:
        lines.append(f"  resolves to {snap['path']} (in the workspace)")
    if snap.get("hints"):
        lines.append(f"  hints (not trusted): {_json(snap['hints'])}")
    if _is_question(snap) and not snap.get("answer"):
        lines.append(f"  {_QUESTION_HELP}")
    lines.append(f"  {card_state_text(snap)}")
    if not snap.get("answer") and snap.get("session_id") and now is not None and timeout is not None:
        lines.append(f"  {countdown_text(snap['created_at'], now, timeout)}")
    return "\n".join(lines)


def arguments_html(arguments: Mapping[str, Any]) -> str:
    """The arguments in full; a long value is folded behind its first characters."""
    if not arguments:
        return "<i>no arguments</i>"
    rows = []
    for key, value in arguments.items():
        text = _json(value)
        if len(text) > LONG_VALUE_CHARS:
            shown = (f"<details><summary><code>{_e(text[:80])}…</code> ({len(text)} characters)</summary>"
                     f'<pre style="white-space:pre-wrap;margin:0">{_e(text)}</pre></details>')
        else:
            shown = f'<pre style="white-space:pre-wrap;margin:0">{_e(text)}</pre>'
        rows.append(f'<tr><td style="vertical-align:top;padding-right:8px"><b>{_e(key)}</b></td><td>{shown}</td></tr>')
    return '<table class="apollia-arguments">' + "".join(rows) + "</table>"


def card_header_html(snap: Mapping[str, Any]) -> str:
    return (f"<b>{_e(snap['agent'])}</b> wants to call <code>{_e(snap['tool'])}</code> "
            f"({_e(_family(snap))}) <span style='color:#57606a'>· card {_e(snap['id'])}</span>")


def card_reason_html(snap: Mapping[str, Any]) -> str:
    out = f"<div>Asked by line {_e(snap.get('line'))}: {_e(snap.get('reason'))}</div>"
    if snap.get("path") is not None:
        out += f"<div>The path resolves to <code>{_e(snap['path'])}</code> in the workspace.</div>"
    if snap.get("hints"):
        out += (f"<div style='color:#57606a'>MCP hints (shown, not trusted): "
                f"<code>{_e(_json(snap['hints']))}</code></div>")
    if _is_question(snap) and not snap.get("answer"):
        out += f"<div>{_e(_QUESTION_HELP)}</div>"
    return out


#: What a card of a server's question (elicitation) says about answering it.
_QUESTION_HELP = ("A question from the server: answer once with the form's values from code, "
                  "card.answer(\"once\", values={...}), or refuse to decline.")


def _is_question(snap: Mapping[str, Any]) -> bool:
    """A server's question in form mode: only a card the server's connection opened says so
    (``request``), never a tool call whose name looks like one."""
    return snap.get("request") == "elicitation/create" and (snap.get("arguments") or {}).get("mode") != "url"


def card_html(snap: Mapping[str, Any], *, now: float | None = None, timeout: float | None = None) -> str:
    if snap.get("answer"):
        state_html = f"{badge(snap['answer'])} by {_e(snap.get('answered_by'))} at {_e(snap.get('answered_at'))}"
    else:
        state_html = "waiting · answers on offer: " + " ".join(badge(a) for a in snap.get("answers") or ())
        if snap.get("session_id") and now is not None and timeout is not None:
            state_html += f" · {_e(countdown_text(snap['created_at'], now, timeout))}"
    inner = (card_header_html(snap) + arguments_html(snap.get("arguments") or {}) + card_reason_html(snap)
             + f"<div>{state_html}</div>")
    return _box(inner, "card")


# --- tasks ----------------------------------------------------------------------------


def _budget(snap: Mapping[str, Any]) -> str:
    budget = snap.get("budget") or {}
    return f"{budget.get('used', 0)}/{budget.get('ceiling', 0)}"


def budget_words(snap: Mapping[str, Any]) -> str:
    """A task's budget in words, beside its bar: ``3/20 steps``, and with a token budget
    ``3/20 steps · tokens 45/44``."""
    tokens = _tokens(snap)
    return f"{_budget(snap)} steps" + (f" · {tokens}" if tokens else "")


def _tokens(snap: Mapping[str, Any]) -> str:
    """A run's token budget as shown (``tokens 45/44``), or "" when it has none."""
    tokens = (snap.get("budget") or {}).get("tokens")
    if not isinstance(tokens, Mapping):
        return ""
    unmetered = tokens.get("unmetered_turn")
    unknown = f" (turn {unmetered} reported none)" if unmetered is not None else ""
    return f"tokens {tokens.get('used', 0)}/{tokens.get('ceiling', 0)}{unknown}"


def _decision_words(d: Mapping[str, Any]) -> str:
    words = f"{d['tool']} ({d.get('family') or 'unclassified'}): {d['outcome']} by line {d.get('line')}"
    if d.get("answer"):
        words += f", answered {d['answer']} by {d.get('answered_by')}"
    return words


def task_text(snap: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]] = ()) -> str:
    tokens = f" · {_tokens(snap)}" if _tokens(snap) else ""
    lines = [f"Task {snap['id']} ({snap['agent']}): {snap['status']} · steps {_budget(snap)}{tokens} · run {snap['run_id']}",
             f"  goal: {snap.get('goal', '')}"]
    for step in snap.get("steps") or ():
        lines.append(f"  {step['index'] + 1}. [{step['status']}] {step['description']}")
        for call in step.get("tool_calls") or ():
            code = f" {call['error_code']}" if call.get("error_code") else ""
            lines.append(f"       {call['tool']}: {call['status']}{code}")
    if decisions:
        lines.append("  decisions:")
        lines += [f"    {_decision_words(d)}" for d in decisions]
    if snap.get("awaiting_plan_approval"):
        lines.append("  waiting for plan approval")
    verdict = snap.get("verdict")
    if verdict:
        reasons = "; ".join(verdict.get("reasons") or ())
        lines.append(f"  critic: {verdict['verdict']}" + (f" ({reasons})" if reasons else ""))
    if snap.get("error"):
        lines.append("  error " + error_line(snap["error"]["code"], snap["error"]["message"]))
    elif snap.get("result") is not None and snap["status"] == "completed":
        lines.append(f"  result: {_json(snap['result'])}")
    for warning in snap.get("warnings") or ():
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)


def reasoning_html(text: str) -> str:
    """A model's reasoning, folded: shown on a click, never mixed into its answer."""
    if not text:
        return ""
    return (f"<details style='color:#57606a'><summary>reasoning ({len(text)} characters)</summary>"
            f"<pre style='white-space:pre-wrap;margin:0'>{_e(text)}</pre></details>")


def timeline_html(snap: Mapping[str, Any], waiting: Sequence[Mapping[str, Any]] = ()) -> str:
    """Plan steps, each with its tool calls; the running step also lists the cards it waits on."""
    items = []
    for step in snap.get("steps") or ():
        calls = []
        for call in step.get("tool_calls") or ():
            code = f" <code>{_e(call['error_code'])}</code>" if call.get("error_code") else ""
            calls.append(f"<li><code>{_e(call['tool'])}</code> {badge(call['status'])}{code}</li>")
        if step["status"] == "running":
            for card in waiting:
                calls.append(f"<li><code>{_e(card['tool'])}</code> {badge('waiting')} on card {_e(card['id'])}</li>")
        sub = f"<ul style='margin:0'>{''.join(calls)}</ul>" if calls else ""
        thought = reasoning_html("\n\n".join(step.get("reasoning") or ()))
        items.append(f"<li>{badge(step['status'])} {_e(step['description'])}{thought}{sub}</li>")
    if not items:
        return "<div style='color:#57606a'>planning…</div>" if snap.get("status") in ("pending", "running") else ""
    return f"<ol style='margin:2px 0'>{''.join(items)}</ol>"


def decisions_html(decisions: Sequence[Mapping[str, Any]]) -> str:
    """The run's governance decisions, as the journal's ``decisions`` view has them."""
    if not decisions:
        return ""
    items = []
    for d in decisions:
        answer = (f", answered {badge(d['answer'])} by {_e(d.get('answered_by'))}" if d.get("answer") else "")
        items.append(f"<li><code>{_e(d['tool'])}</code> ({_e(d.get('family') or 'unclassified')}): "
                     f"{badge(d['outcome'])} by line {_e(d.get('line'))}{answer}</li>")
    return f"<div>Decisions:<ul style='margin:0'>{''.join(items)}</ul></div>"


def task_outcome_html(snap: Mapping[str, Any]) -> str:
    parts = []
    if snap.get("awaiting_plan_approval"):
        parts.append("<div>Waiting for plan approval.</div>")
    verdict = snap.get("verdict")
    if verdict:
        reasons = "; ".join(verdict.get("reasons") or ())
        parts.append(f"<div>Critic: {badge(verdict['verdict'])} {_e(reasons)}</div>")
    if snap.get("error"):
        parts.append(f"<div style='color:#cf222e'><code>{_e(error_line(snap['error']['code'], snap['error']['message']))}</code></div>")
    elif snap.get("result") is not None and snap.get("status") == "completed":
        parts.append(f"<div>Result: {_e(_json(snap['result']))}</div>")
    for warning in snap.get("warnings") or ():
        parts.append(f"<div style='color:#9a6700'>warning: {_e(warning)}</div>")
    return "".join(parts)


def task_header_html(snap: Mapping[str, Any]) -> str:
    return (f"<b>{_e(snap['agent'])}</b> · task <code>{_e(snap['id'])}</code> {badge(snap['status'])} "
            f"· run <code>{_e(snap['run_id'])}</code>"
            f"<div><i>{_e(snap.get('goal', ''))}</i></div>")


def budget_bar_html(snap: Mapping[str, Any]) -> str:
    budget = snap.get("budget") or {}
    used, ceiling = budget.get("used", 0), max(1, budget.get("ceiling", 1))
    pct = min(100, round(100 * used / ceiling))
    return (f"<div title='steps used'>budget {_e(_budget(snap))} "
            f"<span style='display:inline-block;width:120px;height:8px;background:#eaeef2;vertical-align:middle'>"
            f"<span style='display:block;width:{pct}%;height:8px;background:#0969da'></span></span>"
            + (f" <span title='input and output tokens of the run'>{_e(_tokens(snap))}</span>" if _tokens(snap) else "")
            + "</div>")


def task_html(snap: Mapping[str, Any], waiting: Sequence[Mapping[str, Any]] = (),
              decisions: Sequence[Mapping[str, Any]] = ()) -> str:
    inner = (task_header_html(snap) + budget_bar_html(snap) + timeline_html(snap, waiting)
             + decisions_html(decisions) + task_outcome_html(snap) + "".join(card_html(c) for c in waiting))
    return _box(inner, "task")


# --- agents and tables ----------------------------------------------------------------


def agent_text(agent: Mapping[str, Any]) -> str:
    lines = [f"Agent {agent['name']}: {agent['state']} · model {agent.get('model')} · max steps {agent.get('max_steps')}",
             f"  tools: {', '.join(agent.get('tools') or ()) or '(none)'}",
             f"  workspace: {agent.get('workspace')}"]
    for warning in agent.get("warnings") or ():
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)


def agent_html(agent: Mapping[str, Any]) -> str:
    warnings = "".join(f"<div style='color:#9a6700'>warning: {_e(w)}</div>" for w in agent.get("warnings") or ())
    inner = (f"<b>{_e(agent['name'])}</b> {badge(agent['state'])} · model {_e(agent.get('model'))} "
             f"· max steps {_e(agent.get('max_steps'))}"
             f"<div>{_e(agent.get('description') or '')}</div>"
             f"<div>tools: {', '.join(f'<code>{_e(t)}</code>' for t in agent.get('tools') or ()) or '<i>none</i>'}</div>"
             f"<div>workspace: <code>{_e(agent.get('workspace'))}</code></div>{warnings}")
    return _box(inner, "agent")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (dict, list, tuple)):
        return _json(value)
    return str(value)


def table_text(columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [min(40, max([len(c)] + [len(r[i]) for r in cells])) for i, c in enumerate(columns)]

    def fmt(values: Sequence[str]) -> str:
        return "  ".join((v if len(v) <= 40 else v[:39] + "…").ljust(w) for v, w in zip(values, widths)).rstrip()

    lines = [caption] if caption else []
    lines += [fmt(list(columns)), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def table_html(columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
    cap = f"<caption style='text-align:left'>{_e(caption)}</caption>" if caption else ""
    count = f"<div style='color:#57606a'>{len(rows)} row{'s' if len(rows) != 1 else ''}</div>"
    return f"<table class='apollia-table'>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{count}"


# --- chat -----------------------------------------------------------------------------


def exchange_text(session: Mapping[str, Any], message: str, events: Sequence[Mapping[str, Any]]) -> str:
    lines = [f"Chat {session['id']} with {session['agent']} ({session['state']})", f"  you: {message}"]
    reply = "".join(e["text"] for e in events if e["type"] == "text")
    for event in events:
        if event["type"] == "tool_result":
            code = f" {event['error_code']}" if event.get("error_code") else ""
            lines.append(f"  [{event['tool']}: {event['status']}{code}]")
        elif event["type"] == "card":
            card = event["card"]
            lines.append(f"  [card {card['id']}: {card['tool']} ({_family(card)}) asks]")
        elif event["type"] == "plan":
            lines.append("  proposed plan:")
            lines += [f"    {i + 1}. {s}" for i, s in enumerate(event["steps"])]
        elif event["type"] == "paused":
            lines.append("  [paused]")
        elif event["type"] == "end" and event.get("error"):
            lines.append("  error " + error_line(event["error"]["code"], event["error"]["message"]))
    if reply:
        lines.append(f"  {session['agent']}: {reply}")
    return "\n".join(lines)


def exchange_body_html(agent: str, message: str, events: Sequence[Mapping[str, Any]], *, cards: bool = True) -> str:
    """The user's message, tool results, (cards,) the proposed plan and the streamed reply so far."""
    parts = [f"<div><b>you:</b> {_e(message)}</div>"]
    parts.append(reasoning_html("".join(e["text"] for e in events if e["type"] == "reasoning")))
    for event in events:
        if event["type"] == "tool_result":
            code = f" <code>{_e(event['error_code'])}</code>" if event.get("error_code") else ""
            parts.append(f"<div style='color:#57606a'><code>{_e(event['tool'])}</code> {badge(event['status'])}{code}</div>")
        elif event["type"] == "card" and cards:
            parts.append(card_html(event["card"]))
        elif event["type"] == "plan":
            parts.append("<div>Proposed plan:<ol>" + "".join(f"<li>{_e(s)}</li>" for s in event["steps"]) + "</ol></div>")
        elif event["type"] == "paused":
            parts.append(f"<div>{badge('paused')}</div>")
        elif event["type"] == "end" and event.get("error"):
            parts.append(f"<div style='color:#cf222e'><code>{_e(error_line(event['error']['code'], event['error']['message']))}</code></div>")
    reply = "".join(e["text"] for e in events if e["type"] == "text")
    if reply:
        parts.append(f"<div><b>{_e(agent)}:</b> {_e(reply)}</div>")
    return "".join(parts)


def session_header_html(session: Mapping[str, Any]) -> str:
    plan = " · plan-mode" if session.get("plan_mode") else ""
    return (f"<b>{_e(session['agent'])}</b> · chat <code>{_e(session['id'])}</code> "
            f"{badge(session['state'])}{plan}")


def exchange_html(session: Mapping[str, Any], message: str, events: Sequence[Mapping[str, Any]]) -> str:
    return _box(session_header_html(session) + exchange_body_html(session["agent"], message, events), "chat")


# --- audit ----------------------------------------------------------------------------


def verify_text(report: Mapping[str, Any], head: Mapping[str, Any]) -> str:
    if report["ok"]:
        state = (f"verified: {report['entries']} entries (chain, hashes, signatures), "
                 f"{report['checked_checkpoints']} checkpoint(s)")
    else:
        where = f" at seq {report['first_bad_seq']}" if report.get("first_bad_seq") is not None else ""
        state = f"FAILED{where}: {report.get('problem')} ({report['entries']} good leading entries)"
    seq = head.get("journal_seq", 0)
    return f"Journal {head.get('home', '')}/journal.db · head #{seq} {short_hash(head.get('journal_head', ''))}\n  {state}"


def verify_html(report: Mapping[str, Any], head: Mapping[str, Any], columns: Sequence[str] = (),
                tail: Sequence[Sequence[Any]] = ()) -> str:
    word = "ok" if report["ok"] else "error"
    lines = verify_text(report, head).split("\n")
    inner = (f"<div><b>journal</b> {badge('verified' if report['ok'] else 'FAILED')} "
             f"<span style='color:{_STATUS_COLOURS[word]}'>{_e(lines[1].strip())}</span></div>"
             f"<div style='color:#57606a'>{_e(lines[0])}</div>")
    if tail:
        inner += table_html(columns, tail, "latest entries")
    return _box(inner, "journal")


def replay_text(result: Mapping[str, Any]) -> str:
    lines = [f"Replay of {result['run_id']}: {result['verdict']} · {result['responses']} model responses, "
             f"{result['calls']} tool calls, {result['entries']} entries"]
    for missing in result.get("missing") or ():
        lines.append(f"  missing: {missing}")
    for d in result.get("divergences") or ():
        lines.append(f"  at {d['position']} ({d['kind']}{', call ' + d['call_id'] if d.get('call_id') else ''}): "
                     f"expected {_json(d['expected'])}, found {_json(d['found'])}")
    return "\n".join(lines)


def replay_html(result: Mapping[str, Any]) -> str:
    lines = replay_text(result).split("\n")
    inner = (f"<b>replay</b> <code>{_e(result['run_id'])}</code> {badge(result['verdict'])} "
             f"<span style='color:#57606a'>{_e(lines[0].split(' · ', 1)[1])}</span>")
    if len(lines) > 1:
        inner += "<ul>" + "".join(f"<li>{_e(line.strip())}</li>" for line in lines[1:]) + "</ul>"
    return _box(inner, "replay")
