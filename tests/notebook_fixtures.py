"""A real IPython with `apollia_nb` loaded on a fresh home, for the notebook tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def ip(home, capsys):
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "apollia_nb")
    capsys.readouterr()
    yield shell
    from apollia_nb.notebook.extension import unload_ipython_extension

    unload_ipython_extension(shell)
    shell.extension_manager.loaded.discard("apollia_nb")
    shell.config.pop("ApolliaMagics", None)
