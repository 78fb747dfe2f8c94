"""Where a tool call is decided: ``decide(call, view) -> Decision``.

Pure: no I/O, no clock, no globals. The store (``governance/store.py``) keeps a
``GovernanceView`` snapshot current; this module only reads it. The six lines of
SPEC §4 are read in order and the first that applies decides:

1. organisation policy refuses the tool, its connection or its family → refuse
2. a fine ``deny`` rule matches → refuse
3. family ``read``, ``conversation`` or ``memory`` → allow
4. family ``execute`` → allow only in developer mode, by a matching ``allow``
   rule, for one simple command; otherwise ask (``once``/``refuse``, plus
   ``always`` in developer mode for a simple command)
5. family ``profile`` → ask (``once``/``refuse``); any other classified call →
   allow on a standing consent of the agent for the family, or a run grant
6. anything left → ask (``once``/``always``/``refuse``; unclassified:
   ``once``/``refuse``)

Fail closed: an unreadable view (``readable=False``) keeps lines 1–3 and refuses
everything else with line 0. Nothing here turns an error into an allow.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apollia_nb.governance import shellcheck

__all__ = [
    "Family",
    "Outcome",
    "Answer",
    "Effect",
    "Call",
    "Rule",
    "Policy",
    "GovernanceView",
    "Decision",
    "decide",
    "first_argument",
    "rule_matches",
    "READ_ONLY_FAMILIES",
]


class Family(str, enum.Enum):
    """A tool's family of action. Equal to its string; ``None`` means unclassified."""

    READ = "read"
    READ_PERSONAL = "read_personal"
    WRITE = "write"
    SEND = "send"
    EXECUTE = "execute"
    CONVERSATION = "conversation"
    MEMORY = "memory"
    PROFILE = "profile"

    def __str__(self) -> str:
        return self.value


class Outcome(str, enum.Enum):
    ALLOW = "allow"
    REFUSE = "refuse"
    ASK = "ask"

    def __str__(self) -> str:
        return self.value


class Answer(str, enum.Enum):
    ONCE = "once"
    ALWAYS = "always"
    REFUSE = "refuse"

    def __str__(self) -> str:
        return self.value


class Effect(str, enum.Enum):
    ALLOW = "allow"
    DENY = "deny"

    def __str__(self) -> str:
        return self.value


READ_ONLY_FAMILIES = frozenset({Family.READ, Family.CONVERSATION, Family.MEMORY})


def _family(value: Family | str | None) -> Family | None:
    if value is None or isinstance(value, Family):
        return value
    return Family(value)


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call to decide. ``arguments``' first item is the first argument."""

    agent: str
    tool: str
    family: Family | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    connection: str | None = None
    run_grants: frozenset[Family] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", _family(self.family))
        object.__setattr__(self, "run_grants", frozenset(_family(g) for g in self.run_grants))


@dataclass(frozen=True, slots=True)
class Rule:
    """A fine rule: a tool, an optional prefix of its first argument, an effect, a scope."""

    tool: str
    effect: Effect = Effect.DENY
    prefix: str | None = None
    agent: str = "*"
    id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "effect", Effect(self.effect))
        if self.prefix == "":
            object.__setattr__(self, "prefix", None)


@dataclass(frozen=True, slots=True)
class Policy:
    """An accepted organisation policy's refusals."""

    refuse_tools: frozenset[str] = frozenset()
    refuse_connections: frozenset[str] = frozenset()
    refuse_families: frozenset[Family] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "refuse_tools", frozenset(self.refuse_tools))
        object.__setattr__(self, "refuse_connections", frozenset(self.refuse_connections))
        object.__setattr__(
            self, "refuse_families", frozenset(Family(f) for f in self.refuse_families)
        )


@dataclass(frozen=True, slots=True)
class GovernanceView:
    """A snapshot of what governance holds. ``readable=False``: fail closed."""

    rules: tuple[Rule, ...] = ()
    consents: frozenset[tuple[str, Family]] = frozenset()
    developer_mode: bool = False
    policy: Policy | None = None
    readable: bool = True
    unreadable_reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(
            self, "consents", frozenset((a, Family(f)) for a, f in self.consents)
        )
        # Index rules by tool so decide() stays fast with many rules.
        by_tool: dict[str, list[Rule]] = {}
        for rule in self.rules:
            by_tool.setdefault(rule.tool, []).append(rule)
        object.__setattr__(self, "_by_tool", {k: tuple(v) for k, v in by_tool.items()})

    _by_tool: dict[str, tuple[Rule, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def rules_for(self, tool: str) -> tuple[Rule, ...]:
        return self._by_tool.get(tool, ())


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    line: int
    answers: tuple[Answer, ...] = ()
    reason: str = ""
    rule_id: str | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome is Outcome.ALLOW


_ONCE_REFUSE = (Answer.ONCE, Answer.REFUSE)
_ALL_ANSWERS = (Answer.ONCE, Answer.ALWAYS, Answer.REFUSE)


def first_argument(call: Call) -> str | None:
    """The call's first argument as text, or None when it has none."""
    for value in call.arguments.values():
        if value is None:
            return None
        return value if isinstance(value, str) else str(value)
    return None


def _scope_matches(rule: Rule, agent: str) -> bool:
    return rule.agent == "*" or rule.agent == agent


def _deny_prefix_matches(prefix: str, call: Call, arg: str | None) -> bool:
    """Deny rules match broadly: refusing too much is safe, too little is not."""
    if arg is None:
        return False
    if call.family is Family.EXECUTE:
        return shellcheck.deny_prefix_matches(prefix, arg)
    if arg.startswith(prefix):
        return True
    # Paths: "./secrets/x" and "notes/../secrets/x" are "secrets/x".
    normal = posixpath.normpath(arg) if arg else arg
    return normal.startswith(posixpath.normpath(prefix)) if normal else False


def rule_matches(rule: Rule, call: Call) -> bool:
    """Whether ``rule`` applies to ``call`` (tool, scope, prefix per its effect)."""
    if rule.tool != call.tool or not _scope_matches(rule, call.agent):
        return False
    if rule.prefix is None:
        return True
    arg = first_argument(call)
    if rule.effect is Effect.DENY:
        return _deny_prefix_matches(rule.prefix, call, arg)
    return arg is not None and shellcheck.allow_prefix_matches(rule.prefix, arg)


def decide(call: Call, view: GovernanceView) -> Decision:
    """Answer one call from a snapshot. The first of the six lines that applies decides."""
    family = call.family
    policy = view.policy

    # Line 1: organisation policy.
    if policy is not None:
        if call.tool in policy.refuse_tools:
            return Decision(Outcome.REFUSE, 1, reason=f"organisation policy refuses the tool {call.tool!r}")
        if call.connection is not None and call.connection in policy.refuse_connections:
            return Decision(
                Outcome.REFUSE, 1, reason=f"organisation policy refuses the connection {call.connection!r}"
            )
        if family is not None and family in policy.refuse_families:
            return Decision(Outcome.REFUSE, 1, reason=f"organisation policy refuses the family {family.value!r}")

    # Line 2: a fine deny rule (read even from a fail-closed view: refusing more is safe).
    for rule in view.rules_for(call.tool):
        if rule.effect is Effect.DENY and rule_matches(rule, call):
            scope = "every agent" if rule.agent == "*" else f"agent {rule.agent!r}"
            what = f" under {rule.prefix!r}" if rule.prefix is not None else ""
            return Decision(
                Outcome.REFUSE, 2, reason=f"a deny rule for {call.tool!r}{what} ({scope}) matches", rule_id=rule.id
            )

    # Line 3: reading, the conversation and the agent's own memory.
    if family in READ_ONLY_FAMILIES:
        return Decision(Outcome.ALLOW, 3, reason=f"family {family.value!r} only reads or touches nothing outside")

    # Fail closed: nothing sensitive passes an unreadable view.
    if not view.readable:
        why = view.unreadable_reason or "governance cannot be read"
        return Decision(Outcome.REFUSE, 0, reason=f"fail closed: {why}")

    # Line 4: executing code.
    if family is Family.EXECUTE:
        command = first_argument(call)
        simple = command is not None and shellcheck.is_simple(command)
        if view.developer_mode and simple:
            for rule in view.rules_for(call.tool):
                if rule.effect is Effect.ALLOW and rule_matches(rule, call):
                    return Decision(
                        Outcome.ALLOW, 4,
                        reason=f"developer mode and an allow rule for {call.tool!r}"
                        + (f" under {rule.prefix!r}" if rule.prefix else "")
                        + " match a single simple command",
                        rule_id=rule.id,
                    )
            return Decision(
                Outcome.ASK, 4, _ALL_ANSWERS,
                reason="executes code; no allow rule matches this simple command",
            )
        if not view.developer_mode:
            why = "executes code; developer mode is off"
        else:
            why = "executes code; not a single simple command"
        return Decision(Outcome.ASK, 4, _ONCE_REFUSE, reason=why)

    # Line 5: the profile asks every time; consents and run grants allow the rest.
    if family is Family.PROFILE:
        return Decision(Outcome.ASK, 5, _ONCE_REFUSE, reason="proposes a fact for the profile: asked every time")
    if family is not None:
        if (call.agent, family) in view.consents:
            return Decision(
                Outcome.ALLOW, 5, reason=f"standing consent of {call.agent!r} for family {family.value!r}"
            )
        if family in call.run_grants:
            return Decision(Outcome.ALLOW, 5, reason=f"the run holds a grant for family {family.value!r}")

    # Line 6: ask.
    if family is None:
        return Decision(Outcome.ASK, 6, _ONCE_REFUSE, reason="unclassified tool: asked every time")
    return Decision(
        Outcome.ASK, 6, _ALL_ANSWERS, reason=f"no consent of {call.agent!r} for family {family.value!r}"
    )
