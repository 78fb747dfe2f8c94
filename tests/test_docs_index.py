"""``docs/index.md`` lists every document of ``docs/``, grouped, with what each is for; the README links it.

A newcomer who follows only the README and the index reaches every document; every link of both
opens; ``docs/`` holds documents only, and the scripts that generate the reference documents live
in ``dev/docs/``, named by the documents they write.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
README = ROOT / "README.md"
GENERATORS = ROOT / "dev" / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def links(page: Path) -> list[str]:
    """The relative links of a Markdown page, outside code blocks, without their #fragments."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        found.append(target.split("#", 1)[0])
    return found


def resolved(page: Path) -> list[Path]:
    return [(page.parent / target).resolve() for target in links(page)]


def documents() -> list[Path]:
    """Every file of docs/ but the index (leaving out what git ignores there: caches, checkpoints)."""
    return sorted(p.resolve() for p in DOCS.rglob("*") if p.is_file() and p != INDEX
                  and not any(part in ("__pycache__", ".ipynb_checkpoints") for part in p.relative_to(DOCS).parts))


def sections(page: Path) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_file_in_docs_is_linked_from_the_index():
    assert documents(), "docs/ is empty"
    linked = set(resolved(INDEX))
    missing = [p.relative_to(ROOT).as_posix() for p in documents() if p not in linked]
    assert not missing, f"not in docs/index.md: {missing}"


def test_every_link_in_the_index_and_the_readme_opens():
    for page in (INDEX, README):
        for target, path in zip(links(page), resolved(page), strict=True):
            assert path.exists(), f"{page.relative_to(ROOT)}: {target} does not resolve"
            assert path.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: {target} leaves the repository"


def test_a_newcomer_following_the_readme_and_the_index_reaches_every_document():
    from_readme = set(resolved(README))
    assert INDEX.resolve() in from_readme, "the README does not link docs/index.md"
    reached = from_readme | set(resolved(INDEX))
    assert [p for p in documents() if p not in reached] == []


def test_the_index_groups_each_document_once_with_what_it_is_for():
    groups = sections(INDEX)
    assert [g.split(":")[0] for g in groups][:3] == ["Guides", "Reference", "Design"], list(groups)
    seen: list[Path] = []
    for title, body in groups.items():
        for row in re.findall(r"^\| \[.*\|$", body, flags=re.M):
            [target] = LINK.findall(row.split("|")[1])
            purpose = row.split("|")[2].strip()
            assert len(purpose.split()) >= 6, f"{title}: {target} says too little of what it is for: {purpose!r}"
            seen.append((DOCS / target).resolve())
    assert sorted(seen) == sorted(p for p in documents() if p.suffix == ".md"), "each document once, in a table"


def test_docs_holds_documents_only_and_the_generators_live_in_dev_docs():
    assert [p.name for p in DOCS.rglob("*.py")] == []  # not even a one-line stand-in for a moved script
    scripts = sorted(GENERATORS.glob("make_*.py"))
    assert [p.name for p in scripts] == ["make_architecture_diagram.py", "make_cli_reference.py",
                                         "make_journal_commit_table.py", "make_rest_reference.py",
                                         "make_roles_table.py", "make_state_diagrams.py"]
    named = {path for doc in DOCS.glob("*.md")
             for path in re.findall(r"[Gg]enerated[^\n]*?([\w./-]*make_\w+\.py)", doc.read_text(encoding="utf-8"))}
    assert named == {f"dev/docs/{p.name}" for p in scripts}, named


def test_the_reference_group_is_what_the_generators_write():
    reference = next(body for title, body in sections(INDEX).items() if title.startswith("Reference"))
    listed = {(DOCS / LINK.findall(row.split("|")[1])[0]).resolve()
              for row in re.findall(r"^\| \[.*\|$", reference, flags=re.M)}
    for doc in listed:
        text = doc.read_text(encoding="utf-8")
        [script] = set(re.findall(r"\bdev/docs/make_\w+\.py", text))
        assert (ROOT / script).is_file(), (doc.name, script)
        assert doc.name.removesuffix(".md") in (ROOT / script).read_text(encoding="utf-8"), (doc.name, script)
