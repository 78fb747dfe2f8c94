"""Where the process that runs the tools imports or runs code: a value, and the pure test of a path.

A write there is code the process (a notebook's kernel, ``apollia-os serve``,
``apollia-os run``) or the person's next Python will run with the person's
rights — inside the kernel that owns the home, where it could answer cards in the
person's name, read the journal's key or change governance. So a file tool's
``write`` call whose resolved path lies in such a place is asked every time
(``decide``, line 5), whatever consent or grant the agent holds.

The places are worked out at the edge, where the call's paths are resolved
(``apollia_nb.runtime.paths.code_places``), and handed to ``decide`` as a value
(``Call.code_places``): nothing here reads ``sys.path``, the environment or the
file system. Three kinds of place, each an absolute folder or file:

- ``import``: a folder Python imports from — an entry of ``sys.path``, the
  working folder, the folder an imported top-level module came from. Below it a
  Python module counts at any depth (a package's files, a namespace package's):
  a name ending ``.py``, ``.pyw``, ``.pyc``, ``.pyo``, ``.pyd``, ``.so`` (every
  extension module suffix ends so) or ``.pth``; anything in a ``__pycache__``
  folder; package metadata (``*.dist-info``, ``*.egg-info``, ``*.egg``,
  ``*.egg-link``: entry points name code that plugin hosts load); and the entry
  itself (a ``.zip`` or ``.egg`` on the path is replaced whole).
- ``code``: a folder every file of which is code or configuration that runs
  code — site-packages and the standard library, the interpreter's scripts, the
  IPython folder (profiles, startup files, ``ipython_config.py``,
  ``ipython_kernel_config.py``), Jupyter's configuration and data folders
  (``jupyter_*_config.py/json``, kernel specs, extensions), the folders of
  ``PATH``.
- ``file``: one file that runs: ``PYTHONSTARTUP``, a virtual environment's
  ``pyvenv.cfg``.

Names are compared as a file system may fold them, so the test asks too often
rather than too rarely: the last name is put in NFKC form, case-folded and
stripped of trailing dots and spaces (Windows drops them: ``pandas.py.`` is
``pandas.py``; a case-insensitive file system may import ``Pandas.PY`` when
``PYTHONCASEOK`` is set). A look-alike no file system folds (a Cyrillic ``р`` in
``.рy``) names another file, which Python never imports.

``unknown``: the places could not be worked out; every write of a file tool is
then asked (fail closed).
"""

from __future__ import annotations

import enum
import posixpath
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["PlaceKind", "CodePlace", "CodePlaces", "code_place_reason", "MODULE_SUFFIXES"]


class PlaceKind(str, enum.Enum):
    IMPORT = "import"
    CODE = "code"
    FILE = "file"

    def __str__(self) -> str:
        return self.value


#: A file whose (folded) name ends so is a Python module, or a ``.pth`` file, below an import folder.
MODULE_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".pyd", ".so", ".pth")
#: A folder (or file) whose folded name ends so is package metadata: entry points name code to load.
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg", ".egg-link")


def _normal(path: str) -> str:
    normal = posixpath.normpath(path)
    if normal.startswith("//"):  # normpath keeps two leading slashes; the file system does not
        normal = "/" + normal.lstrip("/")
    return normal


def _folded(name: str) -> str:
    """A name as the most lenient file system may read it: NFKC, case-folded, trailing dots and spaces gone."""
    return unicodedata.normalize("NFKC", name).casefold().rstrip(". ")


@dataclass(frozen=True, slots=True)
class CodePlace:
    """One place: an absolute ``path``, its ``kind`` and words saying what it is (``why``)."""

    path: str
    kind: PlaceKind
    why: str

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ValueError(f"a code place is an absolute path, not {self.path!r}")
        object.__setattr__(self, "path", _normal(str.__str__(self.path)))
        object.__setattr__(self, "kind", PlaceKind(self.kind))
        if not isinstance(self.why, str):
            raise TypeError("why must be a string")


@dataclass(frozen=True, slots=True)
class CodePlaces:
    """The places of one process, arranged by path once (``decide`` walks a path's parents)."""

    places: tuple[CodePlace, ...] = ()
    unknown: str = ""

    _index: Mapping[str, tuple[CodePlace, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        places = tuple(self.places or ())
        for place in places:
            if not isinstance(place, CodePlace):
                raise TypeError(f"places must be CodePlace values, not {type(place).__name__}")
        if not isinstance(self.unknown, str):
            raise TypeError("unknown must be a string")
        object.__setattr__(self, "places", places)
        index: dict[str, list[CodePlace]] = {}
        for place in places:
            index.setdefault(place.path, []).append(place)
        object.__setattr__(self, "_index", {k: tuple(v) for k, v in index.items()})

    @classmethod
    def of(cls, places: Iterable[tuple[str, PlaceKind | str, str]], unknown: str = "") -> "CodePlaces":
        """From ``(path, kind, why)`` triples; the first place at a path and of a kind stands."""
        seen: dict[tuple[str, PlaceKind], CodePlace] = {}
        for path, kind, why in places:
            place = CodePlace(path, PlaceKind(kind), why)
            seen.setdefault((place.path, place.kind), place)
        return cls(tuple(seen.values()), unknown)


def _below_import(parts: list[str]) -> str | None:
    """What a path below an import folder is, given its names from there (``[]``: the entry itself)."""
    if not parts:
        return "an entry of the import path itself"
    folded = [_folded(p) for p in parts]
    if "__pycache__" in folded:
        return f"compiled Python ({'/'.join(parts)} in a __pycache__ folder)"
    if any(f.endswith(_METADATA_SUFFIXES) for f in folded):
        return f"package metadata ({'/'.join(parts)}), whose entry points name code to load"
    last = folded[-1]
    if last.endswith(".pth"):
        return f"a .pth file ({'/'.join(parts)}), whose import lines run at startup"
    if last.endswith(MODULE_SUFFIXES):
        return f"a Python module ({'/'.join(parts)})"
    return None


def _hit(path: str, places: CodePlaces) -> tuple[CodePlace, str] | None:
    index = places._index
    folder = path
    parts: list[str] = []
    while True:
        for place in index.get(folder, ()):
            if place.kind is PlaceKind.CODE:
                return place, "a file" if not parts else f"a file ({'/'.join(reversed(parts))})"
            if place.kind is PlaceKind.FILE and not parts:
                return place, "the file"
            if place.kind is PlaceKind.IMPORT:
                what = _below_import(list(reversed(parts)))
                if what is not None:
                    return place, what
        if folder == "/":
            return None
        head, name = posixpath.split(folder)
        parts.append(name)
        folder = head or "/"


def code_place_reason(paths: Iterable[str], places: CodePlaces) -> str | None:
    """Why a write to any of ``paths`` (a file tool's resolved names) lands where code runs, or None.

    Only absolute names are compared (the runtime always gives them); the first
    name that lands in a place decides the words.
    """
    if places.unknown:
        return (f"cannot tell where this process imports or runs code ({places.unknown}): a write of a file"
                " tool is asked every time")
    for name in paths:
        if not name.startswith("/"):
            continue
        found = _hit(_normal(name), places)
        if found is not None:
            place, what = found
            return (f"writes {what} where this process imports or runs code ({place.why} {place.path}),"
                    " which would run with the person's rights: asked every time")
    return None
