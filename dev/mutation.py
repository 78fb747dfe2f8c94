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
from dataclasses import dataclass
from pathlib import Path

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
        ("tests/test_shellcheck.py", "tests/test_decision.py", "tests/test_governance_attacks.py"),
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
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        for kind, detail, apply in _mutations(node, skip):
            yield node, kind, detail, apply


def sites(source: str) -> list[Site]:
    tree = ast.parse(source)
    found = []
    seen: dict[tuple[int, str, str], int] = {}
    for index, (node, kind, detail, _apply) in enumerate(_walk(tree)):
        key = (getattr(node, "lineno", 0), kind, detail)
        seen[key] = seen.get(key, 0) + 1
        found.append(Site(index, key[0], kind, detail, seen[key]))
    return found


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
    ignore = shutil.ignore_patterns(".git", ".venv", ".test-peers", "node_modules", "__pycache__", "*.pyc")
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv", ".test-peers"}:
            continue
        if entry.is_dir():
            shutil.copytree(entry, scratch / entry.name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(entry, scratch / entry.name)
    for link in (".venv", ".test-peers"):
        if (ROOT / link).exists():
            os.symlink((ROOT / link).resolve(), scratch / link)
    return scratch


def _run_tests(scratch: Path, tests: tuple[str, ...], timeout: float | None) -> tuple[str, float]:
    env = dict(os.environ, PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
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


def run_module(name: str, scratch: Path, sample: int | None, seed: int, equivalent: dict[str, str],
               verbose: bool) -> dict[str, int | float]:
    rel, tests = MODULES[name]
    target = scratch / rel
    original = (ROOT / rel).read_text()
    all_sites = sites(original)
    chosen = all_sites
    if sample is not None and sample < len(all_sites):
        chosen = sorted(random.Random(f"{seed}:{name}").sample(all_sites, sample), key=lambda s: s.index)
    # Baseline: the unmutated module, as the mutants are written (``ast.unparse``), must pass.
    target.write_text(ast.unparse(ast.parse(original)))
    outcome, base = _run_tests(scratch, tests, None)
    if outcome != "survived":
        target.write_text(original)
        raise SystemExit(f"mutation: the tests of {name} fail on the unmutated module; fix them first")
    timeout = base * 3 + 15
    counts = {"generated": len(all_sites), "run": len(chosen), "killed": 0, "survived": 0, "timeout": 0,
              "equivalent": 0}
    survivors: list[str] = []
    try:
        for site in chosen:
            ident = site.ident(name)
            target.write_text(mutate(original, site.index))
            outcome, _elapsed = _run_tests(scratch, tests, timeout)
            counts[outcome] += 1
            if outcome == "survived":
                if ident in equivalent:
                    counts["equivalent"] += 1
                else:
                    survivors.append(ident)
            if verbose:
                print(f"  {outcome:8} {ident}", flush=True)
    finally:
        target.write_text(original)
    detected = counts["killed"] + counts["timeout"]
    raw = detected / counts["run"] if counts["run"] else 1.0
    denominator = counts["run"] - counts["equivalent"]
    adjusted = detected / denominator if denominator else 1.0
    print(f"{name}: generated {counts['generated']}, run {counts['run']}, killed {counts['killed']}, "
          f"survived {counts['survived']}, timed out {counts['timeout']}, equivalent {counts['equivalent']}, "
          f"score {raw:.1%} raw, {adjusted:.1%} without equivalent (tests {base:.1f}s, bound {timeout:.0f}s)",
          flush=True)
    for ident in survivors:
        line = int(ident.split(":")[1])
        text = original.splitlines()[line - 1].strip() if line else ""
        print(f"  survived {ident}    {text}", flush=True)
    return {**counts, "raw": raw, "adjusted": adjusted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"one of {', '.join(MODULES)} (all if none)")
    parser.add_argument("--sample", type=int, help="run a uniform sample of N mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--list", action="store_true", help="list the mutants' ids and run nothing")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each mutant's outcome")
    args = parser.parse_args(argv)
    names = args.modules or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}; known: {', '.join(MODULES)}")
    if args.list:
        for name in names:
            for site in sites((ROOT / MODULES[name][0]).read_text()):
                print(site.ident(name))
        return 0
    equivalent = load_equivalent()
    scratch = _scratch_copy()
    try:
        for name in names:
            run_module(name, scratch, args.sample, args.seed, equivalent, args.verbose)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
