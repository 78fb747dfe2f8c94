"""The governance store's face: the snapshot ``decide()`` reads, rules, consents and pending decisions.

Two classes keep it: ``GovernanceStore`` (``governance/store.py``), the
owner's ``governance.db`` plus the organisation policy, and
``RemoteGovernance`` (``runtime/remote.py``), a client of the
``apollia-os serve`` that owns the home. Both subclass ``GovernanceFace``, so
the type checker holds each to every method here (``tests/test_types.py``),
and one contract suite runs against both (``tests/test_home_contract.py``).

Both fail closed: a ``view()`` that cannot be read is ``readable=False`` with
the deny rules known so far. Answering is not on this face: the owner answers
through ``Runtime.answer`` (journal first, then ``answer_pending``); a client
hands the answer to the server's ``Runtime.answer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.governance.decision import GovernanceView
    from apollia_nb.governance.policy import PolicyState
    from apollia_nb.governance.store import ConsentRecord, DeveloperMode, PendingDecision, RuleRecord

__all__ = ["GovernanceFace"]


class GovernanceFace(Protocol):
    """View, policy, developer mode, rules, consents, pending decisions; errors by stable code."""

    # the snapshot
    def view(self) -> "GovernanceView": ...
    def policy_state(self) -> "PolicyState": ...
    def developer_mode(self) -> bool: ...
    def developer_mode_state(self) -> "DeveloperMode": ...
    def set_developer_mode(self, enabled: bool, *, by: str) -> "DeveloperMode": ...

    # rules and consents
    def rules(self) -> list["RuleRecord"]: ...
    def get_rule(self, rule_id: str) -> "RuleRecord": ...
    def add_rule(self, tool: str, effect: Any, prefix: str | None = None, agent: str = "*", *,
                 by: str) -> "RuleRecord": ...
    def remove_rule(self, rule_id: str, *, by: str) -> "RuleRecord": ...
    def consents(self) -> list["ConsentRecord"]: ...
    def grant_consent(self, agent: str, family: Any, *, by: str, until: Any = None,
                      card: str | None = None) -> "ConsentRecord": ...
    def revoke_consent(self, agent: str, family: Any, *, by: str) -> "ConsentRecord": ...

    # pending decisions
    def add_pending(self, run_id: str, task_id: str | None, agent: str, tool: str, family: Any,
                    arguments: Mapping[str, Any], answers: Sequence[Any], reason: str = "", line: int = 0,
                    call_id: str | None = None) -> "PendingDecision": ...
    def pending(self, status: str | None = "pending", *, run_id: str | None = None) -> list["PendingDecision"]: ...
    def get_pending(self, decision_id: str) -> "PendingDecision": ...

    def close(self) -> None: ...
