"""An audit bundle's layout: its files' names, and reading its key and ``meta.json``.

``export.py`` writes bundles and ``verify.py`` checks them; both read the layout from here.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from apollia_nb.errors import IntegrityError
from apollia_nb.journal.checkpoint import NoteVerifier

__all__ = ["BUNDLE_FILES", "read_bundle_key", "read_bundle_meta"]

#: Each file of a bundle by role (what each holds: ``journal/export.py``).
BUNDLE_FILES = {
    "entries": "entries.parquet",
    "checkpoints": "checkpoints.parquet",
    "cosignatures": "cosignatures.parquet",
    "checkpoint": "checkpoint.txt",
    "pub": "journal.pub",
    "vkey": "journal.vkey",
    "meta": "meta.json",
    "views": "views.sql",
    "readme": "README.md",
}


def read_bundle_key(directory: Path) -> NoteVerifier:
    """The bundle's verifier (origin and public key), cross-checked with ``journal.pub``."""
    verifier = NoteVerifier.from_key((directory / BUNDLE_FILES["vkey"]).read_text().strip())
    pub = directory / BUNDLE_FILES["pub"]
    if pub.exists():
        try:
            raw = base64.b64decode(pub.read_text().strip(), validate=True)
        except ValueError:
            raise IntegrityError(f"{pub} is not base64") from None
        if raw != verifier.public_key:
            raise IntegrityError(f"{pub} and {BUNDLE_FILES['vkey']} name different keys")
    return verifier


def read_bundle_meta(directory: Path) -> dict[str, Any]:
    """The bundle's ``meta.json`` (``{}`` when it has none; ``INTEGRITY_FAILURE`` when it is not JSON)."""
    path = Path(directory) / BUNDLE_FILES["meta"]
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise IntegrityError(f"{path} is not JSON") from None
    if not isinstance(meta, dict):
        raise IntegrityError(f"{path} is not a JSON object")
    return meta
