"""The error contract: one JSON body shape and a stable code for every refusal."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from schemas.base import WireModel


class ErrorCode(StrEnum):
    # 422 / 413
    VALIDATION_FAILED = "validation_failed"
    # The gateway: a chat request with tools for a model none of whose deployments' chat
    # templates can call tools (llama-server would ignore them silently).
    TOOLS_UNSUPPORTED = "tools_unsupported"
    # A job's target root is not one the node reports as allowed.
    TARGET_ROOT_NOT_ALLOWED = "target_root_not_allowed"
    # A completion's file list does not name exactly the job's files.
    INVENTORY_MISMATCH = "inventory_mismatch"
    # The source has no such repository, revision or matching files (or refused us).
    MANIFEST_UNRESOLVED = "manifest_unresolved"
    # A runtime probe names what the control plane or the node does not have.
    ARTIFACT_NOT_ON_NODE = "artifact_not_on_node"
    PROFILE_UNKNOWN = "profile_unknown"
    ENVIRONMENT_UNKNOWN = "environment_unknown"
    ENVIRONMENT_NOT_ON_NODE = "environment_not_on_node"
    DEVICE_NOT_ON_NODE = "device_not_on_node"
    # A runtime profile's server_args entry that the allow-list refuses (a flag it does
    # not admit, or a value outside its type and bounds); `extra.flags` names them.
    SERVER_FLAG_REFUSED = "server_flag_refused"
    # Not JSON at all: invalid UTF-8, a syntax error, nesting or a number beyond the
    # parser's limits.
    BODY_UNPARSEABLE = "body_unparseable"
    BODY_TOO_LARGE = "body_too_large"
    # 401
    CREDENTIAL_MISSING = "credential_missing"
    CREDENTIAL_MALFORMED = "credential_malformed"
    CREDENTIAL_INVALID = "credential_invalid"
    CREDENTIAL_REVOKED = "credential_revoked"
    NODE_DECOMMISSIONED = "node_decommissioned"
    ENROLLMENT_TOKEN_INVALID = "enrollment_token_invalid"
    ENROLLMENT_TOKEN_USED = "enrollment_token_used"
    ENROLLMENT_TOKEN_EXPIRED = "enrollment_token_expired"
    ENROLLMENT_TOKEN_REVOKED = "enrollment_token_revoked"
    ADMIN_TOKEN_MISSING = "admin_token_missing"
    ADMIN_TOKEN_INVALID = "admin_token_invalid"
    # 403
    NODE_DISABLED = "node_disabled"
    NODE_MISMATCH = "node_mismatch"
    # Another node's job: never claimed, seen or reported on through this credential.
    JOB_NOT_OWNED = "job_not_owned"
    ADMIN_API_DISABLED = "admin_api_disabled"
    # A service client asked for a model or role outside its scope.
    MODEL_NOT_ALLOWED = "model_not_allowed"
    # 404
    NOT_FOUND = "not_found"
    # The gateway: no deployment (in any state but ended) serves that model or role.
    MODEL_NOT_FOUND = "model_not_found"
    # 405
    METHOD_NOT_ALLOWED = "method_not_allowed"
    # 409
    PROTOCOL_VERSION_UNSUPPORTED = "protocol_version_unsupported"
    SEQUENCE_REPLAYED = "sequence_replayed"
    IDENTITY_CONFLICT = "identity_conflict"
    NODE_TERMINAL = "node_terminal"
    # A decommission whose plan changed since its preview (a credential issued, a job
    # claimed, a deployment loaded, ...): preview again.
    DECOMMISSION_PLAN_CHANGED = "decommission_plan_changed"
    STATE_CONFLICT = "state_conflict"
    # A report under a lease that is no longer the job's current one (fencing), or
    # one that ran out.
    LEASE_STALE = "lease_stale"
    LEASE_EXPIRED = "lease_expired"
    # The job already ended (succeeded, failed, cancelled).
    JOB_FINISHED = "job_finished"
    # A job for a disabled or decommissioned node.
    NODE_NOT_SCHEDULABLE = "node_not_schedulable"
    # 429: past a service client's rate or concurrency bound, or every deployment busy.
    RATE_LIMITED = "rate_limited"
    CONCURRENCY_LIMITED = "concurrency_limited"
    DEPLOYMENT_BUSY = "deployment_busy"
    # A service client's tokens today reached its max_tokens_per_day: Retry-After says
    # when the next UTC day begins.
    BUDGET_EXHAUSTED = "budget_exhausted"
    # The control plane sheds load: too many node requests wait for the database
    # (api/shedding.py); Retry-After says when to come back.
    OVERLOADED = "overloaded"
    # 500 / 502 / 503 / 504
    # The gateway: deployments serve it, but none is ready (or reachable) right now.
    NO_READY_DEPLOYMENT = "no_ready_deployment"
    # The gateway: a deployment's plain answer outgrew what the gateway holds whole.
    UPSTREAM_TOO_LARGE = "upstream_too_large"
    # The gateway: the model server itself failed on the request (its 5xx), passed on.
    UPSTREAM_FAILED = "upstream_failed"
    # The node holding the invoke went away, or it passed a timeout (first token, gap).
    NODE_LOST = "node_lost"
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"
    TOKEN_GAP_TIMEOUT = "token_gap_timeout"
    INTERNAL_ERROR = "internal_error"
    BROKER_UNAVAILABLE = "broker_unavailable"
    DATABASE_UNAVAILABLE = "database_unavailable"
    SOURCE_UNAVAILABLE = "source_unavailable"
    # The artifact source answered something ModelForge does not read: too large, too
    # deeply nested, not JSON, or not the shape its API has (502).
    SOURCE_INVALID = "source_invalid"


class FieldError(WireModel):
    location: list[str | int]
    message: str
    type: str


class ErrorBody(WireModel):
    """Every non-2xx response carries this body."""

    code: ErrorCode
    message: str
    correlation_id: str
    details: list[FieldError] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
