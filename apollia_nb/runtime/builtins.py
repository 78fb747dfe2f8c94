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

import json
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
    "IPYTHON_NAMES",
]

READ_CAP_BYTES = 1_048_576
"""``read_file`` returns at most this many bytes of a file."""
OUTPUT_CAP_BYTES = 65_536
"""``bash_executor`` / ``python_executor`` keep at most this much of stdout and of stderr."""
HTTP_TEXT_CAP = 65_536
"""``http_request`` reads at most this many bytes of a response body."""
LIST_CAP = 1_000
"""``list_dir`` and ``notebook_list_variables`` list at most this many entries."""
FIGURE_CAP = 8
"""``python_executor`` returns at most this many matplotlib figures of a run (as PNG images)."""

HIDDEN_NOTEBOOK_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
"""Names IPython binds in the user namespace: never listed, read or set by an agent."""
IPYTHON_NAMES = frozenset({"display", "get_ipython", "In", "Out", "exit", "quit"})
"""Names an agent may not set (besides every Python builtin): what a notebook relies on."""

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


# --- figures of python_executor ---------------------------------------------------------
#
# The program runs in a fresh interpreter, never in the kernel: its figures reach the agent as PNG
# files written to a folder of this call (outside the workspace), by a matplotlib backend of ours
# (``show()`` saves the open figures and closes them) and, when the program ends, for the figures
# still open. The folder is read back as image bytes only (``image_descriptor`` checks each one), at
# most ``FIGURE_CAP`` of them; the result carries them as images, described by digest like any
# tool's image.

_FIGURE_BACKEND = "_apollia_figures"
_FIGURE_BACKEND_SOURCE = f'''"""matplotlib backend of apollia_nb's python_executor: figures become PNG files."""
import os
import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401

FOLDER = os.path.dirname(os.path.abspath(__file__))
_saved = [0]


def save_open():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for number in plt.get_fignums():
        figure = plt.figure(number)
        if _saved[0] < {FIGURE_CAP}:
            _saved[0] += 1
            figure.savefig(os.path.join(FOLDER, "figure-%03d.png" % _saved[0]), format="png")
        plt.close(figure)


def show(*args, **kwargs):
    save_open()
'''
# Runs the program from stdin as ``python -`` would (in ``__main__``, its frames named ``<stdin>``),
# then saves the figures left open.
_FIGURE_BOOTSTRAP = """\
def _apollia_run():
    import sys, traceback
    folder = sys.argv[1]
    sys.argv[:] = ["-"]
    sys.path.append(folder)
    source = sys.stdin.read()
    namespace = sys.modules["__main__"].__dict__
    namespace.pop("_apollia_run", None)
    try:
        exec(compile(source, "<stdin>", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.exit(1)
    finally:
        if "matplotlib.pyplot" in sys.modules:
            try:
                import _apollia_figures
                _apollia_figures.save_open()
            except Exception as exc:
                print("python_executor: the open figures could not be saved: %r" % (exc,), file=sys.stderr)
_apollia_run()
"""


def _figure_images(folder: Path) -> list[bytes]:
    """The PNG figures a run left in its folder, in order, at most ``FIGURE_CAP`` (larger than
    ``IMAGE_MAX_BYTES`` ones are left out: they could not be given to a model)."""
    from apollia_nb.runtime.outputs import IMAGE_MAX_BYTES

    images = []
    for name in sorted(os.listdir(folder))[:FIGURE_CAP + 1]:
        path = folder / name
        if not (name.startswith("figure-") and name.endswith(".png")) or path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as handle:
            data = handle.read(IMAGE_MAX_BYTES + 1)
        if len(data) <= IMAGE_MAX_BYTES and data.startswith(b"\x89PNG\r\n\x1a\n"):
            images.append(data)
    return images[:FIGURE_CAP]


async def _run_python(python: str, code: str, *, cwd: Path, cap: int) -> dict[str, Any]:
    """``python_executor``'s run: the program in a fresh interpreter, with its figures as images."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="apollia-figures-") as tmp:
        folder = Path(tmp)
        (folder / f"{_FIGURE_BACKEND}.py").write_text(_FIGURE_BACKEND_SOURCE, encoding="utf-8")
        env = {**_child_environment(), "MPLBACKEND": f"module://{_FIGURE_BACKEND}"}
        result = await _run_process([python, "-c", _FIGURE_BOOTSTRAP, str(folder)], cwd=cwd,
                                    stdin=code.encode("utf-8"), cap=cap, env=env)
        images = await anyio.to_thread.run_sync(_figure_images, folder)
    if images:
        result["images"] = images
    return result


async def _run_process(argv: list[str], *, cwd: Path, stdin: bytes | None, cap: int,
                       env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a command in its own process group; on cancellation (the tool's timeout) kill the group.

    The child gets no open descriptor of this process (the home's databases) and
    no ``APOLLIA_*`` variable. When the command ends (or times out) its process
    group is killed: a job it started in the background does not outlive the call.
    """
    process = await anyio.open_process(
        argv,
        cwd=cwd,
        env=_child_environment() if env is None else env,
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
#
# Reading a notebook variable runs no code of the notebook's: no ``repr``, ``__getattr__``,
# property or ``__len__`` of a user class is ever called. Only exact built-in types (numbers,
# text, bytes and lists, tuples, dicts and sets of those) and real pandas/numpy objects (shape,
# dtypes, columns; a head only of numeric data) are read; anything else is shown by its type name.

_PLAIN_TYPES = (type(None), bool, int, float, str, bytes)
_CONTAINER_TYPES = (list, tuple, dict, set, frozenset)
_NUMERIC_KINDS = frozenset("biuf")
_NOT_SHOWN = "not shown: only numbers, text, bytes, containers of those and pandas/numpy objects are read"


def _type_name(value: Any) -> str:
    """``module.Qualname`` of the value's type, read from the type itself (no user code)."""
    kind = type(value)
    module = type.__dict__["__module__"].__get__(kind)
    qualname = type.__dict__["__qualname__"].__get__(kind)
    return qualname if module == "builtins" else f"{module}.{qualname}"


def _array_kind(value: Any) -> str | None:
    """``"frame"``, ``"series"`` or ``"array"`` for a real pandas/numpy object, else None."""
    kind = type(value)
    pandas, numpy = sys.modules.get("pandas"), sys.modules.get("numpy")
    if pandas is not None and kind is getattr(pandas, "DataFrame", None):
        return "frame"
    if pandas is not None and kind is getattr(pandas, "Series", None):
        return "series"
    if numpy is not None and kind is getattr(numpy, "ndarray", None):
        return "array"
    return None


def _plain(value: Any, items: int, chars: int, depth: int = 0) -> Any:
    """A JSON value for exact built-in data, cut (saying how much was left out); other values by type name."""
    kind = type(value)
    if kind is str:
        return value if len(value) <= chars else f"{value[:chars]}… [{len(value)} characters]"
    if kind in _PLAIN_TYPES:
        return to_jsonable(value)
    if kind not in _CONTAINER_TYPES or depth > 4:
        return f"<{_type_name(value)}>"
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in list(value.items())[:items]:
            out[to_jsonable(key) if type(key) is str else f"<{_type_name(key)}>" if type(key) not in _PLAIN_TYPES
                else str(to_jsonable(key))] = _plain(item, items, chars, depth + 1)
        if len(value) > items:
            out["…"] = f"{len(value) - items} more keys"
        return out
    seq = list(value)
    if kind in (set, frozenset) and all(type(v) in _PLAIN_TYPES for v in seq):
        seq.sort(key=lambda v: (type(v).__name__, repr(v)))
    out_list = [_plain(v, items, chars, depth + 1) for v in seq[:items]]
    if len(seq) > items:
        out_list.append(f"… {len(seq) - items} more items")
    return out_list


def _array_summary(value: Any, kind: str, items: int) -> dict[str, Any]:
    summary: dict[str, Any] = {"shape": [int(n) for n in value.shape]}
    if kind == "frame":
        names = [to_jsonable(c) if type(c) in _PLAIN_TYPES else f"<{_type_name(c)}>" for c in list(value.columns)]
        summary["columns"] = names[:items]
        if len(names) > items:
            summary["columns_total"] = len(names)
        dtypes = list(value.dtypes.items())
        summary["dtypes"] = {str(n): str(d) for n, d in zip(names, (d for _, d in dtypes))}
        if all(getattr(d, "kind", "O") in _NUMERIC_KINDS for _, d in dtypes):
            summary["head"] = _plain(value.head(5).to_dict(orient="records"), 5, 200)
        return summary
    summary["dtype"] = str(value.dtype)
    if value.dtype.kind in _NUMERIC_KINDS:
        flat = value.reshape(-1) if kind == "array" else value
        summary["head"] = _plain(flat[:5].tolist(), 5, 200)
    return summary


def summarize_value(value: Any, *, items: int = 50, chars: int = 2_000) -> dict[str, Any]:
    """What an agent sees of a notebook variable: always a ``type``; small values whole,
    long ones cut with their length, pandas/numpy objects described, any other object by its
    type name only (no code of the notebook runs)."""
    summary: dict[str, Any] = {"type": _type_name(value)}
    kind = type(value)
    array = _array_kind(value)
    if array is not None:
        return {**summary, **_array_summary(value, array, items)}
    if kind is str:
        summary["length"] = len(value)
        if len(value) > chars:
            summary["head"] = value[:chars]
            summary["truncated"] = True
        else:
            summary["value"] = value
        return summary
    if kind is bytes:
        summary["length"] = len(value)
        summary["value"] = to_jsonable(value[:chars])
        if len(value) > chars:
            summary["truncated"] = True
        return summary
    if kind in _CONTAINER_TYPES:
        summary["length"] = len(value)
        shown = _plain(value, items, 200)
        if len(value) > items:
            if kind is dict:
                shown.pop("…")
            else:
                shown.pop()
            summary["head"], summary["truncated"] = shown, True
        else:
            summary["value"] = shown
        return summary
    if kind in _PLAIN_TYPES:
        summary["value"] = to_jsonable(value)
        return summary
    summary["note"] = _NOT_SHOWN
    return summary


def short_summary(value: Any) -> str:
    """One line about a value, for listings (no code of the notebook runs)."""
    kind = type(value)
    array = _array_kind(value)
    if array is not None:
        return f"{_type_name(value)} shape {tuple(int(n) for n in value.shape)}"
    if kind in (str, bytes, *_CONTAINER_TYPES):
        return f"{_type_name(value)} of length {len(value)}"
    if kind in _PLAIN_TYPES:
        text = json.dumps(to_jsonable(value), ensure_ascii=False)
        return text if len(text) <= 80 else f"{text[:77]}..."
    return f"<{_type_name(value)}>"


def _unreadable(name: str, value: Any) -> str | None:
    """Why an agent may not read (or list) this notebook variable, or None."""
    kind = type(value)
    if name.startswith("_") or name in HIDDEN_NOTEBOOK_NAMES:
        return "private, or IPython's input and output history"
    if issubclass(kind, types.ModuleType):
        return "a module"
    if value is os.environ or issubclass(kind, type(os.environ)) or value is getattr(os, "environb", None):
        return "the process environment"
    if type.__dict__["__module__"].__get__(kind).split(".")[0] == "apollia_nb":
        return "an object of the agent runtime"
    if callable(value):
        return "a function or class"
    return None


def _listed(name: str, value: Any) -> bool:
    return _unreadable(name, value) is None


def _settable(name: str, current: Any) -> str | None:
    """Why an agent may not set this name in the notebook, or None."""
    import builtins

    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        return "not a public Python identifier"
    if name in HIDDEN_NOTEBOOK_NAMES or name in IPYTHON_NAMES:
        return "an IPython name"
    if name in vars(builtins):
        return "a Python builtin"
    if current is not _MISSING and _unreadable(name, current) is not None:
        return f"bound to {_unreadable(name, current)}"
    return None


_MISSING = object()


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
    http_proxy: str | None = None,
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
    process resolves, ``$APOLLIA_HOME`` or ``~/.apollia``). ``http_request`` ignores the
    proxy environment variables (``HTTP_PROXY``, ``ALL_PROXY``, …): it goes through
    ``http_proxy`` when one is configured (``[tools.http_request] proxy``), shown on its cards.
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
        """Run Python code in a fresh interpreter in the workspace; returns exit_code, stdout and stderr,
        and the matplotlib figures it drew (shown, or open at its end) as PNG images.

        Args:
            code: the program text
        """
        return await _run_python(python, code, cwd=Path(root), cap=OUTPUT_CAP_BYTES)

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
        async with httpx.AsyncClient(timeout=http_timeout_secs, follow_redirects=False, trust_env=False,
                                     proxy=http_proxy) as client:
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
        why = _unreadable(name, None)  # refused by name before looking: the answer never says what exists
        if why is None and name not in ns:
            raise PermanentToolError(f"notebook_get_variable: no variable named {name!r} in the notebook")
        value = ns.get(name)
        why = why or _unreadable(name, value)
        if why is not None:
            raise BadArgument(f"notebook_get_variable: {name!r} is not a variable an agent may read ({why})")
        return {"name": name, **summarize_value(value)}

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
        ns = namespace()
        why = _settable(name, ns.get(name, _MISSING))
        if why is not None:
            raise BadArgument(f"notebook_set_variable: {name!r} is not a name an agent may set ({why})")
        ns[name] = value
        return {"name": name, "type": _type_name(value)}

    def make(fn: Callable[..., Any], timeout: float | None = None) -> ToolDef:
        options: dict[str, Any] = {} if timeout is None else {"timeout_secs": timeout}
        if fn.__name__ in FILE_TOOLS:
            options["resolve_path"] = resolve
        if fn.__name__ == "bash_executor":
            options["shell"] = True  # the one built-in whose first argument bash reads
        if fn.__name__ == "http_request":
            options["aliases"] = url_aliases
            if http_proxy:
                options["annotations"] = {"proxy": http_proxy}  # shown on the call's card
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
