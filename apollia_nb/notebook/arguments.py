"""How a ``%apollia`` subcommand reads its words: shell-like splitting and an argument parser whose
mistakes are ``BAD_INPUT``, never an exit of the kernel.

``magics.py`` and the subcommands that live in their own modules (``batch.py``) read their
arguments with these.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import NoReturn

from apollia_nb.errors import BadInput

__all__ = ["MagicExit", "MagicParser", "magic_parser", "magic_words"]


class MagicExit(Exception):
    """argparse asked to exit (after printing ``--help``)."""


class MagicParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            print(message, file=sys.stderr)
        raise MagicExit()


def magic_parser(prog: str) -> MagicParser:
    return MagicParser(prog=prog, add_help=True, allow_abbrev=False)


def magic_words(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise BadInput(f"cannot read the arguments: {exc}") from None
