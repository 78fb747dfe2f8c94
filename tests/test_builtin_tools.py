"""The built-in tools on a real temporary workspace, through ``invoke``."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from apollia_nb.governance.decision import Family
from apollia_nb.runtime.breaker import Breakers
from apollia_nb.runtime.builtins import (
    OUTPUT_CAP_BYTES,
    builtin_tools,
    resolve_in_workspace,
    summarize_value,
)
from apollia_nb.runtime.tools import ToolOutcome, ToolRegistry, invoke


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret", encoding="utf-8")
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


class Kit:
    """The built-ins of one workspace, called through invoke like the runtime does."""

    def __init__(self, workspace: Path, **options: Any) -> None:
        self.registry = ToolRegistry(builtin_tools(workspace, **options))
        self.breakers = Breakers()

    async def __call__(self, tool: str, /, timeout_secs: float | None = None, **arguments: Any) -> ToolOutcome:
        return await invoke(self.registry.get(tool), arguments, breakers=self.breakers, timeout_secs=timeout_secs)


def test_families_and_optional_tools(ws: Path) -> None:
    plain = ToolRegistry(builtin_tools(ws))
    assert {name: plain.get(name).family for name in plain.names()} == {
        "read_file": Family.READ,
        "list_dir": Family.READ,
        "write_file": Family.WRITE,
        "delete_file": Family.WRITE,
        "bash_executor": Family.EXECUTE,
        "python_executor": Family.EXECUTE,
        "http_request": Family.SEND,
        "memory_save": Family.MEMORY,
        "memory_recall": Family.MEMORY,
    }
    full = ToolRegistry(builtin_tools(ws, profile_sink=lambda fact: None, namespace=dict))
    assert full.get("profile_propose_fact").family is Family.PROFILE
    assert full.get("notebook_get_variable").family is Family.READ
    assert full.get("notebook_list_variables").family is Family.READ
    assert full.get("notebook_set_variable").family is Family.WRITE
    # the first declared parameter is the "first argument" rules match on
    assert [full.get(n).parameter_names[:1] for n in ("read_file", "bash_executor", "http_request", "memory_save")] == [
        ("path",), ("command",), ("url",), ("key",)
    ]
    assert full.get("list_dir").parameters["required"] == []
    assert full.get("http_request").parameter_names == ("url", "method", "body")


# --- files ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_write_read_list_delete(ws: Path) -> None:
    kit = Kit(ws)
    written = await kit("write_file", path="notes/2024/summary.txt", content="héllo\n")
    assert written.output == {"path": "notes/2024/summary.txt", "bytes": 7}
    assert (ws / "notes/2024/summary.txt").read_text(encoding="utf-8") == "héllo\n"

    assert (await kit("read_file", path="notes/2024/summary.txt")).output == "héllo\n"
    await kit("write_file", path="notes/2024/summary.txt", content="replaced")
    assert (await kit("read_file", path="./notes/2024/../2024/summary.txt")).output == "replaced"

    listing = await kit("list_dir")
    assert listing.output == {"path": ".", "entries": [{"name": "notes", "type": "dir", "size": None}], "total": 1}
    listing = await kit("list_dir", path="notes/2024")
    assert listing.output["entries"] == [{"name": "summary.txt", "type": "file", "size": 8}]

    deleted = await kit("delete_file", path="notes/2024/summary.txt")
    assert deleted.output == {"path": "notes/2024/summary.txt", "deleted": True}
    assert not (ws / "notes/2024/summary.txt").exists()


@pytest.mark.anyio
async def test_file_errors_are_permanent(ws: Path) -> None:
    kit = Kit(ws)
    (ws / "d").mkdir()
    missing = await kit("read_file", path="nope.txt")
    assert missing.error_code == "TOOL_PERMANENT" and "No such file" in missing.error.message
    assert (await kit("read_file", path="d")).error_code == "TOOL_PERMANENT"
    assert (await kit("delete_file", path="d")).error.message == "delete_file: 'd' is a directory; only files are deleted"
    assert (ws / "d").is_dir()
    root = await kit("delete_file", path=".")
    assert root.error_code == "TOOL_PERMANENT" and "workspace root" in root.error.message
    assert (await kit("write_file", path="d", content="x")).error_code == "TOOL_PERMANENT"
    assert (await kit("delete_file", path="gone.txt")).error_code == "TOOL_PERMANENT"
    assert (await kit("write_file", path="x.txt")).error_code == "BAD_ARGUMENT"
    assert kit.breakers.get("read_file").consecutive_failures == 0


@pytest.mark.anyio
async def test_absolute_path_inside_the_workspace_is_accepted(ws: Path) -> None:
    kit = Kit(ws)
    (ws / "a.txt").write_text("inside", encoding="utf-8")
    assert (await kit("read_file", path=str(ws / "a.txt"))).output == "inside"
    assert (await kit("list_dir", path=str(ws))).output["path"] == "."


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["../outside/secret.txt", "/etc/passwd", "a/../../outside/secret.txt", "..", "/", "x\x00y"])
async def test_escapes_are_refused(ws: Path, outside: Path, path: str) -> None:
    kit = Kit(ws)
    (ws / "a").mkdir()
    for name, arguments in [
        ("read_file", {"path": path}),
        ("list_dir", {"path": path}),
        ("write_file", {"path": path, "content": "pwned"}),
        ("delete_file", {"path": path}),
    ]:
        outcome = await kit(name, **arguments)
        assert outcome.error_code == "PATH_ESCAPE", (name, path, outcome)
    assert (outside / "secret.txt").read_text(encoding="utf-8") == "top secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.anyio
async def test_a_symlinked_directory_pointing_outside_is_refused(ws: Path, outside: Path) -> None:
    kit = Kit(ws)
    os.symlink(outside, ws / "linked")
    assert (await kit("read_file", path="linked/secret.txt")).error_code == "PATH_ESCAPE"
    assert (await kit("write_file", path="linked/new.txt", content="x")).error_code == "PATH_ESCAPE"
    assert (await kit("write_file", path="linked/deeper/new.txt", content="x")).error_code == "PATH_ESCAPE"
    assert (await kit("delete_file", path="linked/secret.txt")).error_code == "PATH_ESCAPE"
    assert (await kit("list_dir", path="linked")).error_code == "PATH_ESCAPE"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    # The link itself is listed (as a link) from the workspace root.
    entries = (await kit("list_dir")).output["entries"]
    assert entries == [{"name": "linked", "type": "symlink", "size": None}]


@pytest.mark.anyio
async def test_a_symlinked_file_pointing_outside_is_refused(ws: Path, outside: Path) -> None:
    kit = Kit(ws)
    os.symlink(outside / "secret.txt", ws / "innocent.txt")
    assert (await kit("read_file", path="innocent.txt")).error_code == "PATH_ESCAPE"
    assert (await kit("write_file", path="innocent.txt", content="overwritten")).error_code == "PATH_ESCAPE"
    assert (await kit("delete_file", path="innocent.txt")).error_code == "PATH_ESCAPE"
    assert (outside / "secret.txt").read_text(encoding="utf-8") == "top secret"
    # A dangling link pointing outside: writing through it would create a file outside.
    os.symlink(outside / "planted.txt", ws / "dangling.txt")
    assert (await kit("write_file", path="dangling.txt", content="x")).error_code == "PATH_ESCAPE"
    assert not (outside / "planted.txt").exists()


@pytest.mark.anyio
async def test_a_link_to_etc_made_inside_the_workspace_is_refused(ws: Path) -> None:
    kit = Kit(ws)
    made = await kit("bash_executor", command="ln -s /etc etc")
    assert made.output["exit_code"] == 0
    assert (await kit("read_file", path="etc/passwd")).error_code == "PATH_ESCAPE"
    assert (await kit("list_dir", path="etc")).error_code == "PATH_ESCAPE"


@pytest.mark.anyio
async def test_links_inside_the_workspace_work_and_delete_removes_the_link(ws: Path) -> None:
    kit = Kit(ws)
    (ws / "real.txt").write_text("data", encoding="utf-8")
    os.symlink(ws / "real.txt", ws / "alias.txt")
    assert (await kit("read_file", path="alias.txt")).output == "data"
    assert (await kit("delete_file", path="alias.txt")).ok
    assert not (ws / "alias.txt").is_symlink() and (ws / "real.txt").read_text(encoding="utf-8") == "data"


def test_resolve_in_workspace_follows_a_workspace_that_is_itself_a_link(tmp_path: Path, ws: Path) -> None:
    os.symlink(ws, tmp_path / "ws-link")
    assert resolve_in_workspace(tmp_path / "ws-link", "a/b.txt") == Path(os.path.realpath(ws)) / "a/b.txt"
    assert resolve_in_workspace(tmp_path / "ws-link", str(tmp_path / "ws-link" / "c")) == Path(os.path.realpath(ws)) / "c"


# --- executors ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_bash_exit_codes_are_results_not_errors(ws: Path) -> None:
    kit = Kit(ws)
    outcome = await kit("bash_executor", command="echo out; echo err >&2; exit 3")
    assert outcome.ok
    assert outcome.output == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n"}
    assert (await kit("bash_executor", command="pwd")).output["stdout"] == os.path.realpath(ws) + "\n"
    assert (await kit("bash_executor", command="true")).output["exit_code"] == 0
    assert (await kit("bash_executor", command="   ")).error_code == "BAD_ARGUMENT"
    assert (await kit("bash_executor", command="read line; echo \"[$line]\"")).output["stdout"] == "[]\n"


@pytest.mark.anyio
async def test_bash_output_is_capped(ws: Path) -> None:
    kit = Kit(ws)
    outcome = await kit("bash_executor", command=f"head -c {OUTPUT_CAP_BYTES + 5000} /dev/zero | tr '\\0' a")
    stdout = outcome.output["stdout"]
    assert stdout.startswith("a" * OUTPUT_CAP_BYTES)
    assert stdout.endswith(f"[truncated: {OUTPUT_CAP_BYTES + 5000} bytes in all, first {OUTPUT_CAP_BYTES} shown]")


@pytest.mark.anyio
async def test_bash_timeout_kills_the_command(ws: Path) -> None:
    kit = Kit(ws)
    outcome = await kit("bash_executor", timeout_secs=1.0, command="echo $$ > pid; exec sleep 60")
    assert outcome.error_code == "TOOL_TIMEOUT"
    assert outcome.transient
    pid = int((ws / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


@pytest.mark.anyio
async def test_python_executor(ws: Path) -> None:
    kit = Kit(ws)
    outcome = await kit("python_executor", code="import os, sys\nprint(os.getcwd())\nprint(sys.executable)")
    assert outcome.ok
    cwd, exe = outcome.output["stdout"].splitlines()
    assert cwd == os.path.realpath(ws)
    assert os.path.realpath(exe) == os.path.realpath(sys.executable)
    failed = await kit("python_executor", code="import sys\nprint('partial')\nsys.exit(4)")
    assert failed.output["exit_code"] == 4 and failed.output["stdout"] == "partial\n"
    crashed = await kit("python_executor", code="1/0")
    assert crashed.output["exit_code"] == 1 and "ZeroDivisionError" in crashed.output["stderr"]


# --- http ---------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Private", "not passed on")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self._reply(302, b"", {"Location": "/elsewhere"})
        elif self.path == "/missing":
            self._reply(404, b'{"error": "missing"}')
        elif self.path == "/big":
            self._reply(200, b"x" * 70_000)
        else:
            echo = {"method": "GET", "path": self.path, "x-test": self.headers.get("x-test")}
            self._reply(200, json.dumps(echo).encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length).decode()
        echo = {"method": "POST", "body": body, "content-type": self.headers.get("Content-Type")}
        self._reply(201, json.dumps(echo).encode())


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.mark.anyio
async def test_http_request(ws: Path, server: str) -> None:
    kit = Kit(ws)
    got = await kit("http_request", url=f"{server}/hello")
    assert got.output["status"] == 200
    assert json.loads(got.output["text"]) == {"method": "GET", "path": "/hello", "x-test": None}
    assert got.output["headers"]["content-type"] == "application/json"
    assert "x-private" not in got.output["headers"]

    posted = await kit("http_request", url=f"{server}/items", method="POST", body={"a": 1})
    assert posted.output["status"] == 201
    echo = json.loads(posted.output["text"])
    assert json.loads(echo["body"]) == {"a": 1} and echo["content-type"] == "application/json"
    text = await kit("http_request", url=f"{server}/items", method="POST", body="plain")
    assert json.loads(text.output["text"])["body"] == "plain"

    missing = await kit("http_request", url=f"{server}/missing")
    assert missing.ok and missing.output["status"] == 404  # a response is a result
    redirect = await kit("http_request", url=f"{server}/redirect")
    assert redirect.output["status"] == 302 and redirect.output["headers"]["location"] == "/elsewhere"
    big = await kit("http_request", url=f"{server}/big")
    assert big.output["text"].startswith("x" * 65_536) and "truncated" in big.output["text"]

    assert (await kit("http_request", url="file:///etc/passwd")).error_code == "BAD_ARGUMENT"
    assert (await kit("http_request", url=f"{server}/", method="BREW")).error_code == "BAD_ARGUMENT"


@pytest.mark.anyio
async def test_http_request_reuses_the_given_client(ws: Path, server: str) -> None:
    async with httpx.AsyncClient(headers={"x-test": "from-client"}) as client:
        kit = Kit(ws, http_client=client)
        got = await kit("http_request", url=f"{server}/")
    assert json.loads(got.output["text"])["x-test"] == "from-client"


@pytest.mark.anyio
async def test_http_connection_refused_is_transient(ws: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        kit = Kit(ws)
        outcome = await kit("http_request", url=f"http://127.0.0.1:{port}/")
    assert outcome.error_code == "TOOL_TRANSIENT"
    assert kit.breakers.get("http_request").consecutive_failures == 1


# --- memory and profile ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_memory_save_and_recall(ws: Path) -> None:
    memory: dict[str, Any] = {}
    kit = Kit(ws, memory=memory)
    assert (await kit("memory_save", key="colour", value={"favourite": "green"})).output == {"key": "colour", "saved": True}
    assert memory == {"colour": {"favourite": "green"}}
    assert (await kit("memory_recall", key="colour")).output == {"key": "colour", "found": True, "value": {"favourite": "green"}}
    assert (await kit("memory_recall", key="other")).output == {"key": "other", "found": False, "value": None}
    assert (await kit("memory_save", key="", value=1)).error_code == "BAD_ARGUMENT"


@pytest.mark.anyio
async def test_profile_propose_fact_goes_to_the_sink(ws: Path) -> None:
    facts: list[str] = []
    kit = Kit(ws, profile_sink=facts.append)
    assert (await kit("profile_propose_fact", fact="Prefers metric units.")).output == {"proposed": "Prefers metric units."}
    assert facts == ["Prefers metric units."]
    assert (await kit("profile_propose_fact", fact=" ")).error_code == "BAD_ARGUMENT"
    assert facts == ["Prefers metric units."]


# --- notebook variables --------------------------------------------------------------------------


class FakeDtypes:
    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return list(self.pairs)


class FakeFrame:
    """Looks like a DataFrame to duck typing: shape, columns, dtypes, head().to_dict()."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.columns = list(rows[0])
        self.shape = (len(rows), len(self.columns))
        self.dtypes = FakeDtypes([(c, "int64" if isinstance(rows[0][c], int) else "object") for c in self.columns])

    def head(self, n: int) -> "FakeFrame":
        return FakeFrame(self.rows[:n])

    def to_dict(self, orient: str = "dict") -> Any:
        assert orient == "records"
        return list(self.rows)

    def __repr__(self) -> str:
        raise AssertionError("a frame must be summarised, never dumped")


class FakeArray:
    """Looks like a numpy array: shape, dtype, slicing and tolist()."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.shape = (len(values),)
        self.dtype = "float64"

    def __getitem__(self, item: slice) -> "FakeArray":
        return FakeArray(self.values[item])

    def tolist(self) -> list[float]:
        return list(self.values)


@pytest.fixture
def namespace() -> dict[str, Any]:
    import numpy
    import pandas

    rows = [{"city": f"c{i}", "people": i * 1000} for i in range(10_000)]
    return {
        "df": pandas.DataFrame(rows),
        "counts": pandas.DataFrame({"a": range(100), "b": [0.5] * 100}),
        "arr": numpy.arange(1_000, dtype="float64"),
        "fake": FakeFrame(rows),
        "fake_arr": FakeArray([1.0]),
        "big": list(range(10_000)),
        "text": "y" * 5_000,
        "small": {"a": [1, 2], "b": "two"},
        "n": 42,
        "_private": 1,
        "In": [""],
        "Out": {},
        "exit": object(),
        "json": json,
        "FakeFrame": FakeFrame,
    }


@pytest.mark.anyio
async def test_notebook_get_variable_summarises_large_objects(ws: Path, namespace: dict[str, Any]) -> None:
    kit = Kit(ws, namespace=lambda: namespace)
    df = (await kit("notebook_get_variable", name="df")).output
    assert df == {  # text columns: no head (its cells could be any object)
        "name": "df",
        "type": "pandas.DataFrame",
        "shape": [10_000, 2],
        "columns": ["city", "people"],
        "dtypes": {"city": "str", "people": "int64"},
    }
    counts = (await kit("notebook_get_variable", name="counts")).output
    assert counts["head"] == [{"a": i, "b": 0.5} for i in range(5)] and counts["shape"] == [100, 2]
    # look-alikes are user code: nothing of theirs runs (FakeFrame's repr raises), the type name is all
    for name in ("fake", "fake_arr"):
        fake = (await kit("notebook_get_variable", name=name)).output
        assert set(fake) == {"name", "type", "note"} and fake["type"].endswith(("FakeFrame", "FakeArray"))
    arr = (await kit("notebook_get_variable", name="arr")).output
    assert arr["shape"] == [1_000] and arr["dtype"] == "float64" and arr["head"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert arr["type"] == "numpy.ndarray"

    big = (await kit("notebook_get_variable", name="big")).output
    assert big["type"] == "list" and big["length"] == 10_000 and big["truncated"] is True
    assert big["head"] == list(range(50))
    text = (await kit("notebook_get_variable", name="text")).output
    assert text["length"] == 5_000 and len(text["head"]) == 2_000 and text["truncated"] is True
    assert (await kit("notebook_get_variable", name="small")).output == {
        "name": "small", "type": "dict", "length": 2, "value": {"a": [1, 2], "b": "two"}
    }
    assert (await kit("notebook_get_variable", name="n")).output == {"name": "n", "type": "int", "value": 42}
    missing = await kit("notebook_get_variable", name="nothing")
    assert missing.error_code == "TOOL_PERMANENT" and "no variable named 'nothing'" in missing.error.message


def test_summaries_stay_small() -> None:
    nested = {"rows": [list(range(1_000)) for _ in range(10)], "blob": "z" * 10_000}
    summary = summarize_value(nested)
    assert len(json.dumps(summary)) < 5_000
    assert summary["value"]["rows"][0][-1] == "… 950 more items"
    assert summary["value"]["blob"].endswith("[10000 characters]")


@pytest.mark.anyio
async def test_notebook_list_variables_skips_private_modules_and_ipython(ws: Path, namespace: dict[str, Any]) -> None:
    kit = Kit(ws, namespace=lambda: namespace)
    listed = (await kit("notebook_list_variables")).output
    names = [v["name"] for v in listed["variables"]]
    assert names == ["arr", "big", "counts", "df", "fake", "fake_arr", "n", "small", "text"]  # no class, no module
    assert listed["total"] == 9
    by_name = {v["name"]: v for v in listed["variables"]}
    assert by_name["df"]["summary"] == "pandas.DataFrame shape (10000, 2)"
    assert by_name["fake"]["summary"] == f"<{FakeFrame.__module__}.FakeFrame>"
    assert by_name["big"]["summary"] == "list of length 10000"
    assert by_name["n"] == {"name": "n", "type": "int", "summary": "42"}


@pytest.mark.anyio
async def test_notebook_set_variable(ws: Path, namespace: dict[str, Any]) -> None:
    kit = Kit(ws, namespace=lambda: namespace)
    assert (await kit("notebook_set_variable", name="result", value={"total": 3})).output == {"name": "result", "type": "dict"}
    assert namespace["result"] == {"total": 3}
    for bad in ("_hidden", "In", "class", "not a name", "get_ipython"):
        assert (await kit("notebook_set_variable", name=bad, value=1)).error_code == "BAD_ARGUMENT", bad
    assert "_hidden" not in namespace and namespace["In"] == [""]
