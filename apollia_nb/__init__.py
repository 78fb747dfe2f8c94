"""apollia-nb: governed AI agents inside a Jupyter kernel, with a signed journal."""

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext apollia_nb``: register the ``apollia`` magic (imported only now, to keep this cheap)."""
    from apollia_nb.notebook.extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from apollia_nb.notebook.extension import unload_ipython_extension as unload

    unload(ipython)
