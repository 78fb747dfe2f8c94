"""apollia-nb inside a notebook: the IPython extension, the ``%apollia`` magic, widgets, in-kernel tools.

``%load_ext apollia_nb`` (or ``apollia_nb.notebook.load_ipython_extension``)
registers the magic and the side panel's comm target (``panel.py``) and opens the
home for this kernel. ``kernel_runtime()``
returns that open home (a ``KernelRuntime``) for code that wants it directly.
Nothing heavy is imported here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension", "kernel_runtime"]


def load_ipython_extension(ipython: Any) -> None:
    from apollia_nb.notebook.extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from apollia_nb.notebook.extension import unload_ipython_extension as unload

    unload(ipython)


def kernel_runtime(ipython: Any = None) -> Any:
    """The home this kernel opened with ``%load_ext apollia_nb`` (opening it if needed)."""
    from apollia_nb.notebook.extension import loaded_magics

    if ipython is None:
        from IPython import get_ipython

        ipython = get_ipython()
    magics = loaded_magics(ipython) if ipython is not None else None
    if magics is None:
        from apollia_nb.errors import Conflict

        raise Conflict("the apollia_nb extension is not loaded in this kernel: run `%load_ext apollia_nb`")
    return magics.open_home(announce=False)
