"""The wire format of the REST API: one pydantic model per body and per response.

The app declares these as request bodies and ``response_model``s, so the
OpenAPI document at ``/api/v1/openapi.json`` is generated from them; the SDK
parses responses into the same models, so a client and the server cannot
disagree on a field. Request bodies forbid unknown keys (a typo is a 422
``BAD_INPUT`` naming the field, never silently ignored); responses are frozen
and ignore keys they do not know, so an older client reads a newer server.

This module imports pydantic and nothing heavier: the SDK imports it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

__all__ = [
    "AgentName", "FamilyName",
    "FAMILIES", "ANSWERS", "TASK_STATUSES", "AGENT_STATES", "SESSION_STATES",
    "Error", "Health",
    "ManifestIn", "Agent",
    "TaskIn", "Submission", "Budget", "StepCall", "Step", "Verdict", "Task", "PlanApprovalIn", "PlanRejectionIn",
    "SessionIn", "MessageIn", "Session", "Card",
    "TextEvent", "ToolCallStartedEvent", "CardEvent", "ToolResultEvent", "PlanEvent", "PausedEvent", "EndEvent",
    "EXCHANGE_EVENTS",
    "DecideIn", "PendingDecision",
    "RuleIn", "Rule", "Consent", "DeveloperModeIn", "DeveloperMode", "PolicyRefusals", "PolicyDocument", "Policy",
    "VerifyReport", "Divergence", "ReplayResult", "JournalEntry", "EntriesPage",
]

# The enumerations are spelled out (not imported from the runtime) to keep this module
# light; tests pin them to the runtime's enums.
FAMILIES = ("read", "read_personal", "write", "send", "execute", "conversation", "memory", "profile")
ANSWERS = ("once", "always", "refuse")
TASK_STATUSES = ("pending", "running", "waiting", "completed", "failed", "cancelled")
AGENT_STATES = ("initializing", "active", "degraded", "stopping", "stopped")
SESSION_STATES = ("active", "processing", "paused", "closed")

FamilyName = Literal["read", "read_personal", "write", "send", "execute", "conversation", "memory", "profile"]
TaskStatus = Literal["pending", "running", "waiting", "completed", "failed", "cancelled"]
AgentState = Literal["initializing", "active", "degraded", "stopping", "stopped"]
SessionState = Literal["active", "processing", "paused", "closed"]
AnswerName = Literal["once", "always", "refuse"]

NonEmpty = Annotated[str, Field(min_length=1)]
# Python's str.strip() also strips \x1c-\x1f and \x85, which \s does not name.
_VISIBLE = r"[^\s\x1c-\x1f\x85]"
Text = Annotated[str, Field(min_length=1, pattern=_VISIBLE, description="text with at least one non-space character")]
AgentName = Annotated[str, Field(pattern=r"^[a-z0-9_-]+$", max_length=200, description="an agent name, `[a-z0-9_-]+`")]
RuleAgent = Annotated[str, Field(pattern=r"^(\*|[a-z0-9_-]+)$", max_length=200,
                                 description='an agent name, or `"*"` for every agent')]
ToolName = Annotated[str, Field(pattern=r"^[\x21-\x7e]+$", max_length=500,
                                description="a tool name: printable ASCII without spaces")]
Who = Annotated[str, Field(min_length=1, max_length=200, pattern=_VISIBLE)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# --- errors and health ------------------------------------------------------------------


class Error(_Out):
    """Every error response: a stable `code` (see `apollia_nb.errors`) and a message for people."""

    code: str = Field(examples=["UNKNOWN_TASK"])
    message: str


class Health(_Out):
    status: Literal["ok"]
    version: str


# --- agents ------------------------------------------------------------------------------


class ManifestIn(_In):
    manifest: NonEmpty = Field(description="the agent's TOML manifest, as text")
    keep_consents: StrictBool | None = Field(
        default=None,
        description="re-registering a stopped agent whose tools, workspace or model changed while it holds "
                    "standing consents: true keeps them, false revokes them; omitted, such a re-registration "
                    "is 409 CONSENTS_TO_REVIEW showing the difference")


class Agent(_Out):
    name: str
    description: str
    state: AgentState
    warnings: list[str]
    tools: list[str]
    model: str | None
    workspace: str
    max_steps: int
    inflight: int = Field(description="runs of this agent not finished (running or waiting)")


# --- tasks -------------------------------------------------------------------------------


class TaskIn(_In):
    agent: NonEmpty
    goal: Text
    watched: StrictBool = Field(
        False, description="false (the default over the API): an unattended run; the first call that would "
        "ask suspends it and lists the decision in the pending decisions")
    max_steps: int | None = Field(None, ge=1, le=1_000_000, description="the step ceiling (default: the manifest's)")
    grants: list[FamilyName] = Field(default_factory=list, max_length=len(FAMILIES),
                                     description="families this run may use without asking (line 5)")
    approve_plan: StrictBool = Field(False, description="wait for an operator to approve the plan")


class Submission(_Out):
    id: str
    run_id: str
    status: TaskStatus
    warnings: list[str]


class TokenBudget(_Out):
    """A run's token budget (`[budget] max_tokens`): input and output tokens used of `ceiling`;
    `unmetered_turn`, the model turn whose provider reported no usage (the run then stops)."""

    used: int
    ceiling: int
    unmetered_turn: int | None = None


class Budget(_Out):
    used: int
    ceiling: int
    # Absent without a token budget, as the owner's task JSON has it (``None`` is never sent).
    tokens: TokenBudget | None = Field(default=None, exclude_if=lambda v: v is None)


class StepCall(_Out):
    call_id: str
    tool: str
    status: str
    error_code: str | None = None


class Step(_Out):
    index: int
    description: str
    status: str
    tool_calls: list[StepCall] = []
    text: str | None = None
    # The readable reasoning of each model turn of the step that gave any; absent when none did,
    # as the owner's task JSON has it.
    reasoning: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)


class Verdict(_Out):
    verdict: Literal["pass", "fail"]
    reasons: list[str] = []


class Task(_Out):
    id: str
    run_id: str
    agent: str
    goal: str
    status: TaskStatus
    error: Error | None
    steps: list[Step]
    budget: Budget
    result: Any = None
    warnings: list[str]
    plan: list[str] = []
    verdict: Verdict | None = None
    awaiting_plan_approval: bool = False
    plan_digest: str | None = Field(None, description="while the plan awaits approval: the digest of the plan as "
                                                      "shown, what an approval names (`digest`)")
    started_by: str | None = Field(None, description="who started the run (four eyes keeps them from approving "
                                                     "its calls)")
    progress: dict[str, Any] | None = Field(
        None, description="the progress the tool call in flight last reported (an MCP server's progress "
                          "notifications, a long-running call's status): `{\"call_id\", \"tool\", \"progress\", "
                          "\"total\", \"message\"}`; null when none")
    created_at: str
    updated_at: str

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


class PlanApprovalIn(_In):
    steps: list[Text] | None = Field(None, min_length=1, description="an edited plan; omit to run it as proposed")
    digest: str | None = Field(None, max_length=200, description="the `plan_digest` of the plan as shown; another "
                                                                 "plan's is 409 `STALE_APPROVAL`")


class PlanRejectionIn(_In):
    reason: Text


# --- chat sessions -----------------------------------------------------------------------


class SessionIn(_In):
    agent: NonEmpty
    plan_mode: StrictBool = False


class MessageIn(_In):
    text: Text


class Session(_Out):
    id: str
    agent: str
    state: SessionState
    plan_mode: bool
    parent_id: str | None
    forked_from: str | None
    children: list[str]
    history: list[dict[str, Any]]
    run_id: str
    pending_plan: list[str] | None
    created_at: str
    plan_digest: str | None = Field(None, description="while a plan waits: the digest of the plan as shown, what an "
                                                      "approval names (`digest`)")


class Card(_Out):
    """A decision waiting in a conversation, as the `card` event shows it."""

    id: str
    run_id: str
    task_id: str | None = None
    session_id: str | None = None
    agent: str
    tool: str
    family: FamilyName | None
    arguments: dict[str, Any]
    answers: list[AnswerName]
    reason: str = ""
    line: int = 0
    call_id: str | None = None
    created_at: str
    hints: dict[str, Any] | None = None
    path: str | None = Field(
        default=None, description="a file tool's path as resolved, relative to the workspace: the file the call acts on"
    )
    answer: AnswerName | None = None
    answered_by: str | None = None
    answered_at: str | None = None
    digest: str | None = Field(None, description="`sha256:` of the call as shown, as `GET /pending-decisions` gives "
                                                 "it: what an answer approves (the decision's `digest`)")
    may_answer: dict[str, Any] | None = Field(
        None, description="who may answer, as `GET /pending-decisions` gives it (null when it cannot be said)")
    expires_at: str | None = Field(None, description="when the approval given ends (null: it does not, or none "
                                                     "was given yet)")


class TextEvent(_Out):
    type: Literal["text"]
    text: str


class ToolCallStartedEvent(_Out):
    type: Literal["tool_call_started"]
    name: str


class CardEvent(_Out):
    type: Literal["card"]
    card: Card


class ToolResultEvent(_Out):
    type: Literal["tool_result"]
    call_id: str
    tool: str
    status: str
    error_code: str | None = None


class PlanEvent(_Out):
    type: Literal["plan"]
    steps: list[str]


class PausedEvent(_Out):
    type: Literal["paused"]


class EndEvent(_Out):
    type: Literal["end"]
    status: Literal["done", "cancelled", "failed"]
    reply: str | None = None
    error: Error | None = None


#: The events of a chat exchange: the SSE ``event`` name → the model of its ``data``.
EXCHANGE_EVENTS: dict[str, type[BaseModel]] = {
    "text": TextEvent, "tool_call_started": ToolCallStartedEvent, "card": CardEvent,
    "tool_result": ToolResultEvent, "plan": PlanEvent, "paused": PausedEvent, "end": EndEvent,
}


# --- pending decisions -------------------------------------------------------------------


class DecideIn(_In):
    id: NonEmpty
    answer: Annotated[str, Field(json_schema_extra={"enum": list(ANSWERS)},
                                 description="one of the decision's `answers` (else 422 `BAD_ANSWER`)")]
    reason: str | None = Field(None, max_length=10_000)
    by: Who | None = Field(None, description="who answers, for the journal (default `api`)")
    values: dict[str, Any] | None = Field(
        None, description="a server's question (`mcp:<server>/elicitation/create`) answered `once`: the form's "
                          "values, checked against its `requestedSchema` (else 422 `BAD_ANSWER`)")
    digest: str | None = Field(None, max_length=200, description="the decision's `digest` as shown to whoever "
                               "answers; another is 409 `STALE_APPROVAL` (omit it and the answer is bound to the "
                               "card as it is)")
    expires_in: float | None = Field(None, description="an approval's lifetime in seconds: the call is refused "
                                     "(and the refusal journaled) when it would run later")
    expires_at: str | None = Field(None, max_length=64, description="an approval's end, ISO 8601 with offset "
                                   "(not with `expires_in`)")
    lasting: str | None = Field(None, alias="for", max_length=64, description="with `always`: how long the "
                                "standing consent lasts, a whole number of minutes, hours or days (`30m`, `8h`, "
                                "`7d`, at most 366 days) or `until revoked` (the default); anything else, or a "
                                "lifetime with another answer, is 422 `BAD_DURATION`")


class PendingDecision(_Out):
    id: str
    run_id: str
    task_id: str | None
    agent: str
    tool: str
    family: FamilyName | None = Field(description="null when the tool is unclassified")
    arguments: dict[str, Any]
    answers: list[AnswerName]
    created_at: str
    status: Literal["pending", "answered", "expired"] = "pending"
    answer: AnswerName | None = None
    answered_by: str | None = None
    answered_at: str | None = None
    answer_reason: str | None = None
    reason: str = ""
    line: int = 0
    call_id: str | None = None
    hints: dict[str, Any] | None = Field(
        None, description="what the tool's server says of it (MCP annotations: `readOnlyHint`, `destructiveHint`, "
                          "`idempotentHint`, `openWorldHint`, `title`): shown to whoever answers, never used to decide")
    digest: str | None = Field(None, description="`sha256:` of the call as shown (card id, run, agent, tool, call "
                                                 "id, arguments as shown): what an answer approves")
    may_answer: dict[str, Any] | None = Field(
        None, description="who may answer: `roles`, `four_eyes`, `started_by`, `excluded` (people who may not "
                          "approve it), `approvers`, `approved_by`, `approvals_needed`")
    expires_at: str | None = Field(None, description="when the approval given ends (null: it does not)")


# --- governance --------------------------------------------------------------------------


class RuleIn(_In):
    tool: ToolName
    effect: Literal["allow", "deny"]
    prefix: str | None = Field(None, description="a prefix of the first argument (commands: at a word boundary)")
    agent: RuleAgent = "*"
    by: Who | None = Field(None, description="who adds it (default `api`)")


class Rule(_Out):
    id: str
    tool: str
    prefix: str | None
    effect: Literal["allow", "deny"]
    agent: str
    created_by: str | None = None
    created_at: str | None = None


class Consent(_Out):
    agent: str
    family: FamilyName
    granted_by: str
    granted_at: str | None
    card: str | None = Field(None, description="the card whose `always` gave it (null: given directly)")
    until: str | None = Field(None, description="when it ends, ISO 8601 (null: until revoked)")
    state: Literal["in force", "ended", "unreadable"] = Field(
        "in force", description="`ended`: its end has passed (it no longer applies; the home's owner journals "
                                "`consent_expired` and removes it when it first notices); `unreadable`: its end "
                                "does not read, so it does not apply")


class DeveloperModeIn(_In):
    enabled: StrictBool
    by: Who | None = Field(None, description="who changes it (default `api`)")


class DeveloperMode(_Out):
    enabled: bool
    changed_by: str | None = None
    changed_at: str | None = None


class PolicyRefusals(_Out):
    tools: list[str]
    connections: list[str]
    families: list[str]


class PolicyDocument(_Out):
    refuse: PolicyRefusals
    approvals: dict[str, dict[str, dict[str, Any]]] | None = Field(
        None, description="who must approve calls: `families` and `tools`, each name with `four_eyes` and `approvers`")


class Policy(_Out):
    status: Literal["none", "accepted", "refused"]
    reason: str
    key: str | None
    digest: str | None
    policy: PolicyDocument | None


# --- audit -------------------------------------------------------------------------------


class WitnessStatus(_Out):
    url: str
    key: str = Field(description="the witness's cosignature/v1 verifier key")
    key_name: str
    cosigned_size: int | None = Field(description="size of the newest checkpoint it cosigned (None: none yet)")
    pending: bool = Field(description="the newest checkpoint is not cosigned by it yet")
    last_error: str | None = Field(description="why the last attempt failed (None: it succeeded)")
    last_attempt: str | None


class VerifyReport(_Out):
    ok: bool
    entries: int
    first_bad_seq: int | None
    problem: str | None
    checked_checkpoints: int
    witnesses: list[WitnessStatus] | None = Field(
        None, description="each `[[journal.witnesses]]` entry's state; None when the home names no witness")


class Divergence(_Out):
    position: int
    kind: str
    call_id: str | None
    expected: Any = None
    found: Any = None


class ReplayResult(_Out):
    run_id: str
    verdict: Literal["identical", "diverged", "incomplete"]
    divergences: list[Divergence]
    missing: list[str]
    responses: int
    calls: int
    entries: int


class JournalEntry(_Out):
    seq: int
    ts: str
    run_id: str | None
    agent: str | None
    kind: str
    payload: Any
    prev_hash: str
    hash: str
    signature: str
    key_id: str


class EntriesPage(_Out):
    entries: list[JournalEntry]
    next_since_seq: int | None = Field(
        description="pass as `since_seq` for the next page; null when this page is the last")
