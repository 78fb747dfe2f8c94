"""apollia-nb: governed AI agents inside a Jupyter kernel, with a signed journal."""

__version__ = "0.1.0"

__all__ = ["__version__"]
