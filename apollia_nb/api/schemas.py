"""The REST API's wire format lives in :mod:`apollia_nb.wire.schemas`, below the API and the SDK.

This name is the same module, for code written against it before it moved."""

import sys

from apollia_nb.wire import schemas as _schemas

sys.modules[__name__] = _schemas
