"""Errors only the HTTP surface reports, beside the stable codes of :mod:`apollia_nb.errors`.

    ApolliaError
    ├── Unauthorized                  UNAUTHORIZED (401): a missing or wrong bearer token
    ├── MethodNotAllowed              METHOD_NOT_ALLOWED (405): the route exists, the method does not
    └── BadInput
        └── PayloadTooLarge           PAYLOAD_TOO_LARGE (413): a request body over the server's limit

They subclass the project's error tree, so ``apollia_nb.errors.error_for_code``
rebuilds them from a response's ``{"code", "message"}`` once this module is
imported (the SDK imports it). Every other code an API response carries is one
of :mod:`apollia_nb.errors`, re-exported here so ``from apollia_nb.sdk import
errors`` is the one place a client catches from.
"""

from __future__ import annotations

from apollia_nb.errors import *  # noqa: F403 - the whole tree, for one import in client code
from apollia_nb.errors import ApolliaError, BadInput
from apollia_nb.errors import __all__ as _core_all

__all__ = [*_core_all, "Unauthorized", "MethodNotAllowed", "PayloadTooLarge", "HTTP_ONLY_CODES"]


class Unauthorized(ApolliaError):
    code = "UNAUTHORIZED"
    http_status = 401


class MethodNotAllowed(ApolliaError):
    code = "METHOD_NOT_ALLOWED"
    http_status = 405


class PayloadTooLarge(BadInput):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


#: The codes this module adds to the project's error tree.
HTTP_ONLY_CODES = (Unauthorized.code, MethodNotAllowed.code, PayloadTooLarge.code)
