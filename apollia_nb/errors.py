"""Every error apollia-nb reports, each with a stable code.

The code is the contract: the CLI prints it, the REST API returns it as
``{"code", "message"}``, widgets show it and the SDK raises the matching class.
Messages are for people and may change; codes may not.

    ApolliaError                      base; ``.code`` and ``.message``
    ├── BadInput                      BAD_INPUT: malformed argument or body (4xx)
    │   ├── ManifestInvalid           MANIFEST_INVALID: names the key and line
    │   │   └── ModelKeyMissing       MODEL_KEY_MISSING: the model's key variable is not set (names it)
    │   ├── BadAnswer                 BAD_ANSWER: an answer not on offer
    │   ├── BadDuration               BAD_DURATION: a standing consent's lifetime that does not read (e.g. "8h")
    │   ├── BadArgument               BAD_ARGUMENT: a tool called with bad arguments
    │   ├── PayloadTooLarge           PAYLOAD_TOO_LARGE: a request body over the server's limit (413)
    │   ├── WorkspaceOverlapsHome     WORKSPACE_OVERLAPS_HOME: a workspace that contains the home or lies inside it
    │   └── IdempotencyKeyReused      IDEMPOTENCY_KEY_REUSED: one Idempotency-Key sent with another body
    ├── HostNotAllowed                HOST_NOT_ALLOWED: a request whose Host is not served (421)
    ├── OriginNotAllowed              ORIGIN_NOT_ALLOWED: a browser Origin that is not allowed (403)
    ├── Unauthorized                  UNAUTHORIZED: a missing or wrong bearer token (401)
    ├── Forbidden                     FORBIDDEN: a person's token without the role a route needs (403; names the role)
    ├── HubUnreachable                HUB_UNREACHABLE: the JupyterHub that vouches for tokens did not answer (503)
    ├── MethodNotAllowed              METHOD_NOT_ALLOWED: the route exists, the method does not (405)
    ├── NotFound                      NOT_FOUND
    │   ├── UnknownAgent              UNKNOWN_AGENT
    │   ├── UnknownTask               UNKNOWN_TASK
    │   ├── UnknownSession            UNKNOWN_SESSION
    │   ├── UnknownDecision           UNKNOWN_DECISION
    │   ├── UnknownRule               UNKNOWN_RULE
    │   ├── UnknownRun                UNKNOWN_RUN
    │   ├── UnknownTool               UNKNOWN_TOOL
    │   └── UnknownBatch              UNKNOWN_BATCH
    ├── Conflict                      CONFLICT (409)
    │   ├── InvalidTransition         INVALID_TRANSITION: a state machine refused a move
    │   ├── AgentUnavailable          AGENT_UNAVAILABLE: agent cannot take work
    │   ├── SessionBusy               SESSION_BUSY: a message while processing
    │   ├── SessionClosed             SESSION_CLOSED
    │   ├── HomeLocked                HOME_LOCKED: another process owns the home
    │   │   └── ServerNotRunning      SERVER_NOT_RUNNING: server.json names a server that does not answer
    │   ├── IdempotencyInProgress     IDEMPOTENCY_IN_PROGRESS: the first request with this key has not finished
    │   ├── ConsentsToReview          CONSENTS_TO_REVIEW: a changed manifest for an agent with standing consents
    │   └── StaleApproval             STALE_APPROVAL: an answer that names another digest than the card's (it saw something else)
    ├── Refused                       REFUSED: governance refused a call
    ├── Rejected                      REJECTED: an operator rejected a plan
    ├── BudgetExceeded                BUDGET_EXCEEDED: the step ceiling was reached
    ├── Interrupted                   INTERRUPTED: the owning process ended mid-run
    ├── Expired                       EXPIRED: a waiting decision outlived [hitl] timeout_hours
    ├── GovernanceUnreadable          GOVERNANCE_UNREADABLE: fail closed
    ├── PolicyRefused                 POLICY_REFUSED: organisation policy not accepted
    ├── IntegrityError                INTEGRITY_FAILURE: the journal does not verify
    │   └── BundleFileAltered         BUNDLE_FILE_ALTERED: a bundle file is not what this install writes (names it)
    ├── HomeDamaged                   HOME_DAMAGED: a file the home had is missing or unusable
    │   ├── HomeFileMissing           HOME_FILE_MISSING: names the file and how to recover
    │   ├── HomeFileCorrupt           HOME_FILE_CORRUPT: names the file and how to recover
    │   │   └── HomeFileRolledBack    HOME_FILE_ROLLED_BACK: runtime.db holds less than it acknowledged (its WAL lost or cut)
    │   ├── HomeKeyMismatch           HOME_KEY_MISMATCH: the signing key is not the journal's
    │   └── JournalTruncated          JOURNAL_TRUNCATED: the journal holds less than it acknowledged
    ├── StorageError                  STORAGE_ERROR: the disk refused a write (503); nothing was recorded
    │   └── StorageFull               STORAGE_FULL: no space left (507); nothing was recorded
    ├── OutcomeUnknown                OUTCOME_UNKNOWN: carried out, not all of it recorded (503); retry with the same key
    ├── ModelError                    MODEL_ERROR: a model provider failed
    │   ├── ModelTransient            MODEL_TRANSIENT: 429, 5xx, connection or timeout
    │   └── ModelPermanent            MODEL_PERMANENT: 4xx other than 429, bad response
    └── ToolError                     TOOL_ERROR: a tool failed
        ├── TransientToolError        TOOL_TRANSIENT: worth retrying later; counted by the breaker
        ├── PermanentToolError        TOOL_PERMANENT: retrying will not help
        │   └── ToolNameRefused       TOOL_NAME_REFUSED: an MCP server's tool whose name could pass for another
        ├── ToolTimeout               TOOL_TIMEOUT: transient
        ├── CircuitOpen               CIRCUIT_OPEN: failing fast while the breaker is open
        ├── PathEscape                PATH_ESCAPE: a path leaves the workspace (permanent)
        └── PathInHome                PATH_IN_HOME: a path resolves into the apollia home (permanent)
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ApolliaError",
    "BadInput",
    "ManifestInvalid",
    "ModelKeyMissing",
    "BadAnswer",
    "BadDuration",
    "BadArgument",
    "PayloadTooLarge",
    "WorkspaceOverlapsHome",
    "IdempotencyKeyReused",
    "HostNotAllowed",
    "OriginNotAllowed",
    "Unauthorized",
    "Forbidden",
    "HubUnreachable",
    "MethodNotAllowed",
    "NotFound",
    "UnknownAgent",
    "UnknownTask",
    "UnknownBatch",
    "UnknownSession",
    "UnknownDecision",
    "UnknownRule",
    "UnknownRun",
    "UnknownTool",
    "Conflict",
    "InvalidTransition",
    "AgentUnavailable",
    "SessionBusy",
    "SessionClosed",
    "HomeLocked",
    "ServerNotRunning",
    "IdempotencyInProgress",
    "ConsentsToReview",
    "StaleApproval",
    "Refused",
    "Rejected",
    "BudgetExceeded",
    "Interrupted",
    "Expired",
    "GovernanceUnreadable",
    "PolicyRefused",
    "IntegrityError",
    "BundleFileAltered",
    "HomeDamaged",
    "HomeFileMissing",
    "HomeFileCorrupt",
    "HomeKeyMismatch",
    "JournalTruncated",
    "HomeFileRolledBack",
    "StorageError",
    "StorageFull",
    "OutcomeUnknown",
    "ModelError",
    "ModelTransient",
    "ModelPermanent",
    "ToolError",
    "TransientToolError",
    "PermanentToolError",
    "ToolNameRefused",
    "ToolTimeout",
    "CircuitOpen",
    "PathEscape",
    "PathInHome",
    "error_for_code",
]


class ApolliaError(Exception):
    """Base of every apollia-nb error. ``code`` is stable; ``message`` is prose."""

    code: ClassVar[str] = "ERROR"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class BadInput(ApolliaError):
    code = "BAD_INPUT"
    http_status = 422


class ManifestInvalid(BadInput):
    code = "MANIFEST_INVALID"


class ModelKeyMissing(ManifestInvalid):
    """The environment variable a model's ``api_key_env`` names (or its default) is not set."""

    code = "MODEL_KEY_MISSING"


class BadAnswer(BadInput):
    code = "BAD_ANSWER"


class BadDuration(BadInput):
    code = "BAD_DURATION"


class BadArgument(BadInput):
    code = "BAD_ARGUMENT"


class PayloadTooLarge(BadInput):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class WorkspaceOverlapsHome(BadInput):
    code = "WORKSPACE_OVERLAPS_HOME"


class IdempotencyKeyReused(BadInput):
    code = "IDEMPOTENCY_KEY_REUSED"


class HostNotAllowed(ApolliaError):
    code = "HOST_NOT_ALLOWED"
    http_status = 421


class OriginNotAllowed(ApolliaError):
    code = "ORIGIN_NOT_ALLOWED"
    http_status = 403


class Unauthorized(ApolliaError):
    code = "UNAUTHORIZED"
    http_status = 401


class Forbidden(ApolliaError):
    code = "FORBIDDEN"
    http_status = 403


class HubUnreachable(ApolliaError):
    code = "HUB_UNREACHABLE"
    http_status = 503


class MethodNotAllowed(ApolliaError):
    code = "METHOD_NOT_ALLOWED"
    http_status = 405


class NotFound(ApolliaError):
    code = "NOT_FOUND"
    http_status = 404


class UnknownAgent(NotFound):
    code = "UNKNOWN_AGENT"


class UnknownTask(NotFound):
    code = "UNKNOWN_TASK"


class UnknownBatch(NotFound):
    code = "UNKNOWN_BATCH"


class UnknownSession(NotFound):
    code = "UNKNOWN_SESSION"


class UnknownDecision(NotFound):
    code = "UNKNOWN_DECISION"


class UnknownRule(NotFound):
    code = "UNKNOWN_RULE"


class UnknownRun(NotFound):
    code = "UNKNOWN_RUN"


class UnknownTool(NotFound):
    code = "UNKNOWN_TOOL"


class Conflict(ApolliaError):
    code = "CONFLICT"
    http_status = 409


class InvalidTransition(Conflict):
    code = "INVALID_TRANSITION"


class AgentUnavailable(Conflict):
    code = "AGENT_UNAVAILABLE"


class SessionBusy(Conflict):
    code = "SESSION_BUSY"


class SessionClosed(Conflict):
    code = "SESSION_CLOSED"


class HomeLocked(Conflict):
    code = "HOME_LOCKED"


class ServerNotRunning(HomeLocked):
    """The home's ``server.json`` advertises an ``apollia-os serve`` that does not answer (stopped, or
    gone without removing it): start the server again, or remove the stale file."""

    code = "SERVER_NOT_RUNNING"

    @classmethod
    def advertised(cls, server_json: object, url: str, pid: object, why: str, holder: str | None = None,
                   ) -> "ServerNotRunning":
        """The error for ``server_json`` advertising ``url`` (process ``pid``), which ``why`` (e.g. "refuses
        connections"); ``holder`` names another process found owning the home, if any."""
        owner = (f" The home is owned by {holder}: stop it before starting the server."
                 if holder else "")
        return cls(f"the server is not running: {server_json} advertises {url} (process {pid}), which {why}.{owner} "
                   f"Start `apollia-os serve` for the home (or remove the stale server.json {server_json} if no "
                   "server should run for it)")


class IdempotencyInProgress(Conflict):
    code = "IDEMPOTENCY_IN_PROGRESS"


class ConsentsToReview(Conflict):
    """Re-registering an agent whose tools, workspace or model changed while it holds standing
    consents: the operator keeps or drops them (``keep_consents``)."""

    code = "CONSENTS_TO_REVIEW"


class StaleApproval(Conflict):
    """An answer or plan approval that names the digest of something other than what the card or plan
    shows now: the person approved what they saw, and that is not this."""

    code = "STALE_APPROVAL"


class Refused(ApolliaError):
    code = "REFUSED"
    http_status = 403


class Rejected(ApolliaError):
    code = "REJECTED"
    http_status = 409


class BudgetExceeded(ApolliaError):
    code = "BUDGET_EXCEEDED"
    http_status = 409


class Interrupted(ApolliaError):
    code = "INTERRUPTED"
    http_status = 409


class Expired(ApolliaError):
    code = "EXPIRED"
    http_status = 409


class GovernanceUnreadable(ApolliaError):
    code = "GOVERNANCE_UNREADABLE"
    http_status = 503


class PolicyRefused(ApolliaError):
    code = "POLICY_REFUSED"
    http_status = 503


class IntegrityError(ApolliaError):
    code = "INTEGRITY_FAILURE"
    http_status = 500


class BundleFileAltered(IntegrityError):
    """A file of an audit bundle that an auditor is told to run or read (``views.sql``, ``README.md``,
    ``meta.json``, ...) is not what this install writes for that bundle, or is not a plain file.
    ``file`` names it."""

    code = "BUNDLE_FILE_ALTERED"

    def __init__(self, message: str, file: str = "") -> None:
        super().__init__(message)
        self.file = file


class HomeDamaged(ApolliaError):
    code = "HOME_DAMAGED"
    http_status = 503


class HomeFileMissing(HomeDamaged):
    code = "HOME_FILE_MISSING"


class HomeFileCorrupt(HomeDamaged):
    code = "HOME_FILE_CORRUPT"


class HomeFileRolledBack(HomeFileCorrupt):
    """``runtime.db`` holds fewer committed changes than it acknowledged (its write-ahead log lost or
    cut): the owner refuses to start rather than go on without them; names what is missing and how to
    recover (a ``home repair --new-runtime-db`` takes it as it takes a damaged file)."""

    code = "HOME_FILE_ROLLED_BACK"


class HomeKeyMismatch(HomeDamaged):
    code = "HOME_KEY_MISMATCH"


class JournalTruncated(HomeDamaged):
    """The journal's files hold fewer entries than it acknowledged (``journal.log`` cut, or a stored
    checkpoint larger than what is left): the home refuses to start rather than reuse a seq."""

    code = "JOURNAL_TRUNCATED"


class StorageError(ApolliaError):
    """The disk refused a write (I/O error, read-only file system): nothing of it was recorded."""

    code = "STORAGE_ERROR"
    http_status = 503


class StorageFull(StorageError):
    code = "STORAGE_FULL"
    http_status = 507


class OutcomeUnknown(ApolliaError):
    """A request was carried out (or may have been), but not all of it could be recorded: its answer is
    not known durably. Not a refusal: send it again with the same ``Idempotency-Key``, which answers
    with the first outcome once it is recorded and never does it twice."""

    code = "OUTCOME_UNKNOWN"
    http_status = 503


class ModelError(ApolliaError):
    code = "MODEL_ERROR"
    http_status = 502
    transient: ClassVar[bool] = False


class ModelTransient(ModelError):
    code = "MODEL_TRANSIENT"
    transient = True


class ModelPermanent(ModelError):
    code = "MODEL_PERMANENT"


class ToolError(ApolliaError):
    code = "TOOL_ERROR"
    http_status = 502
    transient: ClassVar[bool] = False


class TransientToolError(ToolError):
    code = "TOOL_TRANSIENT"
    transient = True


class PermanentToolError(ToolError):
    code = "TOOL_PERMANENT"


class ToolNameRefused(PermanentToolError):
    """A tool an MCP server lists under a name that could pass for another (the host's own requests,
    another namespace, a path, a name Unicode normalisation changes): it is not offered."""

    code = "TOOL_NAME_REFUSED"


class ToolTimeout(TransientToolError):
    code = "TOOL_TIMEOUT"


class CircuitOpen(ToolError):
    code = "CIRCUIT_OPEN"
    http_status = 503


class PathEscape(PermanentToolError):
    code = "PATH_ESCAPE"


class PathInHome(PermanentToolError):
    code = "PATH_IN_HOME"


def _all_subclasses(cls: type[ApolliaError]) -> list[type[ApolliaError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def error_for_code(code: str, message: str) -> ApolliaError:
    """Rebuild the error class for a stable code (used by the SDK and CLI)."""
    for cls in _all_subclasses(ApolliaError):
        if cls.code == code:
            return cls(message)
    err = ApolliaError(message)
    err.code = code  # type: ignore[misc]
    return err
