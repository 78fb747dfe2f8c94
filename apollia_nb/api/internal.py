"""Routes for the home's clients: what a kernel needs from the process that owns the home.

A home has one owner process. When ``apollia-os serve`` owns it, a
kernel (or a script, or ``apollia-os run``) that finds it running becomes its
client (``apollia_nb.runtime.remote``): its agents run in the kernel, but
every journal entry is appended by the server's single writer, and every read
and change of governance goes through the server's store. These routes, under
``/api/v1/internal``, carry that, bearer-protected like the rest:

* **The journal.** Append entries (one request is one atomic group, committed
  before the answer), read a run's entries a page at a time, read and write
  checkpoints, the head with the log's origin and public key.
* **The governance snapshot** that ``decide()`` reads, with a generation
  (also its ``ETag``): ``If-None-Match`` with the last generation answers
  ``304`` with no body while nothing changed, so a client can ask before every
  decision and still see at once every change any process committed.
* **Pending decisions**: list one, add one, and a long poll that answers as
  soon as any of the given decisions is no longer pending. Answers use the
  public ``POST /pending-decisions/decide`` (validated, journaled, stored,
  ``always`` applied by the server's ``Runtime.answer``).
* **Governance changes** the public routes do not carry with their author:
  granting and revoking a standing consent, removing a rule.

The server's token grants all of it: an append is signed with the home's key
like any entry, so keep the token as you keep the home. A person's token
(``apollia-os people add``, or a hub user's) opens what its roles open
(``api/roles.py``); a ``runner``'s client runs its own agents through these
routes, and for any person (whatever their roles) the server keeps to what a
client runtime does for the runs it opened (:data:`PERSON_KINDS`, the section
"a person's client" below): the run's ``run_open`` is stamped ``started_by``
with the person the token names, and every other append, call, waiting decision
and wait for answers must be of a run that person opened. A worker credential
(``api/worker_tokens.py``: what a Dask batch's items carry, issued and revoked
here by the server's token) opens only the routes one of its batch's items
uses, for that batch's agent and tasks.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import AfterValidator, AwareDatetime, BeforeValidator, Field, StrictBool

from apollia_nb import faults
from apollia_nb.api.deps import acting
from apollia_nb.api.deps import error_responses as _errors
from apollia_nb.api.deps import runtime_of as _runtime
from apollia_nb.api.worker_tokens import authorize_internal, scope_of, tokens_of
from apollia_nb.wire import schemas as s
from apollia_nb.wire.schemas import _In, _Out

__all__ = ["router", "require_owner", "ANSWER_TICK_SECS", "MAX_PAGE", "CALLS_KEPT", "PERSON_KINDS",
           "STARTERS_KEPT"]

#: How often an open long poll for answers looks at the journal's head (an in-memory read).
ANSWER_TICK_SECS = 0.05
#: The most entries one page of ``GET /internal/journal/entries`` holds.
MAX_PAGE = 10_000
#: The most entries one append takes (the journal's largest group commit).
MAX_APPEND = 1024

def require_owner(runtime: Any) -> None:
    """Refuse to serve a runtime that is itself a client: a home has one server (``HOME_LOCKED``)."""
    if runtime is not None and getattr(runtime, "mode", "owner") == "client":
        from apollia_nb.errors import HomeLocked

        server = runtime.journal.server_url
        raise HomeLocked(
            f"the home {runtime.home.path} is served by process {runtime.server.pid} at {server} "
            "(apollia-os serve): a home has one server; use that one, or stop it first"
        )


router = APIRouter(prefix="/internal", dependencies=[Depends(authorize_internal)], responses=_errors(401, 422),
                   tags=["internal"])


# --- wire models ----------------------------------------------------------------------------------

Kind = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$", description="the entry's kind")]
Hex = Annotated[str, Field(description="lowercase hex")]


def _distinct(answers: list[str]) -> list[str]:
    if len(set(answers)) != len(answers):
        raise ValueError("answers must not repeat")
    return answers


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # JSON's true is not the integer 1
        raise ValueError("must be an integer, not a boolean")
    return value


Answers = Annotated[list[s.AnswerName], Field(min_length=1, max_length=3, json_schema_extra={"uniqueItems": True}),
                    AfterValidator(_distinct)]
ConsentFamily = Literal["read_personal", "write", "send"]


class DraftIn(_In):
    kind: Kind
    payload: dict[str, Any] = Field(description="a JSON object; stored as its canonical JSON bytes")
    run_id: str | None = None
    agent: str | None = None


class AppendIn(_In):
    entries: list[DraftIn] = Field(min_length=1, max_length=MAX_APPEND,
                                   description="appended atomically, in order, with consecutive seqs")


class JournalRow(_Out):
    """One entry: the payload as the canonical JSON text of its fields (UTF-8). A salted payload's salts and
    erased fields' commitments are left out unless the entries are read ``stored`` (what a verifier needs)."""

    seq: int
    ts: str
    run_id: str | None
    agent: str | None
    kind: str
    payload: str
    prev_hash: Hex
    hash: Hex
    signature: Hex
    key_id: str


class JournalRows(_Out):
    entries: list[JournalRow]


class JournalRowsPage(_Out):
    entries: list[JournalRow]
    next_since_seq: int | None = Field(
        description="pass as `since_seq` for the next page; null when this page is the last")


class JournalHead(_Out):
    seq: int = Field(description="the last committed entry's seq (0: empty)")
    hash: Hex = Field(description="its hash (32 zero bytes when empty)")
    origin: str = Field(description="the log's origin line")
    key_id: str
    public_key: Hex = Field(description="the raw Ed25519 public key that signs entries and checkpoints")
    checkpoint: str | None = Field(description="the latest stored checkpoint note")
    format: str | None = Field(None, description="the journal's entry format: \"1\" whole payloads, \"2\" salted "
                               "commitments per payload field")


class CheckpointRow(_Out):
    size: int
    root: Hex
    note: str


class Checkpoints(_Out):
    checkpoints: list[CheckpointRow]


class CosignatureRow(_Out):
    size: int = Field(description="the size of the stored checkpoint it cosigns")
    witness: str = Field(description="the witness's cosignature/v1 verifier key")
    timestamp: int
    signature: str = Field(description="the C2SP note signature line, newline included")


class Cosignatures(_Out):
    cosignatures: list[CosignatureRow]


class CheckpointNote(_Out):
    note: str


class VerifyIn(_In):
    checkpoint: Annotated[str, Field(max_length=100_000)] | None = Field(
        None, description="also check this signed checkpoint note, kept elsewhere")


class JournalVerifyReport(_Out):
    """The outcome of verifying the journal where it is stored (what `audit verify` prints)."""

    ok: bool
    entries: int = Field(description="how many leading entries passed every check")
    first_bad_seq: int | None
    problem: str | None
    checked_checkpoints: int
    notes: list[str] = Field(default_factory=list, description="what did not go as planned without changing "
                             "the outcome")
    losses: list[dict[str, Any]] = Field(default_factory=list, description="the losses of acknowledged entries a "
                                         "repair recorded in the journal (`home repair --lost-entries`)")
    erased: int = Field(0, description="payload fields erased (value and salt gone, commitment verified), each "
                        "named by an `erasure` entry")
    format: str | None = Field(None, description="the journal's entry format: \"1\" whole payloads, \"2\" salted "
                               "commitments per payload field")


class SnapshotRule(_Out):
    id: str | None
    tool: str
    prefix: str | None
    effect: Literal["allow", "deny"]
    agent: str


class SnapshotConsent(_Out):
    agent: str
    family: s.FamilyName


class GovernanceSnapshot(_Out):
    """What ``decide()`` reads, as the server's store holds it now."""

    generation: str = Field(description="changes whenever anything below changes; also the `ETag`")
    rules: list[SnapshotRule]
    consents: list[SnapshotConsent]
    developer_mode: bool
    refusals: s.PolicyDocument | None = Field(description="the organisation policy's refusals in effect")
    policy: s.Policy = Field(description="the organisation policy's state")
    readable: bool = Field(description="false: governance fails closed")
    reason: str = Field(description="why it fails closed (empty when readable)")


class PendingIn(_In):
    run_id: Annotated[str, Field(min_length=1, max_length=200)]
    task_id: Annotated[str, Field(max_length=200)] | None = None
    agent: s.AgentName
    tool: s.ToolName
    family: s.FamilyName | None = Field(description="null when the tool is unclassified")
    arguments: dict[str, Any]
    answers: Answers
    reason: Annotated[str, Field(max_length=10_000)] = ""
    line: Annotated[int, BeforeValidator(_not_bool)] = Field(
        0, ge=0, le=6, description="the line of `decide()` that asked")
    call_id: Annotated[str, Field(max_length=200)] | None = None


class ConsentIn(_In):
    agent: s.AgentName
    family: ConsentFamily = Field(description="a family a standing consent can cover")
    by: s.Who
    until: AwareDatetime | None = Field(None, description="when it ends (null: until revoked)")
    card: str | None = Field(None, max_length=200, description="the card whose `always` gave it")


class RevokeIn(_In):
    agent: s.AgentName
    family: s.FamilyName
    by: s.Who


class AgentIdentity(_In):
    tools: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        max_length=10_000, description='the tools it is offered, sorted (`["*"]`: every tool)')
    workspace: Annotated[str, Field(min_length=1, max_length=4096)] = Field(
        description="its workspace, an absolute path resolved when it was registered")
    model: dict[str, Any] = Field(description="its `[model]` table without the script")


class IdentityIn(_In):
    agent: s.AgentName
    identity: AgentIdentity
    keep_consents: bool | None = Field(None, description="the operator's choice when its standing consents "
                                                         "are to be reviewed (null: not given)")


class IdentityReview(_Out):
    difference: dict[str, Any]
    consents: list[str]
    choice: Literal["kept", "dropped"]


class IdentityOut(_Out):
    agent: str
    identity: dict[str, Any]
    digest: Hex
    review: IdentityReview | None


class RuleRemoveIn(_In):
    id: Annotated[str, Field(min_length=1, max_length=200)]
    by: s.Who


# --- a person's client: only its own runs --------------------------------------------------------

#: The kinds of entry a client runtime appends for a run it opened (``runtime/remote.py``'s appends, through
#: ``RemoteJournal``): the run's opening and seal, its status, plans and verdicts, model turns, the decisions
#: and calls of the run (a governed call's are the server's own, through ``/internal/calls``), their progress
#: and results, and an agent's package install (no run). A person's token appends nothing else: an answer,
#: an approval or its refusal, a consent, a rule, a policy, developer mode, a person, an erasure, a checkpoint
#: or a home file's fact is written by the server itself when it does the thing, never taken from a client.
PERSON_KINDS = frozenset({"run_open", "run_seal", "task_status", "session_status", "plan", "verdict",
                          "model_response", "decision", "tool_call", "tool_result", "tool_progress",
                          "packages_install"})
#: Of those, the kinds an entry with no run may have.
_RUNLESS_KINDS = frozenset({"packages_install"})
#: The kinds the server writes for a governed call itself: never among the entries a call carries before it.
_CALL_KINDS = frozenset({"run_open", "decision", "tool_call"})
#: How many runs' starters the server keeps in memory (the others are read back from the journal).
STARTERS_KEPT = 16_384


def _person(request: Request) -> Any:
    """The person whose token sent the request; None for the owner's token (and a worker credential, whose
    routes check their own scope)."""
    identity = getattr(request.state, "identity", None)
    return None if identity is None or identity.via == "owner" else identity


class _Starters:
    """Who opened each run, as its ``run_open`` says: ``(started_by, task or session id)``, ``started_by`` None
    for a run the owner's token or the server itself opened. Kept for recent runs, read back from the
    journal otherwise (a run's first entry is its ``run_open``), so a restarted server knows them too.
    ``opening`` makes the check that a run id is new and the ``run_open``'s append one step."""

    def __init__(self) -> None:
        from collections import OrderedDict

        self.runs: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self.opening = anyio.Lock()

    def noted(self, run_id: str, started_by: str | None, task: str | None) -> None:
        self.runs[run_id] = (started_by, task)
        while len(self.runs) > STARTERS_KEPT:
            self.runs.popitem(last=False)

    async def of(self, rt: Any, run_id: str) -> tuple[str | None, str | None] | None:
        """The run's starter and task, or None when the journal holds no entry of the run."""
        known = self.runs.get(run_id)
        if known is not None:
            return known
        first = await anyio.to_thread.run_sync(lambda: rt.journal.entries(run_id=run_id, limit=1))
        if not first:
            return None
        opened = first[0].data() if first[0].kind == "run_open" else {}
        started = opened.get("started_by")
        task = opened.get("task_id") or opened.get("session_id")
        found = (started if isinstance(started, str) else None, task if isinstance(task, str) else None)
        self.noted(run_id, *found)
        return found


def _starters(request: Request) -> _Starters:
    starters = getattr(request.app.state, "run_starters", None)
    if starters is None:
        starters = request.app.state.run_starters = _Starters()
    return starters


def _not_yours(person: Any, what: str) -> Any:
    from apollia_nb.errors import Forbidden

    return Forbidden(f"{person.name}'s token {what}")


async def _own_run(request: Request, rt: Any, person: Any, run_id: str | None) -> tuple[str | None, str | None]:
    """The run's starter and task when ``person`` opened it; 403 ``FORBIDDEN`` otherwise."""
    found = await _starters(request).of(rt, run_id) if run_id else None
    if found is None or found[0] != person.name:
        raise _not_yours(person, f"acts only on the runs {person.name} opened; run {run_id} is not one of them")
    return found


async def _persons_drafts(request: Request, rt: Any, person: Any, drafts: list[Any],
                          *, before_call: bool = False) -> tuple[list[Any], dict[str, str | None]]:
    """``drafts`` as a person's client may append them, each ``run_open`` stamped with who opened the run
    (whatever its payload said), and the runs they open (with their task); 403 ``FORBIDDEN`` naming why
    for anything else, and nothing is appended."""
    from apollia_nb.journal.store import Draft

    out, opened = [], {}
    for d in drafts:
        if d.kind not in PERSON_KINDS or (before_call and d.kind in _CALL_KINDS):
            where = "before a governed call (the server writes it)" if d.kind in PERSON_KINDS else (
                "the server writes them itself when it does the thing; a client appends only the entries of the "
                "runs it opened")
            raise _not_yours(person, f"does not append {d.kind!r} entries: {where}")
        if d.run_id is None:
            if d.kind not in _RUNLESS_KINDS:
                raise _not_yours(person, f"does not append a {d.kind!r} entry outside a run")
        elif d.kind == "run_open":
            if d.run_id in opened or await _starters(request).of(rt, d.run_id) is not None:
                raise _not_yours(person, f"opens only a new run; run {d.run_id} exists already")
            task = d.payload.get("task_id") or d.payload.get("session_id")
            opened[d.run_id] = task if isinstance(task, str) else None
            d = Draft(d.kind, _started_by(d.payload, person.name), d.run_id, d.agent)
        elif d.run_id not in opened:
            await _own_run(request, rt, person, d.run_id)
        out.append(d)
    return out, opened


async def _reads_own_run(request: Request, rt: Any, run_id: str | None) -> None:
    """A ``runner`` who is no ``auditor`` reads the entries of the runs they opened, and no others."""
    person = _person(request)
    if person is not None and not person.has("auditor"):
        if run_id is None:
            from apollia_nb.errors import BadInput

            raise BadInput(f"{person.name} reads the entries of one of the runs they opened: give its run_id "
                           "(every run's entries are an auditor's read)")
        await _own_run(request, rt, person, run_id)


# --- the journal ----------------------------------------------------------------------------------


def _json(content: Any, status: int = 200) -> Response:
    """``content`` as the JSON body FastAPI would send for it (the same encoding), without checking it again
    against the route's ``response_model``: for hot routes whose answer is built here to that model from
    values the server made (the model still documents the route)."""
    return Response(json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                               separators=(",", ":")).encode("utf-8"),
                    status_code=status, media_type="application/json")


def _row(entry: Any, stored: bool = False) -> dict[str, Any]:
    return {
        "seq": entry.seq, "ts": entry.ts, "run_id": entry.run_id, "agent": entry.agent, "kind": entry.kind,
        # a reader's answer is the fields alone: the salts only to a reader that asked for the stored bytes
        # (a verifier, an export), never in an append's or a call's answer
        "payload": (entry.row_payload if stored else entry.payload).decode("utf-8"),
        "prev_hash": entry.prev_hash.hex(), "hash": entry.hash.hex(),
        "signature": entry.signature.hex(), "key_id": entry.key_id,
    }


@router.get("/journal/head", response_model=JournalHead, operation_id="internalJournalHead",
            summary="The journal's head, origin and signing key")
async def journal_head(rt: Any = Depends(_runtime)) -> dict[str, Any]:
    journal = rt.journal
    seq, digest = journal.head()
    return {"seq": seq, "hash": digest.hex(), "origin": journal.origin, "key_id": journal.key_id,
            "public_key": journal.public_key().hex(), "checkpoint": journal.latest_checkpoint(),
            "format": fmt if isinstance(fmt := getattr(journal, "format", None), str) else None}


@router.post("/journal/entries", status_code=201, response_model=JournalRows, operation_id="internalAppend",
             summary="Append entries (atomic, durable on return)", responses=_errors(413, 422),
             description="The entries get consecutive seqs in one transaction of the server's journal writer "
                         "(group commit with every other appender) and are committed when this answers. A person's "
                         "token appends only what a client runtime writes for the runs that person opened (a "
                         "`run_open` of a new run, stamped `started_by` with the person; then that run's status, "
                         "plans, verdicts, model turns, decisions, calls, progress and results, and an agent's "
                         "`packages_install`): any other kind, or a run another opened, is 403 `FORBIDDEN` and "
                         "nothing is appended.")
async def append_entries(body: AppendIn, request: Request, rt: Any = Depends(_runtime)) -> Any:
    from apollia_nb.journal.store import Draft

    drafts = [Draft(d.kind, d.payload, d.run_id, d.agent) for d in body.entries]
    person = _person(request)
    scope = scope_of(request)
    if scope is not None:  # a batch item's run is the person's who started the batch (the owner's: nobody named)
        issuer = _batch_issuers(request).get(id(scope))
        drafts = [Draft(d.kind, _started_by(d.payload, issuer), d.run_id, d.agent) if d.kind == "run_open"
                  else d for d in drafts]
    if person is None:
        entries = await rt.journal.append_many_async(drafts)
    else:  # a person's client: the runs it opened only, stamped with who opened them
        starters = _starters(request)
        # only an append that opens a run waits its turn: a run id is checked new and taken in one step
        async with starters.opening if any(d.kind == "run_open" for d in drafts) else contextlib.nullcontext():
            drafts, opened = await _persons_drafts(request, rt, person, drafts)
            entries = await rt.journal.append_many_async(drafts)
            for run_id, task in opened.items():
                starters.noted(run_id, person.name, task)
    _calls(request).noted(entries)  # the runs it opens, the decisions it journals (``_Calls``)
    return _json({"entries": [_row(e) for e in entries]}, 201)


@router.get("/journal/entries", response_model=JournalRowsPage, operation_id="internalEntries",
            summary="Committed entries in seq order, a page at a time")
async def read_entries(
    request: Request,
    run_id: str | None = Query(None, max_length=200, description="only this run's entries"),
    since_seq: int | None = Query(None, ge=0, le=2**62, description="only entries with a greater seq"),
    kinds: list[Kind] | None = Query(None, max_length=100, description="only entries of these kinds"),
    limit: int = Query(1000, ge=1, le=MAX_PAGE, description="at most this many"),
    stored: bool = Query(False, description="each payload exactly as stored and hashed (a salted payload's "
                         "salts and erased fields' commitments too), for a verifier or an export; otherwise "
                         "its fields alone"),
    rt: Any = Depends(_runtime),
) -> dict[str, Any]:
    from apollia_nb.journal.pages import entry_page

    await _reads_own_run(request, rt, run_id)
    entries = entry_page(rt.journal, run_id=run_id, since_seq=since_seq, kinds=kinds, limit=limit)
    rows = [_row(e, stored) for e in entries]
    return {"entries": rows, "next_since_seq": rows[-1]["seq"] if len(rows) == limit else None}


class RunSize(_Out):
    run_id: str
    entries: int = Field(description="how many entries the run has, every one committed before the request")


@router.get("/journal/run-size", response_model=RunSize, operation_id="internalRunSize",
            summary="How many entries a run has (what its `run_seal` counts)",
            description="For a run not sealed yet: the count its `run_seal` states. Counted where the journal "
                        "keeps it (no read of the run's entries, no wait for them to be copied into `journal.db`).")
async def run_size(request: Request, run_id: str = Query(..., min_length=1, max_length=200, description="the run"),
                   rt: Any = Depends(_runtime)) -> Any:
    await _reads_own_run(request, rt, run_id)
    count = await anyio.to_thread.run_sync(rt.journal.run_size, run_id)  # one query for a run older than the process
    return _json({"run_id": run_id, "entries": count})


@router.get("/journal/checkpoints", response_model=Checkpoints, operation_id="internalCheckpoints",
            summary="Stored checkpoints, smallest first")
async def read_checkpoints(
    since_size: int = Query(0, ge=0, le=2**62, description="only checkpoints of a larger tree"),
    rt: Any = Depends(_runtime),
) -> dict[str, Any]:
    rows = [{"size": size, "root": root.hex(), "note": note}
            for size, root, note in rt.journal.checkpoints() if size > since_size]
    return {"checkpoints": rows}


@router.get("/journal/cosignatures", response_model=Cosignatures, operation_id="internalCosignatures",
            summary="Stored witness cosignatures of checkpoints, smallest size first")
async def read_cosignatures(rt: Any = Depends(_runtime)) -> dict[str, Any]:
    rows = [{"size": size, "witness": witness, "timestamp": ts, "signature": line}
            for size, witness, ts, line in rt.journal.cosignatures()]
    return {"cosignatures": rows}


@router.post("/journal/checkpoint", response_model=CheckpointNote, operation_id="internalCheckpoint",
             summary="Sign and store a checkpoint of every committed entry",
             description="The latest checkpoint when it already covers every entry. The server signs what "
                         "it holds itself (the request carries nothing): a runner's client asks for one when it "
                         "seals a run or closes.")
async def write_checkpoint(rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return {"note": await anyio.to_thread.run_sync(rt.journal.checkpoint)}


@router.post("/journal/verify", response_model=JournalVerifyReport, operation_id="internalVerify",
             summary="Verify the journal where it is stored, and the given checkpoint",
             description="Every entry's chain link, hash, key id and signature, every stored checkpoint and the "
                         "given one, read in seq ranges from one snapshot (memory does not grow with the journal). "
                         "A journal that does not verify is still a 200 with `ok: false`.")
async def verify(body: VerifyIn, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    from apollia_nb.journal.verify import verify_journal

    report = await anyio.to_thread.run_sync(verify_journal, rt.journal, body.checkpoint)
    return {**report.to_dict(), "notes": list(report.notes), "losses": [dict(loss) for loss in report.losses],
            "erased": report.erased, "format": report.format}


# --- the auditor's face: SQL and proofs answered where the journal is stored -----------------------


class SqlIn(_In):
    query: Annotated[str, Field(min_length=1, max_length=100_000)]
    params: list[Any] | None = Field(None, max_length=1_000, description="values for the query's `?`s")
    timeout: float = Field(60.0, gt=0, le=600, description="seconds, then the query is interrupted")


class SqlOut(_Out):
    columns: list[str]
    rows: list[list[Any]] = Field(description="values as JSON; a blob, time, decimal or other value JSON has no "
                                              "type for is `{\"$\": type, \"v\": text}`")


class InclusionIn(_In):
    seq: int = Field(ge=1, le=2**62)
    checkpoint: Annotated[str, Field(max_length=100_000)] | None = None


class InclusionOut(_Out):
    seq: int
    tree_size: int
    entry_hash: Hex
    leaf_hash: Hex
    path: list[Hex]
    root: Hex
    checkpoint: str


class ConsistencyOut(_Out):
    old_size: int
    new_size: int
    old_root: Hex
    new_root: Hex
    path: list[Hex]


@router.post("/journal/sql", response_model=SqlOut, operation_id="internalJournalSql",
             summary="One read-only query over the journal's tables and views",
             description="The rules of `%%apollia sql`: a single SELECT (or EXPLAIN of one), run in a read-only "
                         "transaction on a database that reads nothing but the journal, interrupted after "
                         "`timeout` seconds; anything else is 422 `BAD_INPUT`.")
async def journal_sql(body: SqlIn, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    from apollia_nb.errors import ApolliaError, BadInput
    from apollia_nb.journal.sql import read_only_query
    from apollia_nb.runtime.remote import from_wire, wire_value

    try:
        params = [from_wire(p) for p in body.params] if body.params is not None else None
    except (ApolliaError, ValueError, TypeError, KeyError) as exc:
        raise BadInput(f"a parameter is not a value of the journal: {exc}"[:300]) from None
    columns, rows, _ = await anyio.to_thread.run_sync(
        lambda: read_only_query(rt.journal, body.query, params=params, timeout=body.timeout))
    return {"columns": columns, "rows": [[wire_value(v) for v in row] for row in rows or ()]}


@router.post("/journal/inclusion-proof", response_model=InclusionOut, operation_id="internalInclusionProof",
             responses=_errors(404), summary="Prove an entry is in the tree of a checkpoint",
             description="Against the given checkpoint, else the latest (written first when it does not cover "
                         "the entry). The client verifies the proof under the home's own key.")
async def inclusion_proof(body: InclusionIn, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    from apollia_nb.errors import BadInput
    from apollia_nb.journal.checkpoint import CheckpointError, parse_note

    if body.checkpoint:
        try:  # the client's checkpoint is its input: one that is not a signed note is BAD_INPUT, not ours failing
            parse_note(body.checkpoint)
        except CheckpointError as exc:
            raise BadInput(f"the checkpoint is not a signed note: {exc.message}"[:300]) from None
    proof = await anyio.to_thread.run_sync(rt.journal.inclusion_proof, body.seq, body.checkpoint or None)
    return {"seq": proof.seq, "tree_size": proof.tree_size, "entry_hash": proof.entry_hash.hex(),
            "leaf_hash": proof.leaf_hash.hex(), "path": [h.hex() for h in proof.path], "root": proof.root.hex(),
            "checkpoint": proof.checkpoint}


@router.get("/journal/consistency-proof", response_model=ConsistencyOut, operation_id="internalConsistencyProof",
            summary="Prove the tree of new_size entries extends the one of old_size")
async def consistency_proof(
    old_size: int = Query(ge=1, le=2**62),
    new_size: int | None = Query(None, ge=1, le=2**62, description="default: every committed entry"),
    rt: Any = Depends(_runtime),
) -> dict[str, Any]:
    proof = await anyio.to_thread.run_sync(rt.journal.consistency_proof, old_size, new_size)
    return {"old_size": proof.old_size, "new_size": proof.new_size, "old_root": proof.old_root.hex(),
            "new_root": proof.new_root.hex(), "path": [h.hex() for h in proof.path]}


# --- the governance snapshot ----------------------------------------------------------------------


class _Generations:
    """Numbers the snapshots a server hands out: a new generation only when the content changes."""

    def __init__(self) -> None:
        self.instance = secrets.token_hex(4)  # a restarted server never repeats a generation
        self.count = 0
        self.seen: tuple[Any, Any] | None = None
        self.body: dict[str, Any] | None = None
        self.wire: tuple[str, dict[str, Any]] | None = None  # (generation, the body as GovernanceSnapshot sends it)

    def sent(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` (one this made) as the ``GovernanceSnapshot`` model sends it: checked once per generation."""
        wire = self.wire
        if wire is None or wire[0] != body["generation"]:
            wire = self.wire = (body["generation"], GovernanceSnapshot.model_validate(body).model_dump(mode="json"))
        return wire[1]

    def current(self, governance: Any) -> dict[str, Any]:
        view = governance.view()
        state = governance.policy_state()
        seen = self.seen
        if seen is not None and (seen[0] is view or seen[0] == view) and (seen[1] is state or seen[1] == state):
            self.seen = (view, state)
            assert self.body is not None
            return self.body
        from apollia_nb.governance.policy import policy_to_dict

        self.count += 1
        self.seen = (view, state)
        self.body = {
            "generation": f"{self.instance}.{self.count}",
            "rules": [{"id": r.id, "tool": r.tool, "prefix": r.prefix, "effect": r.effect.value, "agent": r.agent}
                      for r in view.rules],
            "consents": [{"agent": a, "family": f.value} for a, f in sorted(view.consents)],
            "developer_mode": view.developer_mode,
            "refusals": policy_to_dict(view.policy) if view.policy is not None else None,
            "policy": state.to_dict(),
            "readable": view.readable,
            "reason": view.unreadable_reason,
        }
        return self.body


def _generations(request: Request) -> _Generations:
    generations = getattr(request.app.state, "governance_generations", None)
    if generations is None:
        generations = request.app.state.governance_generations = _Generations()
    return generations


@router.get("/governance/snapshot", response_model=GovernanceSnapshot, operation_id="internalGovernanceSnapshot",
            summary="The governance snapshot `decide()` reads, with its generation",
            responses={304: {"description": "unchanged since the generation given in `If-None-Match`"}},
            description="Includes every change committed before the request. `ETag` is the quoted generation; "
                        "send it back in `If-None-Match` for a `304` (no body) while nothing changed.")
async def governance_snapshot(
    request: Request, response: Response,
    if_none_match: str | None = Header(None, description="the `ETag` of the snapshot the client holds"),
    rt: Any = Depends(_runtime),
) -> Any:
    body = _generations(request).current(rt.governance)
    etag = f'"{body["generation"]}"'
    if if_none_match == etag:
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return body


# --- a governed call, decided here -----------------------------------------------------------------

#: How many answered call requests the server keeps for retries (the oldest are forgotten first).
CALLS_KEPT = 16_384


class CodePlacesIn(_In):
    places: list[tuple[Annotated[str, Field(min_length=1, max_length=4096)], str,
                       Annotated[str, Field(max_length=1000)]]] = Field(max_length=10_000)
    unknown: Annotated[str, Field(max_length=1000)] = ""


class CallIn(_In):
    """One governed call of a client's run, as the client resolved it (the tool, its family, the file its
    path names, where the client runs code): decided by the server, journaled with the entries before it."""

    call_id: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description="chosen by the client, unique in its run: a retried request is answered as the first was")
    run_id: Annotated[str, Field(min_length=1, max_length=200)]
    agent: s.AgentName
    tool: s.ToolName
    family: s.FamilyName | None = Field(description="null when the tool is unclassified")
    arguments: dict[str, Any] = Field(description="in clear, in the tool's parameter order: what `decide()` reads")
    connection: Annotated[str, Field(max_length=500)] | None = None
    run_grants: list[s.FamilyName] = Field(default_factory=list, max_length=8)
    paths: list[Annotated[str, Field(max_length=4096)]] | None = Field(None, max_length=8)
    shell: StrictBool = Field(False, description="bash reads the first argument (false: no allow rule allows it)")
    aliases: list[Annotated[str, Field(max_length=10_000)]] = Field(default_factory=list, max_length=16)
    code_places: CodePlacesIn | None = None
    decision: dict[str, Any] = Field(
        description="the `decision` entry's payload as the client shows it (arguments redacted); `call_id`, "
                    "`tool`, `family`, `connection`, `outcome`, `line`, `answers` and `reason` are the server's")
    secrets: list[tuple[Annotated[str, Field(min_length=1, max_length=10_000)],
                        Annotated[str, Field(max_length=200)]]] = Field(
        default_factory=list, max_length=100,
        description="texts of the arguments the reason must not show, each with what it reads as instead")
    before: list[DraftIn] = Field(default_factory=list, max_length=MAX_APPEND - 2,
                                  description="entries committed first, in the same transaction (the model "
                                              "response that asked for the call, earlier results)")
    generation: Annotated[str, Field(max_length=100)] | None = Field(
        None, description="the snapshot's generation the client holds: the snapshot is sent when it changed")


class CallDecision(_Out):
    outcome: Literal["allow", "refuse", "ask"]
    line: int
    answers: list[str]
    reason: str
    rule_id: str | None


class CallOut(_Out):
    decision: CallDecision
    entries: list[JournalRow] = Field(description="`before`, then `decision`, then `tool_call` (allowed) or the "
                                                  "refused `tool_result` (refused): committed")
    generation: str = Field(description="the generation of the snapshot the call was decided on")
    snapshot: GovernanceSnapshot | None = Field(description="that snapshot, when the client holds another")


class _Calls:
    """The answers of recent call requests by ``(run_id, call_id)``, with the digest of their request:
    a retry (same request) gets the same answer and journals nothing; another request under a used
    id is ``CONFLICT``. Requests of one id are carried out one at a time.

    What an earlier server process answered is in the journal, not here: the first request of a run
    this process sees reads the run's journaled decisions once (``runs``), and a request whose call id
    is among them is answered from its journaled entries (``found``), never decided or journaled again.
    A run this process opened itself (its ``run_open`` came through these routes) is known whole from
    then on (``noted``): no earlier process wrote to it, so nothing is read back (a read waits for the
    journal's newest entries to be copied into ``journal.db``)."""

    def __init__(self) -> None:
        from collections import OrderedDict

        self.answers: OrderedDict[tuple[str, str], tuple[str, dict[str, Any]]] = OrderedDict()
        self.busy: dict[tuple[str, str], anyio.Event] = {}
        self.runs: OrderedDict[str, dict[str, int]] = OrderedDict()  # run → its journaled call ids (seqs)

    def noted(self, entries: Any) -> None:
        """What the client routes of this process committed (a call's group, an append): a run they open is
        known whole from its ``run_open`` on (no earlier process wrote to it, so its first call request
        reads nothing back), and a ``decision`` of a known run is noted with its call id."""
        for entry in entries:
            if entry.kind == "run_open" and entry.run_id is not None and entry.run_id not in self.runs:
                self.runs[entry.run_id] = {}
                while len(self.runs) > CALLS_KEPT:
                    self.runs.popitem(last=False)
            elif entry.kind == "decision" and entry.run_id in self.runs:
                try:
                    call_id = json.loads(bytes(entry.payload)).get("call_id")
                except (ValueError, AttributeError):
                    continue
                if isinstance(call_id, str):
                    self.runs[entry.run_id].setdefault(call_id, entry.seq)

    async def once(self, key: tuple[str, str], digest: str, make: Any, found: Any = None) -> dict[str, Any]:
        from apollia_nb.errors import Conflict

        while key in self.busy:
            await self.busy[key].wait()
        known = self.answers.get(key)
        if known is not None:
            if known[0] != digest:
                raise Conflict(f"call {key[1]} of run {key[0]} was decided already, for another request")
            return known[1]
        done = self.busy[key] = anyio.Event()
        try:
            answer = (await found()) if found is not None else None
            if answer is None:
                answer = await make()
            self.answers[key] = (digest, answer)
            while len(self.answers) > CALLS_KEPT:
                self.answers.popitem(last=False)
            return answer
        finally:
            del self.busy[key]
            done.set()


def _calls(request: Request) -> _Calls:
    calls = getattr(request.app.state, "governed_calls", None)
    if calls is None:
        calls = request.app.state.governed_calls = _Calls()
    return calls


def _decided_call(body: CallIn, view: Any) -> tuple[Any, dict[str, Any]]:
    """The server's decision of the call on ``view``, and the ``decision`` entry's payload."""
    from apollia_nb.errors import BadInput
    from apollia_nb.governance.code_places import CodePlaces
    from apollia_nb.governance.decision import Call, decide
    from apollia_nb.runtime.builtins import BUILTIN_FAMILIES
    from apollia_nb.runtime.outputs import redact

    builtin = BUILTIN_FAMILIES.get(body.tool) if body.connection is None else None
    if builtin is not None and (body.family != builtin.value or body.shell != (body.tool == "bash_executor")):
        # A built-in tool is what the server knows it to be: its family, and whether bash reads its first argument.
        raise BadInput(f"{body.tool} is the built-in tool of family {builtin.value}: it is decided as such")
    try:
        places = (CodePlaces.of([tuple(p) for p in body.code_places.places], body.code_places.unknown)  # type: ignore[misc]  # the schema makes each a triple
                  if body.code_places is not None else None)
        call = Call(agent=body.agent, tool=body.tool, family=body.family, arguments=body.arguments,  # type: ignore[arg-type]  # Family is a str enum
                    connection=body.connection, run_grants=frozenset(body.run_grants),  # type: ignore[arg-type]  # as above
                    paths=tuple(body.paths) if body.paths is not None else None, shell=body.shell,
                    aliases=tuple(body.aliases), code_places=places)
    except (ValueError, TypeError) as exc:
        raise BadInput(f"the call cannot be decided: {exc}"[:300]) from None
    decision = decide(call, view)
    reason = redact(decision.reason, dict(body.secrets)) if body.secrets else decision.reason
    payload = {**body.decision, "call_id": body.call_id, "tool": body.tool, "family": body.family,
               "connection": body.connection, "outcome": decision.outcome.value, "line": decision.line,
               "answers": [a.value for a in decision.answers], "reason": reason}
    return decision, payload


@router.post("/calls", response_model=CallOut, operation_id="internalGovernedCall",
             summary="Decide a client's governed call and journal it (one request a call)",
             responses=_errors(409, 413, 422),
             description="`decide()` on the server's current snapshot; then, in one transaction, `before`, the "
                         "`decision` and — allowed — the `tool_call`, or — refused — the `tool_result` with status "
                         "`refused`; committed when this answers. The client runs the tool only when allowed. A "
                         "retry of the same request (same `run_id` and `call_id`, same body) answers as the first "
                         "did and journals nothing; another body under a used `call_id` is 409 `CONFLICT`. A person's "
                         "token: only for a run that person opened, its `before` entries as its appends are "
                         "(403 `FORBIDDEN` otherwise).")
async def governed_call(body: CallIn, request: Request, rt: Any = Depends(_runtime)) -> Any:
    import hashlib

    from apollia_nb.journal.entry import canonical_json
    from apollia_nb.journal.store import Draft

    digest = hashlib.sha256(canonical_json(body.model_dump(mode="json"))).hexdigest()
    person = _person(request)
    if person is not None:  # a person's client: a call of a run it opened, carrying only that run's activity
        await _own_run(request, rt, person, body.run_id)
        await _persons_drafts(request, rt, person, body.before, before_call=True)

    async def make() -> dict[str, Any]:
        from apollia_nb.governance.decision import Outcome
        from apollia_nb.runtime.governed import NULL_DIGEST

        generations = _generations(request)
        snapshot = generations.current(rt.governance)
        assert generations.seen is not None
        decision, payload = _decided_call(body, generations.seen[0])  # the very snapshot it names
        drafts = [Draft(d.kind, d.payload, d.run_id, d.agent) for d in body.before]
        drafts.append(Draft("decision", payload, body.run_id, body.agent))
        if decision.outcome is Outcome.ALLOW:
            drafts.append(Draft("tool_call", {"call_id": body.call_id, "tool": body.tool,
                                              "arguments": payload.get("arguments")}, body.run_id, body.agent))
        elif decision.outcome is Outcome.REFUSE:
            drafts.append(Draft("tool_result", {"call_id": body.call_id, "tool": body.tool, "status": "refused",
                                                "error_code": "REFUSED", "output": None,
                                                "output_digest": NULL_DIGEST}, body.run_id, body.agent))
        entries = await rt.journal.append_many_async(drafts)
        _calls(request).noted(entries)
        faults.point("calls.after_commit")
        return {"decision": {"outcome": decision.outcome.value, "line": decision.line,
                             "answers": [a.value for a in decision.answers], "reason": payload["reason"],
                             "rule_id": decision.rule_id},
                "entries": [_row(e) for e in entries], "generation": snapshot["generation"],
                "snapshot": snapshot}

    async def found() -> dict[str, Any] | None:
        """The call as an earlier process of this server journaled it (see ``_Calls``)."""
        from apollia_nb.api.idempotency import journaled_call, journaled_calls
        from apollia_nb.errors import Conflict

        calls = _calls(request)
        if body.run_id not in calls.runs:
            calls.runs[body.run_id] = await anyio.to_thread.run_sync(journaled_calls, rt.journal, body.run_id)
            while len(calls.runs) > CALLS_KEPT:
                calls.runs.popitem(last=False)
        seq = calls.runs[body.run_id].get(body.call_id)
        if seq is None:
            return None
        before = [(d.kind, d.payload, d.run_id, d.agent) for d in body.before]
        entries = await anyio.to_thread.run_sync(journaled_call, rt.journal, seq, before, body.model_dump(mode="json"))
        if entries is None:
            raise Conflict(f"call {body.call_id} of run {body.run_id} was decided already, for another request")
        decided = json.loads(entries[len(before)].payload)
        snapshot = _generations(request).current(rt.governance)
        return {"decision": {"outcome": decided["outcome"], "line": decided["line"], "answers": decided["answers"],
                             "reason": decided["reason"], "rule_id": decided.get("rule_id")},
                "entries": [_row(e) for e in entries], "generation": snapshot["generation"], "snapshot": snapshot}

    answer = await _calls(request).once((body.run_id, body.call_id), digest, make, found)
    snapshot = answer["snapshot"]
    # Built here to CallOut from values the server made; the snapshot checked once per generation.
    answer = {**answer, "snapshot": None if body.generation == answer["generation"] or snapshot is None
              else _generations(request).sent(snapshot)}
    return _json(answer)


# --- pending decisions ----------------------------------------------------------------------------


@router.post("/pending-decisions", status_code=201, response_model=s.PendingDecision,
             operation_id="internalAddPending", summary="List a call waiting for a person",
             responses=_errors(413, 422),
             description="The runtime that asks journals the decision itself, before it lists it here. A "
                         "person's token: only for a run that person opened, under the task its `run_open` "
                         "names (403 `FORBIDDEN` otherwise).")
async def add_pending(body: PendingIn, request: Request, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    person = _person(request)
    if person is not None:  # a person's client lists decisions of the runs it opened, under their own task
        _, task = await _own_run(request, rt, person, body.run_id)
        if body.task_id is not None and body.task_id != task:
            raise _not_yours(person, f"lists decisions of run {body.run_id} under its own task ({task}), "
                                     f"not {body.task_id}")
    # the store's write (a DuckDB transaction, synced) in a worker thread: the event loop serves meanwhile
    pending = await anyio.to_thread.run_sync(lambda: rt.governance.add_pending(
        run_id=body.run_id, task_id=body.task_id, agent=body.agent, tool=body.tool, family=body.family,
        arguments=body.arguments, answers=list(body.answers), reason=body.reason, line=body.line,
        call_id=body.call_id,
    ))
    return pending.to_dict()


async def _worker_scope(request: Request) -> Any:
    return scope_of(request)


@router.get("/pending-decisions", response_model=list[s.PendingDecision], operation_id="internalListPending",
            summary="Decisions by status (and run), oldest first",
            description="A `runner` who is neither `approver` nor `auditor` gets the decisions of the runs they "
                        "opened only.")
async def list_pending(
    request: Request,
    status: Literal["pending", "answered", "expired", "all"] = Query("pending"),
    run_id: str | None = Query(None, max_length=200, description="only this run's decisions"),
    rt: Any = Depends(_runtime),
    scope: Any = Depends(_worker_scope),
) -> list[dict[str, Any]]:
    chosen = None if status == "all" else status  # a worker credential: its batch's decisions only
    found = [p for p in rt.governance.pending(chosen, run_id=run_id)
             if scope is None or (p.agent == scope.agent and scope.owns_task(p.task_id))]  # a worker's: its batch's
    person = _person(request)
    if person is not None and not _reads_every_decision(person):  # a runner's client: the runs they opened
        starters = _starters(request)
        found = [p for p in found if ((await starters.of(rt, p.run_id)) or (None,))[0] == person.name]
    return [p.to_dict() for p in found]


def _reads_every_decision(person: Any) -> bool:
    return bool(person.has("approver") or person.has("auditor"))


@router.get("/pending-decisions/{decision_id}", response_model=s.PendingDecision,
            operation_id="internalGetPending", summary="One decision, answered or not", responses=_errors(404))
async def get_pending(decision_id: str, request: Request, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    decision = rt.governance.get_pending(decision_id)
    person = _person(request)
    if person is not None and not _reads_every_decision(person):
        await _own_run(request, rt, person, decision.run_id)
    return decision.to_dict()


def _settled(rt: Any, ids: set[str]) -> list[dict[str, Any]]:
    """Those of ``ids`` no longer pending (``UNKNOWN_DECISION`` for an id nobody knows)."""
    out = []
    for decision_id in sorted(ids):
        decision = rt.governance.get_pending(decision_id)
        if decision.status != "pending":
            out.append({**decision.to_dict(), **_answer_terms(rt, decision)})
    return out


def _answer_terms(rt: Any, decision: Any) -> dict[str, Any]:
    """The end of the approval a decision was answered with (``expires_at``), as its ``answer`` entry
    journals it: the client whose call it is refuses the call after it (``governance/approvals.py``)."""
    for entry in reversed(rt.journal.entries(run_id=decision.run_id, kinds=["answer"])):
        payload = entry.payload
        payload = json.loads(payload) if isinstance(payload, (str, bytes)) else dict(payload)
        if payload.get("decision_id") == decision.id:
            return {"expires_at": payload["expires_at"]} if payload.get("expires_at") else {}
    return {}


@router.get("/answers", response_model=list[s.PendingDecision], operation_id="internalAwaitAnswers",
            summary="Wait until any of these decisions is answered (long poll)", responses=_errors(404),
            description="Answers at once with those of `ids` that are answered or expired; else as soon as one "
                        "is, or with `[]` when `timeout` seconds pass or the server shuts down. 404 "
                        "`UNKNOWN_DECISION` names an id nobody knows. A person's token waits only for the "
                        "decisions of the runs that person opened (403 `FORBIDDEN` otherwise).")
async def await_answers(
    request: Request,
    # At most 200 ids of at most 64 URL-safe characters: the request line stays within what
    # the HTTP server reads (h11: 16 KiB), so no request is refused before it reaches the API.
    ids: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = Query(
        ..., min_length=1, max_length=200, description="decision ids"),
    timeout: float = Query(20.0, ge=0, le=60, description="seconds to wait at most"),
    rt: Any = Depends(_runtime),
) -> list[dict[str, Any]]:
    wanted = set(ids)
    person = _person(request)
    if person is not None:  # a person's client waits for the answers of the runs it opened
        from apollia_nb.errors import UnknownDecision

        for decision_id in sorted(wanted):
            try:
                decision = rt.governance.get_pending(decision_id)
            except UnknownDecision:
                continue  # answered 404 below
            await _own_run(request, rt, person, decision.run_id)
    journal = rt.journal
    seen = journal.head()[0]
    done = _settled(rt, wanted)
    if done:
        return done
    closing: anyio.Event = request.app.state.closing
    hinted: set[str] = set()
    with anyio.move_on_after(timeout):
        while not closing.is_set():
            # Every answer is journaled (kind ``answer``) by the server's runtime before it is stored,
            # so a decision is read again only when an answer to it has been appended.
            with anyio.move_on_after(ANSWER_TICK_SECS):
                await closing.wait()
            head = journal.head()[0]
            if head != seen:
                for entry in journal.entries(since_seq=seen, kinds=["answer"]):
                    decision_id = entry.data().get("decision_id")
                    if decision_id in wanted:
                        hinted.add(decision_id)
                seen = head
            if hinted:
                done = _settled(rt, hinted)
                if done:
                    return done
    return []


# --- an agent registered in a client --------------------------------------------------------------


@router.post("/agents/identity", response_model=IdentityOut, operation_id="internalReviewAgentIdentity",
             summary="Review what an agent's standing consents are given for", responses=_errors(409, 413, 503),
             description="A client registering an agent: the server's review of its tools, resolved workspace "
                         "and model against what its standing consents were given for (409 `CONSENTS_TO_REVIEW` "
                         "when they widen it and `keep_consents` is null; 409 `CONFLICT` when the server runs "
                         "an agent of that name with another identity). The identity is recorded and journaled.")
async def review_agent_identity(body: IdentityIn, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.review_identity(body.agent, body.identity.model_dump(), keep=body.keep_consents)


# --- governance changes with their author ---------------------------------------------------------


@router.post("/governance/consents", status_code=201, response_model=s.Consent,
             operation_id="internalGrantConsent", summary="Grant a standing consent", responses=_errors(413, 422),
             description="Journaled `consent_granted` before it takes effect; an existing consent is returned as is.")
async def grant_consent(body: ConsentIn, request: Request, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.governance.grant_consent(body.agent, body.family, by=acting(request, body.by), until=body.until,
                                       card=body.card).to_dict()


@router.post("/governance/consents/revoke", response_model=s.Consent, operation_id="internalRevokeConsent",
             summary="Revoke a standing consent", responses=_errors(404, 413, 422))
async def revoke_consent(body: RevokeIn, request: Request, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.governance.revoke_consent(body.agent, body.family, by=acting(request, body.by)).to_dict()


@router.post("/governance/rules/remove", response_model=s.Rule, operation_id="internalRemoveRule",
             summary="Remove a fine rule", responses=_errors(404, 413, 422))
async def remove_rule(body: RuleRemoveIn, request: Request, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.governance.remove_rule(body.id, by=acting(request, body.by)).to_dict()


# --- worker credentials ---------------------------------------------------------------------------


class WorkerIdentity(_In):
    tools: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(max_length=10_000)
    model: dict[str, Any]


class WorkerTokenIn(_In):
    agent: s.AgentName
    batch_id: Annotated[str, Field(pattern=r"^batch-[0-9a-f]{1,64}$")]
    tasks: Annotated[int, BeforeValidator(_not_bool)] = Field(ge=0, le=1_000_000,
                                                             description="how many items the batch has")
    identity: WorkerIdentity | None = Field(
        None, description="the agent's tools and model on the workers: the only identity the credential may "
                          "have the server review (null: none)")


class WorkerTokenOut(_Out):
    token: str = Field(description="the credential; it opens only what the batch's items need")
    agent: str
    batch_id: str
    tasks: int


class WorkerTokenRevokeIn(_In):
    token: Annotated[str, Field(min_length=1, max_length=200)]


@router.post("/worker-tokens", status_code=201, response_model=WorkerTokenOut, operation_id="internalWorkerToken",
             summary="A credential for the items of one Dask batch",
             description="Opens only the internal routes a batch's item uses, for its agent and the tasks "
                         "`task-<the batch's hex>-<index>`; every other route answers 401 `UNAUTHORIZED` to "
                         "it. Held in memory: revoked when the batch ends, or when the server stops.")
async def issue_worker_token(body: WorkerTokenIn, request: Request) -> dict[str, Any]:
    identity = body.identity.model_dump() if body.identity is not None else None
    token, scope = tokens_of(request).issue(body.agent, body.batch_id, body.tasks, identity)
    person = _person(request)
    if person is not None:  # its items' runs are that person's (``started_by``), as their own runs are
        _batch_issuers(request)[id(scope)] = person.name
    return {"token": token, **scope.to_dict()}


def _started_by(payload: dict[str, Any], person: str | None) -> dict[str, Any]:
    """A ``run_open``'s payload naming ``person`` as who started the run, never what the client wrote there."""
    kept = {k: v for k, v in payload.items() if k != "started_by"}
    return {**kept, "started_by": person} if person is not None else kept


def _batch_issuers(request: Request) -> dict[int, str]:
    """Who asked for each live worker credential (by its scope, held by ``tokens_of``): a person (the owner's
    token names nobody)."""
    issuers = getattr(request.app.state, "batch_issuers", None)
    if issuers is None:
        issuers = request.app.state.batch_issuers = {}
    return issuers


@router.post("/worker-tokens/revoke", status_code=204, operation_id="internalRevokeWorkerToken",
             summary="End a batch's worker credential (done or not: 204)")
async def revoke_worker_token(body: WorkerTokenRevokeIn, request: Request) -> Response:
    scope = tokens_of(request).scope(body.token)
    if tokens_of(request).revoke(body.token) and scope is not None:
        _batch_issuers(request).pop(id(scope), None)
    return Response(status_code=204)
