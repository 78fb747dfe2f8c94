"""``apollia-os audit``: verify, checkpoint, prove and export the journal.

``verify`` and ``export`` only read: they open ``journal.db`` read-only (or an
exported bundle) and create nothing. ``checkpoint`` and ``prove`` may write a
checkpoint, so they own the home for their duration (``OwnerLock``; another
owner is ``HOME_LOCKED``, naming it). ``verify`` exits 1 on any integrity
failure, printing the first bad sequence number and what was wrong.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from apollia_nb.cli import emit

__all__ = ["register"]

EXIT_INTEGRITY = 1


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ``audit verify|checkpoint|prove|replay|export``."""
    audit = sub.add_parser("audit", help="verify, checkpoint, prove, replay and export the journal")
    asub = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)

    p = asub.add_parser("verify", parents=[common],
                        help="check the chain, every hash and signature, and checkpoints (exit 1: fails)")
    p.add_argument("--checkpoint", type=Path, default=None, metavar="F",
                   help="also check a signed checkpoint kept elsewhere (detects truncation and rollback)")
    p.add_argument("--bundle", type=Path, default=None, metavar="DIR",
                   help="verify an exported bundle instead of the home's journal")
    p.add_argument("--witness", action="append", default=[], metavar="VKEY",
                   help="require the newest checkpoint, covering every entry, to be cosigned by this witness "
                        "(its cosignature/v1 verifier key; repeatable)")
    p.add_argument("--quorum", type=int, default=None, metavar="N",
                   help="with --witness: cosignatures from at least N of them suffice (default: all)")
    p.set_defaults(handler=_verify)

    p = asub.add_parser("checkpoint", parents=[common],
                        help="sign a checkpoint of the whole journal and print it")
    p.add_argument("--out", type=Path, default=None, metavar="F", help="also write the note to F")
    p.set_defaults(handler=_checkpoint)

    p = asub.add_parser("prove", parents=[common],
                        help="an RFC 6962 inclusion proof of one entry against the latest checkpoint")
    p.add_argument("seq", type=int, metavar="SEQ")
    p.set_defaults(handler=_prove)

    p = asub.add_parser("replay", parents=[common],
                        help="replay a run offline (exit 0 identical, 1 diverged, 2 incomplete)")
    p.add_argument("run", metavar="RUN", help="the run id (see the runs view)")
    p.set_defaults(handler=_replay)

    p = asub.add_parser("export", parents=[common], help="write an offline audit bundle")
    p.add_argument("--format", choices=["parquet"], default="parquet")
    p.add_argument("dir", type=Path, metavar="DIR")
    p.set_defaults(handler=_export)


def _home(args: argparse.Namespace) -> Any:
    from apollia_nb.home import Home

    return Home.at(args.home, create=False)


@contextmanager
def _owned_journal(args: argparse.Namespace) -> Iterator[Any]:
    """The home's existing journal, opened by a process that owns the home; the server's journal
    when `apollia-os serve` owns the home."""
    from apollia_nb.cli.client import remote
    from apollia_nb.errors import NotFound
    from apollia_nb.home import OwnerLock
    from apollia_nb.journal.store import Journal

    with remote(args) as served:
        if served is not None:
            yield served.journal
            return
    home = _home(args)
    if not home.journal_db.exists():
        raise NotFound(f"no journal at {home.journal_db}")
    with OwnerLock(home):
        journal = Journal.open(home, create=False)
        try:
            yield journal
        finally:
            journal.close()


def _read_checkpoint(path: Path | None) -> str | None:
    if path is None:
        return None
    from apollia_nb.errors import BadInput

    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read checkpoint {path}: {exc}") from None


def _verify(args: argparse.Namespace) -> int:
    from apollia_nb.cli.client import remote
    from apollia_nb.journal.verify import (
        cosigned_rows_of_bundle,
        cosigned_rows_of_file,
        verify_bundle,
        verify_home,
        verify_journal,
    )

    external = _read_checkpoint(args.checkpoint)
    if args.quorum is not None and not args.witness:
        from apollia_nb.errors import BadInput

        raise BadInput("--quorum needs --witness")
    if args.witness:  # malformed keys or quorum: BAD_INPUT before anything is read
        from apollia_nb.journal.witness import check_cosigned

        check_cosigned(entries=0, checkpoints=(), cosignatures=(), witnesses=args.witness, quorum=args.quorum)
    cosigned = None
    if args.bundle is not None:
        report = verify_bundle(args.bundle, external=external)
        if args.witness:
            cosigned = _cosigned(args, report, *cosigned_rows_of_bundle(args.bundle))
    else:
        with remote(args) as served:  # served: a copy of the server's journal, checked with the home's key
            if served is not None:
                journal = served.journal
                report = verify_journal(journal, external)
                if args.witness:  # the copy's checkpoints, and the server's cosignatures of them
                    cosigned = _cosigned(args, report, journal.snapshot_rows()[1], [
                        (size, line) for size, _w, _t, line in journal.cosignatures()])
            else:
                home = _home(args)
                report = verify_home(home, external=external)
                if args.witness:
                    cosigned = _cosigned(args, report, *cosigned_rows_of_file(home.journal_db))
    if cosigned is None:
        emit(args, report.to_dict(), report.summary())
        return 0 if report.ok else EXIT_INTEGRITY
    data = {**report.to_dict(), "ok": report.ok and cosigned.ok, "witness": cosigned.to_dict()}
    if cosigned.ok:
        names = ", ".join(w["name"] for w in cosigned.witnesses if w["key"] in cosigned.cosigned_by)
        line = f"witnesses: ok: the checkpoint of size {cosigned.size} is cosigned by {names}"
    else:
        line = f"witnesses: FAILED: {cosigned.problem}"
    emit(args, data, f"{report.summary()}\n{line}")
    return 0 if data["ok"] else EXIT_INTEGRITY


def _cosigned(args: argparse.Namespace, report: Any, checkpoints: Any, cosignatures: Any) -> Any:
    from apollia_nb.journal.witness import check_cosigned

    return check_cosigned(entries=report.entries, checkpoints=checkpoints, cosignatures=cosignatures,
                          witnesses=args.witness, quorum=args.quorum)


def _checkpoint(args: argparse.Namespace) -> int:
    with _owned_journal(args) as journal:
        note = journal.checkpoint()
    if args.out is not None:
        args.out.write_text(note, encoding="utf-8")
    if getattr(args, "json", False):
        from apollia_nb.journal.checkpoint import parse_checkpoint, parse_note

        cp = parse_checkpoint(parse_note(note)[0])
        emit(args, {"origin": cp.origin, "size": cp.size, "root": cp.root.hex(), "note": note}, note)
    else:
        print(note, end="")
    return 0


def _prove(args: argparse.Namespace) -> int:
    with _owned_journal(args) as journal:
        proof = journal.inclusion_proof(args.seq)
        proof.verify(journal.verifier())  # checked again here, before anything is printed
        entry = journal.get(args.seq)
    data = proof.to_dict()
    data["entry"] = entry.to_dict()
    lines = [
        f"entry {proof.seq} ({entry.kind}) is leaf {proof.leaf_index} of the tree of "
        f"{proof.tree_size} entries; the proof verifies.",
        f"entry hash  {proof.entry_hash.hex()}",
        f"leaf hash   {proof.leaf_hash.hex()}",
        f"root        {proof.root.hex()}",
        f"audit path  ({len(proof.path)} hashes, lowest first)",
        *(f"  {h.hex()}" for h in proof.path),
        "checkpoint",
        proof.checkpoint.rstrip("\n"),
    ]
    emit(args, data, "\n".join(lines))
    return 0


def _export(args: argparse.Namespace) -> int:
    from apollia_nb.cli.client import remote
    from apollia_nb.journal.export import export_home, export_journal

    with remote(args) as served:
        result = export_home(_home(args), args.dir) if served is None else export_journal(served.journal, args.dir)
    emit(
        args,
        result.to_dict(),
        f"exported {result.entries} entries and {result.checkpoints} checkpoint(s) to {result.directory}\n"
        f"verify with: apollia-os audit verify --bundle {json.dumps(str(result.directory))}",
    )
    return 0


def _replay(args: argparse.Namespace) -> int:
    from apollia_nb.errors import UnknownRun
    from apollia_nb.journal.replay import replay_entries

    with _owned_journal(args) as journal:
        entries = journal.entries(run_id=args.run)
    if not entries:
        raise UnknownRun(f"the journal has no run {args.run!r}")
    result = replay_entries(args.run, entries)
    lines = [f"{result.verdict}: run {args.run}, {result.entries} entries, {result.responses} model responses, "
             f"{result.calls} tool calls"]
    lines += [f"  missing: {m}" for m in result.missing]
    lines += [f"  seq {d.position}: {d.kind} ({d.call_id}) expected {d.expected!r}, found {d.found!r}"
              for d in result.divergences]
    emit(args, result.to_dict(), "\n".join(lines))
    return result.exit_code
