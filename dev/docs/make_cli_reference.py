"""Regenerate docs/cli.md from `apollia-os --help` of every command; `--check` fails on drift.

    python dev/docs/make_cli_reference.py          # rewrite docs/cli.md
    python dev/docs/make_cli_reference.py --check  # exit 1 if docs/cli.md is out of date
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

HEADER = """# `apollia-os` command reference

Generated from the commands' own `--help` by `dev/docs/make_cli_reference.py`; a test fails
when it drifts. Every command takes `--home` (default `$APOLLIA_HOME`, else `~/.apollia`;
`demo` alone uses a fresh temporary home unless given one) and `--json` where its output
is data.

Exit status: 0 success; 1 an integrity failure (`audit verify`, `audit consistency`, `audit
prove --against`, `audit export` of a journal that does not verify), a diverged replay, or a
refused policy (`policy check`); 2 an incomplete replay; 3 an error with a stable code,
printed as `error: CODE: message` (with `--json`, `{"code", "message"}` on stderr). Each
`audit` command's help below gives its exit status and JSON keys; [journal.md](journal.md)
gives the formats.

Each command opens its home once: owned by the command for as long as it runs, or, while
`apollia-os serve` owns it, as a client of that server; the command then prints the same
either way: agents and tasks are the server's (`run` submits the task to the server and
asks at the terminal for its decisions), governance and the journal are read and
changed through it. `policy remove` and `home repair` need the home to themselves and
say so (`HOME_LOCKED`, naming the server's process and how to stop it). A `server.json` left by a server that stopped, on a home another
process holds, is `SERVER_NOT_RUNNING`: start `apollia-os serve`, or remove the stale file.
See [shared-home.md](shared-home.md).

While a Jupyter kernel owns the home (no server), the read-only commands (`audit
verify|verifier-key|consistency|checkpoint|prove|replay|export`, `runs list`, `rules list`,
`consents list`, `pending list`, `agents list`) that cannot open it answer `HOME_LOCKED` naming the
kernel (process, connection file, since when) and the ways to audit it: `%apollia verify`
or `export_journal(...)` from that notebook, shutting the kernel down, or serving the home
with `apollia-os serve` before kernels start.
"""


def _walk(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[list[str], str]]:
    out = [(path, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.extend(_walk(sub, [*path, name]))
    return out


def render() -> str:
    os.environ["COLUMNS"] = "100"
    from apollia_nb.cli import build_parser

    parser = build_parser()
    parser.prog = "apollia-os"
    parts = [HEADER]
    for path, text in _walk(parser, ["apollia-os"]):
        title = " ".join(path)
        parts.append(f"\n## `{title}`\n\n```text\n{text.rstrip()}\n```\n")
    return "".join(parts)


def main() -> int:
    check = "--check" in sys.argv[1:]
    text = render()
    if check:
        if not DOC.exists() or DOC.read_text() != text:
            print("docs/cli.md is out of date: run python dev/docs/make_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
