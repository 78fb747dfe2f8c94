"""Agents spoken to over the Agent Client Protocol, governed by the home: ``apollia-os acp-proxy``.

``mapping`` turns an ACP tool call (its kind, title, raw input, locations) into the ``Call``
``decide()`` judges, and a decision into the permission option the agent is answered with (pure);
``proxy`` relays JSON-RPC between a client and an agent over stdio, answers the agent's
``session/request_permission`` from the home and journals every tool call the agent reports.
"""

from __future__ import annotations

__all__: list[str] = []
