"""Where a file tool's path leads: one resolver for the tool and for governance.

A file tool (``read_file``, ``list_dir``, ``write_file``, ``delete_file``) takes a
path as the agent wrote it and acts on the file it resolves to. The same path
must be what a deny rule sees, so the tool body and the edge that builds the
governed ``Call`` both ask ``resolve_tool_path`` — one function, so they can never
disagree about which file a path names.

Resolution, in order (each refusal is a permanent tool error):

1. the path must be a non-empty string without a NUL byte (``BAD_ARGUMENT``,
   ``PATH_ESCAPE`` for the NUL byte);
2. it is joined to the workspace root (an absolute path is kept as it is; ``~``
   is a plain name, never the user's home) and resolved with
   ``os.path.realpath``: ``..``, ``.``, repeated slashes and every symbolic
   link are gone;
3. a result in the apollia home, or the home itself, is ``PATH_IN_HOME`` —
   whatever the workspace, so the home stays out of reach even if a workspace
   came to contain it; so is a hard link to a file of the home (the same file
   under a name in the workspace, which ``realpath`` cannot see);
4. a result outside the workspace root is ``PATH_ESCAPE``.

The result, a ``ToolPath``, carries the names a deny prefix is matched against
(``names``): the resolved path relative to the workspace, the entry itself (its
parents resolved, not a final symbolic link — what ``delete_file`` removes), the
path as written with only ``..``, ``.`` and repeated slashes folded, and each of
those under the root as configured and as resolved. Matching any of them refuses, so a
rule written with an absolute path, a relative one or a link's name catches every
spelling of the file.

A workspace must neither contain the home nor lie inside it
(``check_workspace_apart_from_home``): registration refuses one that does with
``WORKSPACE_OVERLAPS_HOME``.
"""

from __future__ import annotations

import functools
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apollia_nb.errors import BadArgument, PathEscape, PathInHome, WorkspaceOverlapsHome

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.governance.code_places import CodePlaces

__all__ = ["ToolPath", "resolve_tool_path", "inside", "check_workspace_apart_from_home", "FILE_TOOLS", "code_places"]

FILE_TOOLS = frozenset({"read_file", "list_dir", "write_file", "delete_file"})
"""The built-in tools whose first argument is a path in the workspace."""


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both absolute and normalised)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` (both absolute): ``.`` for the root, ``../x`` outside it."""
    return posixpath.relpath(path, root)


@dataclass(frozen=True, slots=True)
class ToolPath:
    """A file tool's path, resolved. ``relative`` is what the tool acts on, relative to the root."""

    asked: str
    real: Path
    entry: Path
    relative: str
    names: tuple[str, ...]


def resolve_tool_path(workspace: str | os.PathLike[str], path: object, *,
                      home: str | os.PathLike[str] | None = None) -> ToolPath:
    """Resolve ``path`` as a file tool does, or refuse it (see the module docstring)."""
    if not isinstance(path, str):
        raise BadArgument(f"the path must be a string, got {type(path).__name__}")
    if not path:
        raise BadArgument('the path is empty (use "." for the workspace root)')
    if "\x00" in path:
        raise PathEscape("the path contains a NUL byte")
    given = os.path.abspath(workspace)
    root = os.path.realpath(given)
    joined = os.path.join(root, path)  # join keeps an absolute path as it is
    real = os.path.realpath(joined)
    trimmed = joined.rstrip(os.sep) or os.sep
    name = os.path.basename(trimmed)
    if name in ("", ".", ".."):
        entry = real
    else:
        entry = os.path.join(os.path.realpath(os.path.dirname(trimmed)), name)
    if home is not None:
        home_real = os.path.realpath(home)
        if inside(real, home_real) or inside(entry, home_real):
            raise PathInHome(
                f"{path!r} resolves into the apollia home {home_real}: the home (journal, keys, policy, "
                "governance) is never open to a tool"
            )
        if _links_into(real, home_real):
            raise PathInHome(
                f"{path!r} is a hard link to a file of the apollia home {home_real}: the home (journal, keys, "
                "policy, governance) is never open to a tool"
            )
    if not inside(real, root):
        raise PathEscape(f"{path!r} is outside the workspace {root}")
    relative = _relative(real, root)
    relatives = (relative, _relative(entry, root), _relative(posixpath.normpath(os.path.join(given, path)), given))
    absolutes = (posixpath.normpath(posixpath.join(base, rel)) for base in (root, given) for rel in relatives)
    return ToolPath(asked=path, real=Path(real), entry=Path(entry), relative=relative,
                    names=tuple(dict.fromkeys((*relatives, *absolutes))))


def _links_into(real: str, home: str) -> bool:
    """Whether ``real`` is a file with several names, one of them in the home (a hard link).

    A hard link is the same file under a second name: ``realpath`` cannot see it, so
    the file's identity is compared with every file of the home. Only a file with
    more than one link is compared, so an ordinary file costs one ``stat``. A home
    that cannot be walked counts as holding it (fail closed).
    """
    try:
        info = os.stat(real)
    except OSError:
        return False  # nothing there yet: a new file is no link
    if info.st_nlink < 2 or not os.path.isfile(real):
        return False
    wanted = (info.st_dev, info.st_ino)

    if not os.path.lexists(home):
        return False  # no home there: nothing to reach

    def refuse(error: OSError) -> None:
        raise error

    try:
        for folder, _dirs, files in os.walk(home, onerror=refuse):
            for name in files:
                try:
                    found = os.lstat(os.path.join(folder, name))
                except FileNotFoundError:
                    continue  # gone while walking (a database's write-ahead log)
                if (found.st_dev, found.st_ino) == wanted:
                    return True
    except OSError:
        return True
    return False


def check_workspace_apart_from_home(workspace: str | os.PathLike[str], home: str | os.PathLike[str],
                                    *, agent: str = "the agent") -> None:
    """Refuse a workspace that is the home, contains it or lies inside it (``WORKSPACE_OVERLAPS_HOME``).

    Both are compared as resolved (symbolic links followed), and also as written,
    so a link on either side cannot hide the overlap.
    """
    pairs = {(os.path.realpath(workspace), os.path.realpath(home)),
             (os.path.abspath(workspace), os.path.abspath(home))}
    for ws, hm in pairs:
        if ws == hm:
            how = "is the apollia home"
        elif inside(hm, ws):
            how = f"contains the apollia home {hm}"
        elif inside(ws, hm):
            how = f"lies inside the apollia home {hm}"
        else:
            continue
        raise WorkspaceOverlapsHome(
            f"the workspace of {agent} ({ws}) {how}; its tools could then read the signing key and delete "
            "the journal, the policy or the rules. Set [workspace] root to a folder that neither contains "
            "nor lies inside the home (a project folder beside it is fine), or keep the home elsewhere "
            "with --home or APOLLIA_HOME."
        )


# --- where this process imports or runs code --------------------------------------------
#
# decide() asks every time about a write that lands where the process running the
# tools (or the person's next Python) imports or runs code. It compares strings only;
# the places are worked out here, from this process's sys.path, working folder,
# imported modules and environment, every time any of them changes (a later
# ``sys.path.insert`` counts from the next call on).

#: Environment variables that move a code place.
_PLACE_VARIABLES = ("HOME", "PATH", "PYTHONSTARTUP", "PYTHONUSERBASE", "IPYTHONDIR", "XDG_CONFIG_HOME",
                    "XDG_DATA_HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_CONFIG_PATH", "JUPYTER_DATA_DIR",
                    "JUPYTER_PATH", "JUPYTER_PREFER_ENV_PATH", "JUPYTER_PLATFORM_DIRS", "JUPYTER_NO_CONFIG")

_places_cache: dict[object, "CodePlaces"] = {}


def code_places(registered_from: str | os.PathLike[str] | None = None) -> "CodePlaces":
    """The places where this process imports or runs code (``Call.code_places``), cached.

    ``registered_from``: an agent's workspace that was the working folder of the
    process that registered it (``[workspace] root = "."``: a notebook's folder),
    which a kernel there imports from even when the tools run in another process
    (``apollia-os run`` started elsewhere).

    Worked out again whenever ``sys.path``, the working folder, the number of
    imported modules or one of the variables that move a place changes. Anything
    that fails makes a value whose ``unknown`` says why: every write of a file
    tool is then asked (fail closed).
    """
    import sys

    from apollia_nb.governance.code_places import CodePlaces

    try:
        extra = os.fspath(registered_from) if registered_from is not None else None
        key: object = (tuple(sys.path), os.getcwd(), len(sys.modules),
                       tuple(os.environ.get(v) for v in _PLACE_VARIABLES), extra)
        cached = _places_cache.get(key)
    except Exception as exc:  # a deleted working folder, an unhashable sys.path entry
        return CodePlaces(unknown=f"{type(exc).__name__}: {exc}")
    if cached is not None:
        return cached
    try:
        found = _collect_places()
        if extra is not None:
            cwd = os.getcwd()
            found += [(form, "import", "the folder the agent was registered from") for form in _forms(extra, cwd)]
        places = CodePlaces.of(found)
    except Exception as exc:
        return CodePlaces(unknown=f"{type(exc).__name__}: {exc}")
    if len(_places_cache) >= 32:  # sys.path or the modules changed: the old keys will not come back
        _places_cache.clear()
    _places_cache[key] = places
    return places


def _forms(path: str, cwd: str) -> list[str]:
    """A place as written (made absolute) and with its symbolic links followed."""
    written = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    return list(dict.fromkeys((written, os.path.realpath(written))))


def _collect_places() -> list[tuple[str, str, str]]:
    import sys
    import types

    cwd = os.getcwd()
    wanted: dict[tuple[str, str], str] = {}  # (path as written, kind) -> why: each is resolved once

    def add(path: object, kind: str, why: str) -> None:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return  # importlib skips what is not a path too
        wanted.setdefault((path or cwd, kind), why)

    # The Python installation: every file of these folders is imported or run.
    installed, scripts = _installation(sys.prefix, sys.exec_prefix, os.environ.get("PYTHONUSERBASE"),
                                       os.path.expanduser("~"))
    for path in installed:
        add(path, "code", "the Python installation's module folder")
    for path in scripts:
        add(path, "code", "the Python installation's scripts folder")
    for prefix in {sys.prefix, sys.exec_prefix}:
        add(os.path.join(prefix, "pyvenv.cfg"), "file", "the virtual environment's configuration")

    # The import path, as it is now, and the working folder a kernel imports from first.
    add(cwd, "import", "the working folder")
    installed_forms = {f for p in installed for f in _forms(p, cwd)}
    for entry in list(sys.path):
        if isinstance(entry, (str, bytes)):
            text = os.fsdecode(entry)
            forms = _forms(text or cwd, cwd)
            if any(f in installed_forms or os.path.basename(f) in ("site-packages", "dist-packages") for f in forms):
                add(text, "code", "the sys.path entry")
            else:
                add(text, "import", "the sys.path entry")
    # Where the modules this process imported came from (an editable install's finder may map a
    # package's folder without putting it on sys.path).
    for name, module in list(sys.modules.items()):
        if "." in name or not isinstance(module, types.ModuleType):
            continue
        attributes = module.__dict__  # never getattr: a module's __getattr__ may import or run anything
        where = attributes.get("__path__")
        folders = [os.path.dirname(p) for p in list(where) if isinstance(p, str)] if where is not None else []
        file = attributes.get("__file__")
        if not folders and isinstance(file, str):
            folders = [os.path.dirname(file)]
        for folder in folders:
            if folder:
                add(folder, "import", f"the folder the module {name!r} came from")

    home = os.path.expanduser("~")
    # IPython: profiles, their startup files and configuration.
    ipython: list[object] = [os.environ.get("IPYTHONDIR"), os.path.join(home, ".ipython"),
                             os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "ipython")]
    shell = _running_ipython()
    if shell is not None:
        ipython += [getattr(shell, "ipython_dir", None), getattr(getattr(shell, "profile_dir", None), "location", None)]
    for place in ipython:
        if place:
            add(place, "code", "the IPython folder")

    # Jupyter: configuration (jupyter_*_config.py/json) and data (kernel specs, extensions).
    config, data = _jupyter_folders(home)
    for path in config:
        add(path, "code", "a Jupyter configuration folder")
    for path in data:
        add(path, "code", "a Jupyter data folder")

    startup = os.environ.get("PYTHONSTARTUP")
    if startup:
        add(startup, "file", "the PYTHONSTARTUP file")
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        add(folder, "code", "the PATH folder")
    return [(form, kind, why) for (path, kind), why in wanted.items() for form in _forms(path, cwd)]


@functools.lru_cache(maxsize=4)
def _installation(prefix: str, exec_prefix: str, userbase: str | None, home: str) -> tuple[list[str], list[str]]:
    """The installation's module folders and scripts folders (what ``site`` and ``sysconfig`` say)."""
    import site
    import sysconfig

    installed = {p for p in (*site.getsitepackages(), site.getusersitepackages()) if p}
    paths = sysconfig.get_paths()
    installed |= {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    scripts: list[str] = []
    for scheme in (None, f"{os.name}_user"):
        try:
            found = sysconfig.get_path("scripts", scheme) if scheme else paths.get("scripts")
        except KeyError:
            continue
        if found:
            scripts.append(found)
    return sorted(installed), scripts


def _running_ipython() -> object | None:
    """The IPython shell of this process, when there is one (IPython is never imported for it)."""
    import sys

    getipython = sys.modules.get("IPython.core.getipython")
    if getipython is None:
        return None
    return getipython.get_ipython()


def _jupyter_folders(home: str) -> tuple[list[str], list[str]]:
    """Jupyter's configuration and data folders: ``jupyter --paths``, and the defaults beside them."""
    import sys

    env = os.environ
    config = [env.get("JUPYTER_CONFIG_DIR") or os.path.join(home, ".jupyter"),
              os.path.join(sys.prefix, "etc", "jupyter"), "/usr/local/etc/jupyter", "/etc/jupyter",
              *(p for p in env.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p)]
    data = [env.get("JUPYTER_DATA_DIR")
            or os.path.join(env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share"), "jupyter"),
            os.path.join(sys.prefix, "share", "jupyter"), "/usr/local/share/jupyter", "/usr/share/jupyter",
            *(p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p)]
    try:
        from jupyter_core import paths as jupyter
    except ImportError:
        return config, data
    config += [jupyter.jupyter_config_dir(), *jupyter.jupyter_config_path()]
    data += [jupyter.jupyter_data_dir(), *jupyter.jupyter_path()]
    return config, data
