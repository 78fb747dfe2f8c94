"""``apollia-os witness serve``: a C2SP tlog-witness for the journals of a team's homes.

State, all in the witness's folder (``--home-dir``):

``witness.key``       base64 of the 32-byte Ed25519 seed, mode 0600, created on first start
``witness.db``        SQLite: ``meta(key, value)`` (the witness's ``name``) and
                      ``logs(origin PRIMARY KEY, size, root, note, updated_at)``, the latest
                      checkpoint cosigned per origin
``trusted_keys``      the journal verifier keys it trusts, one a line (``#`` comments);
                      ``--trust`` adds keys to it. One key per origin: the witness keeps one
                      record per origin, so a second key for an origin would let its holder
                      advance (or fork) the other key's log and lock it out. A file naming two
                      keys for one origin is refused at start (``BAD_INPUT``, naming both);
                      edited so while serving, the keys trusted before the edit stay in force

``POST /add-checkpoint`` is decided by :func:`~apollia_nb.journal.witness.witness_decide`
under one lock; on success the new record is committed (SQLite, synchronous) before
the 200 carrying the cosignature, so a restart never forgets what it cosigned and
two racing requests cannot roll a log back. ``GET /`` answers the name and verifier key.
``GET /<origin hash>/checkpoint`` is the monitoring API (the monitoring prefix is the same as
the submission prefix, ``/``): the latest checkpoint cosigned for the log whose origin's SHA-256 is
that lowercase hex, with the log signatures the witness verifies and its cosignature as
add-checkpoint returned it; 404 when it never cosigned one for that log.

Every request the witness cannot read is answered, never dropped: 400 for a malformed
body or ``Content-Length`` (not ASCII decimal digits, given twice, or a ``Transfer-Encoding``
instead), 411 without a length, 413 over ``MAX_REQUEST_BYTES`` (a body of at most ``DRAIN_BYTES``
is read and dropped first, so the client reads the answer), 408 when the body does not
arrive within ``REQUEST_TIMEOUT`` seconds, 503 when the record cannot be stored.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nacl.signing

from apollia_nb.errors import BadInput, IntegrityError
from apollia_nb.journal.checkpoint import NoteVerifier, parse_note
from apollia_nb.journal.witness import Cosigner, WitnessRecord, witness_decide

__all__ = ["DRAIN_BYTES", "MAX_REQUEST_BYTES", "REQUEST_TIMEOUT", "WitnessState", "serve", "trust_map"]

MAX_REQUEST_BYTES = 64 * 1024
#: How much of a body over the limit is read (and dropped) so the 413 reaches the client.
DRAIN_BYTES = 16 * 1024 * 1024
#: Seconds a connection may stay silent while the witness waits for a request or its body.
REQUEST_TIMEOUT = 30.0
KEY_FILE = "witness.key"
DB_FILE = "witness.db"
TRUST_FILE = "trusted_keys"


def _default_name() -> str:
    host = "".join(ch for ch in socket.gethostname() if ch.isalnum() or ch in "-.") or "localhost"
    return f"{host}/apollia-witness"


def trust_map(lines: Iterable[str], where: str = TRUST_FILE) -> dict[str, list[NoteVerifier]]:
    """The trusted journal keys by origin: one key per origin (a key given twice counts once);
    ``BAD_INPUT`` naming the lines for a malformed key or a second key for one origin."""
    trusted: dict[str, list[NoteVerifier]] = {}
    first: dict[str, str] = {}
    for line in lines:
        try:
            v = NoteVerifier.from_key(line)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc.message}") from None
        held = trusted.get(v.name)
        if held is None:
            trusted[v.name], first[v.name] = [v], line
        elif held[0] != v:
            raise BadInput(f"{where}: two keys for the origin {v.name!r} ({first[v.name]} and {line}); a witness "
                           "trusts one key per origin (the holder of either could lock the other's log out): keep "
                           "one, or give the other journal an origin of its own")
    return trusted


class WitnessState:
    """The witness's key, trusted log keys and latest cosigned checkpoints, in ``directory``."""

    def __init__(self, directory: Path, *, name: str | None = None, trust: Iterable[str] = (),
                 clock: Callable[[], float] = time.time) -> None:
        from apollia_nb.journal.keys import _write_once

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        key_path = self.directory / KEY_FILE
        if not key_path.exists():
            _write_once(key_path, base64.b64encode(os.urandom(32)) + b"\n", 0o600)
        try:
            seed = base64.b64decode(key_path.read_text().strip(), validate=True)
        except ValueError:
            raise IntegrityError(f"{key_path} is not base64") from None
        if len(seed) != 32:
            raise IntegrityError(f"{key_path} holds {len(seed)} bytes, expected 32")
        self._db = sqlite3.connect(self.directory / DB_FILE, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS logs (origin TEXT PRIMARY KEY, size INTEGER NOT NULL, "
                         "root BLOB NOT NULL, note TEXT NOT NULL, updated_at INTEGER NOT NULL)")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'name'").fetchone()
        if row is None:
            stored = name or _default_name()
            self._db.execute("INSERT INTO meta VALUES ('name', ?)", [stored])
        else:
            stored = row[0]
            if name is not None and name != stored:
                raise BadInput(f"this witness is named {stored!r} (in {self.directory / DB_FILE}); "
                               f"it cannot be renamed to {name!r}")
        self.cosigner = Cosigner(stored, nacl.signing.SigningKey(seed))
        self._lock = threading.Lock()
        self._add_trust(list(trust))
        self.trusted = self._read_trust()
        self._trust_mtime = self._trust_stamp()
        self._refused_stamp: float | None = None

    def _trust_stamp(self) -> float | None:
        try:
            return (self.directory / TRUST_FILE).stat().st_mtime
        except FileNotFoundError:
            return None

    def _reload_trust(self) -> None:
        """``trusted_keys`` edited while serving (a member joined): read it again; a broken edit
        keeps the keys trusted before it."""
        stamp = self._trust_stamp()
        if stamp != self._trust_mtime:
            try:
                self.trusted = self._read_trust()
            except BadInput as exc:
                if stamp != self._refused_stamp:  # said once per edit
                    self._refused_stamp = stamp
                    print(f"apollia-os witness serve: the edit is not used, the keys trusted before it stay: "
                          f"{exc.message}", file=sys.stderr, flush=True)
                return
            self._trust_mtime = stamp

    @property
    def name(self) -> str:
        return self.cosigner.name

    def verifier_key(self) -> str:
        return self.cosigner.verifier_key()

    def _add_trust(self, keys: list[str]) -> None:
        known = self._trust_lines()
        fresh = [k for k in dict.fromkeys(k.strip() for k in keys) if k not in set(known)]
        trust_map([*known, *fresh], f"{self.directory / TRUST_FILE} with --trust")  # BAD_INPUT before any write
        if fresh:
            with (self.directory / TRUST_FILE).open("a", encoding="utf-8") as f:
                f.writelines(k + "\n" for k in fresh)

    def _trust_lines(self) -> list[str]:
        path = self.directory / TRUST_FILE
        if not path.exists():
            return []
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read {path}: {exc}") from None
        lines = (line.strip() for line in text.splitlines())
        return [line for line in lines if line and not line.startswith("#")]

    def _read_trust(self) -> dict[str, list[NoteVerifier]]:
        return trust_map(self._trust_lines(), str(self.directory / TRUST_FILE))

    def record(self, origin: str) -> WitnessRecord | None:
        row = self._db.execute("SELECT size, root, note FROM logs WHERE origin = ?", [origin]).fetchone()
        return WitnessRecord(int(row[0]), bytes(row[1]), row[2]) if row else None

    def logs(self) -> list[dict[str, object]]:
        rows = self._db.execute("SELECT origin, size, updated_at FROM logs ORDER BY origin").fetchall()
        return [{"origin": o, "size": int(s), "updated_at": int(t)} for o, s, t in rows]

    def add_checkpoint(self, request: bytes) -> tuple[int, str, str]:
        """Answer one add-checkpoint request: ``(status, content type, body)``."""
        with self._lock:
            self._reload_trust()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                answer = witness_decide(request, trusted=self.trusted, lookup=self.record)
                if answer.status != 200:
                    self._db.execute("ROLLBACK")
                    return answer.status, answer.content_type, answer.body
                assert answer.record is not None and answer.checkpoint is not None
                now = int(self.clock())
                rec = answer.record
                self._db.execute(
                    "INSERT INTO logs (origin, size, root, note, updated_at) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (origin) DO UPDATE SET size = excluded.size, root = excluded.root, "
                    "note = excluded.note, updated_at = excluded.updated_at",
                    [answer.checkpoint.origin, rec.size, rec.root, rec.note, now])
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        line = self.cosigner.cosign(answer.checkpoint.body(), now).line()
        return 200, "text/plain; charset=utf-8", line

    def monitored_checkpoint(self, origin_hash: str) -> str | None:
        """The monitoring API's answer for ``sha256(origin)`` in lowercase hex: the latest checkpoint
        cosigned for that log, with the log's signatures this witness verifies and the cosignature
        add-checkpoint returned; None when it never cosigned one for that log."""
        if len(origin_hash) != 64 or any(ch not in "0123456789abcdef" for ch in origin_hash):
            return None
        with self._lock:
            self._reload_trust()
            rows = self._db.execute("SELECT origin, note, updated_at FROM logs").fetchall()
            trusted = dict(self.trusted)
        for origin, note, updated_at in rows:
            if hashlib.sha256(origin.encode("utf-8")).hexdigest() != origin_hash:
                continue
            body, signatures = parse_note(note)
            keys = {(v.name, v.key_id): v for v in trusted.get(origin, [])}
            verified = [sig for sig in signatures
                        if (sig.name, sig.key_id) in keys and keys[(sig.name, sig.key_id)].verifies(body, sig)]
            # the cosignature returned then: cosignature/v1 over the same body and time (Ed25519 is
            # deterministic, so it is the same line)
            cosignature = self.cosigner.cosign(body, int(updated_at)).line()
            return body + "\n" + "".join(sig.line() for sig in verified) + cosignature
        return None

    def close(self) -> None:
        self._db.close()


def _handler(state: WitnessState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "apollia-witness"
        timeout = REQUEST_TIMEOUT  # a request or body that never comes ends the connection, not a thread

        def _reply(self, status: int, content_type: str, body: str, *, close: bool = False) -> None:
            data = body.encode("utf-8")
            if close:
                self.close_connection = True
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if close:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _refuse(self, status: int, message: str) -> None:
            """A request whose body cannot be read as one: answered, and the connection closed
            (where its body ends is unknown)."""
            self._reply(status, "text/plain; charset=utf-8", message + "\n", close=True)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "":
                self._reply(200, "text/plain; charset=utf-8", f"{state.name}\n{state.verifier_key()}\n")
                return
            parts = self.path.split("/")
            if len(parts) == 3 and parts[0] == "" and parts[2] == "checkpoint":  # the monitoring API
                note = state.monitored_checkpoint(parts[1])
                if note is not None:
                    self._reply(200, "text/plain; charset=utf-8", note)
                    return
                self._reply(404, "text/plain; charset=utf-8", "this witness never cosigned a checkpoint of that log\n")
                return
            self._reply(404, "text/plain; charset=utf-8", "not found\n")

        def _body_length(self) -> int | None:
            """The body's length, or None once a refusal was sent."""
            if self.headers.get_all("Transfer-Encoding"):
                self._refuse(400, "send the body with Content-Length, not Transfer-Encoding")
                return None
            given = self.headers.get_all("Content-Length") or []
            if not given:
                self._refuse(411, "Content-Length is required")
                return None
            if len(given) > 1:
                self._refuse(400, "Content-Length is given more than once")
                return None
            text = given[0].strip()
            if not text or not text.isascii() or not text.isdigit():
                self._refuse(400, "Content-Length must be a decimal number of bytes")
                return None
            if len(text) > 20 or int(text) > MAX_REQUEST_BYTES:
                if len(text) <= 20 and int(text) <= DRAIN_BYTES:
                    self._drain(int(text))
                self._refuse(413, f"at most {MAX_REQUEST_BYTES} bytes")
                return None
            return int(text)

        def _drain(self, length: int) -> None:
            """Read and drop a body refused for its size (one of at most ``DRAIN_BYTES``), so that
            closing the connection does not reset it before the client reads the answer."""
            left = length
            try:
                while left > 0:
                    chunk = self.rfile.read(min(left, 65536))
                    if not chunk:
                        return
                    left -= len(chunk)
            except OSError:
                return

        def do_POST(self) -> None:
            length = self._body_length()
            if length is None:
                return
            try:
                request = self.rfile.read(length)
            except TimeoutError:
                self._refuse(408, f"the body did not arrive within {REQUEST_TIMEOUT:g} s")
                return
            if len(request) < length:  # the client closed before sending it all: nobody to answer
                self.close_connection = True
                return
            if self.path != "/add-checkpoint":
                self._reply(404, "text/plain; charset=utf-8", "not found\n")
                return
            try:
                status, content_type, body = state.add_checkpoint(request)
            except Exception as exc:  # noqa: BLE001 - the record could not be stored: nothing was cosigned
                self._refuse(503, f"the witness could not record the checkpoint: {type(exc).__name__}")
                return
            self._reply(status, content_type, body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def serve(state: WitnessState, *, host: str = "127.0.0.1", port: int = 0,
          on_listening: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (Ctrl+C or SIGTERM)."""
    import signal

    httpd = ThreadingHTTPServer((host, port), _handler(state))
    httpd.daemon_threads = True
    bound_host, bound_port = httpd.server_address[:2]
    url = f"http://{str(bound_host) if ':' not in str(bound_host) else f'[{str(bound_host)}]'}:{bound_port}"

    def stop(*_: object) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
    if on_listening is not None:
        on_listening(url)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        state.close()
        sys.stdout.flush()
