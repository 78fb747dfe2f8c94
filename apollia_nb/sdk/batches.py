"""The SDK's requests for batches (``Client.batch`` and the rest): the wire's (``wire/batches.py``)."""

from __future__ import annotations

from apollia_nb.wire.batches import Routes, batch_request, items_list

__all__ = ["Routes", "batch_request", "items_list"]
