"""Which role each route of a served home needs: one table, checked by the token check of every route.

``ROUTE_ROLES`` maps ``(method, path under /api/v1)`` to a role of
:data:`apollia_nb.governance.people.ROLES`, or ``None`` for the one route served without a token
(``/health``). A route missing from the table needs ``admin`` (fail closed); a test walks the app's
route table and fails on any route not named here. ``admin`` holds every role. The docs' table
(``docs/people-and-roles.md``) and the OpenAPI document's ``x-apollia-role`` are printed from it.

The internal routes are those of the home's clients (a client runtime in a kernel, the CLI, Dask
workers). What a person may read through them is what they may read through the public routes: the
journal's reads and proofs are ``auditor``'s, the governance snapshot and consent changes ``rules``',
waiting decisions ``approver``'s. What only a runtime running agents does (append journal entries,
decide a governed call, list a call for a person, wait for answers, sign a checkpoint) is ``admin``'s:
the owner's clients send the owner's token from ``server.json``. A batch's worker credential opens
its own routes (``worker_tokens.WORKER_ROUTES``), never a person's.
"""

from __future__ import annotations

from typing import Any

from apollia_nb.governance.people import ROLE_WORDS, ROLES

__all__ = ["ROLE_WORDS", "ROUTE_ROLES", "ROLE_EXTENSION", "role_of", "with_roles"]

#: The OpenAPI extension naming the role an operation needs.
ROLE_EXTENSION = "x-apollia-role"

R, A, G, U, ADMIN = "runner", "approver", "rules", "auditor", "admin"

ROUTE_ROLES: dict[tuple[str, str], str | None] = {
    ("GET", "/health"): None,
    # agents, tasks, chat, batches, hooks
    ("GET", "/agents"): R,
    ("POST", "/agents"): R,
    ("GET", "/agents/{name}"): R,
    ("POST", "/agents/{name}/start"): R,
    ("POST", "/agents/{name}/stop"): R,
    ("POST", "/tasks"): R,
    ("GET", "/tasks"): R,
    ("GET", "/tasks/{task_id}"): R,
    ("GET", "/tasks/{task_id}/wait"): R,
    ("POST", "/tasks/{task_id}/cancel"): R,
    ("GET", "/tasks/{task_id}/events"): R,
    ("POST", "/sessions"): R,
    ("GET", "/sessions"): R,
    ("GET", "/sessions/{session_id}"): R,
    ("POST", "/sessions/{session_id}/messages"): R,
    ("GET", "/sessions/{session_id}/events"): R,
    ("POST", "/sessions/{session_id}/pause"): R,
    ("POST", "/sessions/{session_id}/inject"): R,
    ("POST", "/sessions/{session_id}/resume"): R,
    ("POST", "/sessions/{session_id}/fork"): R,
    ("POST", "/sessions/{session_id}/close"): R,
    ("POST", "/batches"): R,
    ("GET", "/batches"): R,
    ("GET", "/batches/{batch_id}"): R,
    ("GET", "/batches/{batch_id}/results"): R,
    ("POST", "/batches/{batch_id}/cancel"): R,
    ("GET", "/batches/{batch_id}/events"): R,
    ("POST", "/hooks/{tool}"): R,
    ("POST", "/internal/worker-tokens"): R,
    ("POST", "/internal/worker-tokens/revoke"): R,
    # answers and plans
    ("POST", "/tasks/{task_id}/plan/approve"): A,
    ("POST", "/tasks/{task_id}/plan/reject"): A,
    ("POST", "/sessions/{session_id}/plan/approve"): A,
    ("POST", "/sessions/{session_id}/plan/reject"): A,
    ("GET", "/pending-decisions"): A,
    ("POST", "/pending-decisions/decide"): A,
    ("GET", "/internal/pending-decisions"): A,
    ("GET", "/internal/pending-decisions/{decision_id}"): A,
    # rules, consents, developer mode, policy
    ("GET", "/governance/rules"): G,
    ("POST", "/governance/rules"): G,
    ("DELETE", "/governance/rules/{rule_id}"): G,
    ("GET", "/governance/consents"): G,
    ("DELETE", "/governance/consents/{agent}/{family}"): G,
    ("GET", "/governance/developer-mode"): G,
    ("PUT", "/governance/developer-mode"): G,
    ("GET", "/governance/policy"): G,
    ("GET", "/internal/governance/snapshot"): G,
    ("POST", "/internal/governance/consents"): G,
    ("POST", "/internal/governance/consents/revoke"): G,
    ("POST", "/internal/governance/rules/remove"): G,
    ("POST", "/internal/agents/identity"): G,
    # the journal, read-only
    ("GET", "/audit/verify"): U,
    ("POST", "/audit/replay/{run_id}"): U,
    ("GET", "/audit/entries"): U,
    ("GET", "/internal/journal/head"): U,
    ("GET", "/internal/journal/entries"): U,
    ("GET", "/internal/journal/run-size"): U,
    ("GET", "/internal/journal/checkpoints"): U,
    ("GET", "/internal/journal/cosignatures"): U,
    ("POST", "/internal/journal/verify"): U,
    ("POST", "/internal/journal/sql"): U,
    ("POST", "/internal/journal/inclusion-proof"): U,
    ("GET", "/internal/journal/consistency-proof"): U,
    # what a runtime running agents does, and people
    ("POST", "/internal/journal/entries"): ADMIN,
    ("POST", "/internal/journal/checkpoint"): ADMIN,
    ("POST", "/internal/calls"): ADMIN,
    ("POST", "/internal/pending-decisions"): ADMIN,
    ("GET", "/internal/answers"): ADMIN,
    ("GET", "/people"): ADMIN,
    ("POST", "/people"): ADMIN,
    ("POST", "/people/{name}/revoke"): ADMIN,
    ("POST", "/people/{name}/rotate"): ADMIN,
}

assert all(role is None or role in ROLES for role in ROUTE_ROLES.values())


def role_of(method: str, template: str) -> str | None:
    """The role a route needs (``template`` under ``/api/v1``); ``admin`` for a route not in the table."""
    return ROUTE_ROLES.get((method.upper(), template), ADMIN)


def with_roles(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    """State each operation's role in the OpenAPI document: ``x-apollia-role`` and a sentence."""
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or method.startswith("x-"):
                continue
            role = role_of(method, path.removeprefix(prefix))
            op[ROLE_EXTENSION] = role
            sentence = ("No token needed." if role is None else
                        f"Needs the role `{role}` (a person without it gets 403 `FORBIDDEN`); "
                        "the home's owner token holds every role.")
            op["description"] = f"{op['description']}\n\n{sentence}" if op.get("description") else sentence
    return doc
