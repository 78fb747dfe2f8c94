"""Sending a home's checkpoints to its witnesses, off the hot path.

``[[journal.witnesses]]`` in ``apollia.toml`` names each witness (``url``, ``key`` =
its cosignature/v1 verifier key). A :class:`CosignSender` thread, owned by whoever
owns the journal (the runtime: started on open, stopped before the journal closes),
sends the newest stored checkpoint to every witness whose newest cosignature is
older, with the consistency proof from the size the witness holds (on a 409, the
size it answers). A valid cosignature is stored in ``checkpoint_cosignatures``. A
witness that does not answer, or refuses, is retried with a doubling backoff (up
to a minute); nothing waits for it, and its state is what :meth:`status` returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from apollia_nb.errors import ApolliaError, BadInput
from apollia_nb.journal.checkpoint import CheckpointError, parse_checkpoint, parse_note
from apollia_nb.journal.witness import (
    CosignatureVerifier,
    format_add_checkpoint,
    parse_cosignature_lines,
)

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "CosignSender", "WitnessConfig", "WitnessedJournal", "parse_witnesses"]

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 60.0
POLL_SECS = 1.0


class WitnessedJournal(Protocol):
    """What the sender needs of a journal (``journal.store.Journal``; reads also ``RemoteJournal``)."""

    def latest_checkpoint(self) -> str | None: ...
    def checkpoints(self) -> list[tuple[int, bytes, str]]: ...
    def cosignatures(self) -> list[tuple[int, str, int, str]]: ...
    def add_cosignature(self, size: int, witness: str, timestamp: int, line: str) -> None: ...
    def consistency_proof(self, old_size: int, new_size: int | None = None) -> Any: ...


@dataclass(frozen=True)
class WitnessConfig:
    url: str
    verifier: CosignatureVerifier

    @property
    def key(self) -> str:
        return self.verifier.key()


def parse_witnesses(raw: Mapping[str, Any], where: str = "apollia.toml") -> list[WitnessConfig]:
    """The ``[[journal.witnesses]]`` tables of a parsed ``apollia.toml`` (BAD_INPUT when malformed)."""
    journal = raw.get("journal", {})
    if not isinstance(journal, dict):
        raise BadInput(f"{where}: [journal] must be a table")
    items = journal.get("witnesses", [])
    if not isinstance(items, list):
        raise BadInput(f"{where}: journal.witnesses must be an array of tables ([[journal.witnesses]])")
    out: list[WitnessConfig] = []
    seen: dict[bytes, int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("url"), str) or not isinstance(item.get("key"), str):
            raise BadInput(f"{where}: [[journal.witnesses]] #{i + 1} needs url and key strings")
        url = item["url"].rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"{where}: [[journal.witnesses]] #{i + 1}: url {item['url']!r} is not http(s)")
        try:
            verifier = CosignatureVerifier.from_key(item["key"])
        except BadInput as exc:
            raise BadInput(f"{where}: [[journal.witnesses]] #{i + 1}: {exc.message}") from None
        if verifier.public_key in seen:  # one witness, whatever the name: its cosignature signs no name
            raise BadInput(f"{where}: [[journal.witnesses]] #{i + 1} names the witness key of "
                           f"#{seen[verifier.public_key]} again: list each witness once")
        seen[verifier.public_key] = i + 1
        out.append(WitnessConfig(url, verifier))
    return out


@dataclass
class _State:
    config: WitnessConfig
    cosigned_size: int | None = None
    held_size: int | None = None  # what the witness said it holds (409), else what it last cosigned
    last_error: str | None = None
    last_attempt: float | None = None
    tried_size: int | None = None  # the checkpoint size of the last attempt
    next_at: float = 0.0
    backoff: float = BACKOFF_FIRST


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class CosignSender:
    """One thread sending the journal's newest checkpoint to each configured witness."""

    def __init__(self, journal: WitnessedJournal, witnesses: Sequence[WitnessConfig], *, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.journal = journal
        self.timeout = timeout
        self._clock, self._wall = clock, wall
        self._states = [_State(w) for w in witnesses]
        # What each witness cosigned: stored cosignatures that verify over the stored checkpoint
        # (a line kept beside a checkpoint it does not sign counts for nothing).
        bodies = {size: parse_note(note)[0] for size, _root, note in journal.checkpoints()}
        for size, key, _ts, line in journal.cosignatures():
            for st in self._states:
                if st.config.key != key or size not in bodies or (st.cosigned_size or 0) >= size:
                    continue
                try:
                    if any(st.config.verifier.verifies(bodies[size], c) for c in parse_cosignature_lines(line)):
                        st.cosigned_size = st.held_size = size
                except CheckpointError:
                    continue
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one attempt at a time (the thread, or push())
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._states and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="journal-witness-sender", daemon=True)
            self._thread.start()

    def notify(self) -> None:
        """A new checkpoint was stored: look now rather than at the next poll."""
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (an attempt under way ends within ``timeout``); nothing pending is lost:
        the next owner of the journal sends it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.push(due_only=True)
            waits = [st.next_at - self._clock() for st in self._states if st.last_error is not None]
            self._wake.wait(max(0.05, min([POLL_SECS, *waits])))
            self._wake.clear()

    # ------------------------------------------------------------------ sending
    def _latest(self) -> tuple[int, str] | None:
        note = self.journal.latest_checkpoint()
        if note is None:
            return None
        try:
            return parse_checkpoint(parse_note(note)[0]).size, note
        except CheckpointError:
            return None

    def push(self, *, due_only: bool = False) -> list[dict[str, Any]]:
        """Send the newest checkpoint to every witness (``due_only``: to those that lack it and whose
        backoff has passed, or a newer checkpoint came since their last attempt); returns :meth:`status`.

        Sent to a witness that cosigned it already, it is cosigned again with a newer time, or
        answered with the larger size the witness holds: a home put back to an older copy learns so."""
        with self._lock:
            latest = self._latest()
            if latest is not None:
                for st in self._states:
                    if self._stop.is_set() and due_only:
                        break
                    if due_only and st.cosigned_size == latest[0]:
                        continue
                    if (due_only and st.last_error is not None and st.tried_size == latest[0]
                            and self._clock() < st.next_at):
                        continue  # backing off; a newer checkpoint is tried at once
                    self._attempt(st, *latest)
        return self.status()

    def _attempt(self, st: _State, size: int, note: str) -> None:
        import httpx

        st.last_attempt, st.tried_size = self._wall(), size
        error = None
        old = st.held_size or 0
        try:
            for _ in range(2):  # a 409 names the size the witness holds: one more try from there
                if old > size:
                    error = (f"the witness holds a checkpoint of size {old}, larger than this journal's newest "
                             f"({size}): the journal was rolled back or replaced")
                    break
                proof = [] if old in (0, size) else list(self.journal.consistency_proof(old, size).path)
                response = httpx.post(f"{st.config.url}/add-checkpoint", content=format_add_checkpoint(old, proof, note),
                                      timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 2.0)))
                if response.status_code == 200:
                    error = self._store(st, size, note, response.text)
                    break
                text = response.text.strip()
                if response.status_code == 409 and response.headers.get("content-type", "").startswith("text/x.tlog.size"):
                    try:
                        held = int(text)
                    except ValueError:
                        error = f"409 with a malformed size {text[:80]!r}"
                        break
                    if held == old:  # same size, other root: a fork (as witnesses said before July 2026)
                        error = (f"409: the witness holds another checkpoint of size {held}: this journal's "
                                 "history differs from the one it cosigned")
                        break
                    st.held_size = old = held
                    continue
                if response.status_code == 422 and old == size:  # same size, other root: a fork
                    error = (f"422: the witness holds another checkpoint of size {size}: this journal's "
                             "history differs from the one it cosigned")
                    break
                detail = {422: " (this journal's history differs from the one it cosigned: it does not extend it)",
                          403: " (it does not trust this journal's key)",
                          404: " (it does not know this journal's origin: add its verifier key to the witness)"}
                error = f"{response.status_code}: {text[:200]}{detail.get(response.status_code, '')}"
                break
        except httpx.HTTPError as exc:
            error = f"unreachable: {type(exc).__name__}: {exc}"
        except ApolliaError as exc:
            error = f"{exc.code}: {exc.message}"
        if error is None:
            st.last_error, st.backoff, st.next_at = None, BACKOFF_FIRST, 0.0
        else:
            st.last_error = error
            st.next_at = self._clock() + st.backoff
            st.backoff = min(st.backoff * 2, BACKOFF_MAX)

    def _store(self, st: _State, size: int, note: str, text: str) -> str | None:
        body = parse_note(note)[0]
        try:
            cosigs = parse_cosignature_lines(text)
        except CheckpointError as exc:
            return f"200 with a malformed answer: {exc.message}"
        valid = [c for c in cosigs if st.config.verifier.verifies(body, c)]
        if not valid:
            return "200 without a valid cosignature from the configured witness key"
        best = max(valid, key=lambda c: c.timestamp)
        self.journal.add_cosignature(size, st.config.key, best.timestamp, best.line())
        st.cosigned_size = st.held_size = size
        return None

    # ------------------------------------------------------------------ reading
    def status(self) -> list[dict[str, Any]]:
        latest = self._latest()
        size = latest[0] if latest else None
        return [{
            "url": st.config.url,
            "key": st.config.key,
            "key_name": st.config.verifier.name,
            "cosigned_size": st.cosigned_size,
            "pending": size is not None and st.cosigned_size != size,
            "last_error": st.last_error,
            "last_attempt": _iso(st.last_attempt),
        } for st in self._states]
