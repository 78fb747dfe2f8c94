"""``apollia-os audit``: verify, checkpoint, prove and export the journal.

``verify`` and ``export`` only read: they open ``journal.db`` read-only (or an
exported bundle) and create nothing. ``checkpoint`` and ``prove`` may write a
checkpoint, so they own the home for their duration (``OwnerLock``; another
owner is ``HOME_LOCKED``, naming it). ``verify`` exits 1 on any integrity
failure, printing the first bad sequence number and what was wrong. ``verify
--bundle`` first checks the files a bundle's README tells the auditor to run or read
(``BUNDLE_FILE_ALTERED`` naming the file, exit 1); ``views`` prints the bundle views
from this install, so that querying a bundle runs nothing the bundle brought.
``erase`` owns the home (it must not be in use) and removes payload fields from the journal
and every copy of them (``runtime.erasure``), recording a signed ``erasure`` entry first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from apollia_nb.cli.common import emit

__all__ = ["register"]

EXIT_INTEGRITY = 1


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ``audit verify|oversight|verifier-key|views|consistency|checkpoint|prove|replay|export|erase``."""
    audit = sub.add_parser("audit", help="verify, checkpoint, prove, replay and export the journal")
    asub = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)

    p = asub.add_parser("verify", parents=[common],
                        help="check the chain, every hash and signature, and checkpoints (exit 1: fails)",
                        description="Check every entry's chain link, hash, key id and signature and every "
                        "checkpoint. Exit 0 ok; 1 a failure: `FAILED at seq N: problem`, or `FAILED: problem` "
                        "when no entry is at fault (a checkpoint's root, a key). JSON: ok, entries, first_bad_seq, "
                        "problem, checked_checkpoints.")
    p.add_argument("--checkpoint", type=Path, default=None, metavar="F",
                   help="also check a signed checkpoint kept elsewhere (detects truncation and rollback)")
    p.add_argument("--bundle", type=Path, default=None, metavar="DIR",
                   help="verify an exported bundle instead of the home's journal")
    p.add_argument("--key", default=None, metavar="VKEY",
                   help="the log's verifier key you hold (`audit verifier-key`): any other key fails")
    p.add_argument("--witness", action="append", default=[], metavar="VKEY",
                   help="require the newest checkpoint, covering every entry, to be cosigned by this witness "
                        "(its cosignature/v1 verifier key; repeatable)")
    p.add_argument("--quorum", type=int, default=None, metavar="N",
                   help="with --witness: cosignatures from at least N of them suffice (default: all); "
                        "witnesses count by key, so one given twice is one")
    p.set_defaults(handler=_verify)

    p = asub.add_parser("views", parents=[common],
                        help="print this install's SQL views for an exported bundle (for duckdb -cmd)",
                        description="Print the SQL that maps a bundle's Parquet files and creates the views "
                        "journal, decisions, tool_calls, runs and oversight, from this install (never from the bundle): "
                        "duckdb -cmd \"$(apollia-os audit views --bundle DIR)\". Exit 0; 3 DIR is not a bundle. "
                        "JSON: sql.")
    p.add_argument("--bundle", type=Path, default=None, metavar="DIR",
                   help="name the bundle's files by their absolute paths in DIR (default: relative, run it there)")
    p.set_defaults(handler=_views)

    p = asub.add_parser("oversight", parents=[common],
                        help="who answered which card, in what role, after how long, having seen what (the "
                             "oversight view)",
                        description="Print the oversight view: one row per answer given to a card, per approval "
                        "short of the approvers a policy needs, per answer refused and per plan approved or "
                        "rejected (event plan, the task as its card); the card, when it was "
                        "asked, when and by whom it was answered, their role and how they authenticated, how "
                        "long it waited, and the digest of what they were shown. Exit 0. JSON: the rows, each "
                        "with seq, card, event, run_id, agent, tool, family, asked_at, answered_at, "
                        "waited_seconds, answer, answered_by, by_role, auth, digest, consent_for, consent_until, "
                        "refused_code.")
    p.add_argument("--since", default=None, metavar="SEQ|TIME",
                   help="only entries after sequence number SEQ, or answered at or after TIME (ISO 8601; UTC "
                        "when it names no zone)")
    p.set_defaults(handler=_oversight)

    p = asub.add_parser("verifier-key", parents=[common],
                        help="print the log's verifier key (<origin>+<key id>+<key>) to pin with --key",
                        description="Print the C2SP verifier key of the journal's checkpoints. Exit 0. JSON: "
                        "verifier_key, origin, key_id (4-byte note key hash, hex), public_key (hex).")
    p.set_defaults(handler=_verifier_key)

    p = asub.add_parser("consistency", parents=[common],
                        help="prove the journal extends checkpoints you kept, or say where it does not (exit 1)",
                        description="Check that the journal extends every kept checkpoint (or bundle) and print "
                        "the RFC 6962 consistency proof from the largest to the current checkpoint (signed now "
                        "when the latest does not cover every entry). Exit 0 ok; 1 it does not: `FAILED at seq N` "
                        "when the first entry that differs is known (a kept bundle, or kept checkpoints one entry "
                        "apart), else `FAILED within seqs A..B`; `FAILED: ...` when a kept note is not signed by "
                        "this log's key. JSON: ok, entries, first_bad_seq, differs_within [A, B], problem, kept; "
                        "when ok also old and new {size, root, note} and path (hex).")
    p.add_argument("--from", dest="kept", type=Path, action="append", required=True, metavar="F",
                   help="a checkpoint note you kept, or a bundle folder you exported earlier (repeatable)")
    p.set_defaults(handler=_consistency)

    p = asub.add_parser("checkpoint", parents=[common],
                        help="sign a checkpoint of the whole journal and print it")
    p.add_argument("--out", type=Path, default=None, metavar="F", help="also write the note to F")
    p.set_defaults(handler=_checkpoint)

    p = asub.add_parser("prove", parents=[common],
                        help="an RFC 6962 inclusion proof of one entry against the latest (or a kept) checkpoint",
                        description="Prove entry SEQ is in the tree of a signed checkpoint; verified before it is "
                        "printed. Exit 0; 1 the journal does not extend the --against checkpoint (as "
                        "`consistency`); 3 no such entry, or SEQ beyond the checkpoint. JSON: seq, leaf_index "
                        "(0-based), tree_size, entry_hash, leaf_hash, path (hex, lowest first), root (hex), "
                        "checkpoint (the note), entry (payload parsed), stored (payload_base64: the stored bytes), "
                        "hashed_base64 (the bytes whose SHA-256 is entry_hash).")
    p.add_argument("seq", type=int, metavar="SEQ")
    p.add_argument("--against", type=Path, default=None, metavar="F",
                   help="prove against this checkpoint note you kept (exit 1 when the journal does not extend it)")
    p.add_argument("--format", choices=["text", "json", "tlog-proof"], default="text",
                   help="json: as --json; tlog-proof: the c2sp.org/tlog-proof@v1 text")
    p.set_defaults(handler=_prove)

    p = asub.add_parser("replay", parents=[common],
                        help="replay a run offline (exit 0 identical, 1 diverged, 2 incomplete)")
    p.add_argument("run", metavar="RUN", help="the run id (see the runs view)")
    p.set_defaults(handler=_replay)

    p = asub.add_parser("export", parents=[common], help="write an offline audit bundle",
                        description="Verify the journal, then write the bundle. Exit 0; 1 the journal does not "
                        "verify (nothing written; the error names the first bad seq) unless --allow-invalid, "
                        "which writes it with meta.json `verified: false` and `invalid` (the failed "
                        "verification); 3 DIR holds a bundle. JSON: directory, entries, checkpoints, files, "
                        "verified, verification. With --format ocsf, DIR is a file: OCSF events as JSON "
                        "Lines (governed calls as API Activity, consent and mode changes as Authorize Session), "
                        "each with its entry's hash and signature (docs/evidence.md); 3 the file exists.")
    p.add_argument("--format", choices=["parquet", "ocsf"], default="parquet")
    p.add_argument("--since", type=int, default=0, metavar="SEQ",
                   help="with --format ocsf: only entries after SEQ")
    p.add_argument("--allow-invalid", action="store_true",
                   help="export a journal that does not verify, marked invalid in meta.json (else: refused, exit 1)")
    p.add_argument("dir", type=Path, metavar="DIR")
    p.set_defaults(handler=_export)

    p = asub.add_parser("erase", parents=[common],
                        help="erase payload fields from the journal and its copies, recording a signed erasure entry",
                        description="Append a signed `erasure` entry naming what goes (seq and field, who, why; never "
                        "the value), then remove those fields' values and salts from journal.db and journal.log, "
                        "their copies from runtime.db's records, and rewrite every database file of the home from "
                        "its live rows. The entries' hashes, signatures, checkpoints and cosignatures stay valid "
                        "(the journal's format 2 commits to salted fields); `audit verify` then counts the fields "
                        "erased. --subject ID erases every field the journal tags with that data subject (a tool "
                        "argument marked x-apollia-subject or named in [subjects.tools]; found through the home's "
                        "keys/subjects.key), across runs; the erasure entry names it by its keyed digest only; "
                        "NOT_FOUND (exit 3, nothing recorded) when no field of it is left. The home must not be in "
                        "use (HOME_LOCKED). A journal of format 1 is BAD_INPUT: it "
                        "hashes payloads whole. Exit 0. JSON: erasure_seq, erased, fields, runtime_rows, scrubbed.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--seq", type=int, default=None, metavar="N", help="the entry whose fields go")
    what.add_argument("--subject", default=None, metavar="ID",
                      help="every field tagged with this data subject's id, across runs")
    p.add_argument("--field", default=None, metavar="PATH",
                   help="with --seq: only this payload field (e.g. output of a tool_result; default: every field)")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded in the erasure entry)")
    p.set_defaults(handler=_erase)


@contextmanager
def _owned_journal(args: argparse.Namespace) -> Iterator[Any]:
    """The home's existing journal: opened by this command, which owns the home meanwhile, or the
    server's when `apollia-os serve` owns it."""
    from apollia_nb.cli.backend import open_home

    with open_home(args, reading=True) as home, home.journal() as journal:
        yield journal


def _since(text: str | None) -> tuple[int | None, Any]:
    """``--since``: ``(seq, None)`` for a sequence number, ``(None, time)`` for an ISO 8601 time."""
    if text is None:
        return None, None
    from datetime import datetime, timezone

    from apollia_nb.errors import BadInput

    words = text.strip()
    if words.isdigit():
        return int(words), None
    try:
        when = datetime.fromisoformat(words)
    except ValueError:
        raise BadInput(f"--since takes a sequence number or an ISO 8601 time, not {text!r}") from None
    return None, when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _oversight(args: argparse.Namespace) -> int:
    from apollia_nb.journal.views import list_oversight

    since_seq, since = _since(args.since)
    with _owned_journal(args) as journal:
        rows = list_oversight(journal, since_seq=since_seq, since=since)
    if not rows:
        emit(args, rows, "no answers yet" if args.since is None else f"no answers since {args.since}")
        return 0
    head = ["SEQ", "CARD", "EVENT", "AGENT", "TOOL", "ASKED", "ANSWERED", "WAITED", "ANSWER", "BY", "ROLE", "AUTH",
            "DIGEST"]
    lines = []
    for r in rows:
        waited = f"{r['waited_seconds']:.1f}s" if r["waited_seconds"] is not None else "-"
        answer = r["answer"] or "-"
        if r["consent_for"]:
            answer += f" for {r['consent_for']}"
        if r["refused_code"]:
            answer += f" ({r['refused_code']})"
        lines.append([str(r["seq"]), r["card"] or "-", r["event"], r["agent"] or "-", r["tool"] or "-",
                      r["asked_at"] or "-", r["answered_at"] or "-", waited, answer, r["answered_by"] or "-",
                      r["by_role"] or "-", r["auth"] or "-", (r["digest"] or "-")[:19]])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *lines])
    emit(args, rows, text)
    return 0


def _read_checkpoint(path: Path | None) -> str | None:
    if path is None:
        return None
    from apollia_nb.errors import BadInput

    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read checkpoint {path}: {exc}") from None


def _pinned(text: str | None) -> Any:
    """The verifier of ``--key VKEY`` (``BAD_INPUT`` when it is not a verifier key), or None."""
    if text is None:
        return None
    from apollia_nb.journal.checkpoint import NoteVerifier

    return NoteVerifier.from_key(text.strip())


def _verify(args: argparse.Namespace) -> int:
    from apollia_nb.journal.verify import cosigned_rows_of_bundle, verify_bundle

    external = _read_checkpoint(args.checkpoint)
    pinned = _pinned(args.key)  # a malformed key is BAD_INPUT before anything is read
    if args.quorum is not None and not args.witness:
        from apollia_nb.errors import BadInput

        raise BadInput("--quorum needs --witness")
    if args.witness:  # malformed keys or quorum: BAD_INPUT before anything is read
        from apollia_nb.journal.witness import check_cosigned

        check_cosigned(entries=0, checkpoints=(), cosignatures=(), witnesses=args.witness, quorum=args.quorum)
    cosigned = None
    if args.bundle is not None:
        from apollia_nb.errors import BundleFileAltered
        from apollia_nb.journal.export import check_bundle_files

        try:  # before anything else reads it: a file that is not what this install writes fails here
            check_bundle_files(args.bundle)
        except BundleFileAltered as exc:
            return _altered(args, exc)
        report = verify_bundle(args.bundle, external=external)
        if args.witness:
            cosigned = _cosigned(args, report, *cosigned_rows_of_bundle(args.bundle))
    else:
        from apollia_nb.cli.backend import open_home

        with open_home(args, reading=True) as home:
            report, rows = home.verify(external, witnessed=bool(args.witness))
        if rows is not None:
            cosigned = _cosigned(args, report, *rows)
    report = _pin(args, report, pinned)
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


def _altered(args: argparse.Namespace, exc: Any) -> int:
    """``verify --bundle`` on a bundle whose README, views or other small file was altered: an
    integrity failure naming the file (exit 1); its entries are not looked at."""
    data = {"ok": False, "entries": 0, "first_bad_seq": None, "problem": exc.message, "checked_checkpoints": 0,
            "code": exc.code, "file": exc.file}
    emit(args, data, f"FAILED: {exc.code}: {exc.message}")
    return EXIT_INTEGRITY


def _views(args: argparse.Namespace) -> int:
    from apollia_nb.errors import BadInput, NotFound
    from apollia_nb.journal.export import BUNDLE_FILES
    from apollia_nb.journal.views import bundle_sql

    if args.bundle is not None:
        if any(ord(ch) < 0x20 or ch == "\x7f" for ch in str(args.bundle.resolve())):
            raise BadInput(f"{str(args.bundle)!r}: a bundle path with control characters cannot be named in SQL")
        if not (args.bundle / BUNDLE_FILES["entries"]).is_file():
            raise NotFound(f"{args.bundle} is not an audit bundle: {BUNDLE_FILES['entries']} is missing")
    sql = bundle_sql(args.bundle)
    if getattr(args, "json", False):
        emit(args, {"sql": sql}, sql)
    else:
        print(sql, end="")
    return 0


def _cosigned(args: argparse.Namespace, report: Any, checkpoints: Any, cosignatures: Any) -> Any:
    from apollia_nb.journal.witness import check_cosigned

    return check_cosigned(entries=report.entries, checkpoints=checkpoints, cosignatures=cosignatures,
                          witnesses=args.witness, quorum=args.quorum)


def _pin(args: argparse.Namespace, report: Any, pinned: Any) -> Any:
    """``report`` as it stands under the key pinned with ``--key`` (as it is without one)."""
    if pinned is None:
        return report
    from apollia_nb.journal.audit import pin
    from apollia_nb.journal.export import read_bundle_key

    return pin(report, read_bundle_key(args.bundle) if args.bundle is not None else _log_verifier(args), pinned)


def _log_verifier(args: argparse.Namespace) -> Any:
    """The home's log verifier (a served journal's is checked against the home's key)."""
    from apollia_nb.cli.backend import open_home

    with open_home(args, reading=True) as home:
        return home.verifier()


def _verifier_key(args: argparse.Namespace) -> int:
    verifier = _log_verifier(args)
    key = verifier.key()
    emit(args, {"verifier_key": key, "origin": verifier.name, "key_id": verifier.key_id.hex(),
                "public_key": verifier.public_key.hex()}, key)
    return 0


def _kept(paths: list[Path]) -> list[Any]:
    """What the auditor kept: checkpoint notes, or bundle folders (their checkpoint and entry hashes)."""
    from apollia_nb.errors import BadInput
    from apollia_nb.journal.audit import Kept
    from apollia_nb.journal.export import BUNDLE_FILES, bundle_hashes

    kept = []
    for path in paths:
        if path.is_dir():
            note = _read_checkpoint(path / BUNDLE_FILES["checkpoint"])
            if not note:
                raise BadInput(f"{path} holds no {BUNDLE_FILES['checkpoint']}: not a bundle with a checkpoint")
            kept.append(Kept(f"the bundle {path}", note, bundle_hashes(path)))
        else:
            kept.append(Kept(f"the checkpoint {path}", _read_checkpoint(path) or ""))
    return kept


def _entry_hashes(journal: Any) -> list[bytes]:
    return [bytes(h) for (h,) in journal.sql("SELECT hash FROM entries ORDER BY seq")]


def _root_at(journal: Any) -> Any:
    """The Merkle root of the journal's first ``n`` entries, from its own consistency proofs."""
    from apollia_nb.journal.merkle import EMPTY_ROOT

    return lambda n: journal.consistency_proof(n, n).old_root if n else EMPTY_ROOT


def _check_kept(journal: Any, kept: list[Any]) -> Any:
    from apollia_nb.journal.audit import check_kept

    return check_kept(kept, journal.head()[0], _root_at(journal), journal.verifier(),
                      lambda: _entry_hashes(journal))


def _consistency(args: argparse.Namespace) -> int:
    from apollia_nb.journal.audit import consistency_document

    kept = _kept(args.kept)
    with _owned_journal(args) as journal:
        check = _check_kept(journal, kept)
        if not check.ok:
            emit(args, check.to_dict(), check.summary())
            return EXIT_INTEGRITY
        note = journal.checkpoint()  # the current tree, signed (the latest when it covers every entry)
        doc = consistency_document(check, note, journal.verifier(), journal.consistency_proof, _root_at(journal))
    old, new = doc["old"], doc["new"]
    lines = [f"ok: the journal ({new['size']} entries) extends {', '.join(check.checked)}; the proof verifies.",
             f"old root    {old['root'] if old else '-'} (size {old['size'] if old else 0})",
             f"new root    {new['root']} (size {new['size']})",
             f"proof       ({len(doc['path'])} hashes, RFC 6962 order)",
             *(f"  {h}" for h in doc["path"]),
             "checkpoint",
             new["note"].rstrip("\n")]
    emit(args, doc, "\n".join(lines))
    return 0


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
    from apollia_nb.journal.audit import proof_document, tlog_proof

    against = _kept([args.against]) if args.against is not None else None
    with _owned_journal(args) as journal:
        if against is not None:
            check = _check_kept(journal, against)
            if not check.ok:  # a proof against a tree the journal does not extend cannot be made
                emit(args, check.to_dict(), check.summary())
                return EXIT_INTEGRITY
        proof = journal.inclusion_proof(args.seq, against[0].note if against else None)
        proof.verify(journal.verifier())  # checked again here, before anything is printed
        entry = journal.get(args.seq)
    if args.format == "tlog-proof":
        print(tlog_proof(proof, entry), end="")
        return 0
    if args.format == "json":
        args.json = True
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
    emit(args, proof_document(proof, entry), "\n".join(lines))
    return 0


def _erase(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import _home
    from apollia_nb.errors import BadInput
    from apollia_nb.runtime.erasure import erase_home

    if args.field is not None and args.seq is None:
        raise BadInput("--field names a field of the entry --seq names")
    import getpass

    result = erase_home(_home(args), seq=args.seq, field_path=args.field, subject=args.subject,
                        reason=args.reason, by=f"owner ({getpass.getuser()})")
    data = result.to_dict()
    names = "; ".join(f"entry {e['seq']}: {', '.join(e['fields'])}" for e in data["erased"]) or "nothing left to remove"
    emit(args, data, f"erasure recorded as entry {result.seq}; erased {data['fields']} field(s) ({names}); "
                     f"{result.runtime_rows} runtime record(s) changed; {len(result.scrubbed)} file(s) rewritten")
    return 0


def _export(args: argparse.Namespace) -> int:
    import sys

    from apollia_nb.cli.backend import open_home

    if args.format == "ocsf":
        return _export_ocsf(args)
    with open_home(args, reading=True) as home:
        report, result = home.export(args.dir, allow_invalid=args.allow_invalid)
    if result is None:
        message = (f"the journal does not verify ({report.summary()}); nothing was exported. Export it "
                   "anyway, marked invalid, with --allow-invalid")
        if getattr(args, "json", False):
            print(json.dumps({"code": "INTEGRITY_FAILURE", "message": message,
                              "verification": report.to_dict()}), file=sys.stderr)
        else:
            print(f"error: INTEGRITY_FAILURE: {message}", file=sys.stderr)
        return EXIT_INTEGRITY
    invalid = None if report.ok else report.to_dict()
    marked = "" if invalid is None else f"\nmarked INVALID (meta.json): {report.summary()}"
    emit(
        args,
        {**result.to_dict(), "verified": invalid is None, "verification": report.to_dict()},
        f"exported {result.entries} entries and {result.checkpoints} checkpoint(s) to {result.directory}{marked}\n"
        f"verify with: apollia-os audit verify --bundle {json.dumps(str(result.directory))}",
    )
    return 0


def _export_ocsf(args: argparse.Namespace) -> int:
    """``audit export --format ocsf``: verify, then write the mapped entries after ``--since``."""
    import sys

    from apollia_nb.cli.backend import open_home
    from apollia_nb.errors import BadInput

    out: Path = args.dir
    if out.exists():
        print(f"error: CONFLICT: {out} exists; nothing was written", file=sys.stderr)
        return 3
    if args.since < 0:
        raise BadInput(f"--since takes a sequence number, 0 or more, got {args.since}")
    with open_home(args, reading=True) as home:
        report, _ = home.verify(None, witnessed=False)
        if not report.ok and not args.allow_invalid:
            print(f"error: INTEGRITY_FAILURE: the journal does not verify ({report.summary()}); nothing was "
                  "exported", file=sys.stderr)
            return EXIT_INTEGRITY
        with home.journal() as journal:
            tmp = out.with_name(out.name + ".part")
            try:
                written, through = _write_ocsf(journal, tmp, args.since)
                tmp.replace(out)
            except BaseException:
                tmp.unlink(missing_ok=True)  # nothing half-written is left under either name
                raise
    emit(args, {"file": str(out), "events": written, "since": args.since, "through": through,
                "verified": report.ok},
         f"wrote {written} OCSF events (entries {args.since + 1}..{through}) to {out}")
    return 0


def _write_ocsf(journal: Any, path: Path, since: int) -> tuple[int, int]:
    """The OCSF events of the entries after ``since`` into ``path``, a page at a time: (events, last seq)."""
    from apollia_nb.journal.ocsf import KINDS, ocsf_event

    origin, key_id = journal.origin, journal.key_id
    tools: dict[str, Any] = {}  # call id → its decision, so an answer names its tool
    written = 0
    with path.open("w", encoding="utf-8") as f:
        while True:
            page = journal.entries(since_seq=since, limit=5000)
            if not page:
                break
            since = int(page[-1].seq)
            for entry in page:
                event = ocsf_event(entry, origin, key_id, tools) if entry.kind in KINDS else None
                if event is not None:
                    f.write(json.dumps(event, sort_keys=True, ensure_ascii=False) + "\n")
                    written += 1
    return written, since


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
