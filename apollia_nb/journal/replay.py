"""Replay a run from its journal trace, offline: no model is called, no tool runs.

The trace is stepped through in sequence order: each captured model response,
then the decisions, answers and outputs of the tool calls it asked for. The
answer is

- ``identical``: the capture is consistent with itself;
- ``diverged``: with every divergence, typed — ``missing_output`` (a requested
  call has no output before the next model response, or before the seal),
  ``extra_output`` (a decision, answer, start or output no response asked for,
  a second one, or a tool that started although its call was refused),
  ``arguments_mismatch`` (a call was decided or ran with another tool or other
  arguments than the response asked for), ``order`` (calls handled out of the
  order they were asked for, a tool started before its decision or before the
  answer it was waiting on, a result before its start, an output after the next
  model response), ``output_digest`` (a result's output does not hash to its
  recorded digest), ``reasoning_digest`` (a model response's reasoning is not
  a list of parts, or does not hash to its recorded digest);
- ``incomplete``: the trace lacks its start (``run_open``), its end
  (``run_seal``), entries its seal counts, or an output a call needed (a tool
  that started has no result), or fields that were erased (``audit erase``:
  their values are unknown, so nothing that depends on them is a divergence —
  whatever they would have shown about their entry, their call, or, for a
  model response's erased calls, the run's calls is left out, and the erased
  fields are named). Divergences found on the way are still listed.

Arguments: the runtime fills in a tool's declared defaults before deciding, so
a decision may carry arguments the model left out; every argument the model
gave must be there with the same value, and the tool must start with exactly
the decided arguments. An output cut in the journal (``{"truncated": true,
...}``) carries the digest of the whole, which cannot be recomputed from the
cut; it is not checked.

A server's request made during a call (an MCP server's question or model call:
its ``decision`` carries ``caused_by``, the call it came from) is stepped through
on its own — decision, answer, start, output, each once and in that order — and
must come while the call that caused it has started and has no output yet
(``order`` otherwise); its output's digest is checked like any. ``tool_progress``
entries carry nothing a call is checked against.

Pure: takes entries, returns a value. The journal's own verification (chain,
signatures, checkpoints) is separate — replay assumes nothing about it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Divergence", "ReplayResult", "replay_entries", "DIVERGENCE_KINDS"]

DIVERGENCE_KINDS = ("missing_output", "extra_output", "arguments_mismatch", "order", "output_digest",
                    "reasoning_digest")

#: Kinds that carry nothing a call is checked against.
_CONTEXT_KINDS = frozenset({"run_open", "run_seal", "task_status", "session_status", "plan", "verdict",
                            "tool_progress"})
#: A server's request during a call: its entries in the order they must come.
_REQUEST_STAGES = ("decision", "answer", "tool_call", "tool_result")


@dataclass(frozen=True)
class Divergence:
    position: int  # the journal seq where it shows (or the seal's seq for what never came)
    kind: str
    call_id: str | None
    expected: Any
    found: Any

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "kind": self.kind, "call_id": self.call_id,
                "expected": self.expected, "found": self.found}


@dataclass(frozen=True)
class ReplayResult:
    run_id: str
    verdict: Literal["identical", "diverged", "incomplete"]
    divergences: tuple[Divergence, ...] = ()
    missing: tuple[str, ...] = ()
    responses: int = 0
    calls: int = 0
    entries: int = 0

    @property
    def exit_code(self) -> int:
        return {"identical": 0, "diverged": 1, "incomplete": 2}[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "verdict": self.verdict,
                "divergences": [d.to_dict() for d in self.divergences], "missing": list(self.missing),
                "responses": self.responses, "calls": self.calls, "entries": self.entries}


def _stored(entry: Any) -> dict[str, Any]:
    raw = entry.payload
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return json.loads(bytes(raw))
    if isinstance(raw, str):
        return json.loads(raw)
    return dict(raw)


def _payload(entry: Any) -> dict[str, Any]:
    """The payload's fields (a salted payload's salts and erased commitments left out)."""
    data = _stored(entry)
    if isinstance(data, dict) and "@salts" in data:
        data = {k: v for k, v in data.items() if k not in ("@salts", "@erased")}
    return data


def _erased(entry: Any) -> list[str]:
    """The fields erased from an entry (``audit erase``): their values are unknown."""
    stored = getattr(entry, "stored", None)
    data = _stored(entry) if stored is None else json.loads(stored)
    gone = data.get("@erased") if isinstance(data, dict) and "@salts" in data else None
    return sorted(gone) if isinstance(gone, dict) else []


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Call:
    call_id: str
    name: str
    arguments: dict[str, Any]
    asked_at: int
    outcome: str | None = None  # the decision's outcome, once decided
    decided_arguments: dict[str, Any] | None = None
    answer: str | None = None
    started: bool = False
    result: bool = False
    superseded_at: int | None = None  # seq of the next model response
    misordered: bool = False  # an order divergence was reported for this call


@dataclass
class _State:
    requested: dict[str, _Call] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # call ids of the current response, in order
    handled: frozenset[Any] = frozenset()  # call ids with a decision, start or output anywhere in the trace
    divergences: list[Divergence] = field(default_factory=list)

    def add(self, seq: int, kind: str, call_id: str | None, expected: Any, found: Any) -> None:
        self.divergences.append(Divergence(seq, kind, call_id, expected, found))


def replay_entries(run_id: str, entries: list[Any]) -> ReplayResult:
    """Step through one run's entries (any order; sorted by ``seq`` here)."""
    entries = sorted(entries, key=lambda e: e.seq)
    missing: list[str] = []
    if not entries or entries[0].kind != "run_open":
        missing.append("the trace lacks its start (run_open)")
    seal = next((e for e in entries if e.kind == "run_seal"), None)
    if seal is None:
        missing.append("the trace lacks its end (run_seal)")
    else:
        before = [e for e in entries if e.seq < seal.seq]
        counted = _payload(seal).get("entries")
        if counted != len(before):
            missing.append(f"the seal counts {counted} entries before it, the trace has {len(before)}")

    state = _State(handled=frozenset(
        _payload(e).get("call_id") for e in entries if e.kind in ("decision", "tool_call", "tool_result")))
    causes = {p["call_id"]: p["caused_by"] for p in (_payload(e) for e in entries if e.kind == "decision")
              if p.get("caused_by") is not None}
    stages: dict[str, int] = {}
    responses = 0
    for entry in entries:
        kind = entry.kind
        if kind in _CONTEXT_KINDS:
            continue
        p = _payload(entry)
        if p.get("call_id") in causes:
            _request(state, entry.seq, kind, p, causes[p["call_id"]], stages)
            continue
        if kind == "model_response":
            responses += 1
            _response(state, entry.seq, p)
            continue
        call_id = p.get("call_id")
        call = state.requested.get(call_id) if call_id is not None else None
        if kind == "decision":
            _decision(state, entry.seq, call_id, call, p)
        elif kind == "answer":
            _answer(state, entry.seq, call_id, call, p)
        elif kind == "tool_call":
            _start(state, entry.seq, call_id, call, p)
        elif kind == "tool_result":
            _result(state, entry.seq, call_id, call, p)

    for call in state.requested.values():
        if call.result:
            continue
        if call.started:
            missing.append(f"call {call.call_id} ({call.name}) started and has no output")
        elif call.superseded_at is not None:
            state.add(call.superseded_at, "missing_output", call.call_id, f"an output of {call.name}",
                      "the next model response")
        elif seal is not None:
            state.add(seal.seq, "missing_output", call.call_id, f"an output of {call.name}", "the end of the run")
    erased = {e.seq: (e, names) for e in entries if (names := _erased(e))}
    if erased:
        # What an erased field would have shown is unknown: nothing that depends on it is a divergence.
        unknown_calls = {_payload(e).get("call_id") for e, _ in erased.values()} - {None}
        calls_unknown = any(e.kind == "model_response" and {"tool_calls", "structured"} & set(names)
                            for e, names in erased.values())
        state.divergences = [d for d in state.divergences if d.position not in erased
                             and d.call_id not in unknown_calls and not calls_unknown]
        missing.extend(f"entry {seq} ({e.kind}): {', '.join(names)} erased, so unknown"
                       for seq, (e, names) in sorted(erased.items()))
    if missing:
        verdict: Literal["identical", "diverged", "incomplete"] = "incomplete"
    elif state.divergences:
        verdict = "diverged"
    else:
        verdict = "identical"
    divergences = sorted(state.divergences, key=lambda d: d.position)
    return ReplayResult(run_id, verdict, tuple(divergences), tuple(missing), responses,
                        len(state.requested), len(entries))


def _reasoning(state: _State, seq: int, p: dict[str, Any]) -> None:
    """A response's reasoning: a list of parts (text, and opaque signature or redacted data, as
    strings) that hashes to its ``reasoning_digest``; one cut in the journal is not rehashed.
    Reasoning without its digest, or a digest without reasoning, is a divergence too."""
    if "reasoning" not in p and "reasoning_digest" not in p:
        return
    reasoning, recorded = p.get("reasoning"), p.get("reasoning_digest")
    if isinstance(reasoning, dict) and reasoning.get("truncated") is True:
        if not isinstance(recorded, str):
            state.add(seq, "reasoning_digest", None, "the digest of the whole reasoning", recorded)
        return
    well_formed = isinstance(reasoning, list) and all(
        isinstance(part, dict) and isinstance(part.get("text", ""), str)
        and all(isinstance(part.get(k), str) for k in ("signature", "redacted") if k in part)
        for part in reasoning)
    if not well_formed:
        state.add(seq, "reasoning_digest", None, "a list of reasoning parts", reasoning)
    elif recorded != _digest(reasoning):
        state.add(seq, "reasoning_digest", None, recorded, _digest(reasoning))


def _response(state: _State, seq: int, p: dict[str, Any]) -> None:
    """A new response: the previous one's calls are superseded; this one's are asked, in order."""
    _reasoning(state, seq, p)
    for call_id in state.order:
        call = state.requested[call_id]
        if call.superseded_at is None:
            call.superseded_at = seq
    state.order = []
    for tc in p.get("tool_calls") or []:
        call = _Call(tc["call_id"], tc["name"], dict(tc.get("arguments") or {}), seq)
        if call.call_id in state.requested:
            state.add(seq, "extra_output", call.call_id, "a new call id", "a repeated call id")
        state.requested[call.call_id] = call
        state.order.append(call.call_id)


def _decision(state: _State, seq: int, call_id: Any, call: _Call | None, p: dict[str, Any]) -> None:
    if call is None:
        state.add(seq, "extra_output", call_id, "no call", f"a decision on {p.get('tool')}")
        return
    if call.outcome is not None:
        state.add(seq, "extra_output", call_id, "one decision", "a second decision")
    _check_order(state, seq, call)
    found = dict(p.get("arguments") or {})
    if p.get("tool") != call.name or any(k not in found or _digest(found[k]) != _digest(v)
                                         for k, v in call.arguments.items()):
        _mismatch(state, seq, call, call.arguments, p.get("tool"), found)
    call.outcome = str(p.get("outcome"))
    call.decided_arguments = found


def _answer(state: _State, seq: int, call_id: Any, call: _Call | None, p: dict[str, Any]) -> None:
    answer = p.get("answer")
    if call is None:
        state.add(seq, "extra_output", call_id, "no call", f"an answer {answer!r}")
    elif call.outcome is None:
        if not call.misordered:
            call.misordered = True
            state.add(seq, "order", call_id, "the decision before its answer", f"an answer {answer!r} first")
        call.answer = str(answer)
    elif call.outcome != "ask":
        state.add(seq, "extra_output", call_id, f"no answer (the decision was {call.outcome!r})",
                  f"an answer {answer!r}")
    elif call.answer is not None:
        state.add(seq, "extra_output", call_id, "one answer", f"a second answer {answer!r}")
    else:
        call.answer = str(answer)


def _start(state: _State, seq: int, call_id: Any, call: _Call | None, p: dict[str, Any]) -> None:
    if call is None:
        state.add(seq, "extra_output", call_id, "no call", f"{p.get('tool')} started")
        return
    if call.started:
        state.add(seq, "extra_output", call_id, "one start", "a second start")
    call.started = True
    _check_order(state, seq, call)
    if call.outcome is None:
        state.add(seq, "order", call_id, f"a decision before {call.name} started", f"{call.name} started undecided")
    elif call.outcome == "refuse" or call.answer == "refuse":
        state.add(seq, "extra_output", call_id, "no start (the call was refused)", f"{call.name} started")
    elif call.outcome == "ask" and call.answer is None:
        state.add(seq, "order", call_id, f"an answer before {call.name} started", f"{call.name} started unanswered")
    found = dict(p.get("arguments") or {})
    wanted = call.decided_arguments if call.decided_arguments is not None else call.arguments
    if p.get("tool") != call.name or _digest(found) != _digest(wanted):
        _mismatch(state, seq, call, wanted, p.get("tool"), found)


def _result(state: _State, seq: int, call_id: Any, call: _Call | None, p: dict[str, Any]) -> None:
    if call is None:
        state.add(seq, "extra_output", call_id, "no call", f"an output of {p.get('tool')}")
        return
    if call.result:
        state.add(seq, "extra_output", call_id, "one output", "a second output")
    _check_order(state, seq, call)
    if p.get("status") == "ok" and not call.started:
        state.add(seq, "order", call_id, "the call started before its output", "an output first")
    if p.get("tool") not in (None, call.name):
        state.add(seq, "arguments_mismatch", call_id, {"tool": call.name}, {"tool": p.get("tool")})
    call.result = True
    output = p.get("output")
    truncated = isinstance(output, dict) and output.get("truncated") is True
    if "output_digest" in p and not truncated and _digest(output) != p["output_digest"]:
        state.add(seq, "output_digest", call_id, p["output_digest"], _digest(output))


def _request(state: _State, seq: int, kind: str, p: dict[str, Any], cause: str, stages: dict[str, int]) -> None:
    """One entry of a server's request made during the call ``cause``."""
    call_id = p["call_id"]
    stage = _REQUEST_STAGES.index(kind) if kind in _REQUEST_STAGES else -1
    if stage <= stages.get(call_id, -1):
        state.add(seq, "order", call_id, f"after its {_REQUEST_STAGES[stages.get(call_id, 0)]}", kind)
        return
    stages[call_id] = stage
    causing = state.requested.get(cause)
    if causing is None or not causing.started or causing.result:
        state.add(seq, "order", call_id, f"during the call {cause}", f"a {kind} outside it")
    if kind == "tool_result":
        output = p.get("output")
        truncated = isinstance(output, dict) and output.get("truncated") is True
        if "output_digest" in p and not truncated and _digest(output) != p["output_digest"]:
            state.add(seq, "output_digest", call_id, p["output_digest"], _digest(output))


def _check_order(state: _State, seq: int, call: _Call) -> None:
    """Calls are handled in the order asked, before the next response; reported once per call.

    An earlier call that is never handled is a ``missing_output`` only, not also
    an ``order`` divergence of every call after it.
    """
    if call.misordered:
        return
    if call.call_id not in state.order:
        call.misordered = True
        state.add(seq, "order", call.call_id, "a call of the latest response",
                  f"a call of an earlier one (superseded at {call.superseded_at})")
        return
    for earlier in state.order[: state.order.index(call.call_id)]:
        if not state.requested[earlier].result and earlier in state.handled:
            call.misordered = True
            state.add(seq, "order", call.call_id, f"{earlier} handled first", f"{call.call_id} handled first")
            return


def _mismatch(state: _State, seq: int, call: _Call, wanted: dict[str, Any], tool: Any,
              found: dict[str, Any]) -> None:
    state.add(seq, "arguments_mismatch", call.call_id,
              {"tool": call.name, "arguments": wanted}, {"tool": tool, "arguments": found})
