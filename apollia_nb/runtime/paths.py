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

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from apollia_nb.errors import BadArgument, PathEscape, PathInHome, WorkspaceOverlapsHome

__all__ = ["ToolPath", "resolve_tool_path", "inside", "check_workspace_apart_from_home", "FILE_TOOLS"]

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
