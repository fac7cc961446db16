"""ProtocolClient: the agent side of Node Agent Protocol v1 over httpx.

Typed methods take and return the wire models of schemas/agent.py. Every failure is mapped
once, here, to the hierarchy in agent/errors.py, by HTTP status and the error body's
`code`; the body's other fields (message, details) are never read into an error, so
nothing the server echoes can reach a log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from agent import AGENT_VERSION
from agent.diagnostics import classify_transport
from agent.errors import (
    Conflict,
    FailureClass,
    Refused,
    Rejected,
    RequestFailed,
    Transient,
    invalid_fields,
)
from agent.failover import FailoverTransport, environment_proxy
from schemas.admin import CreateEnrollmentToken, EnrollmentTokenCreated
from schemas.agent import (
    EnrollRequest,
    EnrollResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    IngestResult,
    InventoryReport,
    TelemetryReport,
)
from schemas.base import WireModel
from schemas.errors import ErrorCode
from schemas.jobs import FailAnswer, JobFamily, Lease, LeaseFence, ProgressAnswer
from schemas.protocol import (
    ADMIN_HEADER,
    CORRELATION_HEADER,
    ENROLL,
    HEARTBEAT,
    INVENTORY,
    INVOKE_EPOCH_HEADER,
    INVOKE_GATEWAY_HEADER,
    INVOKE_LEASE_HEADER,
    INVOKE_STATUS_HEADER,
    INVOKE_STREAM,
    RUNTIME,
    TELEMETRY,
    TOKENS,
)
from schemas.runtime_local import RuntimeReport

logger = logging.getLogger("modelforge.agent.http")


Answer = TypeVar("Answer", bound=BaseModel)
T = TypeVar("T")


class Claim(Protocol):
    """What every kind's claim carries (schemas/jobs.py: JobType.claim): the job, its
    kind and attempt, and the lease to report under. Its spec is the kind's own."""

    job_id: uuid.UUID
    attempt: int
    lease: Lease

    # Read-only: each claim narrows it to its own kinds.
    @property
    def kind(self) -> str: ...


# One parser per family's claim (a kind's claim, or the kinds' claims by `kind`): built
# once, as building a TypeAdapter is the costly part.
_CLAIM_ADAPTERS: dict[str, TypeAdapter[Any]] = {}


def _claim_adapter(family: JobFamily) -> TypeAdapter[Any]:
    adapter = _CLAIM_ADAPTERS.get(family.name)
    if adapter is None:
        adapter = _CLAIM_ADAPTERS[family.name] = TypeAdapter(family.claim)
    return adapter


# Longer than the heartbeat interval (a connection is reused from one to the next), and
# shorter than the API's keep-alive timeout (api/settings.py: keep_alive_s).
KEEPALIVE_EXPIRY_S = 20.0


@dataclass(frozen=True)
class TlsOptions:
    """Private-CA TLS: the CA bundle that signs the API's certificate, and optionally this
    node's client certificate for APIs that require one."""

    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self.ca_bundle is not None:
            context = ssl.create_default_context(cafile=str(self.ca_bundle))
        else:
            context = ssl.create_default_context()
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_cert is not None:
            context.load_cert_chain(
                str(self.client_cert), str(self.client_key) if self.client_key else None
            )
        return context


def make_http_client(
    api_url: str,
    *,
    tls: TlsOptions | None = None,
    timeout_s: float = 10.0,
    max_connections: int = 10,
    trust_env: bool = True,
    failover: Sequence[str] = (),
) -> httpx.AsyncClient:
    """The control plane's client. failover: more endpoints of the same control plane,
    used in order when the current one cannot be reached (agent/failover.py)."""
    endpoints = [api_url.rstrip("/"), *(url.rstrip("/") for url in failover)]
    # Plain http (development) needs no TLS context, so no CA file has to exist for it.
    secure = any(url.lower().startswith("https://") for url in endpoints)
    verify: ssl.SSLContext | bool = (tls or TlsOptions()).ssl_context() if secure else True
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        # Below the API's keep-alive (KEEP_ALIVE_S, 30 s): the client drops an idle
        # connection before the server does, so a heartbeat never races the server's
        # close (a reset, retried, but a failure all the same).
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    transport: FailoverTransport | None = None
    if len(endpoints) > 1:

        def pool(endpoint: str) -> httpx.AsyncBaseTransport:
            # Each endpoint's own proxy from the environment, as httpx would pick it.
            proxy = environment_proxy(endpoint) if trust_env else None
            return httpx.AsyncHTTPTransport(
                verify=verify, limits=limits, trust_env=trust_env, proxy=proxy
            )

        transport = FailoverTransport(endpoints, pool)
    return httpx.AsyncClient(
        base_url=endpoints[0],
        verify=verify,
        timeout=httpx.Timeout(timeout_s),
        limits=limits,
        headers={"User-Agent": f"modelforge-agent/{AGENT_VERSION}"},
        follow_redirects=False,
        # With several endpoints the proxies are the transport's, per endpoint: the
        # client's own would take every request past it.
        trust_env=trust_env and transport is None,
        transport=transport,
    )


def _error_code(response: httpx.Response) -> tuple[ErrorCode | None, int | None]:
    """The stable `code` of an error body and, for a replay, the server's cursor."""
    try:
        body = json.loads(response.content)
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    raw_code = body.get("code")
    code = None
    if isinstance(raw_code, str) and raw_code in ErrorCode._value2member_map_:
        code = ErrorCode(raw_code)
    extra = body.get("extra")
    cursor = extra.get("cursor") if isinstance(extra, dict) else None
    return code, cursor if isinstance(cursor, int) and not isinstance(cursor, bool) else None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 3600 else None


def failure_from_response(
    method: str, path: str, response: httpx.Response, correlation_id: str | None = None
) -> RequestFailed:
    status = response.status_code
    code, cursor = _error_code(response)
    kind: type[RequestFailed]
    if status == 429 or status >= 500:
        kind = Transient
    elif status in (401, 403):
        kind = Rejected
    elif status == 409:
        kind = Conflict
    else:
        kind = Refused
    error = kind(
        method=method,
        path=path,
        failure_class=FailureClass.HTTP,
        status=status,
        code=code,
        # The server echoes ours; a proxy in between may not.
        correlation_id=response.headers.get(CORRELATION_HEADER, correlation_id),
        retry_after_s=_retry_after(response) if kind is Transient else None,
    )
    if isinstance(error, Conflict):
        error.cursor = cursor
    return error


# An invoke's answer stream: connecting and each write bounded; the wait for the next
# chunk of llama-server's answer is not (a long answer takes its time).
INVOKE_STREAM_TIMEOUT = httpx.Timeout(30.0, connect=10.0)


class ProtocolClient:
    """One node's view of the protocol. `credential` is set after enrollment or a reload.

    The httpx client may be shared by many ProtocolClients (the fleet simulator does);
    the credential travels per request, never in the shared client's default headers.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        credential: str | None = None,
        *,
        limiter: asyncio.Semaphore | None = None,
    ) -> None:
        self.http = http
        self.credential = credential
        # Bounds requests in flight across clients sharing it (the fleet simulator).
        self.limiter = limiter

    async def enroll(self, request: EnrollRequest) -> EnrollResponse:
        return await self._call("POST", ENROLL, request, EnrollResponse, authenticated=False)

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return await self._call("POST", HEARTBEAT, request, HeartbeatResponse)

    async def put_inventory(self, report: InventoryReport) -> IngestResult:
        return await self._call("PUT", INVENTORY, report, IngestResult)

    async def put_telemetry(self, report: TelemetryReport) -> IngestResult:
        return await self._call("PUT", TELEMETRY, report, IngestResult)

    async def put_runtime(self, report: RuntimeReport) -> IngestResult:
        return await self._call("PUT", RUNTIME, report, IngestResult)

    # A job family's four calls, on the routes its declaration names (schemas/jobs.py:
    # JobFamily): one set for every family, so a new kind needs no call of its own.

    async def claim(self, family: JobFamily) -> Claim | None:
        """The next job of any of the family's kinds and its lease, parsed as the
        declared claim (by `kind`); None when there is nothing to do (204)."""
        response = await self._send("GET", family.next, None)
        if response.status_code == 204:
            return None
        claim: Claim = _parse(_claim_adapter(family).validate_json, response, "GET", family.next)
        return claim

    async def progress(
        self, family: JobFamily, job_id: uuid.UUID, report: WireModel
    ) -> ProgressAnswer:
        path = family.progress_path.format(job_id=job_id)
        return await self._call("POST", path, report, ProgressAnswer)

    async def complete(self, family: JobFamily, job_id: uuid.UUID, report: WireModel) -> WireModel:
        """The completion of the job's kind; the family's declared answer."""
        path = family.complete_path.format(job_id=job_id)
        return await self._call("POST", path, report, family.completed)

    async def fail(self, family: JobFamily, job_id: uuid.UUID, report: WireModel) -> FailAnswer:
        return await self._call("POST", family.fail_path.format(job_id=job_id), report, FailAnswer)

    async def stream_invoke(
        self,
        invoke_id: uuid.UUID,
        lease: LeaseFence,
        gateway: str,
        *,
        status: int,
        content_type: str,
        body: bytes | AsyncIterable[bytes],
    ) -> None:
        """POST an invoke's answer under its lease: `status` and `content_type` are
        llama-server's (or the worker's refusal's), `body` its bytes as they come (an
        iterable is sent chunked, each chunk as it arrives). Returns once the API took
        the whole body (2xx); a refusal (409 lease_stale: the invoke ended or went
        elsewhere) or a broken connection raises, as every call here does."""
        path = INVOKE_STREAM.format(invoke_id=invoke_id)
        headers = {
            INVOKE_LEASE_HEADER: str(lease.lease_id),
            INVOKE_EPOCH_HEADER: str(lease.epoch),
            INVOKE_GATEWAY_HEADER: gateway,
            INVOKE_STATUS_HEADER: str(status),
            "content-type": content_type,
        }
        await self._send(
            "POST", path, None, extra_headers=headers, content=body, timeouts=INVOKE_STREAM_TIMEOUT
        )

    async def _call(
        self,
        method: str,
        path: str,
        body: WireModel,
        answer: type[Answer],
        *,
        authenticated: bool = True,
        extra_headers: dict[str, str] | None = None,
    ) -> Answer:
        response = await self._send(
            method, path, body, authenticated=authenticated, extra_headers=extra_headers
        )
        return _parse(answer.model_validate_json, response, method, path)

    async def _send(
        self,
        method: str,
        path: str,
        body: WireModel | None,
        *,
        authenticated: bool = True,
        extra_headers: dict[str, str] | None = None,
        content: bytes | AsyncIterable[bytes] | None = None,
        timeouts: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """A 2xx response, or the failure mapped to agent/errors.py. The body is `body`
        as JSON, or `content` as it is (its content type in `extra_headers`)."""
        correlation_id = f"agent-{uuid.uuid4().hex}"
        headers = {CORRELATION_HEADER: correlation_id}
        if body is not None:
            headers["content-type"] = "application/json"
        headers |= extra_headers or {}
        if authenticated:
            if not self.credential:
                raise Rejected(
                    method=method,
                    path=path,
                    failure_class=FailureClass.HTTP,
                    code=ErrorCode.CREDENTIAL_MISSING,
                    detail="no credential in the state dir",
                )
            headers["Authorization"] = f"Bearer {self.credential}"
        payload = body.model_dump_json() if body is not None else content
        bounds = timeouts or self.http.timeout
        started = time.monotonic()
        try:
            if self.limiter is None:
                response = await self.http.request(
                    method, path, content=payload, headers=headers, timeout=bounds
                )
            else:
                async with self.limiter:
                    response = await self.http.request(
                        method, path, content=payload, headers=headers, timeout=bounds
                    )
        except httpx.TransportError as exc:
            failure_class, detail = classify_transport(exc)
            raise Transient(
                method=method,
                path=path,
                failure_class=failure_class,
                detail=detail,
                correlation_id=correlation_id,
            ) from exc
        except httpx.HTTPError as exc:
            raise Transient(
                method=method,
                path=path,
                failure_class=FailureClass.CONNECTION,
                detail=type(exc).__name__,
                correlation_id=correlation_id,
            ) from exc
        logger.debug(
            "%s %s -> %d in %.0f ms (correlation_id=%s)",
            method,
            path,
            response.status_code,
            (time.monotonic() - started) * 1000,
            response.headers.get(CORRELATION_HEADER, correlation_id),
        )
        if not 200 <= response.status_code < 300:
            raise failure_from_response(method, path, response, correlation_id)
        return response


def _parse(validate: Callable[[bytes], T], response: httpx.Response, method: str, path: str) -> T:
    try:
        return validate(response.content)
    except ValidationError as exc:
        raise Refused(
            method=method,
            path=path,
            failure_class=FailureClass.RESPONSE,
            status=response.status_code,
            detail=f"unexpected answer; invalid fields: {invalid_fields(exc)}",
            correlation_id=response.headers.get(CORRELATION_HEADER),
        ) from None


class OperatorClient(ProtocolClient):
    """The few admin calls the fleet simulator makes (creating enrollment tokens)."""

    def __init__(
        self, http: httpx.AsyncClient, operator_key: str, *, limiter: asyncio.Semaphore | None
    ) -> None:
        super().__init__(http, limiter=limiter)
        self._operator_key = operator_key

    async def create_token(self, request: CreateEnrollmentToken) -> EnrollmentTokenCreated:
        return await self._call(
            "POST",
            TOKENS,
            request,
            EnrollmentTokenCreated,
            authenticated=False,
            extra_headers={ADMIN_HEADER: self._operator_key},
        )
