"""Which role each route of a served home needs: one table, checked by the token check of every route.

``ROUTE_ROLES`` maps ``(method, path under /api/v1)`` to the roles of
:data:`apollia_nb.governance.people.ROLES` that may use it (any one of them is enough; the first is the
role the route is for), or ``None`` for the one route served without a token (``/health``). A route
missing from the table needs ``admin`` (fail closed); a test walks the app's route table and fails on any
route not named here. ``admin`` holds every role. The docs' table (``docs/people-and-roles.md``) and the
OpenAPI document's ``x-apollia-role`` are printed from it.

``auditor`` is read-only over everything governance shows: every read of agents, runs, waiting
decisions, rules, consents, developer mode, the policy and people is open to it beside the role the
route is for; it changes nothing.

The internal routes are those of the home's clients (a client runtime in a kernel, the CLI, Dask
workers). What a person may read through them is what they may read through the public routes: the
journal's reads and proofs are ``auditor``'s (its head, which any client reads to open the home, every
role's), the governance snapshot and consent changes ``rules``' (the snapshot ``auditor``'s too),
waiting decisions ``approver``'s (and ``auditor``'s to read). What a runtime running agents does (append
journal entries, decide a governed call, list a call for a person, wait for answers, count a run's entries
and read them back, have the server sign a checkpoint of what it holds) is ``runner``'s: a kernel or the CLI
sends its person's token, and the server keeps a person's client to the runs that person opened and to the
kinds of entry a run writes (``internal.PERSON_KINDS``); the owner's token is not held to it. A batch's
worker credential opens its own routes (``worker_tokens.WORKER_ROUTES``), never a person's.
"""

from __future__ import annotations

from typing import Any

from apollia_nb.governance.people import ROLE_WORDS, ROLES

__all__ = ["ROLE_WORDS", "ROUTE_ROLES", "ROLE_EXTENSION", "roles_of", "roles_text", "with_roles"]

#: The OpenAPI extension naming the role an operation needs: the role's name when one role opens it, the
#: list of names when several do (any one is enough), ``null`` when no token is needed.
ROLE_EXTENSION = "x-apollia-role"

#: Who may use a route: one role, or a read also open to ``auditor`` (the writing role first).
R, A, G, U, ADMIN = ("runner",), ("approver",), ("rules",), ("auditor",), ("admin",)
RU, AU, GU, ADMIN_U = ("runner", "auditor"), ("approver", "auditor"), ("rules", "auditor"), ("admin", "auditor")
#: Every role: what any client of the home reads to open it (the journal's head: its seq, hash, origin and
#: public key, no entry), so a person of any role can use the CLI or a kernel on the served home.
ANY = ("auditor", "runner", "approver", "rules")
#: The journal's entries read by an auditor, and by a runner's client for the runs that person opened only.
UR = ("auditor", "runner")
#: An agent's identity reviewed for a client registering it: a runner's, as ``POST /agents`` is (and ``rules``').
R_G = ("runner", "rules")
#: Waiting decisions read by approvers and auditors, and by a runner's client for the runs that person opened.
AUR = ("approver", "auditor", "runner")
#: A run's own state, read by whoever runs it, approves its plan or audits it (an approver sees the plan it approves).
RAU = ("runner", "approver", "auditor")

ROUTE_ROLES: dict[tuple[str, str], tuple[str, ...] | None] = {
    ("GET", "/health"): None,
    # agents, tasks, chat, batches, hooks
    ("GET", "/agents"): RU,
    ("POST", "/agents"): R,
    ("GET", "/agents/{name}"): RU,
    ("POST", "/agents/{name}/start"): R,
    ("POST", "/agents/{name}/stop"): R,
    ("POST", "/tasks"): R,
    ("GET", "/tasks"): RU,
    ("GET", "/tasks/{task_id}"): RAU,
    ("GET", "/tasks/{task_id}/wait"): RU,
    ("POST", "/tasks/{task_id}/cancel"): R,
    ("GET", "/tasks/{task_id}/events"): RU,
    ("POST", "/sessions"): R,
    ("GET", "/sessions"): RU,
    ("GET", "/sessions/{session_id}"): RAU,
    ("POST", "/sessions/{session_id}/messages"): R,
    ("GET", "/sessions/{session_id}/events"): RU,
    ("POST", "/sessions/{session_id}/pause"): R,
    ("POST", "/sessions/{session_id}/inject"): R,
    ("POST", "/sessions/{session_id}/resume"): R,
    ("POST", "/sessions/{session_id}/fork"): R,
    ("POST", "/sessions/{session_id}/close"): R,
    ("POST", "/batches"): R,
    ("GET", "/batches"): RU,
    ("GET", "/batches/{batch_id}"): RU,
    ("GET", "/batches/{batch_id}/results"): RU,
    ("POST", "/batches/{batch_id}/cancel"): R,
    ("GET", "/batches/{batch_id}/events"): RU,
    ("POST", "/hooks/{tool}"): R,
    ("POST", "/internal/worker-tokens"): R,
    ("POST", "/internal/worker-tokens/revoke"): R,
    # answers and plans
    ("POST", "/tasks/{task_id}/plan/approve"): A,
    ("POST", "/tasks/{task_id}/plan/reject"): A,
    ("POST", "/sessions/{session_id}/plan/approve"): A,
    ("POST", "/sessions/{session_id}/plan/reject"): A,
    ("GET", "/pending-decisions"): AU,
    ("POST", "/pending-decisions/decide"): A,
    ("GET", "/internal/pending-decisions"): AUR,
    ("GET", "/internal/pending-decisions/{decision_id}"): AUR,
    # rules, consents, developer mode, policy
    ("GET", "/governance/rules"): GU,
    ("POST", "/governance/rules"): G,
    ("DELETE", "/governance/rules/{rule_id}"): G,
    ("GET", "/governance/consents"): GU,
    ("DELETE", "/governance/consents/{agent}/{family}"): G,
    ("GET", "/governance/developer-mode"): GU,
    ("PUT", "/governance/developer-mode"): G,
    ("GET", "/governance/policy"): GU,
    ("GET", "/internal/governance/snapshot"): GU,
    ("POST", "/internal/governance/consents"): G,
    ("POST", "/internal/governance/consents/revoke"): G,
    ("POST", "/internal/governance/rules/remove"): G,
    ("POST", "/internal/agents/identity"): R_G,  # a client registering an agent (as POST /agents does)
    # the journal, read-only
    ("GET", "/audit/verify"): U,
    ("POST", "/audit/replay/{run_id}"): U,
    ("GET", "/audit/entries"): U,
    ("GET", "/internal/journal/head"): ANY,
    ("GET", "/internal/journal/entries"): UR,
    ("GET", "/internal/journal/run-size"): UR,
    ("GET", "/internal/journal/checkpoints"): U,
    ("GET", "/internal/journal/cosignatures"): U,
    ("POST", "/internal/journal/verify"): U,
    ("POST", "/internal/journal/sql"): U,
    ("POST", "/internal/journal/inclusion-proof"): U,
    ("GET", "/internal/journal/consistency-proof"): U,
    # what a runtime running agents does (a person's client: for the runs that person opened), and people
    ("POST", "/internal/journal/entries"): R,
    ("POST", "/internal/journal/checkpoint"): R,
    ("POST", "/internal/calls"): R,
    ("POST", "/internal/pending-decisions"): R,
    ("GET", "/internal/answers"): R,
    ("GET", "/people/me"): ANY,  # who the token is: every role's, the owner's token too
    ("GET", "/people"): ADMIN_U,
    ("POST", "/people"): ADMIN,
    ("POST", "/people/{name}/revoke"): ADMIN,
    ("POST", "/people/{name}/rotate"): ADMIN,
}

assert all(roles is None or (roles and set(roles) <= set(ROLES)) for roles in ROUTE_ROLES.values())
assert all(roles is None or method in ("GET", "POST") or roles[1:] == ()
           for (method, _), roles in ROUTE_ROLES.items())  # a PUT or DELETE (a change) is one role's


def roles_of(method: str, template: str) -> tuple[str, ...] | None:
    """The roles that may use a route (``template`` under ``/api/v1``), any one being enough; ``None`` for a
    route served without a token; ``("admin",)`` for a route not in the table."""
    return ROUTE_ROLES.get((method.upper(), template), ADMIN)


def roles_text(roles: tuple[str, ...]) -> str:
    """``'rules'``, ``'rules' or 'auditor'``: the roles a refusal names."""
    return " or ".join(repr(role) for role in roles)


def _extension(roles: tuple[str, ...] | None) -> str | list[str] | None:
    return None if roles is None else roles[0] if len(roles) == 1 else list(roles)


def with_roles(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    """State each operation's role in the OpenAPI document: ``x-apollia-role`` and a sentence."""
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or method.startswith("x-"):
                continue
            roles = roles_of(method, path.removeprefix(prefix))
            op[ROLE_EXTENSION] = _extension(roles)
            sentence = ("No token needed." if roles is None else
                        f"Needs the role {' or '.join(f'`{r}`' for r in roles)} (a person "
                        f"{'without it' if len(roles) == 1 else 'with none of them'} gets 403 `FORBIDDEN`); "
                        "the home's owner token holds every role.")
            op["description"] = f"{op['description']}\n\n{sentence}" if op.get("description") else sentence
    return doc
