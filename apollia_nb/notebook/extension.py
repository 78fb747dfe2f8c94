"""``%load_ext apollia_nb``: register the ``apollia`` magic, open the home, print the status line.

In a kernel it also registers the side panel's comm target (``panel.py``) and
announces it to the front end. The extension only registers (and opens the home
this kernel owns); widgets, pandas and the SQL machinery are imported when first
used, so loading stays quick. Loading again in the same kernel keeps the open home.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension", "loaded_magics", "open_runtime"]

_REGISTRY_NAME = "ApolliaMagics"


def loaded_magics(ipython: Any) -> Any:
    """The registered ``ApolliaMagics`` of this shell, or None."""
    return ipython.magics_manager.registry.get(_REGISTRY_NAME)


def load_ipython_extension(ipython: Any) -> None:
    from apollia_nb.notebook.magics import ApolliaMagics

    magics = loaded_magics(ipython)
    if magics is None:
        magics = ApolliaMagics(shell=ipython, parent=ipython)
        ipython.register_magics(magics)
    if magics not in ipython.configurables:
        ipython.configurables.append(magics)  # so `%config ApolliaMagics` lists and sets its traits
    from apollia_nb.notebook import panel

    if panel.register(ipython, lambda: open_runtime(magics)):  # first: a panel can say why no home opened
        panel.announce(ipython)
    magics.open_home()


def open_runtime(magics: Any) -> Any:
    """The kernel's open home, for the side panel (which never opens one itself: it may run on any thread)."""
    runtime = magics.runtime
    if runtime is None or runtime.closed:
        from apollia_nb.errors import Conflict

        failed = getattr(magics, "open_error", None)
        if failed is not None and runtime is None:  # the home did not open: say why, not what failed
            from apollia_nb.home import Home
            from apollia_nb.notebook.panel import kernel_error

            raise kernel_error(failed, Home.at(magics.home or None, create=False))
        raise Conflict("no home is open in this kernel: `%load_ext apollia_nb` or `%apollia` opens it")
    return runtime


def unload_ipython_extension(ipython: Any) -> None:
    magics = loaded_magics(ipython)
    if magics is None:
        return
    from apollia_nb.notebook import panel

    panel.unregister(ipython)
    magics.close_home()
    if magics in ipython.configurables:
        ipython.configurables.remove(magics)
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("apollia", None)
    ipython.magics_manager.registry.pop(_REGISTRY_NAME, None)
