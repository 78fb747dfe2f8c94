"""The simple-command check (placeholder: conservative; to be completed).

Interface used by ``decision.py``:

- ``simple_words(command) -> tuple[str, ...] | None``: the words of one simple command, or None
- ``is_simple(command) -> bool``
- ``allow_prefix_matches(prefix, command) -> bool``: allow rules, whole words, simple only
- ``deny_prefix_matches(prefix, command) -> bool``: deny rules, broad
"""

from __future__ import annotations

import re

_SAFE_WORD = re.compile(r"[A-Za-z0-9_./:@%+,=-]+")


def simple_words(command: str) -> tuple[str, ...] | None:
    words = command.split(" ")
    words = [w for w in words if w]
    if not words or not all(_SAFE_WORD.fullmatch(w) for w in words):
        return None
    if "=" in words[0]:
        return None
    return tuple(words)


def is_simple(command: str) -> bool:
    return simple_words(command) is not None


def allow_prefix_matches(prefix: str, command: str) -> bool:
    words = simple_words(command)
    want = simple_words(prefix)
    if words is None or want is None:
        return False
    return words[: len(want)] == want


def deny_prefix_matches(prefix: str, command: str) -> bool:
    if command.startswith(prefix):
        return True
    want = prefix.split()
    return bool(want) and " ".join(want) in " ".join(command.split())
