"""`audit verify` and `audit export` on a home a real `apollia-os serve` owns: the same results as the
owner's, and the client never holds the journal.

`verify` checks here, under the home's own key, the entries it reads from the server a page at a time;
the export reads the entries the server verified a page at a time and writes them to the bundle as they
come.
The server here is the real `apollia-os serve` with one addition, made by its launcher: every request
it answers is written to a log (method, path, query, bytes of the answer), so what the client asked
for is counted where it was served. The client runs the real CLI with a smaller page (500 entries)
so a journal of a few thousand entries takes several pages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import parse_qs

import duckdb
import pytest

from apollia_nb.home import Home
from apollia_nb.journal.store import Draft, Journal

N = 3_000
PAGE = 500
BAD_SEQ = 1_234

SERVER = textwrap.dedent("""
    import json, sys
    import apollia_nb.api.app as app_module

    LOG = sys.argv.pop(1)
    made = app_module.create_app

    class Counted:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http":
                return await self.app(scope, receive, send)
            sent = 0

            async def counting(message):
                nonlocal sent
                if message["type"] == "http.response.body":
                    sent += len(message.get("body", b""))
                await send(message)

            await self.app(scope, receive, counting)
            with open(LOG, "a") as f:
                f.write(json.dumps({"method": scope["method"], "path": scope["path"],
                                    "query": scope["query_string"].decode(), "bytes": sent}) + "\\n")

    def create_app(*args, **kwargs):
        app = made(*args, **kwargs)
        app.add_middleware(Counted)
        return app

    app_module.create_app = create_app
    from apollia_nb.cli import main
    sys.exit(main(sys.argv[1:]))
""")

CLIENT = textwrap.dedent(f"""
    import sys
    import apollia_nb.runtime.remote as remote
    remote._PAGE = {PAGE}
    from apollia_nb.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def build_home(path: Path) -> Home:
    """A home whose journal holds N entries of the shapes a run writes, and a checkpoint."""
    home = Home.at(path)
    with Journal.open(home) as journal:
        for start in range(0, N, 1000):
            journal.append_many(
                Draft("tool_result" if i % 3 else "decision",
                      {"call_id": f"call-{i}", "tool": "read_note", "status": "ok", "output": f"note {i} " * 8},
                      f"run-{i // 50}", "clerk")
                for i in range(start, start + 1000))
        journal.checkpoint()
    return home


class Served:
    """A real `apollia-os serve` on the home, logging each request it answers."""

    def __init__(self, home: Path, tmp: Path) -> None:
        self.log = tmp / "requests.jsonl"
        self.log.write_text("")
        launcher = tmp / "serve_counted.py"
        launcher.write_text(SERVER)
        env = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}
        self.proc = subprocess.Popen([sys.executable, str(launcher), str(self.log), "serve", "--home", str(home),
                                      "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=tmp, env=env)
        assert self.proc.stdout.readline(), self.proc.stderr.read()

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()


def run(tmp: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    client = tmp / "client.py"
    if not client.exists():
        client.write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}
    return subprocess.run([sys.executable, str(client), *args, "--home", str(home)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp)


def asked(served: Served, since: int) -> list[dict]:
    """The requests the server answered after the first ``since``, other than its own health checks."""
    return [r for r in served.requests()[since:] if not r["path"].endswith("/health")]


def entry_rows(bundle: Path) -> list[tuple]:
    con = duckdb.connect()
    try:
        return con.execute("SELECT * FROM read_parquet(?) ORDER BY seq", [str(bundle / "entries.parquet")]).fetchall()
    finally:
        con.close()


@pytest.fixture()
def foreign_checkpoint(tmp_path) -> Path:
    """A checkpoint signed by another home's key."""
    with Journal.open(Home.at(tmp_path / "other")) as journal:
        journal.append("note", {"text": "elsewhere"})
        note = journal.checkpoint()
    (tmp_path / "foreign.txt").write_text(note)
    return tmp_path / "foreign.txt"


def test_served_verify_and_export_give_the_owners_results_without_reading_the_journal_here(
        tmp_path, foreign_checkpoint):
    home = build_home(tmp_path / "home").path
    served = Served(home, tmp_path)
    try:
        before = len(served.requests())
        verified = run(tmp_path, "audit", "verify", "--json", home=home)
        verify_asked = asked(served, before)
        foreign = run(tmp_path, "audit", "verify", "--checkpoint", str(foreign_checkpoint), "--json", home=home)
        before = len(served.requests())
        exported = run(tmp_path, "audit", "export", str(tmp_path / "served-bundle"), "--json", home=home)
        export_asked = asked(served, before)
        bundle = run(tmp_path, "audit", "verify", "--bundle", str(tmp_path / "served-bundle"), "--json", home=home)
    finally:
        served.stop()
    owner_foreign = run(tmp_path, "audit", "verify", "--checkpoint", str(foreign_checkpoint), "--json", home=home)
    owner_exported = run(tmp_path, "audit", "export", str(tmp_path / "owner-bundle"), "--json", home=home)

    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["entries"] > N and report["checked_checkpoints"] >= 1
    # The client verified under the home's key what it read a bounded page at a time: each entry asked
    # for once, and no answer larger than a page (nothing of the journal is held beyond one page).
    entries = report["entries"]
    pages = [parse_qs(r["query"]) for r in verify_asked if r["path"] == "/api/v1/internal/journal/entries"]
    assert [(int(p["since_seq"][0]), int(p["limit"][0])) for p in pages] == [
        (since, min(PAGE, entries - since)) for since in range(0, entries, PAGE)]
    assert max(r["bytes"] for r in verify_asked) < PAGE * 1_000
    assert not [r for r in verify_asked if r["path"].endswith("/journal/verify")]

    # A checkpoint of another log fails the same way with and without the server.
    assert foreign.returncode == owner_foreign.returncode == 1
    assert json.loads(foreign.stdout)["problem"] == json.loads(owner_foreign.stdout)["problem"]
    assert "the given checkpoint" in json.loads(foreign.stdout)["problem"]

    # The export: the entries the server verified, each asked for once, a bounded page at a time.
    assert exported.returncode == 0, exported.stderr
    result = json.loads(exported.stdout)
    assert result["entries"] == entries and result["verified"] and result["verification"] == report
    pages = [parse_qs(r["query"]) for r in export_asked if r["path"] == "/api/v1/internal/journal/entries"]
    assert [(int(p["since_seq"][0]), int(p["limit"][0])) for p in pages] == [
        (since, min(PAGE, entries - since)) for since in range(0, entries, PAGE)]
    biggest = max(r["bytes"] for r in export_asked)
    assert biggest < PAGE * 1_000, biggest  # no answer carries more than a page
    assert sum(r["bytes"] for r in export_asked) > (entries // PAGE) * biggest // 2  # the pages carried it all

    # The bundle verifies offline as the server said, and holds the owner's entries byte for byte.
    assert bundle.returncode == 0, bundle.stderr
    assert json.loads(bundle.stdout) == report
    assert owner_exported.returncode == 0, owner_exported.stderr
    owner_rows = entry_rows(tmp_path / "owner-bundle")
    assert entry_rows(tmp_path / "served-bundle") == owner_rows[:entries]
    meta = json.loads((tmp_path / "served-bundle" / "meta.json").read_text())
    assert meta["entries"] == entries and meta["head_hash"] == bytes(owner_rows[entries - 1][7]).hex()
    assert meta["verified"] is True and meta["invalid"] is None


def test_a_served_journal_that_does_not_verify_is_reported_and_not_exported(tmp_path):
    home = build_home(tmp_path / "home").path
    con = duckdb.connect(str(home / "journal.db"))
    try:
        con.execute("UPDATE entries SET payload = CAST('{\"forged\":true}' AS BLOB) WHERE seq = ?", [BAD_SEQ])
    finally:
        con.close()
    served = Served(home, tmp_path)
    try:
        verified = run(tmp_path, "audit", "verify", home=home)
        refused = run(tmp_path, "audit", "export", str(tmp_path / "refused"), home=home)
        marked = run(tmp_path, "audit", "export", str(tmp_path / "marked"), "--allow-invalid", "--json", home=home)
        marked_verify = run(tmp_path, "audit", "verify", "--bundle", str(tmp_path / "marked"), home=home)
    finally:
        served.stop()
    owner = run(tmp_path, "audit", "verify", home=home)

    assert verified.returncode == owner.returncode == 1
    assert verified.stdout == owner.stdout
    assert verified.stdout.startswith(f"FAILED at seq {BAD_SEQ}: ")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: INTEGRITY_FAILURE: the journal does not verify (FAILED at seq "
                                     f"{BAD_SEQ}"), refused.stderr
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
    assert marked.returncode == 0, marked.stderr
    result = json.loads(marked.stdout)
    assert result["verified"] is False and result["verification"]["first_bad_seq"] == BAD_SEQ
    assert result["entries"] > N  # the whole journal, marked invalid
    meta = json.loads((tmp_path / "marked" / "meta.json").read_text())
    assert meta["verified"] is False and meta["invalid"]["first_bad_seq"] == BAD_SEQ
    assert marked_verify.returncode == 1 and f"FAILED at seq {BAD_SEQ}" in marked_verify.stdout


def test_the_client_frees_each_page_before_the_next(tmp_path):
    """Each answer is freed once its page is handed on: the pages read never pile up in the client."""
    import gc

    import httpx

    from apollia_nb.api.server import ServerThread
    from apollia_nb.runtime.remote import RemoteHome, ServerAddress

    home = build_home(tmp_path / "home")
    with ServerThread(home) as server:
        remote = RemoteHome(home, ServerAddress(server.url, server.token, os.getpid()))
        try:
            high = remote.journal.head()[0]

            def responses() -> int:
                return sum(1 for o in gc.get_objects() if isinstance(o, httpx.Response))

            gc.collect()
            before = responses()  # what earlier tests in this process left behind is not ours to count
            seen, alive = [], []
            for rows in remote.journal.entry_pages(high, page=300):
                seen.extend(r[0] for r in rows)
                alive.append(responses() - before)
        finally:
            remote.close()
    assert seen == list(range(1, high + 1))
    assert len(alive) == -(-high // 300) and max(alive) <= 1, alive
