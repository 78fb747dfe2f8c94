"""Helpers for storage-fault tests: a real small disk (tmpfs) that can be filled and freed."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, megabytes: int = 24) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` mounted at ``where`` (skips the test when mounting is not permitted)."""
    _need("mount", "umount")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}M,mode=0700", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and mount): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _need(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH")


class Filler:
    """A file that takes every free block of a disk until ``free()``."""

    def __init__(self, disk: Path) -> None:
        self.path = disk / "filler"

    def fill(self) -> None:
        with open(self.path, "ab", buffering=0) as f:
            chunk = b"\xff" * (1 << 20)
            while chunk:
                try:
                    f.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk = chunk[: len(chunk) // 2] if len(chunk) > 512 else b""
        assert os.statvfs(self.path).f_bavail == 0

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def ext4_disk(where: Path, image: Path, megabytes: int = 32) -> Iterator[Path]:
    """An ext4 file system in ``image``, loop-mounted at ``where`` (skips when that is not permitted);
    ``remount(where, read_only=...)`` turns it read-only and back."""
    _need("mkfs.ext4", "mount", "umount")
    with open(image, "wb") as f:
        f.truncate(megabytes << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make an ext4 file system here: {made.stderr.strip()}")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount a file system here (needs root and a loop device): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def remount(where: Path, *, read_only: bool) -> None:
    """Remount a file system read-only or read-write (nothing may hold a file open for writing)."""
    subprocess.run(["mount", "-o", "remount," + ("ro" if read_only else "rw"), str(where)], check=True,
                   capture_output=True)
