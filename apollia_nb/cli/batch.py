"""``apollia-os batch AGENT ITEMS``: run an agent over the items of a JSON Lines or CSV file.

Each item (a line of JSON, or a CSV row) fills the goal template and runs as an
unattended task. A progress bar is drawn on the terminal (stderr) while the
batch runs; when no item is pending or running any more, the results are
written (JSON Lines, or CSV when ``--out`` ends in ``.csv``) and the command
ends: 0 when every item completed, 1 when some failed or still wait on a
person (their decisions stay in ``apollia-os pending list``; the batch goes on
where the home is next opened). When ``apollia-os serve`` owns the home, the
batch runs in the server, over its REST API.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from apollia_nb.cli.common import emit
from apollia_nb.errors import BadInput

__all__ = ["progress_line", "read_items", "register"]

def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "batch", parents=[common], help="run an agent over the items of a JSONL or CSV file",
        description="Run AGENT over every item of ITEMS (.jsonl: one JSON object a line; .csv: a header and "
                    "rows), each as an unattended task whose goal is --goal filled from the item's fields. "
                    "Draws progress on the terminal, then writes the results (key, status, result, error_code, "
                    "run_id, steps_used, task_id, goal) to --out. Exit status 0 when every item completed, 1 "
                    "when some failed or wait on a person (see `apollia-os pending list`).")
    p.add_argument("agent")
    p.add_argument("items", type=Path, help="a .jsonl or .csv file of items")
    p.add_argument("--goal", default="{goal}", help="the goal template, e.g. 'Summarise {path}' "
                                                    "(default: each item's `goal` field)")
    p.add_argument("--concurrency", type=int, default=4, help="items pending or running at once (default 4)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--key", default=None, help="the field that keys each item (default: its line number)")
    p.add_argument("--out", type=Path, default=None,
                   help="the results file, .jsonl or .csv (default: ITEMS with .results.jsonl)")
    p.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="where the items run: here or in the server (local, the default), or on a Dask cluster "
                        "(dask: AGENT is then the agent's manifest file, the home must be served by "
                        "`apollia-os serve`, and every worker is a client of that server)")
    p.add_argument("--scheduler", default=None, help="with --engine dask: the Dask scheduler's address "
                                                     "(tcp://HOST:PORT)")
    p.add_argument("--server-url", default=None,
                   help="with --engine dask: the URL the workers reach the server at (default: the one in "
                        "the home's server.json)")
    p.set_defaults(handler=_batch)


def read_items(path: Path) -> list[dict[str, Any]]:
    """The items of a ``.jsonl`` or ``.csv`` file; a line that is not a JSON object is ``BAD_INPUT`` naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if path.suffix.lower() == ".csv":
        return [dict(row) for row in csv.DictReader(text.splitlines())]
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        raise BadInput(f"{path}: items must be a .jsonl or .csv file")
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise BadInput(f"{path}:{number}: an item must be a JSON object")
        items.append(item)
    return items


def progress_line(counts: dict[str, int], total: int, width: int = 30) -> str:
    """``[#####.....]  12/200 done 10 · waiting 1 · failed 1 · running 8`` (pure)."""
    finished = counts["completed"] + counts["failed"] + counts["cancelled"]
    filled = width * finished // total if total else width
    return (f"[{'#' * filled}{'.' * (width - filled)}] {finished:>{len(str(total))}}/{total} "
            f"done {counts['completed']} · waiting {counts['waiting']} · failed {counts['failed']} · "
            f"running {counts['running'] + counts['pending']}")


def _out_path(args: argparse.Namespace) -> Path:
    out = args.out or args.items.with_name(args.items.stem + ".results.jsonl")
    if out.suffix.lower() not in (".jsonl", ".csv"):
        raise BadInput(f"{out}: the results file must end in .jsonl or .csv")
    return out


def _draw(counts: dict[str, int], total: int, *, final: bool = False) -> None:
    if sys.stderr.isatty() or final:
        sys.stderr.write(("\r" if sys.stderr.isatty() else "") + progress_line(counts, total)
                         + ("\n" if final else ""))
        sys.stderr.flush()


def _finish(args: argparse.Namespace, out: Path, rows: list[dict[str, Any]], batch: dict[str, Any]) -> int:
    from apollia_nb.api.batches import results_text

    out.write_text(results_text(rows, "csv" if out.suffix.lower() == ".csv" else "jsonl"), encoding="utf-8")
    counts = batch["counts"]
    _draw(counts, batch["total"], final=True)
    emit(args, {**batch, "results": str(out)},
         f"batch {batch['id']}: {counts['completed']} completed, {counts['failed']} failed, "
         f"{counts['waiting']} waiting; results in {out}"
         + ("\nwaiting items resume once their decisions are answered: apollia-os pending list"
            if counts["waiting"] else ""))
    return 0 if counts["completed"] == batch["total"] else 1


def _batch(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home

    items = read_items(args.items)
    out = _out_path(args)
    if args.engine == "dask":
        manifest = Path(args.agent)
        if not manifest.is_file():
            raise BadInput(f"with --engine dask, AGENT is the agent's manifest file; {manifest} is not a file")
        if not args.scheduler:
            raise BadInput("--engine dask needs --scheduler ADDRESS (tcp://HOST:PORT)")
        with open_home(args) as home:  # the workers are clients of the server that owns the home
            rows, batch = home.dask_batch(manifest, items, progress=_draw, goal=args.goal,
                                          concurrency=args.concurrency, max_steps=args.max_steps, key=args.key,
                                          scheduler=args.scheduler, server_url=args.server_url)
        return _finish(args, out, rows, batch)
    with open_home(args) as home, home.runtime() as rt:
        rows, batch = rt.batch(args.agent, items, goal=args.goal, concurrency=args.concurrency,
                               max_steps=args.max_steps, key=args.key, progress=_draw)
    return _finish(args, out, rows, batch)
