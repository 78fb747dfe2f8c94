"""The built-in tools and the workspace they are confined to.

Each built-in is a plain function turned into a ``ToolDef`` with its family;
nothing here decides whether a call may run — governance did that before
``invoke`` reached the body. What the bodies do guard is the workspace and the
home: every path is taken relative to the agent's workspace root, resolved with
``os.path.realpath`` (so symbolic links, of the file or of any parent
directory, are followed) and refused with ``PATH_IN_HOME`` when the result is in
the apollia home, with ``PATH_ESCAPE`` when it is not inside the root. That check
is a property of the tool, not a decision: even an approved call cannot read
``/etc/passwd`` or the journal's key through ``read_file``. The file tools carry
their resolver (``ToolDef.resolve_path``) so governance matches deny rules on the
same resolved file (``runtime/paths.py``). The executors run in the workspace
without the runtime's ``APOLLIA_*`` variables.

Outputs are bounded: command output, file contents, HTTP bodies and notebook
variables are capped or summarised so one call cannot flood the journal or the
model's context. Large notebook objects (DataFrame- or array-like, duck-typed
by ``shape``/``dtypes``/``columns``) are described, never dumped.
"""

from __future__ import annotations

import keyword
import os
import signal
import subprocess
import sys
import types
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc

from apollia_nb.errors import BadArgument, PathEscape, PermanentToolError
from apollia_nb.governance.decision import Family
from apollia_nb.home import resolve_home
from apollia_nb.runtime.paths import FILE_TOOLS, inside, resolve_tool_path
from apollia_nb.runtime.tools import ToolDef, to_jsonable

__all__ = [
    "builtin_tools",
    "resolve_in_workspace",
    "summarize_value",
    "short_summary",
    "BUILTIN_FAMILIES",
    "READ_CAP_BYTES",
    "OUTPUT_CAP_BYTES",
    "HTTP_TEXT_CAP",
    "LIST_CAP",
    "HIDDEN_NOTEBOOK_NAMES",
]

READ_CAP_BYTES = 1_048_576
"""``read_file`` returns at most this many bytes of a file."""
OUTPUT_CAP_BYTES = 65_536
"""``bash_executor`` / ``python_executor`` keep at most this much of stdout and of stderr."""
HTTP_TEXT_CAP = 65_536
"""``http_request`` reads at most this many bytes of a response body."""
LIST_CAP = 1_000
"""``list_dir`` and ``notebook_list_variables`` list at most this many entries."""

HIDDEN_NOTEBOOK_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})

BUILTIN_FAMILIES: dict[str, Family] = {
    "read_file": Family.READ,
    "list_dir": Family.READ,
    "write_file": Family.WRITE,
    "delete_file": Family.WRITE,
    "bash_executor": Family.EXECUTE,
    "python_executor": Family.EXECUTE,
    "http_request": Family.SEND,
    "memory_save": Family.MEMORY,
    "memory_recall": Family.MEMORY,
    "profile_propose_fact": Family.PROFILE,
    "notebook_get_variable": Family.READ,
    "notebook_list_variables": Family.READ,
    "notebook_set_variable": Family.WRITE,
}

_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_HTTP_HEADERS = ("content-type", "content-length", "location", "date", "etag", "last-modified", "retry-after")


# --- the workspace ----------------------------------------------------------------------


def resolve_in_workspace(workspace: Path | str, path: str, *, home: Path | str | None = None) -> Path:
    """The real path ``path`` names inside the workspace, or ``PATH_ESCAPE`` (``PATH_IN_HOME``).

    Relative paths are relative to the workspace root; absolute paths are
    accepted only when they resolve inside it. Symbolic links are followed
    before the check, so a link (or a linked parent directory) pointing
    outside is refused even when its own name is inside. The file tools and
    governance share this resolution: ``paths.resolve_tool_path``.
    """
    return resolve_tool_path(workspace, path, home=home).real


def url_aliases(url: Any) -> tuple[str, ...]:
    """Where ``http_request`` sends ``url``, as its HTTP client reads it: the names a deny
    rule is also matched against (``Call.aliases``).

    ``https://example.org\\@api.example.com/`` goes to ``api.example.com``, so its alias
    is ``https://api.example.com/``; ``HTTP://127.1`` is also ``http://127.0.0.1``. A URL
    the client cannot read is refused here, before anything is decided.
    """
    import ipaddress
    import socket

    import httpx

    from apollia_nb.governance.decision import url_form

    if not isinstance(url, str):
        return ()
    try:
        parsed = httpx.URL(url)
    except Exception as exc:
        raise BadArgument(f"http_request: the URL cannot be read: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        return ()
    path = parsed.raw_path.decode("ascii", "replace")
    port = f":{parsed.port}" if parsed.port is not None else ""
    hosts = [parsed.host]
    try:
        hosts.append(socket.inet_ntoa(socket.inet_aton(parsed.host)))  # 127.1, 0x7f.1, 2130706433
    except OSError:
        pass
    try:
        address = ipaddress.ip_address(parsed.host)
        hosts.append(str(address))
        if address.version == 6 and address.ipv4_mapped is not None:
            hosts.append(str(address.ipv4_mapped))
    except ValueError:
        pass
    names = []
    for host in hosts:
        shown = f"[{host}]" if ":" in host else host
        names.append(url_form(f"{parsed.scheme}://{shown}{port}{path}"))
    return tuple(dict.fromkeys(names))


def _child_environment() -> dict[str, str]:
    """The executors' environment: this process's, without any ``APOLLIA_*`` variable
    (the home's location, the server's token)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("APOLLIA_")}


# --- subprocesses ---------------------------------------------------------------------


class _Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept.extend(chunk[:room])

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n… [truncated: {self.total} bytes in all, first {len(self.kept)} shown]"
        return text


async def _drain(stream: anyio.abc.ByteReceiveStream | None, capture: _Capture) -> None:
    if stream is None:
        return
    try:
        async for chunk in stream:
            capture.add(chunk)
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        return


async def _feed(stream: anyio.abc.ByteSendStream | None, data: bytes) -> None:
    if stream is None:
        return
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
        pass
    finally:
        await stream.aclose()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _run_process(argv: list[str], *, cwd: Path, stdin: bytes | None, cap: int) -> dict[str, Any]:
    """Run a command in its own process group; on cancellation (the tool's timeout) kill the group.

    The child gets no open descriptor of this process (the home's databases) and
    no ``APOLLIA_*`` variable. When the command ends (or times out) its process
    group is killed: a job it started in the background does not outlive the call.
    """
    process = await anyio.open_process(
        argv,
        cwd=cwd,
        env=_child_environment(),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    out, err = _Capture(cap), _Capture(cap)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_drain, process.stdout, out)
            group.start_soon(_drain, process.stderr, err)
            if stdin is not None:
                group.start_soon(_feed, process.stdin, stdin)
        code = await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            # The whole group ends with the call, also what it left in the background
            # (`sleep 9 && rm x &`): nothing of an approved call acts after its result.
            _kill_group(process.pid)
            await process.aclose()
    return {"exit_code": code, "stdout": out.text(), "stderr": err.text()}


# --- notebook summaries -------------------------------------------------------------


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _attr(value: Any, name: str) -> Any:
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _is_array_like(value: Any) -> bool:
    if isinstance(value, type):
        return False
    shape = _attr(value, "shape")
    if not isinstance(shape, tuple):
        return False
    return any(_attr(value, name) is not None for name in ("columns", "dtypes", "dtype"))


def _bounded(value: Any, items: int, chars: int, depth: int = 0) -> Any:
    """A JSON value with long strings, lists and dicts cut, each cut saying how much was left out."""
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}… [{len(value)} characters]"
    if depth > 4:
        return to_jsonable(value) if isinstance(value, (int, float, bool, type(None))) else short_summary(value)
    if isinstance(value, dict):
        out = {str(k): _bounded(v, items, chars, depth + 1) for k, v in list(value.items())[:items]}
        if len(value) > items:
            out["…"] = f"{len(value) - items} more keys"
        return out
    if isinstance(value, (list, tuple)):
        out_list = [_bounded(v, items, chars, depth + 1) for v in list(value[:items])]
        if len(value) > items:
            out_list.append(f"… {len(value) - items} more items")
        return out_list
    if _is_array_like(value):
        return short_summary(value)
    converted = to_jsonable(value)
    if isinstance(converted, str) and len(converted) > chars:
        return f"{converted[:chars]}… [{len(converted)} characters]"
    return converted


def _head(value: Any) -> Any:
    head_fn = _attr(value, "head")
    if callable(head_fn):
        head = head_fn(5)
        to_dict = _attr(head, "to_dict")
        if callable(to_dict):
            try:
                return _bounded(to_dict(orient="records"), 5, 200)
            except TypeError:
                return _bounded(to_dict(), 5, 200)
        return short_summary(head)
    tolist = _attr(value, "tolist")
    if callable(tolist):
        return _bounded(value[:5].tolist(), 5, 200)
    return None


def summarize_value(value: Any, *, items: int = 50, chars: int = 2_000) -> dict[str, Any]:
    """What an agent sees of a notebook variable: always a ``type``; small values whole,
    long ones cut with their length, DataFrame/array-like objects described."""
    summary: dict[str, Any] = {"type": _type_name(value)}
    if _is_array_like(value):
        shape = _attr(value, "shape")
        summary["shape"] = [int(n) if isinstance(n, int) else str(n) for n in shape]
        columns = _attr(value, "columns")
        if columns is not None:
            try:
                names = [str(c) for c in list(columns)]
            except Exception:
                names = []
            summary["columns"] = names[:items]
            if len(names) > items:
                summary["columns_total"] = len(names)
        dtypes = _attr(value, "dtypes")
        dtype = _attr(value, "dtype")
        if dtypes is not None and callable(_attr(dtypes, "items")):
            try:
                summary["dtypes"] = {str(k): str(v) for k, v in list(dtypes.items())[:items]}
            except Exception:
                summary["dtypes"] = str(dtypes)[:chars]
        elif dtype is not None:
            summary["dtype"] = str(dtype)
        try:
            head = _head(value)
        except Exception:
            head = None
        if head is not None:
            summary["head"] = head
        return summary
    if isinstance(value, str):
        summary["length"] = len(value)
        if len(value) > chars:
            summary["head"] = value[:chars]
            summary["truncated"] = True
        else:
            summary["value"] = value
        return summary
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        seq: Any = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        summary["length"] = len(value)
        if len(value) > items:
            cut = dict(list(seq.items())[:items]) if isinstance(seq, dict) else list(seq)[:items]
            summary["head"] = _bounded(cut, items, 200)
            summary["truncated"] = True
        else:
            summary["value"] = _bounded(seq if isinstance(seq, dict) else list(seq), items, 200)
        return summary
    if value is None or isinstance(value, (bool, int, float)):
        summary["value"] = to_jsonable(value)
        return summary
    text = to_jsonable(value) if not isinstance(value, (types.FunctionType, type)) else repr(value)
    if isinstance(text, str):
        summary["repr"] = text if len(text) <= chars else f"{text[:chars]}… [{len(text)} characters]"
    else:
        summary["value"] = _bounded(text, items, 200)
    return summary


def short_summary(value: Any) -> str:
    """One line about a value, for listings."""
    if _is_array_like(value):
        shape = _attr(value, "shape")
        return f"{_type_name(value)} shape {tuple(shape)}"
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return f"{_type_name(value)} of length {len(value)}"
    try:
        text = repr(value)
    except Exception:
        text = f"<{_type_name(value)}>"
    return text if len(text) <= 80 else f"{text[:77]}..."


def _listed(name: str, value: Any) -> bool:
    return not (name.startswith("_") or name in HIDDEN_NOTEBOOK_NAMES or isinstance(value, types.ModuleType))


# --- the tools --------------------------------------------------------------------------


def builtin_tools(
    workspace: Path,
    *,
    memory: MutableMapping[str, Any] | None = None,
    profile_sink: Callable[[str], None] | None = None,
    namespace: Callable[[], MutableMapping[str, Any]] | None = None,
    http_client: Any = None,
    python: str = sys.executable,
    exec_timeout_secs: float = 120.0,
    http_timeout_secs: float = 30.0,
    home: Path | str | None = None,
) -> list[ToolDef]:
    """The built-in tools for one agent.

    ``workspace`` confines the file tools and is the working directory of the
    executors. ``memory`` is the agent's memory mapping (a private dict when
    omitted; the runtime persists the one it passes). ``profile_propose_fact``
    is present only with a ``profile_sink``, the notebook tools only with a
    ``namespace`` (a callable returning the kernel's user namespace).
    ``http_client`` is an ``httpx.AsyncClient`` to reuse; without one each
    request opens its own. ``python`` is the interpreter ``python_executor`` runs.
    ``home`` is the apollia home no file tool may reach (default: the home this
    process resolves, ``$APOLLIA_HOME`` or ``~/.apollia``).
    """
    root = os.path.realpath(workspace)
    home_path = os.path.realpath(resolve_home() if home is None else home)
    store: MutableMapping[str, Any] = {} if memory is None else memory

    def resolve(path: Any) -> Any:
        """The one resolution of a file tool's path: the tool's own and governance's."""
        return resolve_tool_path(workspace, path, home=home_path)

    def read_file(path: str) -> str:
        """Read a text file in the workspace (at most 1 MiB is returned).

        Args:
            path: file path relative to the workspace root
        """
        real = resolve(path).real
        with open(real, "rb") as handle:
            data = handle.read(READ_CAP_BYTES + 1)
        text = data[:READ_CAP_BYTES].decode("utf-8", errors="replace")
        if len(data) > READ_CAP_BYTES:
            size = os.path.getsize(real)
            text += f"\n… [truncated: the file has {size} bytes, first {READ_CAP_BYTES} shown]"
        return text

    def list_dir(path: str = ".") -> dict[str, Any]:
        """List a directory in the workspace: name, type (file, dir, symlink, other) and size.

        Args:
            path: directory path relative to the workspace root
        """
        resolved = resolve(path)
        real = resolved.real
        entries: list[dict[str, Any]] = []
        with os.scandir(real) as scan:
            found = sorted(scan, key=lambda e: e.name)
        for entry in found[:LIST_CAP]:
            if entry.is_symlink():
                kind, size = "symlink", None
            elif entry.is_dir():
                kind, size = "dir", None
            elif entry.is_file():
                kind, size = "file", entry.stat().st_size
            else:
                kind, size = "other", None
            entries.append({"name": entry.name, "type": kind, "size": size})
        return {"path": resolved.relative, "entries": entries, "total": len(found)}

    def write_file(path: str, content: str) -> dict[str, Any]:
        """Write a text file in the workspace, creating parent directories; replaces an existing file.

        Args:
            path: file path relative to the workspace root
            content: the full text to write
        """
        resolved = resolve(path)
        real = resolved.real
        if str(real) == root or real.is_dir():
            raise PermanentToolError(f"write_file: {path!r} is a directory")
        real.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        real.write_bytes(data)
        return {"path": resolved.relative, "bytes": len(data)}

    def delete_file(path: str) -> dict[str, Any]:
        """Delete one file (or symbolic link) in the workspace; directories are refused.

        Args:
            path: file path relative to the workspace root
        """
        resolved = resolve(path)
        target = resolved.entry  # the link itself when the name is a symbolic link
        name = os.path.basename(os.path.join(root, path).rstrip(os.sep))
        if str(resolved.real) == root or str(target) == root or name in ("", ".", ".."):
            raise PermanentToolError(f"delete_file: refusing to delete the workspace root or a directory ({path!r})")
        if not inside(str(target.parent), root):
            raise PathEscape(f"{path!r} is outside the workspace {root}")
        if not target.is_symlink() and target.is_dir():
            raise PermanentToolError(f"delete_file: {path!r} is a directory; only files are deleted")
        target.unlink()
        return {"path": os.path.relpath(target, root), "deleted": True}

    async def bash_executor(command: str) -> dict[str, Any]:
        """Run one shell command with bash in the workspace; returns exit_code, stdout and stderr.

        Args:
            command: the command line
        """
        if not command.strip():
            raise BadArgument("bash_executor: the command is empty")
        return await _run_process(["bash", "-c", command], cwd=Path(root), stdin=None, cap=OUTPUT_CAP_BYTES)

    async def python_executor(code: str) -> dict[str, Any]:
        """Run Python code in a fresh interpreter in the workspace; returns exit_code, stdout and stderr.

        Args:
            code: the program text
        """
        return await _run_process(
            [python, "-"], cwd=Path(root), stdin=code.encode("utf-8"), cap=OUTPUT_CAP_BYTES
        )

    async def http_request(
        url: str, method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET",
        body: str | dict | list | None = None,
    ) -> dict[str, Any]:
        """Send an HTTP request (redirects are not followed); returns status, some headers and the text.

        Args:
            url: an http:// or https:// URL
            method: the HTTP method
            body: text, or a JSON object or array sent as JSON
        """
        import httpx  # imported on first use: it is not needed to load the extension

        if not url.lower().startswith(("http://", "https://")):
            raise BadArgument(f"http_request: only http:// and https:// URLs are sent, got {url!r}")
        options: dict[str, Any] = {}
        if isinstance(body, str):
            options["content"] = body.encode("utf-8")
        elif body is not None:
            options["json"] = body
        capture = _Capture(HTTP_TEXT_CAP)

        async def send(client: Any) -> dict[str, Any]:
            async with client.stream(method, url, **options) as response:
                async for chunk in response.aiter_bytes():
                    capture.add(chunk)
                    if capture.total > HTTP_TEXT_CAP:
                        break
                headers = {k: response.headers[k] for k in _HTTP_HEADERS if k in response.headers}
                text = bytes(capture.kept).decode(response.encoding or "utf-8", errors="replace")
                if capture.total > len(capture.kept):
                    text += f"\n… [truncated: first {len(capture.kept)} bytes shown]"
                return {"status": response.status_code, "headers": headers, "text": text}

        if http_client is not None:
            return await send(http_client)
        async with httpx.AsyncClient(timeout=http_timeout_secs, follow_redirects=False) as client:
            return await send(client)

    def memory_save(key: str, value: Any) -> dict[str, Any]:
        """Remember a value under a key in this agent's memory (replaces the previous value).

        Args:
            key: a short name for the memory
            value: any JSON value
        """
        if not key.strip() or len(key) > 200:
            raise BadArgument("memory_save: the key must be 1 to 200 characters")
        store[key] = to_jsonable(value)
        return {"key": key, "saved": True}

    def memory_recall(key: str) -> dict[str, Any]:
        """Recall what this agent saved under a key.

        Args:
            key: the name it was saved under
        """
        if key in store:
            return {"key": key, "found": True, "value": store[key]}
        return {"key": key, "found": False, "value": None}

    def profile_propose_fact(fact: str) -> dict[str, Any]:
        """Propose a fact for the user's profile (a person confirms each one).

        Args:
            fact: one sentence about the user
        """
        if not fact.strip():
            raise BadArgument("profile_propose_fact: the fact is empty")
        assert profile_sink is not None
        profile_sink(fact)
        return {"proposed": fact}

    def notebook_get_variable(name: str) -> dict[str, Any]:
        """Look at a variable of the notebook; large objects are summarised (type, shape, columns, head).

        Args:
            name: the variable name
        """
        assert namespace is not None
        ns = namespace()
        if name not in ns:
            raise PermanentToolError(f"notebook_get_variable: no variable named {name!r} in the notebook")
        return {"name": name, **summarize_value(ns[name])}

    def notebook_list_variables() -> dict[str, Any]:
        """List the notebook's variables with their type and a one-line summary."""
        assert namespace is not None
        listed = [(n, v) for n, v in list(namespace().items()) if _listed(n, v)]
        listed.sort(key=lambda item: item[0])
        variables = [
            {"name": n, "type": _type_name(v), "summary": short_summary(v)} for n, v in listed[:LIST_CAP]
        ]
        return {"variables": variables, "total": len(listed)}

    def notebook_set_variable(name: str, value: Any) -> dict[str, Any]:
        """Set a variable in the notebook to a JSON value.

        Args:
            name: a Python identifier not starting with _
            value: any JSON value
        """
        assert namespace is not None
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in HIDDEN_NOTEBOOK_NAMES:
            raise BadArgument(f"notebook_set_variable: {name!r} is not a name an agent may set")
        namespace()[name] = value
        return {"name": name, "type": _type_name(value)}

    def make(fn: Callable[..., Any], timeout: float | None = None) -> ToolDef:
        options: dict[str, Any] = {} if timeout is None else {"timeout_secs": timeout}
        if fn.__name__ in FILE_TOOLS:
            options["resolve_path"] = resolve
        if fn.__name__ == "bash_executor":
            options["shell"] = True  # the one built-in whose first argument bash reads
        if fn.__name__ == "http_request":
            options["aliases"] = url_aliases
        return ToolDef.from_function(fn, BUILTIN_FAMILIES[fn.__name__], **options)

    tools = [
        make(read_file),
        make(list_dir),
        make(write_file),
        make(delete_file),
        make(bash_executor, exec_timeout_secs),
        make(python_executor, exec_timeout_secs),
        make(http_request, http_timeout_secs),
        make(memory_save),
        make(memory_recall),
    ]
    if profile_sink is not None:
        tools.append(make(profile_propose_fact))
    if namespace is not None:
        tools += [make(notebook_get_variable), make(notebook_list_variables), make(notebook_set_variable)]
    return tools
