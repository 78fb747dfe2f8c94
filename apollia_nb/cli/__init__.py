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

from apollia_nb.cli.common import emit  # noqa: F401 - where the command groups found it
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
    from apollia_nb.cli import audit, batch, governance, home, hook, people, runtime, witness

    parser = _Parser(prog="apollia-os", description="Governed AI agents with a signed journal.")
    common = _common()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in (runtime, batch, governance, people, audit, home, witness, hook):
        module.register(sub, common)
    try:
        from apollia_nb.cli import serve
    except ImportError:  # pragma: no cover - serve lands with the REST API
        pass
    else:
        serve.register(sub, common)
    from apollia_nb.cli import acp, gateway

    for module in (acp, gateway):
        module.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        try:
            return int(args.handler(args) or 0)
        except ApolliaError:
            raise
        except Exception as exc:  # the disk refusing a write anywhere (the home's lock, a workspace)
            from apollia_nb.dbutil import storage_error

            storage = storage_error(exc, "the command could not finish")
            if storage is not None:
                raise storage from exc
            damaged = damaged_home_file(exc, getattr(args, "home", None))  # a block that does not read
            if damaged is None:
                raise
            raise damaged from exc
    except ApolliaError as exc:
        if getattr(args, "json", False):
            print(json.dumps(exc.to_dict()), file=sys.stderr)
        else:
            print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def damaged_home_file(exc: BaseException, home: str | None) -> ApolliaError | None:
    """``HOME_FILE_CORRUPT`` for DuckDB finding a home file damaged where nothing named the file, else
    None. The file is the one DuckDB's message names, else the first of the home's database files
    that does not read whole (each opened read-only, nothing written)."""
    from pathlib import Path

    from apollia_nb.errors import HomeFileCorrupt
    from apollia_nb.home import DATABASE_FILES, Home, check_whole, damage_error, is_damage

    if not is_damage(exc):
        return None
    where = Home.at(home, create=False)
    named = damage_error(exc, where.journal_db, home=where.path)
    if named is not None and any(f"/{name}" in str(exc) for name in DATABASE_FILES):
        return named
    import duckdb

    for name in DATABASE_FILES:
        path: Path = where.path / name
        if not path.is_file():
            continue
        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as opened:
            found = damage_error(opened, path, home=where.path)
            if found is not None:
                return found
            continue  # held by another process, or open in this one: not the file found damaged here
        try:
            check_whole(con, path)
        except ApolliaError as found:
            return found
        except duckdb.Error:
            continue
        finally:
            con.close()
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return HomeFileCorrupt(
        f"a database file of the home {where.path} does not read ({first}); nothing was changed; run "
        f"`apollia-os audit verify --home {where.path}` to check the journal, and restore the damaged file "
        "from a backup (or replace it on purpose with `apollia-os home repair`)")


