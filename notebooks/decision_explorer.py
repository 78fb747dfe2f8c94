"""An interactive explorer of ``decide()`` for the governance notebook (02-governance-six-lines).

Pick an agent, a tool, its family, the call's arguments, the fine rules, the standing
consents and run grants, developer mode and an organisation policy; the explorer calls
``apollia_nb.governance.decide`` and shows which of the six lines decided, and why.

The core is pure (``parse_rules``, ``build``, ``explain_html``, ``explain_text``); the
``DecisionExplorer`` class only wires ipywidgets to it. Displayed, an explorer carries
``text/plain`` and ``text/html`` renderings of its current state beside the live widget,
so a saved notebook shows the decision where no widget runs.
"""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apollia_nb.governance import Call, Decision, Family, GovernanceView, Policy, Rule, decide
from apollia_nb.runtime.builtins import BUILTIN_FAMILIES

__all__ = ["LINES", "Setting", "parse_rules", "build", "explain_text", "explain_html", "DecisionExplorer"]

UNCLASSIFIED = "(unclassified)"
FAMILIES = [f.value for f in Family]

LINES: dict[int, str] = {
    1: "organisation policy refuses the tool, its connection or its family → refuse",
    2: "a fine deny rule matches → refuse",
    3: "family read, conversation or memory → allow",
    4: "family execute → allow only in developer mode, by an allow rule, for one simple command; else ask",
    5: "family profile → ask; else allow on a standing consent or a run grant",
    6: "anything left → ask (once/always/refuse; unclassified: once/refuse)",
}
FAIL_CLOSED = "0: governance unreadable (fail closed) → refuse what lines 1–3 did not decide"

EXAMPLE_ARGUMENTS: dict[str, dict[str, Any]] = {
    "read_file": {"path": "notes/meeting.txt"},
    "list_dir": {"path": "notes"},
    "write_file": {"path": "notes/summary.txt", "content": "Launch moves to Friday."},
    "delete_file": {"path": "notes/old.txt"},
    "bash_executor": {"command": "git status --short"},
    "python_executor": {"code": "print(1 + 1)"},
    "http_request": {"url": "https://example.org/hook", "method": "POST", "body": "hello"},
    "memory_save": {"key": "launch", "value": "Friday"},
    "memory_recall": {"key": "launch"},
    "profile_propose_fact": {"fact": "prefers short summaries"},
    "notebook_get_variable": {"name": "df"},
    "notebook_list_variables": {},
    "notebook_set_variable": {"name": "threshold", "value": 3},
}


@dataclass(frozen=True)
class Setting:
    """Everything the explorer's form holds, as plain values."""

    agent: str = "clerk"
    tool: str = "write_file"
    family: str | None = "write"
    arguments: str = json.dumps(EXAMPLE_ARGUMENTS["write_file"])
    connection: str = ""
    rules: str = ""
    consents: tuple[str, ...] = ()
    run_grants: tuple[str, ...] = ()
    developer_mode: bool = False
    refuse_families: tuple[str, ...] = ()
    refuse_tools: str = ""
    refuse_connections: str = ""
    policy_deposited: bool = False
    readable: bool = True


def parse_rules(text: str) -> list[Rule]:
    """One rule per line: ``EFFECT TOOL [PREFIX] [AGENT]`` — quote a prefix with spaces; ``#`` starts a comment.

    ``deny write_file secrets/`` · ``allow bash_executor "git status" clerk`` · ``deny http_request``
    """
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) < 2 or len(words) > 4 or words[0] not in ("allow", "deny"):
            raise ValueError(f"rule line {number}: write EFFECT TOOL [PREFIX] [AGENT], e.g. deny write_file secrets/")
        effect, tool, *rest = words
        prefix = rest[0] if rest else None
        agent = rest[1] if len(rest) > 1 else "*"
        rules.append(Rule(tool=tool, effect=effect, prefix=prefix, agent=agent, id=f"rule {number}"))
    return rules


def _names(text: str) -> frozenset[str]:
    return frozenset(w.strip() for w in text.split(",") if w.strip())


def build(setting: Setting) -> tuple[Call, GovernanceView]:
    """The ``Call`` and ``GovernanceView`` a setting stands for (``ValueError`` when it cannot be built)."""
    try:
        arguments = json.loads(setting.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"the arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ValueError("the arguments must be a JSON object, e.g. {\"path\": \"notes/a.txt\"}")
    if not setting.agent or not setting.tool:
        raise ValueError("name an agent and a tool")
    # As the runtime builds it: only bash_executor's first argument is a shell command.
    call = Call(agent=setting.agent, tool=setting.tool, family=setting.family, arguments=arguments,
                connection=setting.connection or None, run_grants=frozenset(setting.run_grants),
                shell=setting.tool == "bash_executor")
    policy = None
    if setting.policy_deposited:
        policy = Policy(refuse_tools=_names(setting.refuse_tools),
                        refuse_connections=_names(setting.refuse_connections),
                        refuse_families=frozenset(setting.refuse_families))
    view = GovernanceView(rules=parse_rules(setting.rules),
                          consents=frozenset((setting.agent, f) for f in setting.consents),
                          developer_mode=setting.developer_mode, policy=policy, readable=setting.readable,
                          unreadable_reason="" if setting.readable else "governance.db cannot be read")
    return call, view


def _decision(setting: Setting) -> tuple[Decision | None, str | None]:
    try:
        call, view = build(setting)
    except (ValueError, TypeError) as exc:
        return None, str(exc)
    return decide(call, view), None


def _answers(decision: Decision) -> str:
    return "/".join(str(a) for a in decision.answers) or "—"


def _call_words(setting: Setting) -> str:
    family = setting.family or "unclassified"
    connection = f" via {setting.connection}" if setting.connection else ""
    return f"{setting.agent} → {setting.tool} ({family}){connection} {setting.arguments}"


def _view_words(setting: Setting) -> list[str]:
    words = []
    try:
        rules = parse_rules(setting.rules)
    except ValueError:
        rules = []
    for rule in rules:
        prefix = f" {rule.prefix!r}" if rule.prefix else ""
        words.append(f"rule: {rule.effect} {rule.tool}{prefix} for {rule.agent}")
    if setting.consents:
        words.append(f"standing consents of {setting.agent}: {', '.join(setting.consents)}")
    if setting.run_grants:
        words.append(f"run grants: {', '.join(setting.run_grants)}")
    words.append(f"developer mode {'on' if setting.developer_mode else 'off'}")
    if setting.policy_deposited:
        refused = [*(f"family {f}" for f in setting.refuse_families), *(f"tool {t}" for t in sorted(_names(setting.refuse_tools))),
                   *(f"connection {c}" for c in sorted(_names(setting.refuse_connections)))]
        words.append("policy refuses: " + (", ".join(refused) or "nothing"))
    else:
        words.append("no organisation policy")
    if not setting.readable:
        words.append("governance unreadable")
    return words


def explain_text(setting: Setting) -> str:
    """The call, the view, the decision and the line that made it, as text."""
    decision, error = _decision(setting)
    lines = [f"call: {_call_words(setting)}", *(f"  {w}" for w in _view_words(setting))]
    if decision is None:
        return "\n".join([*lines, f"cannot decide: {error}"])
    lines.append(f"decision: {decision.outcome} by line {decision.line} · answers {_answers(decision)}")
    lines.append(f"  {decision.reason}")
    return "\n".join(lines)


_COLOURS = {"allow": "#1a7f37", "refuse": "#cf222e", "ask": "#9a6700"}


def _lines_html(decided: int) -> str:
    items = []
    for number, words in LINES.items():
        if decided != 0 and number < decided:
            style, note = "color:#57606a", " — did not apply"
        elif number == decided:
            style, note = "font-weight:bold", " ← decided"
        else:
            style, note = "color:#8c959f", ""
        items.append(f"<li style='{style}'>{number}. {html.escape(words)}{note}</li>")
    fail = "font-weight:bold" if decided == 0 else "color:#8c959f"
    note = " ← decided" if decided == 0 else ""
    items.append(f"<li style='{fail}'>{html.escape(FAIL_CLOSED)}{note}</li>")
    return "<ul style='list-style:none;padding-left:0;margin:4px 0'>" + "".join(items) + "</ul>"


def explain_html(setting: Setting) -> str:
    """The decision with the six lines, the deciding one marked, as HTML."""
    decision, error = _decision(setting)
    view = "".join(f"<li>{html.escape(w)}</li>" for w in _view_words(setting))
    head = (f"<div><b>call</b> <code>{html.escape(_call_words(setting))}</code></div>"
            f"<ul style='margin:2px 0'>{view}</ul>")
    if decision is None:
        body = f"<div style='color:#cf222e'>cannot decide: {html.escape(error or '')}</div>"
    else:
        colour = _COLOURS[str(decision.outcome)]
        body = (f"<div style='font-size:110%'><b style='color:{colour}'>{html.escape(str(decision.outcome))}</b> "
                f"by line {decision.line} · answers <code>{html.escape(_answers(decision))}</code></div>"
                f"<div><i>{html.escape(decision.reason)}</i></div>" + _lines_html(decision.line))
    return (f"<div class='apollia-explorer' style='border:1px solid #d0d7de;border-radius:6px;padding:6px 10px'>"
            f"{head}{body}</div>")


class DecisionExplorer:
    """The form, wired to ``decide()``: every change shows the new decision."""

    def __init__(self, setting: Setting = Setting()) -> None:
        import ipywidgets as W

        self.setting = setting
        wide = W.Layout(width="98%")
        self.agent = W.Text(setting.agent, description="agent")
        self.tool = W.Combobox(value=setting.tool, options=sorted(BUILTIN_FAMILIES), description="tool",
                               ensure_option=False)
        self.family = W.Dropdown(options=[*FAMILIES, UNCLASSIFIED], value=setting.family or UNCLASSIFIED,
                                 description="family")
        self.arguments = W.Text(setting.arguments, description="arguments", layout=wide)
        self.connection = W.Text(setting.connection, description="connection", placeholder="an MCP server or host")
        self.rules = W.Textarea(setting.rules, description="rules", rows=3, layout=wide,
                                placeholder='one per line: deny write_file secrets/ · allow bash_executor "git status" clerk')
        self.consents = W.SelectMultiple(options=FAMILIES, value=setting.consents, rows=8,
                                         description="consents")
        self.run_grants = W.SelectMultiple(options=FAMILIES, value=setting.run_grants, rows=8,
                                           description="run grants")
        self.developer_mode = W.Checkbox(setting.developer_mode, description="developer mode")
        self.readable = W.Checkbox(setting.readable, description="governance readable")
        self.policy_deposited = W.Checkbox(setting.policy_deposited, description="organisation policy")
        self.refuse_families = W.SelectMultiple(options=FAMILIES, value=setting.refuse_families, rows=8,
                                                description="refuses")
        self.refuse_tools = W.Text(setting.refuse_tools, description="tools", placeholder="comma-separated")
        self.refuse_connections = W.Text(setting.refuse_connections, description="connections",
                                         placeholder="comma-separated")
        self.result = W.HTML()
        self._fields = {
            "agent": self.agent, "tool": self.tool, "family": self.family, "arguments": self.arguments,
            "connection": self.connection, "rules": self.rules, "consents": self.consents,
            "run_grants": self.run_grants, "developer_mode": self.developer_mode, "readable": self.readable,
            "policy_deposited": self.policy_deposited, "refuse_families": self.refuse_families,
            "refuse_tools": self.refuse_tools, "refuse_connections": self.refuse_connections,
        }
        for name, widget in self._fields.items():
            widget.observe(self._changed, names="value")
        self.tool.observe(self._tool_picked, names="value")
        call = W.VBox([W.HTML("<b>The call</b>"), W.HBox([self.agent, self.tool, self.family]), self.arguments,
                       self.connection])
        view = W.VBox([W.HTML("<b>What governance holds</b>"), self.rules,
                       W.HBox([self.consents, self.run_grants]),
                       W.HBox([self.developer_mode, self.readable]),
                       W.HBox([self.policy_deposited, self.refuse_families,
                               W.VBox([self.refuse_tools, self.refuse_connections])])])
        self.box = W.VBox([call, view, W.HTML("<b>The decision</b>"), self.result])
        self._render()

    def _tool_picked(self, change: Mapping[str, Any]) -> None:
        """A built-in tool brings its family and example arguments."""
        tool = change["new"]
        if tool in BUILTIN_FAMILIES:
            self.family.value = BUILTIN_FAMILIES[tool].value
            self.arguments.value = json.dumps(EXAMPLE_ARGUMENTS.get(tool, {}))

    def _read(self) -> Setting:
        family = self.family.value
        return Setting(
            agent=self.agent.value.strip(), tool=self.tool.value.strip(),
            family=None if family == UNCLASSIFIED else family, arguments=self.arguments.value,
            connection=self.connection.value.strip(), rules=self.rules.value, consents=tuple(self.consents.value),
            run_grants=tuple(self.run_grants.value), developer_mode=self.developer_mode.value,
            refuse_families=tuple(self.refuse_families.value), refuse_tools=self.refuse_tools.value,
            refuse_connections=self.refuse_connections.value, policy_deposited=self.policy_deposited.value,
            readable=self.readable.value,
        )

    def _changed(self, _change: Any = None) -> None:
        self.setting = self._read()
        self._render()

    def _render(self) -> None:
        self.result.value = explain_html(self.setting)

    def set(self, **values: Any) -> "DecisionExplorer":
        """Change fields from code (as a trainer would in the form): ``explorer.set(developer_mode=True)``."""
        # The tool first: picking a built-in tool brings its family and example arguments.
        for name, value in sorted(values.items(), key=lambda item: item[0] != "tool"):
            widget = self._fields[name]
            if name == "family" and value is None:
                value = UNCLASSIFIED
            if name == "arguments" and not isinstance(value, str):
                value = json.dumps(value)
            if isinstance(value, Iterable) and not isinstance(value, str):
                value = tuple(value)
            widget.value = value
        return self

    @property
    def decision(self) -> Decision | None:
        return _decision(self.setting)[0]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle = dict(self.box._repr_mimebundle_() or {})
        bundle["text/plain"] = explain_text(self.setting)
        bundle["text/html"] = explain_html(self.setting)
        return bundle

    def __repr__(self) -> str:
        return explain_text(self.setting)
