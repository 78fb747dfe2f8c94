"""The mutation runner's own rules: which mutants it makes, and which tests it picks for each."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _runner():
    spec = importlib.util.spec_from_file_location("mutation_runner", ROOT / "dev" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_runner"] = module
    spec.loader.exec_module(module)
    return module


SOURCE = '''
from typing import Literal, TypeVar

T = TypeVar("T")
Kind = Literal["a", "b"]
LIMIT = 8
"""The limit's docstring."""


def f(x: int = 3) -> bool:
    """f's docstring."""
    if x < LIMIT and x:
        return x + 1 > 2
    return False
'''


def test_sites_leave_text_only_type_checkers_see_alone():
    runner = _runner()
    found = {s.ident("toy") for s in runner.sites(SOURCE)}
    assert not any(":4:" in i or ":5:" in i or ":7:" in i for i in found), found
    assert "toy:6:const:8->9" in found
    assert "toy:10:const:3->4" in found  # a default value is behaviour
    assert {"toy:12:if:test->not", "toy:12:boolop:And->Or", "toy:12:cmp:0:Lt->LtE", "toy:13:binop:Add->Sub",
            "toy:13:return:value->None", "toy:14:const:False->True"} <= found


def test_every_mutant_is_one_change_that_parses():
    runner = _runner()
    original = ast.dump(ast.parse(SOURCE))
    for site in runner.sites(SOURCE):
        mutated = runner.mutate(SOURCE, site.index)
        assert ast.dump(ast.parse(mutated)) != original, site


def test_the_tests_for_a_mutant_are_those_reaching_its_lines_fastest_first():
    runner = _runner()
    by_ident = {s.ident("toy"): s for s in runner.sites(SOURCE)}
    cmap = runner.CoverageMap(
        total=3.0,
        durations={"t::slow": 2.0, "t::fast": 0.5},
        lines={12: ["t::slow", "t::fast"], 13: ["t::slow"]},
    )
    assert cmap.tests_for(by_ident["toy:12:cmp:0:Lt->LtE"]) == ["t::fast", "t::slow"]
    assert cmap.tests_for(by_ident["toy:13:binop:Add->Sub"]) == ["t::slow"]
    # Reached only at import (or in a subprocess, or never): the whole test files decide.
    assert cmap.tests_for(by_ident["toy:6:const:8->9"]) is None
    assert cmap.tests_for(by_ident["toy:14:const:False->True"]) is None


def test_a_line_run_only_at_import_maps_to_no_test_though_a_subprocess_imports_the_module():
    runner = _runner()
    main = {6: {""}, 10: {""}, 12: {"", "t::a"}, 13: {"t::a"}}
    # A test that starts Python (the CLI, an import under -W error) imports the module there too.
    sub = {6: ["t::cli"], 10: ["t::cli"], 12: ["t::cli"], 13: ["t::cli"], 20: ["t::cli"]}
    lines = runner._tests_by_line(main, [sub])
    assert lines[6] == [] and lines[10] == []  # constants, def lines: the whole test files decide
    assert lines[12] == ["t::a", "t::cli"] and lines[13] == ["t::a", "t::cli"]
    assert lines[20] == ["t::cli"]  # run only in the subprocess: its test reaches it
    by_ident = {s.ident("toy"): s for s in runner.sites(SOURCE)}
    cmap = runner.CoverageMap(total=1.0, durations={}, lines=lines, at_import=frozenset({6, 10, 12}))
    assert cmap.tests_for(by_ident["toy:6:const:8->9"]) is None


def test_an_if_is_reached_through_its_test():
    runner = _runner()
    site = next(s for s in runner.sites(SOURCE) if s.ident("toy") == "toy:12:if:test->not")
    assert site.span == (12, 12)


def test_the_equivalent_list_names_only_mutants_that_exist():
    runner = _runner()
    listed = runner.load_equivalent()
    assert listed, "the list is read"
    known = set()
    for name, (rel, _tests) in runner.MODULES.items():
        known.update(s.ident(name) for s in runner.sites((ROOT / rel).read_text()))
    assert sorted(set(listed) - known) == []
    assert all(reason for reason in listed.values())


def test_a_function_body_mutant_is_patched_into_the_imported_function(tmp_path, monkeypatch):
    runner = _runner()
    (tmp_path / "toy_mutation_module.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_mutation_module as toy

    by_ident = {s.ident("toy"): s for s in runner.sites(SOURCE)}
    funcs = runner.targets(SOURCE)
    assert [(f.qualname, f.body) for f in funcs] == [("f", (11, 14))]
    cmap = runner.CoverageMap(total=1.0, durations={}, lines={})
    site = by_ident["toy:13:binop:Add->Sub"]
    target = runner.patch_target(site, funcs, cmap)
    assert target is not None and target.qualname == "f"
    f = toy.f
    assert f(2) is True  # 2 + 1 > 2
    assert runner._patch(toy, runner.mutate(SOURCE, site.index), target)
    assert toy.f is f and f(2) is False  # 2 - 1 > 2: the same function object runs the mutant
    # Not patched: a default value or a module constant (only importing the mutant shows those), nor a
    # function that ran while modules were imported (what was built then would differ).
    assert runner.patch_target(by_ident["toy:10:const:3->4"], funcs, cmap) is None
    assert runner.patch_target(by_ident["toy:6:const:8->9"], funcs, cmap) is None
    imported = runner.CoverageMap(total=1.0, durations={}, lines={}, at_import=frozenset({12}))
    assert runner.patch_target(site, funcs, imported) is None
