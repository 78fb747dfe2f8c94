"""``apollia-os witness serve``: a C2SP tlog-witness for the journals of a team's homes.

State, all in the witness's folder (``--home-dir``):

``witness.key``       base64 of the 32-byte Ed25519 seed, mode 0600, created on first start
``witness.db``        SQLite: ``meta(key, value)`` (the witness's ``name``) and
                      ``logs(origin PRIMARY KEY, size, root, note, updated_at)``, the latest
                      checkpoint cosigned per origin
``trusted_keys``      the journal verifier keys it trusts, one a line (``#`` comments);
                      ``--trust`` adds keys to it

``POST /add-checkpoint`` is decided by :func:`~apollia_nb.journal.witness.witness_decide`
under one lock; on success the new record is committed (SQLite, synchronous) before
the 200 carrying the cosignature, so a restart never forgets what it cosigned and
two racing requests cannot roll a log back. ``GET /`` answers the name and verifier key.
"""

from __future__ import annotations

import base64
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
from apollia_nb.journal.checkpoint import NoteVerifier
from apollia_nb.journal.witness import Cosigner, WitnessRecord, witness_decide

__all__ = ["MAX_REQUEST_BYTES", "WitnessState", "serve"]

MAX_REQUEST_BYTES = 64 * 1024
KEY_FILE = "witness.key"
DB_FILE = "witness.db"
TRUST_FILE = "trusted_keys"


def _default_name() -> str:
    host = "".join(ch for ch in socket.gethostname() if ch.isalnum() or ch in "-.") or "localhost"
    return f"{host}/apollia-witness"


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
            except BadInput:
                return
            self._trust_mtime = stamp

    @property
    def name(self) -> str:
        return self.cosigner.name

    def verifier_key(self) -> str:
        return self.cosigner.verifier_key()

    def _add_trust(self, keys: list[str]) -> None:
        for key in keys:
            NoteVerifier.from_key(key)  # BAD_INPUT before anything is written
        path = self.directory / TRUST_FILE
        known = set(self._trust_lines())
        fresh = [k for k in keys if k not in known]
        if fresh:
            with path.open("a", encoding="utf-8") as f:
                f.writelines(k + "\n" for k in fresh)

    def _trust_lines(self) -> list[str]:
        path = self.directory / TRUST_FILE
        if not path.exists():
            return []
        lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
        return [line for line in lines if line and not line.startswith("#")]

    def _read_trust(self) -> dict[str, list[NoteVerifier]]:
        trusted: dict[str, list[NoteVerifier]] = {}
        for line in self._trust_lines():
            try:
                v = NoteVerifier.from_key(line)
            except BadInput as exc:
                raise BadInput(f"{self.directory / TRUST_FILE}: {exc.message}") from None
            trusted.setdefault(v.name, []).append(v)
        return trusted

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

    def close(self) -> None:
        self._db.close()


def _handler(state: WitnessState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "apollia-witness"

        def _reply(self, status: int, content_type: str, body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "":
                self._reply(200, "text/plain; charset=utf-8", f"{state.name}\n{state.verifier_key()}\n")
            else:
                self._reply(404, "text/plain; charset=utf-8", "not found\n")

        def do_POST(self) -> None:
            if self.path != "/add-checkpoint":
                self._reply(404, "text/plain; charset=utf-8", "not found\n")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._reply(411, "text/plain; charset=utf-8", "Content-Length is required\n")
                return
            if not 0 <= length <= MAX_REQUEST_BYTES:
                self.close_connection = True
                self._reply(413, "text/plain; charset=utf-8", f"at most {MAX_REQUEST_BYTES} bytes\n")
                return
            status, content_type, body = state.add_checkpoint(self.rfile.read(length))
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
    url = f"http://{bound_host if ':' not in str(bound_host) else f'[{bound_host}]'}:{bound_port}"

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
