"""The error tree for client code: every stable code of :mod:`apollia_nb.errors`, one import.

The three codes only the HTTP surface reports live in ``apollia_nb.errors`` too:

    ApolliaError
    ├── Unauthorized                  UNAUTHORIZED (401): a missing or wrong bearer token
    ├── MethodNotAllowed              METHOD_NOT_ALLOWED (405): the route exists, the method does not
    └── BadInput
        └── PayloadTooLarge           PAYLOAD_TOO_LARGE (413): a request body over the server's limit

``apollia_nb.errors.error_for_code`` rebuilds any of them from a response's
``{"code", "message"}``; ``from apollia_nb.sdk import errors`` is the one place a
client catches from.
"""

from __future__ import annotations

from apollia_nb.errors import *  # noqa: F403 - the whole tree, for one import in client code
from apollia_nb.errors import MethodNotAllowed, PayloadTooLarge, Unauthorized
from apollia_nb.errors import __all__ as _core_all

__all__ = [*_core_all, "HTTP_ONLY_CODES"]


#: The codes only the HTTP surface reports.
HTTP_ONLY_CODES = (Unauthorized.code, MethodNotAllowed.code, PayloadTooLarge.code)
