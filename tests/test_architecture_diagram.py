"""docs/architecture.md's diagram of the two homes is generated from the code and current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    path = ROOT / "dev" / "docs" / "make_architecture_diagram.py"
    spec = importlib.util.spec_from_file_location("make_architecture_diagram", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_diagram_matches_the_code():
    assert _generator().main(["--check"]) == 0, "run: python dev/docs/make_architecture_diagram.py"


def test_both_homes_keep_each_store_face_and_the_runtime_keeps_every_capability():
    m = _generator().model()
    assert m["kept"] == {"JournalFace": ["Journal", "RemoteJournal"],
                         "GovernanceFace": ["GovernanceStore", "RemoteGovernance"],
                         "RecordsFace": ["RuntimeRecords"]}
    assert all(m["hosted"].values()), m["hosted"]
    assert m["users"]["GovernedHost"] == ["governed"] and m["users"]["ChatHost"] == ["chat"]


def test_a_class_lacking_a_member_does_not_keep_the_face():
    gen = _generator()
    from apollia_nb.journal.contract import JournalFace
    from apollia_nb.runtime.remote import RemoteJournal

    class Partial(RemoteJournal):
        pass

    assert gen.keeps(Partial, JournalFace)
    del_name = "checkpoint_async"
    Lacking = type("Lacking", (), {n: getattr(RemoteJournal, n) for n in gen.members(JournalFace) if n != del_name})
    assert not gen.keeps(Lacking, JournalFace)


def test_a_stale_doc_is_reported(tmp_path):
    gen = _generator()
    doc = tmp_path / "architecture.md"
    doc.write_text(f"# x\n\n{gen.START}\nold\n{gen.END}\n")
    assert gen.main(["--check", "--doc", str(doc)]) == 1
    assert gen.main(["--doc", str(doc)]) == 0
    assert gen.main(["--check", "--doc", str(doc)]) == 0
    assert "graph LR" in doc.read_text()
