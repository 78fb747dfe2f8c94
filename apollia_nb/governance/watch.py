"""Whether a set of files may have changed since a moment, without a system call per question.

``GovernanceStore.view()`` runs on every tool call and must see a change to
``governance.db`` or the policy files made by any process as soon as that
change is made. Comparing five ``stat()`` results per call does that, but each
``stat()`` releases Python's lock on the interpreter, and taking it back while
the journal's writer or a tool's worker thread holds it costs far more than
the call itself.

A ``FileWatch`` asks the kernel instead (Linux ``inotify``): watches are set on
each file and on the folder that holds it (or, for a folder that does not exist
yet, on the nearest one that does), and the kernel queues an event, inside the
changing process's own system call, for any write, attribute change, creation,
deletion or rename of those names. ``quiet()`` asks how many bytes of events are
queued (one ``ioctl``, made without releasing the interpreter lock, since it
never blocks) and reads only events for the names it watches; anything else
queued (the journal's own files in the home's folder) is read and dropped.

``quiet()`` is True only when nothing watched can have changed since the watch
was armed. It is False — and stays False until the watch is replaced — for any
event on a watched name, a queue overflow, a watch the kernel dropped, an
error, or when the watch could not be set up at all (not Linux, no ``inotify``
instances left, a file or folder reached through a symbolic link): the caller
then compares ``stat()`` results as before. The store also compares them every
``FULL_CHECK_SECS`` whatever the watch says, for file systems whose changes
from other machines the kernel never hears of (network file systems). A watch
made before a ``fork`` is never quiet in the child, which shares its queue.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["FileWatch", "FULL_CHECK_SECS"]

#: However quiet the watch, the store compares ``stat()`` results at least this often.
FULL_CHECK_SECS = 0.25

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_FIONREAD = 0x541B

_FILE_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF
# A folder only for its names (a file made, deleted or renamed in or out): the files in
# it are watched themselves, and its other files' writes (the journal's) are no news.
_FOLDER_MASK = _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, NUL-padded)
_SELF = ""  # the name a watch on a file (not a folder) reports for itself

_libc_lock = threading.Lock()
_libc: "ctypes.CDLL | None | bool" = False  # False: not looked up yet


def _lib() -> "ctypes.CDLL | None":
    """libc as a ``PyDLL`` (calls keep the interpreter lock: they never block), or None."""
    global _libc
    with _libc_lock:
        if _libc is False:
            _libc = None
            if sys.platform.startswith("linux"):
                try:
                    lib = _libc_with_inotify()
                    lib.inotify_init1.argtypes = [ctypes.c_int]
                    lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
                    _libc = lib
                except (OSError, AttributeError):
                    _libc = None
        return _libc  # type: ignore[return-value]


def _libc_with_inotify() -> "ctypes.CDLL":
    """The C library this process already has (its own symbols: no search, no ``ldconfig`` run), else the
    one ``ctypes.util.find_library`` names."""
    try:
        lib = ctypes.PyDLL(None, use_errno=True)
        lib.inotify_init1  # raises AttributeError when the process's symbols lack it
        return lib
    except (OSError, AttributeError):
        from ctypes.util import find_library  # lazy: it runs `ldconfig -p` in a subprocess, 2–14 ms measured

        return ctypes.PyDLL(find_library("c") or "libc.so.6", use_errno=True)


_forks = 0  # a forked child shares its parent's inotify queues: it must never read them


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class FileWatch:
    """Change notification for a few files (see the module's docstring). Thread-safe."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._lock = threading.Lock()  # one reader at a time: another must not see events half read
        self._fd = -1
        self._names: dict[int, frozenset[str]] = {}  # wd -> the names it reports that matter
        self._fired = True
        self._count = ctypes.c_int(0)
        self._ask: tuple[Any, ...] = ()  # ioctl's arguments, made once (ctypes values: no conversions per call)
        self._fork = _forks
        lib = _lib()
        if lib is None:
            return
        try:
            self._arm(lib, paths)
        except Exception:
            self.close()
            self._fired = True

    def _arm(self, lib: "ctypes.CDLL", paths: Sequence[str]) -> None:
        folders: dict[str, set[str]] = {}
        files: list[str] = []
        for path in paths:
            path = os.path.abspath(path)
            if os.path.realpath(path) != path:
                return  # through a symbolic link: the kernel would watch what it points to now
            folder, name = os.path.split(path)
            while not os.path.isdir(folder):  # a folder still to be made: watch for it
                folder, name = os.path.split(folder)
                if not name:
                    return
            folders.setdefault(folder, set()).add(name)
            if os.path.exists(path):
                files.append(path)
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return  # no inotify instances left, or none at all
        self._fd = fd
        self._ask = (ctypes.c_int(fd), ctypes.c_ulong(_FIONREAD), ctypes.byref(self._count))
        for folder, names in folders.items():
            wd = lib.inotify_add_watch(fd, os.fsencode(folder), _FOLDER_MASK)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"cannot watch {folder}")
            self._names[wd] = self._names.get(wd, frozenset()) | frozenset(names)
        for path in files:
            wd = lib.inotify_add_watch(fd, os.fsencode(path), _FILE_MASK)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"cannot watch {path}")
            if wd in self._names:  # the same inode as a folder watched above: never quiet
                raise OSError(0, f"{path} is watched twice")
            self._names[wd] = frozenset({_SELF})
        self._fired = False

    @property
    def armed(self) -> bool:
        return self._fd >= 0 and not self._fired

    def quiet(self) -> bool:
        """True when nothing watched can have changed since the watch was armed."""
        with self._lock:
            return self._quiet()

    def _quiet(self) -> bool:
        if self._fired or self._fd < 0 or self._fork != _forks:
            return False  # (in a forked child, reading would take the events from the parent)
        lib = _lib()
        try:
            if lib is None or lib.ioctl(*self._ask) != 0:
                self._fired = True
                return False
            if self._count.value == 0:
                return True
            data = os.read(self._fd, max(self._count.value, 65536))
        except Exception:
            self._fired = True
            return False
        if self._relevant(data):
            self._fired = True
            return False
        return True

    def _relevant(self, data: bytes) -> bool:
        """Whether any event in ``data`` may concern a watched name (anything unreadable does)."""
        at = 0
        size = _EVENT.size
        try:
            while at < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + size: at + size + length].rstrip(b"\0").decode("utf-8", "surrogateescape")
                at += size + length
                names = self._names.get(wd)
                if names is None or _SELF in names:  # an overflow (wd -1), a dropped watch, a watched file
                    return True
                if mask & (_IN_DELETE_SELF | _IN_MOVE_SELF) or not name or name in names:
                    return True
        except Exception:
            return True
        return at != len(data)

    def close(self) -> None:
        with self._lock:  # never while quiet() reads: the number could name another file by then
            fd, self._fd = self._fd, -1
            self._fired = True
            self._names = {}
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        if getattr(self, "_lock", None) is not None:
            self.close()
