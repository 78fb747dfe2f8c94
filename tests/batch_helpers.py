"""Helpers for batch tests: an agent whose answer names its item, and which writes a file when the item says so."""

from __future__ import annotations

import re
from typing import Any

from runtime_helpers import manifest

from apollia_nb.runtime.models.scripted import ScriptedModel

GOAL = "Summarise item {n} about {topic} (file: {file})"
_ITEM = re.compile(r"Summarise item (\d+) about (\w+) \(file: (\w+)\)")


def item_frame(count: int, *, every: int = 20) -> Any:
    """A DataFrame of ``count`` items; every ``every``-th one asks to write a file (so it waits unattended)."""
    import pandas as pd

    return pd.DataFrame({"n": list(range(count)),
                         "topic": [("alpha", "beta", "gamma")[i % 3] for i in range(count)],
                         "file": ["yes" if i % every == every - 1 else "no" for i in range(count)]},
                        index=[f"row-{i}" for i in range(count)])


def expected_result(n: int, topic: str) -> str:
    return f"item {n}: {topic} summarised"


def _actor(role: str, messages: Any, tools: Any) -> Any:
    if role != "actor":
        return None
    text = " ".join(m.content for m in messages if m.content)
    found = _ITEM.search(text)
    if found is None:
        return {"text": "no item"}
    n, topic, file = found.groups()
    if file == "yes" and not any(m.role == "tool" for m in messages):
        return {"tool_calls": [{"name": "write_file", "arguments": {"path": f"item-{n}.txt", "content": topic}}]}
    return {"text": expected_result(int(n), topic)}


def item_model() -> ScriptedModel:
    return ScriptedModel.from_function(_actor)


AGENT = manifest("summariser")
