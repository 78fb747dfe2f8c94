"""Governing the agents people already use (Claude Code, Codex, Cursor) through their hooks.

Each tool runs ``apollia-os hook TOOL`` (or, for Claude Code, calls ``POST /api/v1/hooks/TOOL``
on a served home) before a tool call; the call is decided by the same ``decide()`` our own
agents' calls are, journaled with its ``source``, and answered in the tool's own format.

- ``mapping.py`` — which of our tools each of theirs is decided as; ``[hooks.<tool>]`` settings
- ``codecs.py`` — each tool's hook JSON in and out (pure)
- ``gate.py`` — decide, journal, ask and wait on a home (``answer_hook``)
- ``command.py`` — the command form: stdin to stdout, an owned or a served home
- ``install.py`` — ``hook install|uninstall``: the tool's settings file, merged and restored

See ``docs/other-agents.md``.
"""

from __future__ import annotations

from apollia_nb.hooks.mapping import TOOLS

__all__ = ["TOOLS"]
