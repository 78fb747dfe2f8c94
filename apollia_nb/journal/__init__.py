"""The signed, hash-chained journal: append, checkpoints and proofs, verify, export, SQL views.

Names are imported lazily, so a process that only verifies (or a worker that
only checks signatures) does not load DuckDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apollia_nb.journal.entry import Entry, canonical_json
    from apollia_nb.journal.export import ExportResult, export_home, export_journal
    from apollia_nb.journal.store import ConsistencyProof, Draft, InclusionProof, Journal
    from apollia_nb.journal.verify import (
        VerifyReport,
        verify_bundle,
        verify_file,
        verify_home,
        verify_journal,
    )

__all__ = [
    "Journal",
    "Draft",
    "Entry",
    "InclusionProof",
    "ConsistencyProof",
    "VerifyReport",
    "canonical_json",
    "verify_journal",
    "verify_home",
    "verify_file",
    "verify_bundle",
    "ExportResult",
    "export_home",
    "export_journal",
]

_WHERE = {
    "Journal": "store",
    "Draft": "store",
    "InclusionProof": "store",
    "ConsistencyProof": "store",
    "Entry": "entry",
    "canonical_json": "entry",
    "VerifyReport": "verify",
    "verify_journal": "verify",
    "verify_home": "verify",
    "verify_file": "verify",
    "verify_bundle": "verify",
    "ExportResult": "export",
    "export_home": "export",
    "export_journal": "export",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'apollia_nb.journal' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"apollia_nb.journal.{module}"), name)
    globals()[name] = value
    return value
