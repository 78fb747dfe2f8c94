"""Replay a run from its journal trace, offline: no model is called, no tool runs.

The trace is stepped through in sequence order: each captured model response,
then the decisions and outputs of the tool calls it asked for. The answer is

- ``identical``: the capture is consistent with itself;
- ``diverged``: with every divergence, typed — ``missing_output`` (a requested
  call has no decision or result), ``extra_output`` (a decision, call or result
  no response asked for, or a second one), ``arguments_mismatch`` (a call ran
  with other arguments than the response asked for), ``order`` (calls handled
  out of the order they were asked for, or a result before its call),
  ``output_digest`` (a result's output does not hash to its recorded digest);
- ``incomplete``: the trace lacks its start (``run_open``), its end
  (``run_seal``), entries its seal counts, or an output a call needed (a tool
  that started has no result).

Pure: takes entries, returns a value. The journal's own verification (chain,
signatures, checkpoints) is separate — replay assumes nothing about it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Divergence", "ReplayResult", "replay_entries", "DIVERGENCE_KINDS"]

DIVERGENCE_KINDS = ("missing_output", "extra_output", "arguments_mismatch", "order", "output_digest")


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


def _payload(entry: Any) -> dict[str, Any]:
    raw = entry.payload
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return json.loads(bytes(raw))
    if isinstance(raw, str):
        return json.loads(raw)
    return dict(raw)


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Call:
    call_id: str
    name: str
    arguments: dict[str, Any]
    asked_at: int
    decided: bool = False
    started: bool = False
    result: bool = False


@dataclass
class _State:
    requested: dict[str, _Call] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # call ids of the current response, in order
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

    state = _State()
    responses = 0
    for entry in entries:
        kind = entry.kind
        if kind in ("run_open", "run_seal", "task_status", "session_status", "plan", "verdict", "answer"):
            continue
        p = _payload(entry)
        if kind == "model_response":
            _close_response(state, entry.seq)
            responses += 1
            state.order = []
            for tc in p.get("tool_calls") or []:
                call = _Call(tc["call_id"], tc["name"], dict(tc.get("arguments") or {}), entry.seq)
                if call.call_id in state.requested:
                    state.add(entry.seq, "extra_output", call.call_id, "a new call id", "a repeated call id")
                state.requested[call.call_id] = call
                state.order.append(call.call_id)
            continue
        call_id = p.get("call_id")
        call = state.requested.get(call_id) if call_id is not None else None
        if kind == "decision":
            if call is None:
                state.add(entry.seq, "extra_output", call_id, "no call", f"a decision on {p.get('tool')}")
                continue
            if call.decided:
                state.add(entry.seq, "extra_output", call_id, "one decision", "a second decision")
            _check_order(state, entry.seq, call)
            call.decided = True
            _check_arguments(state, entry.seq, call, p)
        elif kind == "tool_call":
            if call is None:
                state.add(entry.seq, "extra_output", call_id, "no call", f"{p.get('tool')} started")
                continue
            if call.started:
                state.add(entry.seq, "extra_output", call_id, "one start", "a second start")
            call.started = True
            _check_arguments(state, entry.seq, call, p)
        elif kind == "tool_result":
            if call is None:
                state.add(entry.seq, "extra_output", call_id, "no call", f"an output of {p.get('tool')}")
                continue
            if call.result:
                state.add(entry.seq, "extra_output", call_id, "one output", "a second output")
            _check_order(state, entry.seq, call)
            if p.get("status") == "ok" and not call.started:
                state.add(entry.seq, "order", call_id, "the call started before its output", "an output first")
            call.result = True
            output = p.get("output")
            truncated = isinstance(output, dict) and output.get("truncated") is True
            if "output_digest" in p and not truncated and _digest(output) != p["output_digest"]:
                state.add(entry.seq, "output_digest", call_id, p["output_digest"], _digest(output))
    end = seal.seq if seal is not None else (entries[-1].seq if entries else 0)
    for call in state.requested.values():
        if call.result:
            continue
        if call.started:
            missing.append(f"call {call.call_id} ({call.name}) started and has no output")
        elif seal is not None:
            state.add(end, "missing_output", call.call_id, f"an output of {call.name}", None)
    if missing:
        verdict: Literal["identical", "diverged", "incomplete"] = "incomplete"
    elif state.divergences:
        verdict = "diverged"
    else:
        verdict = "identical"
    return ReplayResult(run_id, verdict, tuple(state.divergences), tuple(missing), responses,
                        len(state.requested), len(entries))


def _close_response(state: _State, seq: int) -> None:
    """A new response: every call of the previous one must have had its output by now."""
    for call_id in state.order:
        call = state.requested[call_id]
        if not call.result and not call.started:
            state.add(seq, "missing_output", call_id, f"an output of {call.name}", "the next model response")
            call.result = True  # reported once


def _check_order(state: _State, seq: int, call: _Call) -> None:
    """Calls are handled in the order asked: every earlier call of the response has its output."""
    if call.call_id not in state.order:
        state.add(seq, "order", call.call_id, "a call of the latest response", "a call of an earlier one")
        return
    for earlier in state.order[: state.order.index(call.call_id)]:
        if not state.requested[earlier].result:
            state.add(seq, "order", call.call_id, f"{earlier} handled first", f"{call.call_id} handled first")
            return


def _check_arguments(state: _State, seq: int, call: _Call, payload: dict[str, Any]) -> None:
    found = payload.get("arguments")
    if found is None:
        return
    if _digest(dict(found)) != _digest(call.arguments) or payload.get("tool") not in (None, call.name):
        state.add(seq, "arguments_mismatch", call.call_id,
                  {"tool": call.name, "arguments": call.arguments},
                  {"tool": payload.get("tool"), "arguments": found})
