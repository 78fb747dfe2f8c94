"""``apollia-os hook claude-code|codex|cursor`` and ``apollia-os hook install|uninstall TOOL [--project DIR]``.

The first form is what a tool runs before (and after) each of its tool calls: the tool's hook
JSON on stdin, its answer on stdout (``apollia_nb/hooks/command.py``). It never ends with the
CLI's usual error status 3, which the tools read as "the hook failed, go on": anything that
goes wrong denies, with exit status 2 and the reason on stderr. See ``docs/other-agents.md``.
"""

from __future__ import annotations

import argparse
import json
import sys

from apollia_nb.hooks.mapping import TOOLS

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "hook", parents=[common],
        help="answer another agent's hook (claude-code, codex, cursor), or install/uninstall it",
        description="`apollia-os hook TOOL` reads TOOL's hook input on stdin and answers on stdout (each call "
                    "decided and journaled by the home); `apollia-os hook install|uninstall TOOL [--project DIR]` "
                    "adds the hooks to TOOL's settings file, or removes exactly those.")
    p.add_argument("action", choices=[*TOOLS, "install", "uninstall"],
                   help="a tool to answer for, or install/uninstall")
    p.add_argument("tool", nargs="?", choices=TOOLS, help="with install/uninstall: the tool")
    p.add_argument("--project", metavar="DIR",
                   help="with install/uninstall: the project folder (default: the user's own settings)")
    p.set_defaults(handler=_hook)


def _hook(args: argparse.Namespace) -> int:
    if args.action in TOOLS:
        return _answer(args.action, args.home)
    from apollia_nb.errors import BadInput
    from apollia_nb.home import Home
    from apollia_nb.hooks.install import install, uninstall

    if args.tool is None:
        raise BadInput(f"hook {args.action} needs the tool: one of {', '.join(TOOLS)}")
    if args.action == "install":
        home = Home.at(args.home)  # created when missing: the hook denies on a home that is not there
        path = install(args.tool, home=str(home.path), project=args.project)
        print(json.dumps({"installed": args.tool, "file": str(path)}) if args.json
              else f"installed the {args.tool} hooks in {path} (home {home.path})")
        return 0
    removed = uninstall(args.tool, project=args.project)
    if args.json:
        print(json.dumps({"uninstalled": args.tool, "file": str(removed) if removed else None}))
    else:
        print(f"removed the {args.tool} hooks from {removed}" if removed else f"no {args.tool} hooks file to change")
    return 0


def _answer(tool: str, home: str | None) -> int:
    """One hook call: never an exit status but 0 (answered) or 2 (denied: each tool's "block")."""
    try:
        from apollia_nb.hooks.command import run_command

        raw = sys.stdin.buffer.read()
        reply = run_command(tool, raw, home)
        body, code, err = reply.body, reply.exit_code, reply.stderr
    except BaseException as exc:  # noqa: BLE001 - fail closed, KeyboardInterrupt included
        from apollia_nb.hooks.codecs import malformed_reply

        reply = malformed_reply(tool, f"apollia denied the call: the hook failed ({type(exc).__name__}: {exc})")
        body, code, err = reply.body, reply.exit_code, reply.stderr
    try:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()
        if err:
            sys.stderr.write(err + "\n")
            sys.stderr.flush()
    except OSError:
        return 2
    return code
