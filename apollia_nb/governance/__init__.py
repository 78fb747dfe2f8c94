"""Governance: the one function that decides a tool call, and what it reads."""

from apollia_nb.governance.decision import (
    Answer,
    Call,
    Decision,
    Effect,
    Family,
    GovernanceView,
    Outcome,
    Policy,
    Rule,
    decide,
)

__all__ = [
    "Answer",
    "Call",
    "Decision",
    "Effect",
    "Family",
    "GovernanceView",
    "Outcome",
    "Policy",
    "Rule",
    "decide",
]
