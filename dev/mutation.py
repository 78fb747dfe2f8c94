"""Mutation testing of the trusted core, built on ``ast``.

Each mutant changes one operator, comparison, boolean, constant or returned value of one module. The
mutated module is written into a scratch copy of the repository, and the tests that cover the module run
against it in a fresh process (``pytest -x -q -p no:cacheprovider``) with a time bound. A mutant is
*killed* when the tests fail, *survived* when they pass, *timed out* when they overrun the bound.
Known equivalent mutants are listed in ``dev/mutation-equivalent.txt`` and subtracted from the score.

Usage: ``python dev/mutation.py [--sample N] [--seed S] [--list] [--keep-going] [MODULE ...]``
(see ``docs/mutation-testing.md``).
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "dev" / "mutation-equivalent.txt"

# Module (short name) -> (path in the repository, the test files that cover it).
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "decision": (
        "apollia_nb/governance/decision.py",
        ("tests/test_decision.py", "tests/test_decision_properties.py", "tests/test_governance_attacks.py",
         "tests/test_policy.py"),
    ),
    "shellcheck": (
        "apollia_nb/governance/shellcheck.py",
        ("tests/test_shellcheck_tables.py", "tests/test_shellcheck.py", "tests/test_shellcheck_exact.py",
         "tests/test_shellcheck_globs.py", "tests/test_decision.py", "tests/test_governance_attacks.py"),
    ),
    "merkle": ("apollia_nb/journal/merkle.py", ("tests/test_merkle.py", "tests/test_journal_verify.py")),
    "verify": (
        "apollia_nb/journal/verify.py",
        ("tests/test_journal_verify.py", "tests/test_journal_tail.py", "tests/test_journal_frontier.py"),
    ),
    "states": ("apollia_nb/runtime/states.py", ("tests/test_states.py", "tests/test_breaker.py")),
    "breaker": ("apollia_nb/runtime/breaker.py", ("tests/test_breaker.py",)),
}

_BINOP_SWAP = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd,
}
_CMP_SWAP = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}


@dataclass(frozen=True)
class Site:
    """One mutation: the ``index``-th site of a module, in a deterministic walk of its tree."""

    index: int
    line: int
    kind: str
    detail: str
    nth: int = 1  # the n-th site with the same line, kind and detail
    span: tuple[int, int] = (0, 0)  # the source lines whose execution reaches the mutated code

    def ident(self, module: str) -> str:
        suffix = f"#{self.nth}" if self.nth > 1 else ""
        return f"{module}:{self.line}:{self.kind}:{self.detail}{suffix}"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """Nodes inside type annotations: mutating them changes no behaviour."""
    ids: set[int] = set()
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.returns is not None:
                roots.append(node.returns)
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                if arg.annotation is not None:
                    roots.append(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    for root in roots:
        ids.update(id(n) for n in ast.walk(root))
    return ids


def _mutations(node: ast.AST, skip: set[int]):
    """Yield (kind, detail, apply) for each mutation of ``node``; ``apply`` changes it in place."""
    if id(node) in skip:
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        new = _BINOP_SWAP[type(node.op)]
        yield "binop", f"{type(node.op).__name__}->{new.__name__}", lambda n: setattr(n, "op", new())
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
        new = _BINOP_SWAP[type(node.op)]
        yield "augop", f"{type(node.op).__name__}->{new.__name__}", lambda n: setattr(n, "op", new())
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP_SWAP:
                new = _CMP_SWAP[type(op)]

                def apply(n, i=i, new=new):
                    n.ops[i] = new()

                yield "cmp", f"{i}:{type(op).__name__}->{new.__name__}", apply
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield "boolop", f"{type(node.op).__name__}->{new.__name__}", lambda n: setattr(n, "op", new())
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "not", "drop-not", lambda n: _replace(n, n.operand)
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            yield "const", f"{value}->{not value}", lambda n: setattr(n, "value", not n.value)
        elif isinstance(value, int):
            yield "const", f"{value}->{value + 1}", lambda n: setattr(n, "value", n.value + 1)
        elif isinstance(value, float):
            yield "const", f"{value}->{value + 1}", lambda n: setattr(n, "value", n.value + 1.0)
        elif isinstance(value, str) and value:
            yield "const", f"str{len(value)}->XX", lambda n: setattr(n, "value", "XX" + n.value + "XX")
        elif isinstance(value, bytes) and value:
            yield "const", f"bytes{len(value)}->XX", lambda n: setattr(n, "value", b"XX" + n.value + b"XX")
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            yield "return", "value->None", lambda n: setattr(n, "value", ast.Constant(None))
    elif isinstance(node, ast.If):
        yield "if", "test->not", lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test))


def _replace(node: ast.AST, by: ast.AST) -> None:
    # A ``not x`` becomes ``x``: keep the node object, take the operand's class and fields.
    node.__class__ = by.__class__
    for field in by._fields:
        setattr(node, field, getattr(by, field))
    for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        if hasattr(by, attr):
            setattr(node, attr, getattr(by, attr))


def _walk(tree: ast.AST):
    skip = _docstring_nodes(tree) | _annotation_nodes(tree)
    for node in ast.walk(tree):
        # Leave ``from __future__`` and ``__all__`` alone: they change no behaviour the tests can see.
        if isinstance(node, (ast.ImportFrom, ast.Import)):
            skip.update(id(n) for n in ast.walk(node))
        # Text only type checkers and readers see: a string standing as a statement (an attribute's
        # docstring), the name given to a ``TypeVar``, the values of a ``Literal[...]`` type.
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            skip.add(id(node.value))
        if (isinstance(node, ast.Call) and _name_of(node.func) in {"TypeVar", "NewType", "ParamSpec"}
                and node.args):
            skip.add(id(node.args[0]))
        if isinstance(node, ast.Subscript) and _name_of(node.value) == "Literal":
            skip.update(id(n) for n in ast.walk(node.slice))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        for kind, detail, apply in _mutations(node, skip):
            yield node, kind, detail, apply


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def sites(source: str) -> list[Site]:
    tree = ast.parse(source)
    found = []
    seen: dict[tuple[int, str, str], int] = {}
    for index, (node, kind, detail, _apply) in enumerate(_walk(tree)):
        key = (getattr(node, "lineno", 0), kind, detail)
        seen[key] = seen.get(key, 0) + 1
        found.append(Site(index, key[0], kind, detail, seen[key], _span(node)))
    return found


def _span(node: ast.AST) -> tuple[int, int]:
    # An ``if`` is reached when its test is evaluated, a ``return`` when its value is.
    part = node.test if isinstance(node, ast.If) else node.value if isinstance(node, ast.Return) else node
    first = getattr(part, "lineno", 0)
    return first, getattr(part, "end_lineno", None) or first


def mutate(source: str, index: int) -> str:
    tree = ast.parse(source)
    for i, (node, _kind, _detail, apply) in enumerate(_walk(tree)):
        if i == index:
            apply(node)
            return ast.unparse(ast.fix_missing_locations(tree))
    raise IndexError(index)


def load_equivalent(path: Path = EQUIVALENT_FILE) -> dict[str, str]:
    """``id | reason`` lines; ``#`` starts a comment line."""
    found: dict[str, str] = {}
    if not path.exists():
        return found
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ident, _, reason = line.partition(" | ")
        found[ident.strip()] = reason.strip()
    return found


def _scratch_copy() -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="apollia-mutation-"))
    ignore = shutil.ignore_patterns(".git", ".venv", ".test-peers", "node_modules", "__pycache__", "*.pyc",
                                    ".hypothesis", ".test-artifacts")
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv", ".test-peers", ".hypothesis", ".test-artifacts"}:
            continue
        if entry.is_dir():
            shutil.copytree(entry, scratch / entry.name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(entry, scratch / entry.name)
    for link in (".venv", ".test-peers"):
        if (ROOT / link).exists():
            os.symlink((ROOT / link).resolve(), scratch / link)
    (scratch / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return scratch


# Imported by every Python process started with the scratch copy on PYTHONPATH; does nothing unless the
# coverage map is being made.
_SITECUSTOMIZE = """\
import os

if os.environ.get("APOLLIA_MUTATION_COVERAGE") and os.environ.get("APOLLIA_MUTATION_CONTEXT"):
    import atexit

    import coverage

    _cov = coverage.Coverage(data_file=os.environ["APOLLIA_MUTATION_COVERAGE"], data_suffix=True,
                             include=[os.environ["APOLLIA_MUTATION_TARGET"]], config_file=False,
                             context=os.environ["APOLLIA_MUTATION_CONTEXT"])
    _cov.start()

    def _save():
        _cov.stop()
        _cov.save()

    atexit.register(_save)
"""


def _pytest_args(scratch: Path, tests: tuple[str, ...]) -> list[str]:
    return ["-x", "-q", "-p", "no:cacheprovider", f"--basetemp={scratch / '.mutation-tmp'}", *tests]


def _clear_caches() -> None:
    """Empty every ``functools`` cache of the project's modules.

    ``shellcheck`` caches what it reads of a command: with a warm cache a test does not execute the lines
    that computed an answer, so the coverage map would not send it to their mutants, and a forked child
    would answer from what the unmutated code cached before the fork."""
    import functools

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("apollia_nb"):
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


# --- the coverage map: which test reaches which line -------------------------------------------------------


def _map_main(name: str, out: Path) -> int:
    """Run a module's tests once, unmutated, recording per test the module's lines it executes.

    Runs inside a scratch copy (the caller sets ``cwd`` and ``PYTHONPATH``). Lines reached only while modules
    are imported (module constants, ``def`` lines, defaults) are recorded with no test: every test needs them.
    """
    import json

    import coverage
    import pytest

    rel, tests = MODULES[name]
    target = str(Path.cwd() / rel)
    cov = coverage.Coverage(data_file=None, include=[target], config_file=False)
    durations: dict[str, float] = {}
    # Python processes the tests start (signature workers, the CLI) record their coverage too, under the
    # test that started them: ``sitecustomize`` in the scratch copy starts it when these are set.
    sub_dir = Path.cwd() / ".mutation-subprocess-coverage"
    sub_dir.mkdir(exist_ok=True)
    os.environ["APOLLIA_MUTATION_COVERAGE"] = str(sub_dir / "cov")
    os.environ["APOLLIA_MUTATION_TARGET"] = target

    class Recorder:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            _clear_caches()  # each test executes every line its answers need
            cov.switch_context(item.nodeid)
            os.environ["APOLLIA_MUTATION_CONTEXT"] = item.nodeid
            start = time.perf_counter()
            yield
            durations[item.nodeid] = time.perf_counter() - start
            os.environ["APOLLIA_MUTATION_CONTEXT"] = ""
            cov.switch_context("")

    cov.start()
    start = time.perf_counter()
    code = pytest.main(_pytest_args(Path.cwd(), tests), plugins=[Recorder()])
    total = time.perf_counter() - start
    cov.stop()
    data = cov.get_data()
    by_line = {line: set(contexts) for line, contexts in data.contexts_by_lineno(target).items()}
    at_import = sorted(line for line, contexts in by_line.items() if "" in contexts)
    subs = []
    for path in sub_dir.glob("cov.*"):
        sub = coverage.CoverageData(basename=str(path))
        sub.read()
        subs.append(sub.contexts_by_lineno(target))
    lines = {str(line): tests for line, tests in _tests_by_line(by_line, subs).items()}
    out.write_text(json.dumps({"exit": int(code), "total": total, "durations": durations, "lines": lines,
                               "at_import": at_import}))
    return 0


def _tests_by_line(main: dict[int, set[str]], subprocesses: list[dict[int, list[str]]]) -> dict[int, list[str]]:
    """Per line of the module, the tests that reach it: in the tests' own process (``main``, where the context
    ``""`` is import and collection) or in a Python process a test started (its context is that test).

    A line the tests' process executed only at import (a module constant, a ``def`` line) maps to no test, even
    when a subprocess imported the module under some test: every test reads what importing it built, so only
    the whole test files can tell a mutant of it."""
    by_line = {line: set(contexts) for line, contexts in main.items()}
    only_at_import = {line for line, contexts in by_line.items() if contexts <= {""}}
    for sub in subprocesses:
        for line, contexts in sub.items():
            if line not in only_at_import:
                by_line.setdefault(line, set()).update(contexts)
    return {line: sorted(c for c in contexts if c) for line, contexts in by_line.items()}


@dataclass
class CoverageMap:
    total: float
    durations: dict[str, float]
    lines: dict[int, list[str]]
    at_import: frozenset[int] = frozenset()  # lines executed while modules were imported or tests collected

    def tests_for(self, site: Site) -> list[str] | None:
        """The tests that reach the site, fastest first; ``None`` when only a whole run can tell."""
        found: set[str] = set()
        first, last = site.span
        for line in range(first, last + 1):
            found.update(self.lines.get(line, ()))
        if not found:
            # Reached at import only, or only in a subprocess (a signature worker, the CLI), or never.
            return None
        return sorted(found, key=lambda t: (self.durations.get(t, 0.0), t))


def _coverage_map(name: str, scratch: Path) -> CoverageMap:
    import json

    out = scratch / f".mutation-map-{name}.json"
    env = dict(os.environ, PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([sys.executable, str(scratch / "dev" / "mutation.py"), "--map", name, "--map-out", str(out)],
                   cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if not out.exists():
        raise SystemExit(f"mutation: the coverage run of {name}'s tests did not finish")
    data = json.loads(out.read_text())
    out.unlink()
    if data["exit"] != 0:
        raise SystemExit(f"mutation: the tests of {name} fail on the unmutated module; fix them first")
    return CoverageMap(data["total"], data["durations"], {int(k): v for k, v in data["lines"].items()},
                       frozenset(data["at_import"]))


# --- patching a function in place: mutants of function bodies ----------------------------------------------


@dataclass(frozen=True)
class Target:
    """A function (or method) of the module whose body holds a mutant: its qualified name and rank among
    functions of that name (a property's getter and setter share one), and the lines of its body."""

    qualname: str
    rank: int
    body: tuple[int, int]
    lines: tuple[int, int]


def targets(source: str) -> list[Target]:
    """The module's outermost functions: module functions and methods of (nested) classes."""
    found: list[Target] = []
    ranks: dict[str, int] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + node.name
                ranks[qualname] = ranks.get(qualname, -1) + 1
                body_span = (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
                found.append(Target(qualname, ranks[qualname], body_span, (node.lineno, body_span[1])))

    visit(ast.parse(source).body, "")
    return found


def patch_target(site: Site, funcs: list[Target], cmap: CoverageMap) -> Target | None:
    """The function whose code a mutant changes, when patching that function's code is the same as
    importing the mutated module: the mutant is in its body (not a default or a decorator), and no line of
    the function ran while modules were imported (else objects built then would differ)."""
    for func in funcs:
        if func.body[0] <= site.span[0] and site.span[1] <= func.body[1]:
            if any(func.body[0] <= line <= func.body[1] for line in cmap.at_import):
                return None
            return func
    return None


def _functions(namespace: dict, module_name: str) -> dict[tuple[str, int], object]:
    """Every function reachable from a module's namespace, keyed like :class:`Target`."""
    import inspect

    seen: dict[str, list[object]] = {}

    def add(qualname: str, func: object) -> None:
        func = inspect.unwrap(func)  # type: ignore[arg-type]
        if hasattr(func, "__code__") and getattr(func, "__module__", None) == module_name:
            seen.setdefault(qualname, []).append(func)

    def visit(items, prefix: str, depth: int) -> None:
        for key, value in items:
            if isinstance(value, type) and value.__module__ == module_name and depth < 5:
                visit(list(vars(value).items()), f"{prefix}{key}.", depth + 1)
            elif isinstance(value, property):
                for part in (value.fget, value.fset, value.fdel):
                    if part is not None:
                        add(prefix + key, part)
            elif isinstance(value, (staticmethod, classmethod)):
                add(prefix + key, value.__func__)
            elif callable(value):
                add(prefix + key, value)

    visit(list(namespace.items()), "", 0)
    found: dict[tuple[str, int], object] = {}
    for qualname, funcs in seen.items():
        unique = list({id(f): f for f in funcs}.values())
        unique.sort(key=lambda f: f.__code__.co_firstlineno)  # type: ignore[attr-defined]
        for rank, func in enumerate(unique):
            found[(qualname, rank)] = func
    return found


_CANNOT_PATCH = 97


def _patch(module, mutated: str, target: Target) -> bool:
    """Give the module's function the mutated function's code; False if it cannot be done exactly."""
    import builtins

    namespace = {"__name__": module.__name__, "__file__": module.__file__, "__package__": module.__package__,
                 "__builtins__": builtins, "__spec__": module.__spec__}
    try:
        exec(compile(mutated, module.__file__, "exec"), namespace)  # noqa: S102 - the mutant under test
    except BaseException:  # noqa: BLE001
        return False
    key = (target.qualname, target.rank)
    old = _functions(vars(module), module.__name__).get(key)
    new = _functions(namespace, module.__name__).get(key)
    if old is None or new is None:
        return False
    try:
        old.__code__ = new.__code__  # type: ignore[attr-defined]
    except ValueError:  # a different closure
        return False
    return True


class _Server:
    """Runs inside one pytest session: the tests are collected once, then each mutant runs in a child forked
    after collection, with one function's code patched, on the collected items it needs."""

    def __init__(self, name: str, scratches: list[Path], jobs: list[dict], out: Path, parallel: int) -> None:
        self.name, self.scratches, self.jobs, self.out, self.parallel = name, scratches, jobs, out, parallel

    def pytest_runtestloop(self, session) -> bool:
        import importlib
        import json

        rel = MODULES[self.name][0]
        module = importlib.import_module(rel[:-3].replace("/", "."))
        original = Path(module.__file__).read_text()
        items = list(session.items)
        by_id = {item.nodeid: item for item in items}
        factory = getattr(session.config, "_tmp_path_factory", None)
        queue = list(self.jobs)
        kills: dict[str, int] = {}
        free = list(self.scratches[: self.parallel])
        running: dict[int, tuple[dict, Path, float]] = {}
        with self.out.open("w") as out:
            while queue or running:
                while queue and free:
                    job = queue.pop(0)
                    scratch = free.pop()
                    mutated = mutate(original, job["index"])
                    (scratch / rel).write_text(mutated)
                    (scratch / ".mutation-killer").unlink(missing_ok=True)
                    # Every test the map names, or every test when one of them is not collected here.
                    named = job["tests"] is not None and all(t in by_id for t in job["tests"])
                    chosen = [by_id[t] for t in job["tests"]] if named else items
                    # Tests that killed earlier mutants first: a mutant is usually killed by one of them.
                    chosen = sorted(chosen, key=lambda item: -kills.get(item.nodeid, 0))
                    pid = os.fork()
                    if pid == 0:
                        self._child(module, mutated, Target(**job["target"]), chosen, scratch, factory)
                    try:
                        os.setpgid(pid, pid)
                    except OSError:
                        pass
                    running[pid] = (job, scratch, time.monotonic(), job["bound"])
                time.sleep(0.005)
                for job, scratch, outcome in _reap(running, _patched_outcome, free, rel, original):
                    killer = scratch / ".mutation-killer"
                    if outcome == "killed" and killer.exists():
                        kills[killer.read_text()] = kills.get(killer.read_text(), 0) + 1
                    if outcome == "timeout" and not job.get("again"):  # (not "spun": it kept a core busy)
                        # Over a bound set by the tests' own durations: on a busy machine, give it another.
                        queue.insert(0, dict(job, bound=job["bound"] * 3, again=True))
                        continue
                    outcome = "timeout" if outcome == "spun" else outcome
                    out.write(json.dumps({"ident": job["ident"], "outcome": outcome}) + "\n")
                    out.flush()
        return True

    @staticmethod
    def _child(module, mutated: str, target: Target, items: list, scratch: Path, factory) -> None:
        code = _CANNOT_PATCH
        try:
            os.setpgid(0, 0)
            _bound_resources()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            # Subprocesses the tests start import the mutant from this copy, also those that put the
            # package's own folder first (the journal's signature workers): it is this copy's now.
            os.environ["PYTHONPATH"] = str(scratch)
            package = sys.modules.get("apollia_nb")
            if package is not None:
                package.__file__ = str(scratch / "apollia_nb" / "__init__.py")
            os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
            if factory is not None and hasattr(factory, "_given_basetemp"):
                factory._given_basetemp = scratch / ".mutation-tmp"
                factory._basetemp = None
            if not _patch(module, mutated, target):
                os._exit(_CANNOT_PATCH)
            _clear_caches()  # answers the unmutated code cached before the fork
            from _pytest.runner import runtestprotocol

            code = 0
            for i, item in enumerate(items):
                reports = runtestprotocol(item, nextitem=items[i + 1] if i + 1 < len(items) else None, log=False)
                if any(report.failed for report in reports):
                    (scratch / ".mutation-killer").write_text(item.nodeid)
                    code = 1
                    break
        except BaseException:  # noqa: BLE001 - the child reports by exit code only
            code = _CANNOT_PATCH
        finally:
            os._exit(code)


def _serve_main(name: str, spec: Path, out: Path) -> int:
    import json

    import pytest

    pytest.hookimpl(tryfirst=True)(_Server.pytest_runtestloop)
    data = json.loads(spec.read_text())
    scratches = [Path(p) for p in data["scratches"]]
    sys.dont_write_bytecode = True
    server = _Server(name, scratches, data["jobs"], out, data["parallel"])
    pytest.main([*_pytest_args(scratches[0], MODULES[name][1])], plugins=[server])
    return 0


def _run_patched(name: str, scratches: list[Path], jobs: list[tuple[Site, Target, list[str] | None, float]],
                 cmap: CoverageMap, verbose: bool) -> dict[str, str]:
    """Run the mutants of function bodies in one pytest session (see :class:`_Server`)."""
    import json

    spec = scratches[0] / f".mutation-serve-{name}.json"
    out = scratches[0] / f".mutation-serve-{name}.jsonl"
    whole = cmap.total * 3 + 15
    spec.write_text(json.dumps({
        "scratches": [str(p) for p in scratches], "parallel": len(scratches),
        "jobs": [{"index": site.index, "ident": site.ident(name), "target": target.__dict__, "tests": tests,
                  "bound": bound, "whole_bound": whole} for site, target, tests, bound in jobs],
    }))
    env = dict(os.environ, PYTHONPATH=str(scratches[0]), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([sys.executable, str(scratches[0] / "dev" / "mutation.py"), "--serve", name,
                             "--serve-spec", str(spec), "--serve-out", str(out)],
                            cwd=scratches[0], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict[str, str] = {}
    seen = 0
    while True:
        finished = proc.poll() is not None
        if out.exists():
            text = out.read_text()
            lines = text.splitlines()
            complete = lines if text.endswith("\n") else lines[:-1]  # a line being written waits
            for line in complete[seen:]:
                record = json.loads(line)
                results[record["ident"]] = record["outcome"]
                if verbose and record["outcome"] != "reimport":
                    print(f"  {record['outcome']:8} {record['ident']}  (patched)", flush=True)
            seen = len(complete)
        if finished:
            break
        time.sleep(0.5)
    return results


# --- running mutants: forked from a process that has the test suite's packages imported -------------------


class _Select:
    """A pytest plugin keeping only the named tests, in the given order."""

    def __init__(self, nodeids: list[str]) -> None:
        self.order = {n: i for i, n in enumerate(nodeids)}

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        kept = [item for item in items if item.nodeid in self.order]
        if len(kept) < len(self.order):
            return  # a test the map named is not collected: run them all rather than fewer
        kept.sort(key=lambda item: self.order[item.nodeid])
        items[:] = kept


def _warm(scratch: Path, tests: tuple[str, ...]) -> None:
    """Import pytest, its plugins and every package the tests import, then forget the project's own modules.

    Each mutant then runs in a child forked from here: a fresh process that imports the project (and the
    mutant) from its own scratch copy but does not pay for starting Python and the third-party imports.
    """
    import pytest

    # This collection writes the bytecode of the project and of the rewritten tests into the scratch copy,
    # so children do not compile them again; the mutated module's bytecode is removed below and never
    # written again (a mutant of the same size written in the same second would otherwise pass as the
    # original).
    sys.dont_write_bytecode = False
    saved_path, saved_cwd = list(sys.path), os.getcwd()
    null = os.open(os.devnull, os.O_WRONLY)
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        os.chdir(scratch)
        sys.path.insert(0, str(scratch))
        pytest.main(["--collect-only", *_pytest_args(scratch, tests)])
    finally:
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (null, saved_out, saved_err):
            os.close(fd)
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        sys.dont_write_bytecode = True
    _forget_project()
    for rel, _tests in MODULES.values():
        module = scratch / rel
        for cached in (module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"):
            cached.unlink()
    # What is imported now lives as long as the children: keep it out of their collections (and their pages
    # shared with this process).
    import gc

    gc.collect()
    gc.freeze()


def _forget_project() -> None:
    scratch_root = str(Path(tempfile.gettempdir()).resolve() / "apollia-mutation-")
    for mod_name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if (file.startswith(scratch_root) or mod_name.split(".")[0] in {"apollia_nb", "tests", "conftest"}
                or mod_name.startswith(("test_", "notebook_fixtures", "runtime_helpers"))):
            del sys.modules[mod_name]


@dataclass
class _Job:
    site: Site
    tests: list[str] | None  # None: the module's whole test files
    bound: float
    first: bool = True  # False when run again (over its bound once, or unclear)


def _fork_run(scratch: Path, test_files: tuple[str, ...], job: _Job) -> int:
    pid = os.fork()
    if pid:
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        return pid
    code = 99
    try:
        os.setpgid(0, 0)
        _bound_resources()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.chdir(scratch)
        sys.path[:] = [str(scratch)] + [p for p in sys.path if "apollia-mutation-" not in p]
        os.environ["PYTHONPATH"] = str(scratch)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
        import pytest

        if job.tests is None:
            files, plugins = test_files, []
        else:
            files = tuple(dict.fromkeys(t.split("::")[0] for t in job.tests))
            plugins = [_Select(job.tests)]
        code = int(pytest.main(_pytest_args(scratch, files), plugins=plugins))
    except BaseException:  # noqa: BLE001 - the child reports by exit code only
        code = 99
    finally:
        os._exit(code)


def _fresh_run(scratch: Path, tests: tuple[str, ...], timeout: float | None) -> tuple[str, float]:
    """The strict way: a new interpreter runs the module's whole test files (``--fresh``)."""
    env = dict(os.environ, PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", *_pytest_args(scratch, tests)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The tests and whatever they started (servers, workers) go together.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout", time.monotonic() - start
    elapsed = time.monotonic() - start
    return ("survived" if proc.returncode == 0 else "killed"), elapsed


def _reap(running: dict[int, tuple[Any, Path, float, float]], outcome_of: Callable[[int], str],
          free: list[Path], rel: str, original: str) -> Iterator[tuple[Any, Path, str]]:
    """``(job, scratch, outcome)`` of each child in ``running`` (``pid: (job, scratch, started, bound)``)
    that has ended (``outcome_of`` its wait status) or overrun its bound: killed, ``"spun"`` when it
    used a core for most of that time (a mutant looping: detected, no second try) or overran it while the
    machine had a core to spare (waiting on itself: the same), else ``"timeout"``
    (perhaps only a busy machine: the caller may give it a longer bound). Each leaves ``running`` with
    whatever it started, and its scratch copy goes back to ``free`` holding ``original`` again."""
    for pid, (job, scratch, started, bound) in list(running.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            outcome = outcome_of(status)
        elif time.monotonic() - started > bound:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, _, usage = os.wait4(pid, 0)
            spun = usage.ru_utime + usage.ru_stime > 0.5 * (time.monotonic() - started)
            # Stuck with a core to spare (the load under the number of cores): waiting on itself, not on
            # the machine, so a longer bound would only wait longer.
            spun = spun or os.getloadavg()[0] < (os.cpu_count() or 1) - 0.5
            outcome = "spun" if spun else "timeout"
        else:
            continue
        try:  # whatever the tests started and left behind goes with them
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        del running[pid]
        free.append(scratch)
        (scratch / rel).write_text(original)
        yield job, scratch, outcome


#: The data a mutant's process (and each process it starts) may allocate, and its CPU seconds: a mutant that
#: grows a list without end fails with ``MemoryError`` instead of taking the machine's memory, and a process
#: it started that spins on after its test was killed ends by ``SIGXCPU``.
CHILD_DATA_LIMIT = 3 * 1024**3
CHILD_CPU_LIMIT = 1200


def _bound_resources() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_DATA, (CHILD_DATA_LIMIT, CHILD_DATA_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CHILD_CPU_LIMIT, CHILD_CPU_LIMIT + 10))


def _patched_outcome(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return {0: "survived", 1: "killed", _CANNOT_PATCH: "reimport"}.get(code, "reimport")


def _outcome(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "survived"
    if code in (1, 2, 3):  # tests failed, collection or import broken, internal error
        return "killed"
    return "unclear"  # usage error, no test selected, the child itself failed: run again with every test


def _run_forked(name: str, scratches: list[Path], jobs: list[_Job], original: str, cmap: CoverageMap,
                verbose: bool) -> dict[str, str]:
    rel, test_files = MODULES[name]
    queue = list(jobs)
    running: dict[int, tuple[_Job, Path, float]] = {}
    free = list(scratches)
    results: dict[str, str] = {}
    whole_bound = cmap.total * 3 + 15
    while queue or running:
        while queue and free:
            job = queue.pop(0)
            scratch = free.pop()
            (scratch / rel).write_text(mutate(original, job.site.index))
            pid = _fork_run(scratch, test_files, job)
            running[pid] = (job, scratch, time.monotonic(), job.bound)
        time.sleep(0.01)
        for job, scratch, outcome in _reap(running, _outcome, free, rel, original):
            if outcome == "timeout" and job.first:
                # Over a bound set by the tests' own durations: on a busy machine, give it another.
                queue.insert(0, _Job(job.site, job.tests, job.bound * 3, first=False))
                continue
            if job.tests is not None and outcome == "unclear":
                queue.insert(0, _Job(job.site, None, whole_bound, first=False))
                continue
            if outcome == "unclear":
                outcome = "killed" if job.tests is None else outcome
            outcome = "timeout" if outcome == "spun" else outcome
            results[job.site.ident(name)] = outcome
            if verbose:
                print(f"  {outcome:8} {job.site.ident(name)}", flush=True)
    return results


def run_module(name: str, scratches: list[Path], sample: int | None, seed: int, equivalent: dict[str, str],
               verbose: bool, fresh: bool, patch: bool = True,
               only: set[str] | None = None) -> dict[str, int | float]:
    rel, tests = MODULES[name]
    original = (ROOT / rel).read_text()
    if ast.dump(ast.parse(ast.unparse(ast.parse(original)))) != ast.dump(ast.parse(original)):
        raise SystemExit(f"mutation: {rel} does not survive ast.unparse unchanged")
    all_sites = sites(original)
    chosen = all_sites
    if only is not None:
        chosen = [site for site in all_sites if site.ident(name) in only]
    if sample is not None and sample < len(chosen):
        chosen = sorted(random.Random(f"{seed}:{name}").sample(chosen, sample), key=lambda s: s.index)
    if not chosen:
        print(f"{name}: generated {len(all_sites)}, nothing to run", flush=True)
        return {"generated": len(all_sites), "run": 0}
    began = time.monotonic()
    results: dict[str, str] = {}
    if fresh:
        scratch = scratches[0]
        target = scratch / rel
        target.write_text(ast.unparse(ast.parse(original)))
        outcome, base = _fresh_run(scratch, tests, None)
        if outcome != "survived":
            target.write_text(original)
            raise SystemExit(f"mutation: the tests of {name} fail on the unmutated module; fix them first")
        bound = base * 3 + 15
        try:
            for site in chosen:
                target.write_text(mutate(original, site.index))
                results[site.ident(name)] = _fresh_run(scratch, tests, bound)[0]
                if verbose:
                    print(f"  {results[site.ident(name)]:8} {site.ident(name)}", flush=True)
        finally:
            target.write_text(original)
        how = f"fresh interpreter per mutant, tests {base:.1f}s, bound {bound:.0f}s"
    else:
        cmap = _coverage_map(name, scratches[0])
        funcs = targets(original)
        patched_jobs, jobs = [], []
        for site in chosen:
            selected = cmap.tests_for(site)
            bound = cmap.total * 3 + 15
            if selected is not None:
                bound = sum(cmap.durations.get(t, 0.0) for t in selected) * 3 + 10
            target = patch_target(site, funcs, cmap) if patch else None
            if target is not None:
                patched_jobs.append((site, target, selected, bound))
            else:
                jobs.append(_Job(site, selected, bound))
        if patched_jobs:
            results.update(_run_patched(name, scratches, patched_jobs, cmap, verbose))
            by_ident = {site.ident(name): (site, selected, bound) for site, _t, selected, bound in patched_jobs}
            for ident, outcome in list(results.items()):
                if outcome == "reimport":
                    site, selected, bound = by_ident[ident]
                    jobs.append(_Job(site, selected, bound))
                    del results[ident]
            # A session that ended early (it crashed, say) leaves its mutants to the re-importing runs.
            queued = {job.site.ident(name) for job in jobs}
            jobs.extend(_Job(site, selected, bound) for site, _t, selected, bound in patched_jobs
                        if site.ident(name) not in results and site.ident(name) not in queued)
        if jobs:
            for scratch in scratches:
                _warm(scratch, tests)
            results.update(_run_forked(name, scratches, jobs, original, cmap, verbose))
        how = (f"tests {cmap.total:.1f}s, {len(scratches)} at a time, {len(chosen) - len(jobs)} patched in place, "
               f"{len(jobs)} re-imported")
    counts = {"generated": len(all_sites), "run": len(chosen), "killed": 0, "survived": 0, "timeout": 0,
              "equivalent": 0}
    survivors: list[str] = []
    for site in chosen:
        ident = site.ident(name)
        outcome = results[ident]
        counts[outcome] += 1
        if outcome == "survived":
            if ident in equivalent:
                counts["equivalent"] += 1
            else:
                survivors.append(ident)
    detected = counts["killed"] + counts["timeout"]
    raw = detected / counts["run"] if counts["run"] else 1.0
    denominator = counts["run"] - counts["equivalent"]
    adjusted = detected / denominator if denominator else 1.0
    minutes = (time.monotonic() - began) / 60
    print(f"{name}: generated {counts['generated']}, run {counts['run']}, killed {counts['killed']}, "
          f"survived {counts['survived']}, timed out {counts['timeout']}, equivalent {counts['equivalent']}, "
          f"score {raw:.1%} raw, {adjusted:.1%} without equivalent ({minutes:.1f} min; {how})", flush=True)
    for ident in survivors:
        line = int(ident.split(":")[1])
        text = original.splitlines()[line - 1].strip() if line else ""
        print(f"  survived {ident}    {text}", flush=True)
    return {**counts, "raw": raw, "adjusted": adjusted}


def main(argv: list[str] | None = None) -> int:
    # Test ids hold reprs of parameters (a set's order follows the string hash): the same seed in the map,
    # the server and every child keeps the ids the map recorded the ids the session collects.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"one of {', '.join(MODULES)} (all if none)")
    parser.add_argument("--sample", type=int, help="run a uniform sample of N mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--list", action="store_true", help="list the mutants' ids and run nothing")
    parser.add_argument("--ids", type=Path, metavar="FILE",
                        help="run only the mutants whose ids FILE lists (one a line, as --list prints them)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each mutant's outcome")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="mutants run at a time (default: the number of cores)")
    parser.add_argument("--fresh", action="store_true",
                        help="start a new interpreter per mutant and run the whole test files (slow)")
    parser.add_argument("--map", help=argparse.SUPPRESS)
    parser.add_argument("--map-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--serve-spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.map:
        return _map_main(args.map, args.map_out)
    if args.serve:
        return _serve_main(args.serve, args.serve_spec, args.serve_out)
    names = args.modules or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}; known: {', '.join(MODULES)}")
    if args.list:
        for name in names:
            for site in sites((ROOT / MODULES[name][0]).read_text()):
                print(site.ident(name))
        return 0
    only = None
    if args.ids is not None:
        only = {line.split()[0] for line in args.ids.read_text().splitlines() if line.strip()}
        names = [n for n in names if any(i.startswith(f"{n}:") for i in only)]
    equivalent = load_equivalent()
    scratches = [_scratch_copy() for _ in range(1 if args.fresh else max(1, args.jobs))]
    try:
        for name in names:
            run_module(name, scratches, args.sample, args.seed, equivalent, args.verbose, args.fresh, only=only)
    finally:
        for scratch in scratches:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
