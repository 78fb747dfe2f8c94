"""``POST /api/v1/hooks/{tool}``: another agent's hook, answered by the server that owns the home.

The body is the tool's hook input, exactly as the tool sends it (Claude Code's HTTP hooks
``POST`` it; ``apollia-os hook TOOL`` forwards its stdin here when the home is served). The
answer is the tool's own hook JSON, always with 200: an HTTP hook's non-2xx answer is taken by
Claude Code as a non-blocking error (the call goes on), so a denial is never a 4xx here —
malformed input, an ``apollia.toml`` whose ``[hooks]`` does not read and any failure to decide
answer the tool's deny JSON. For the command form, ``X-Apollia-Hook-Block: 1`` says the
command must exit 2 (each tool's "block") and ``X-Apollia-Hook-Reason`` carries its stderr.

An asked call waits here for a person (``POST /pending-decisions/decide``, ``apollia-os pending
decide``, the panel, a notebook card) up to ``[hooks.<tool>] ask_timeout_secs``.
Included by ``api/app.py``'s ``create_app``; see ``docs/other-agents.md``.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from apollia_nb.api.deps import authorize, error_responses, runtime_of
from apollia_nb.hooks.codecs import MAX_INPUT, malformed_reply
from apollia_nb.hooks.gate import answer_hook

__all__ = ["router"]

router = APIRouter(dependencies=[Depends(authorize)], responses=error_responses(401, 422))

#: Any body: the tool's hook input as the tool sends it. Nothing is refused with a 4xx (Claude Code takes
#: a 4xx for "no opinion"): a body that is not what the tool documents is answered with its deny JSON.
_BODY = {"content": {"application/json": {"schema": {
    "description": "the tool's hook input, as the tool sends it (anything else is answered with the deny JSON)"}}},
    "required": False}


@router.post(
    "/hooks/{tool}", operation_id="answerHook", tags=["hooks"],
    summary="Decide another agent's tool call from its hook input",
    description="`tool` is `claude-code`, `codex` or `cursor`. The body is the tool's hook input; the answer is "
                "the tool's hook JSON (200 always: a denial, malformed input included, is the tool's deny JSON). "
                "The call is decided as the mapped tool of this home (`docs/other-agents.md`), journaled with "
                "`source`, and an asked call waits for a person up to `[hooks.<tool>] ask_timeout_secs`. "
                "422 `BAD_INPUT` for another tool name (the body itself is never refused with a 4xx).",
    openapi_extra={"requestBody": _BODY},
    response_model=None,
    responses={200: {"description": "the tool's hook JSON", "content": {"application/json": {"schema": {
        "type": "object", "description": "the tool's hook answer, in the shape the tool documents"}}}}},
)
async def answer_hook_route(tool: Literal["claude-code", "codex", "cursor"], request: Request,
                            rt: Any = Depends(runtime_of)) -> JSONResponse:
    raw = await request.body()
    if len(raw) > MAX_INPUT:
        reply = malformed_reply(tool, f"apollia: the hook input is larger than {MAX_INPUT} bytes")
    else:
        reply = await answer_hook(rt, tool, raw, served=True)
    headers = {}
    if reply.exit_code:
        headers["X-Apollia-Hook-Block"] = "1"
    if reply.stderr:
        headers["X-Apollia-Hook-Reason"] = quote(reply.stderr[:4000])
    return JSONResponse(reply.body, status_code=200, headers=headers)
