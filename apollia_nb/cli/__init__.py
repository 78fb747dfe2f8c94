"""``apollia-os``: the command line.

Each command group lives in its own module with a ``register(subparsers,
common)`` function; this module only assembles them and maps errors to exit
codes. Exit status: 0 success; 1 an integrity failure (``audit verify``) or a
diverged replay; 2 an incomplete replay; 3 an error with a stable code (printed
as ``error: CODE: message``, or ``{"code", "message"}`` with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from apollia_nb.errors import ApolliaError, BadInput

__all__ = ["main", "build_parser", "EXIT_ERROR"]

EXIT_ERROR = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {BadInput.code}: {message}\n")
        raise SystemExit(EXIT_ERROR)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", help="home folder (default: $APOLLIA_HOME, else ~/.apollia)")
    common.add_argument("--json", action="store_true", help="print data as JSON")
    return common


def build_parser() -> argparse.ArgumentParser:
    from apollia_nb.cli import audit, batch, governance, home, runtime, witness

    parser = _Parser(prog="apollia-os", description="Governed AI agents with a signed journal.")
    common = _common()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in (runtime, batch, governance, audit, home, witness):
        module.register(sub, common)
    try:
        from apollia_nb.cli import serve
    except ImportError:  # pragma: no cover - serve lands with the REST API
        pass
    else:
        serve.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        try:
            from apollia_nb.cli.client import route

            return int(route(args)(args) or 0)
        except ApolliaError:
            raise
        except Exception as exc:  # the disk refusing a write anywhere (the home's lock, a workspace)
            from apollia_nb.dbutil import storage_error

            storage = storage_error(exc, "the command could not finish")
            if storage is None:
                raise
            raise storage from exc
    except ApolliaError as exc:
        if getattr(args, "json", False):
            print(json.dumps(exc.to_dict()), file=sys.stderr)
        else:
            print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def emit(args: argparse.Namespace, data: object, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)
