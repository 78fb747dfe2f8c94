"""The journal's commit path as data: events in, actions out, no I/O, no clock, no threads.

A commit goes queue → group → sequence (hash, sign) → durable record (one record of
``journal.log``, one ``fdatasync``) → acknowledge → copy into ``journal.db`` → frontier.
Two roles play it, each with a state of its own, as the client and the server of an
HTTP connection do in h11 (``h11/_state.py``): the **writer**, which groups requests,
writes their record and acknowledges them, and the **copier**, which copies acknowledged
entries into ``journal.db``. :class:`CommitCore` holds both states and the seqs that say
how far each step has come; :meth:`CommitCore.handle` takes one event and returns the
actions the shell (``store.Journal``: its threads, ``journal.log``, DuckDB) carries out,
then tells the core how they went with the next event.

Every move is in one of two tables, :data:`WRITER_TRANSITIONS` and
:data:`COPIER_TRANSITIONS` (``state → {trigger: next state}``); an event names its trigger
(``Seal`` is ``seal`` when the record fits in the log, ``seal_full`` when it does not). A
trigger the table has no move for raises :class:`~apollia_nb.errors.InvalidTransition` and
changes nothing. ``dev/docs/make_journal_commit_table.py`` prints the tables into
``docs/journal.md``.

The seqs, in the order they advance (each at most the one before it):
``sequenced`` ≥ ``acknowledged`` (= the head: durable in the log and returned to its
appenders) ≥ ``copied`` (held by ``journal.db``, its frontier with it). What a crash
leaves at each step, and what the next open does about it, is :func:`crash` over
:data:`CRASH_POINTS` (the fault points of ``apollia_nb/faults.py`` and ``dbutil``'s storage
faults, at the same places).

Events and actions are values made for one step and dropped (slotted dataclasses compared by
class and fields; not frozen: a frozen one costs five times as much to make, and the writer
makes several per commit).

The shell keeps what is not protocol: the rows themselves, the futures of the appenders,
the locks, the log file and the DuckDB connection. Times are given to the core as numbers
(``now``, monotonic seconds) and never read by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Callable, Mapping, Union

from apollia_nb.errors import InvalidTransition

__all__ = [
    "WriterState",
    "CopierState",
    "Sequenced",
    "Seal",
    "Drained",
    "LogSynced",
    "LogFailed",
    "Close",
    "CopyStart",
    "Copied",
    "CopyRefused",
    "CopyBroke",
    "Stop",
    "JobQueued",
    "JobTaken",
    "Hurry",
    "Event",
    "WriteLog",
    "AwaitCopy",
    "ResetLog",
    "Acknowledge",
    "FailGroup",
    "WakeCopier",
    "CopyRows",
    "ReleaseWaiters",
    "Action",
    "WRITER_TRANSITIONS",
    "COPIER_TRANSITIONS",
    "TRIGGERS",
    "CRASH_POINTS",
    "CrashOutcome",
    "CommitCore",
    "crash",
    "IMPORT_BATCH",
    "IMPORT_IDLE_SECS",
    "IMPORT_RETRY_SECS",
]

#: Entries the log holds before the copier copies them into ``journal.db``. A copy's cost is
#: mostly per statement (measured: 512 entries 230 µs each, 2,048 entries 75 µs each), and the
#: copier makes it while the writer goes on committing, so batches are large.
IMPORT_BATCH = 2048
#: Idle time after which the copier copies what the log holds.
IMPORT_IDLE_SECS = 0.1
#: After ``journal.db`` refused a copy (a full disk), the copier tries again this often.
IMPORT_RETRY_SECS = 0.5


class WriterState(StrEnum):
    """Where the writer's current group stands."""

    IDLE = "idle"  # no group open: everything sequenced is acknowledged or failed
    GROUPING = "grouping"  # requests sequenced (hashed, signed) onto a group, its record not written
    DRAINING = "draining"  # the record does not fit in the log: waits for journal.db to hold all of it
    LOGGING = "logging"  # the record is being written and synced: durable or not, nobody told yet
    CLOSED = "closed"  # closed: takes nothing more


class CopierState(StrEnum):
    """Where the copier stands."""

    IDLE = "idle"  # nothing being copied
    COPYING = "copying"  # acknowledged entries being copied into journal.db (in pieces)
    RETRYING = "retrying"  # journal.db refused the last copy (the disk): tried again later
    BROKEN = "broken"  # journal.db refused it for another reason: copies nothing more
    STOPPED = "stopped"  # closed


# ---------------------------------------------------------------------- events
@dataclass(slots=True)
class Sequenced:
    """The writer numbered one request's ``count`` entries onto its group (hashed and signed
    them, starting at ``first``); ``waiting``: an appender waits for them (not ``append_soon``)."""

    first: int
    count: int
    waiting: bool = True


@dataclass(slots=True)
class Seal:
    """The group takes nothing more; ``fits``: the log has room for its record."""

    fits: bool


@dataclass(slots=True)
class Drained:
    """``journal.db`` holds every acknowledged entry: the log may start over."""


@dataclass(slots=True)
class LogSynced:
    """The group's record is written and synced (``fdatasync`` returned) at ``now``;
    ``half_full``: the log is half used or more."""

    now: float
    half_full: bool = False


@dataclass(slots=True)
class LogFailed:
    """The group's record could not be made durable (or the journal refuses appends): none of it
    counts; its seqs are given again."""


@dataclass(slots=True)
class Close:
    """The writer has taken every request queued before close."""


@dataclass(slots=True)
class CopyStart:
    """The copier takes every acknowledged entry ``journal.db`` lacks (it does when
    :meth:`CommitCore.copy_due` says so, or when somebody waits)."""


@dataclass(slots=True)
class Copied:
    """``journal.db`` holds every entry up to ``last`` (with the frontier they end at)."""

    last: int


@dataclass(slots=True)
class CopyRefused:
    """The disk refused the copy (full, read-only, I/O error); tried again at ``retry_at``. The
    entries stay in the log; a piece committed before the refusal is counted by ``stored``."""

    retry_at: float
    stored: int = 0


@dataclass(slots=True)
class CopyBroke:
    """``journal.db`` refused the copy for another reason (it holds rows the journal did not write)."""


@dataclass(slots=True)
class Stop:
    """The copier stops (close); the jobs it has not run are the shell's to refuse."""


@dataclass(slots=True)
class JobQueued:
    """A write to ``journal.db`` other than a copy (a checkpoint's store, a cosignature) is queued for
    the copier; ``lazy``: held back (a run's closing checkpoint) until the journal is idle or somebody
    waits for it — only behind jobs held back too, so no job waits behind one that is."""

    lazy: bool = False


@dataclass(slots=True)
class JobTaken:
    """The copier takes the first queued job (it runs it whatever its state: IDLE, RETRYING or BROKEN)."""


@dataclass(slots=True)
class Hurry:
    """Somebody waits for a held-back job (or for a copy, which runs the jobs queued before it)."""


Event = Union[Sequenced, Seal, Drained, LogSynced, LogFailed, Close, CopyStart, Copied, CopyRefused, CopyBroke, Stop,
              JobQueued, JobTaken, Hurry]


# ---------------------------------------------------------------------- actions
@dataclass(slots=True)
class WriteLog:
    """Write entries ``first..last`` as one record of the log and ``fdatasync`` it; then send
    ``LogSynced`` (or ``LogFailed``)."""

    first: int
    last: int


@dataclass(slots=True)
class AwaitCopy:
    """Wait until ``journal.db`` holds every entry up to ``upto``; then send ``Drained`` (or ``LogFailed``)."""

    upto: int


@dataclass(slots=True)
class ResetLog:
    """Start the log over (everything in it is in ``journal.db``), with room for the next record."""


@dataclass(slots=True)
class Acknowledge:
    """Entries ``first..last`` are durable: resolve their appenders' futures. ``crowded``: more than one
    appender waited for this commit (while that holds, appenders queue rather than lead a commit)."""

    first: int
    last: int
    crowded: bool


@dataclass(slots=True)
class FailGroup:
    """Fail the requests of ``first..last``: nothing of them counts (their seqs are given again)."""

    first: int
    last: int


@dataclass(slots=True)
class WakeCopier:
    """Wake the copier: a copy may be due, or ``journal.db`` is wanted up to a seq."""


@dataclass(slots=True)
class CopyRows:
    """Copy entries ``first..last`` (acknowledged, in the log) into ``journal.db`` with their frontier."""

    first: int
    last: int


@dataclass(slots=True)
class ReleaseWaiters:
    """Wake whoever waits on the copier (a read, a drain, close)."""


Action = Union[WriteLog, AwaitCopy, ResetLog, Acknowledge, FailGroup, WakeCopier, CopyRows, ReleaseWaiters]


# ---------------------------------------------------------------------- the tables
W, C = WriterState, CopierState

#: The writer's moves: ``state → {trigger: next state}``.
WRITER_TRANSITIONS: Mapping[WriterState, Mapping[str, WriterState]] = MappingProxyType({
    W.IDLE: MappingProxyType({"sequenced": W.GROUPING, "close": W.CLOSED}),
    W.GROUPING: MappingProxyType({"sequenced": W.GROUPING, "seal": W.LOGGING, "seal_full": W.DRAINING,
                                  "log_failed": W.IDLE}),
    W.DRAINING: MappingProxyType({"drained": W.LOGGING, "log_failed": W.IDLE}),
    W.LOGGING: MappingProxyType({"log_synced": W.IDLE, "log_failed": W.IDLE}),
    W.CLOSED: MappingProxyType({}),
})

#: The copier's moves: ``state → {trigger: next state}``.
COPIER_TRANSITIONS: Mapping[CopierState, Mapping[str, CopierState]] = MappingProxyType({
    C.IDLE: MappingProxyType({"copy_start": C.COPYING, "stop": C.STOPPED}),
    C.COPYING: MappingProxyType({"copied": C.IDLE, "copy_refused": C.RETRYING, "copy_broke": C.BROKEN}),
    C.RETRYING: MappingProxyType({"copy_start": C.COPYING, "stop": C.STOPPED}),
    C.BROKEN: MappingProxyType({"stop": C.STOPPED}),
    C.STOPPED: MappingProxyType({}),
})

#: Which role each event belongs to, and the triggers it can name (documented beside the tables).
TRIGGERS: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType({
    "Sequenced": ("writer", ("sequenced",)),
    "Seal": ("writer", ("seal", "seal_full")),
    "Drained": ("writer", ("drained",)),
    "LogSynced": ("writer", ("log_synced",)),
    "LogFailed": ("writer", ("log_failed",)),
    "Close": ("writer", ("close",)),
    "CopyStart": ("copier", ("copy_start",)),
    "Copied": ("copier", ("copied",)),
    "CopyRefused": ("copier", ("copy_refused",)),
    "CopyBroke": ("copier", ("copy_broke",)),
    "Stop": ("copier", ("stop",)),
})


def _moves(table: Mapping[Any, Mapping[str, Any]]) -> dict[Any, dict[str, tuple[Any, Any]]]:
    """The table as the core walks it: each state's moves by trigger, each to its target and the
    target's own moves (so a move hashes a trigger string, never a state: an enum's hash is
    Python code, and the writer moves several times per commit)."""
    moves: dict[Any, dict[str, tuple[Any, Any]]] = {state: {} for state in table}
    for state, row in table.items():
        for trigger, target in row.items():
            moves[state][trigger] = (target, moves[target])
    return moves


_WRITER_MOVES = _moves(WRITER_TRANSITIONS)
_COPIER_MOVES = _moves(COPIER_TRANSITIONS)


def _refuse(role: str, state: str, trigger: str) -> InvalidTransition:
    return InvalidTransition(f"the journal's {role} cannot take '{trigger}' while {state}")


# ---------------------------------------------------------------------- the core
class CommitCore:
    """The state of one journal's commit path; ``handle(event)`` → actions. Not thread-safe: the
    shell calls it holding the lock that orders its writer and copier (``store.Journal._state_lock``),
    or from the one thread that owns the role's half (the writer's group: ``_commit_lock``)."""

    __slots__ = ("writer", "copier", "sequenced", "group_first", "waiting", "acknowledged", "copied",
                 "copying", "wanted", "early_copy", "last_commit", "retry_at", "crowded",
                 "transactions", "largest_batch", "copies", "attempts", "failed_attempt", "batch", "idle", "jobs", "held", "_wm", "_cm")

    def __init__(self, head: int = 0, *, batch: int = IMPORT_BATCH, idle: float = IMPORT_IDLE_SECS) -> None:
        self.batch = batch  # entries pending that make a copy due (``IMPORT_BATCH``)
        self.idle = idle  # seconds without a commit that make a copy due (``IMPORT_IDLE_SECS``)
        self.writer = WriterState.IDLE
        self.copier = CopierState.IDLE
        self._wm = _WRITER_MOVES[WriterState.IDLE]  # the writer's moves from where it is
        self._cm = _COPIER_MOVES[CopierState.IDLE]
        self.sequenced = head  # highest seq given (in the open group, or acknowledged)
        self.group_first = head + 1  # first seq of the open group
        self.waiting = 0  # appenders waiting on the open group
        self.acknowledged = head  # the head: durable in the log, its appenders told
        self.copied = head  # journal.db holds every entry up to this
        self.copying = head  # the last seq of the copy under way (== copied when none)
        self.wanted = 0  # a seq somebody waits for journal.db to hold: copied at once
        self.early_copy = False  # a copy was asked for since the log is half full
        self.last_commit = 0.0  # monotonic time of the last acknowledged commit
        self.retry_at = 0.0  # no copy before this after a refused one
        self.crowded = False  # the last group served more than one waiting appender
        self.transactions = 0
        self.largest_batch = 0
        self.copies = 0  # copies that succeeded
        self.attempts = 0  # copies started
        self.failed_attempt = 0  # the last copy that failed (a waiter that asked before it raises its error)
        self.jobs = 0  # jobs queued for the copier (run before its next copy)
        self.held = 0  # how many of them, from the front, are held back

    # -- questions (pure)
    @property
    def pending(self) -> int:
        """Acknowledged entries ``journal.db`` does not hold yet (they are in the log)."""
        return self.acknowledged - self.copied

    def copy_due(self, now: float) -> bool:
        """Whether the copier copies now: somebody waits for a seq it lacks, or (unless a refused
        copy is not due again) ``IMPORT_BATCH`` entries wait, or no commit came for ``IMPORT_IDLE_SECS``."""
        copier = self.copier
        if not (copier is CopierState.IDLE or copier is CopierState.RETRYING) or not self.pending:
            return False
        if self.wanted > self.copied:
            return True
        if now < self.retry_at:
            return False
        return self.pending >= self.batch or now - self.last_commit >= self.idle

    def jobs_due(self, now: float) -> bool:
        """Whether the copier runs its jobs now: at once, unless all are held back and the journal was
        committed to within ``idle`` seconds."""
        if not self.jobs:
            return False
        return self.jobs > self.held or now - self.last_commit >= self.idle

    def copy_wait(self, now: float) -> float | None:
        """How long the copier sleeps before it looks again (None: until woken)."""
        if self.jobs:  # held back: they run once the journal is idle
            return max(0.001, self.last_commit + self.idle - now)
        copier = self.copier
        if not (copier is CopierState.IDLE or copier is CopierState.RETRYING) or not self.pending:
            return None
        due = max(self.retry_at, self.last_commit + self.idle)
        return max(0.001, due - now)

    def want(self, seq: int) -> bool:
        """Somebody waits for ``journal.db`` to hold ``seq``; True when the copier must be woken."""
        if self.wanted < seq:
            self.wanted = seq
            return True
        return False

    # -- moves
    def _writer_to(self, trigger: str) -> None:
        try:
            self.writer, self._wm = self._wm[trigger]  # WRITER_TRANSITIONS[self.writer][trigger]
        except KeyError:
            raise _refuse("writer", self.writer, trigger) from None

    def _copier_to(self, trigger: str) -> None:
        try:
            self.copier, self._cm = self._cm[trigger]  # COPIER_TRANSITIONS[self.copier][trigger]
        except KeyError:
            raise _refuse("copier", self.copier, trigger) from None

    def handle(self, event: Event) -> list[Action]:
        """Take one event; return what the shell does next. An illegal move raises
        ``InvalidTransition`` and changes nothing."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise InvalidTransition(f"the journal's commit path has no event {type(event).__name__}")
        return handler(self, event)

    # writer
    def _sequenced(self, event: Sequenced) -> list[Action]:
        if event.first != self.sequenced + 1 or event.count < 1:
            raise InvalidTransition(
                f"entries sequenced from {event.first} ({event.count}) do not follow seq {self.sequenced}")
        if self.writer is WriterState.IDLE:
            self._writer_to("sequenced")
            self.group_first, self.waiting = event.first, 0
        else:
            self._writer_to("sequenced")
        self.sequenced += event.count
        self.waiting += event.waiting
        return []

    def first_free(self) -> int:
        """The seq the next sequenced entry takes."""
        return self.sequenced + 1

    def _seal(self, event: Seal) -> list[Action]:
        self._writer_to("seal" if event.fits else "seal_full")
        self.crowded = self.waiting > 1
        if event.fits:
            return [WriteLog(self.group_first, self.sequenced)]
        return [AwaitCopy(self.acknowledged)]

    def _drained(self, event: Drained) -> list[Action]:
        if self.copied < self.acknowledged:
            raise InvalidTransition(f"journal.db holds {self.copied} of the {self.acknowledged} acknowledged "
                                    "entries: the log cannot start over")
        self._writer_to("drained")
        self.early_copy = False
        return [ResetLog(), WriteLog(self.group_first, self.sequenced)]

    def _log_synced(self, event: LogSynced) -> list[Action]:
        self._writer_to("log_synced")
        first, last = self.group_first, self.sequenced
        before = self.pending
        self.acknowledged = last
        self.group_first = last + 1
        self.transactions += 1
        self.largest_batch = max(self.largest_batch, last - first + 1)
        self.last_commit = event.now
        actions: list[Action] = [Acknowledge(first, last, self.crowded)]
        if not self.early_copy and event.half_full:
            # Half the log is used: have everything copied now, so that when it is full and
            # starts over, journal.db already holds what it has (no wait then).
            self.early_copy = True
            self.wanted = max(self.wanted, last)
            actions.insert(0, WakeCopier())
        elif before == 0 or before < self.batch <= self.pending:
            actions.insert(0, WakeCopier())  # the copier starts its idle wait, or copies a full batch
        return actions

    def _log_failed(self, event: LogFailed) -> list[Action]:
        self._writer_to("log_failed")
        first, last = self.group_first, self.sequenced
        self.sequenced = self.acknowledged
        self.group_first = self.acknowledged + 1
        return [FailGroup(first, last)]

    def _close(self, event: Close) -> list[Action]:
        self._writer_to("close")
        return []

    # copier
    def _copy_start(self, event: CopyStart) -> list[Action]:
        if not self.pending:
            raise InvalidTransition("the copier has nothing to copy: journal.db holds every acknowledged entry")
        self._copier_to("copy_start")
        self.copying = self.acknowledged
        self.attempts += 1
        return [CopyRows(self.copied + 1, self.copying)]

    def _copied(self, event: Copied) -> list[Action]:
        if event.last != self.copying:
            raise InvalidTransition(f"the copy under way ends at {self.copying}, not {event.last}")
        self._copier_to("copied")
        self.copied = event.last
        self.copies += 1
        return [ReleaseWaiters()]

    def _copy_refused(self, event: CopyRefused) -> list[Action]:
        if event.stored and not self.copied <= event.stored <= self.copying:
            raise InvalidTransition(f"a refused copy of {self.copied + 1}..{self.copying} cannot have stored "
                                    f"up to {event.stored}")
        self._copier_to("copy_refused")
        self.copied = max(self.copied, event.stored)
        self.copying = self.copied
        self.retry_at = event.retry_at
        self.failed_attempt = self.attempts
        self.wanted = 0  # the next waiter asks again
        return [ReleaseWaiters()]

    def _copy_broke(self, event: CopyBroke) -> list[Action]:
        self._copier_to("copy_broke")
        self.copying = self.copied
        self.failed_attempt = self.attempts
        self.wanted = 0
        return [ReleaseWaiters()]

    def _stop(self, event: Stop) -> list[Action]:
        self._copier_to("stop")
        self.jobs = self.held = 0
        return [ReleaseWaiters()]

    # the copier's jobs: counted, not states (it runs them in whatever state it is)
    def _job_queued(self, event: JobQueued) -> list[Action]:
        if self.copier is CopierState.STOPPED:
            raise _refuse("copier", self.copier, "job_queued")
        if event.lazy and self.jobs == self.held:  # held back only behind held-back jobs
            self.held += 1
        self.jobs += 1
        return [WakeCopier()]

    def _job_taken(self, event: JobTaken) -> list[Action]:
        if not self.jobs:
            raise InvalidTransition("the copier has no job to take")
        self.jobs -= 1
        self.held = max(0, self.held - 1)
        return []

    def _hurry(self, event: Hurry) -> list[Action]:
        if not self.held:
            return []
        self.held = 0
        return [WakeCopier()]


_HANDLERS: dict[type, Callable[[CommitCore, Any], list[Action]]] = {
    Sequenced: CommitCore._sequenced,
    Seal: CommitCore._seal,
    Drained: CommitCore._drained,
    LogSynced: CommitCore._log_synced,
    LogFailed: CommitCore._log_failed,
    Close: CommitCore._close,
    CopyStart: CommitCore._copy_start,
    Copied: CommitCore._copied,
    CopyRefused: CommitCore._copy_refused,
    CopyBroke: CommitCore._copy_broke,
    Stop: CommitCore._stop,
    JobQueued: CommitCore._job_queued,
    JobTaken: CommitCore._job_taken,
    Hurry: CommitCore._hurry,
}


# ---------------------------------------------------------------------- crashes
@dataclass(frozen=True, slots=True)
class CrashOutcome:
    """What a process killed at one point leaves, as seqs: ``acknowledged`` (appenders told),
    ``log`` (the lowest and highest head the log may hold: a record being written may be whole
    or torn), ``db`` (the lowest and highest head ``journal.db`` may hold: a copy under way may
    have committed some pieces), and what the next open does."""

    acknowledged: int
    log: tuple[int, int]
    db: tuple[int, int]
    recovery: str


#: The places a crash is tested at (``apollia_nb/faults.py`` points, and ``journal.log`` /
#: ``journal.db``: ``dbutil.fault_point``'s storage faults), each with the state it leaves
#: the role in and what the next open must do.
CRASH_POINTS: Mapping[str, tuple[str, str, str]] = MappingProxyType({
    "journal.log": ("writer", WriterState.LOGGING,
                    "read the log: a torn last record (never acknowledged) is dropped, a whole one is taken; "
                    "take every entry after journal.db's head (checked: chain, hash, signature)"),
    "journal.db": ("copier", CopierState.COPYING,
                   "journal.db holds the pieces committed before; take the rest from the log"),
    "journal.before_frontier": ("copier", CopierState.COPYING,
                                "the piece's transaction did not commit (entries and frontier together): "
                                "take them from the log"),
    "journal.after_piece": ("copier", CopierState.COPYING,
                            "journal.db holds a consistent prefix (its frontier with it): the log's rows up to "
                            "it must equal journal.db's, the rest are taken"),
    "journal.after_copy": ("copier", CopierState.COPYING,
                           "journal.db holds the whole copy the core had not counted yet: the log's rows up to "
                           "its head must equal journal.db's, the rest are taken"),
})


def crash(core: CommitCore, point: str | None = None) -> CrashOutcome:
    """What a crash leaves when the process dies with the core in its current state (``point``:
    a place of :data:`CRASH_POINTS`, which must match the role's state). Pure."""
    if point is not None:
        role, state, _ = CRASH_POINTS[point]
        now = core.writer if role == "writer" else core.copier
        if now != state:
            raise InvalidTransition(f"a crash at {point} happens while the {role} is {state}, not {now}")
    acked = core.acknowledged
    log_high = core.sequenced if core.writer is WriterState.LOGGING else acked
    if point == "journal.after_copy":  # the copy committed whole; the core has not counted it yet
        db = (core.copying, core.copying)
    elif core.copier is CopierState.COPYING:  # pieces commit one by one: any prefix of them
        db = (core.copied, core.copying)
    else:
        db = (core.copied, core.copied)
    if point is not None:
        recovery = CRASH_POINTS[point][2]
    elif core.writer is WriterState.LOGGING:
        recovery = CRASH_POINTS["journal.log"][2]
    elif db[0] < acked:
        recovery = "take the log's entries after journal.db's head (checked: chain, hash, signature)"
    else:
        recovery = "nothing to take: journal.db holds every acknowledged entry"
    return CrashOutcome(acked, (acked, log_high), db, recovery)
