"""The one HTTP client of `modelforge admin`: where the API is, the operator key, and the
error contract turned into one line.

The admin CLI talks to the control plane over HTTP only, like any operator tool would:
it imports the wire models (schemas/) to read the answers, never the server's code.
The operator key is read from the environment or from the file `modelforge up` keeps it
in, never from the command line, where it would sit in the shell history and in every
process listing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from cli.admin import diagnose
from schemas.errors import ErrorBody
from schemas.protocol import ADMIN_EVENTS, ADMIN_HEADER, CORRELATION_HEADER
from schemas.stack import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR,
    OPERATOR_KEY_FILE,
    StackFileError,
    StackInfo,
    operator_key_from,
    read_stack_info,
)

KEY_ENV: Final = "MODELFORGE_OPERATOR_API_KEY"
URL_ENV: Final = "MODELFORGE_API_URL"
# The file `modelforge up` keeps a generated operator key in, in its data dir.
KEY_FILE: Final = OPERATOR_KEY_FILE

M = TypeVar("M", bound=BaseModel)


class AdminFailure(Exception):
    """What the command prints as its one line, and its exit status."""

    exit_code = 1

    def line(self) -> str:
        return f"error: {self}"


class Refused(AdminFailure):
    """The API answered with the error contract's body."""

    def __init__(self, status: int, code: str, message: str, correlation_id: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.correlation_id = correlation_id

    def line(self) -> str:
        return f"error: {self.code}: {self} (correlation id {self.correlation_id})"


@dataclass(frozen=True)
class Target:
    """Where the API is and how to prove we are the operator; built once in the root
    command from the environment and the stack file."""

    api_url: str
    operator_key: str
    timeout_s: float = 30.0


def resolve_target(api_url: str | None, env: Mapping[str, str] = os.environ) -> Target:
    """The explicit --api-url, then MODELFORGE_API_URL, then the running `up`. The key
    from MODELFORGE_OPERATOR_API_KEY, then the file the running `up` names in its stack
    file, then the file `up` keeps it in (<data dir>/operator_api_key), which outlives
    the stack file: with --api-url (or an `up` that was killed) it is still found."""
    url = api_url or env.get(URL_ENV)
    key = env.get(KEY_ENV) or None
    directory = Path(env.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)
    if url is None or key is None:
        try:
            info: StackInfo | None = read_stack_info(directory)
        except StackFileError as exc:
            if url is None:
                raise AdminFailure(
                    f"{exc}; or set {URL_ENV} and {KEY_ENV} for another control plane"
                ) from None
            info = None
        if info is not None:
            url = url or info.api_url
        if key is None:
            key = _stack_key(info) if info is not None else _key_file(directory / KEY_FILE)
    assert url is not None, "given, or the stack file's (a missing one raised above)"
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise AdminFailure(f"the API URL {url!r} is not a URL ({exc})") from None
    if not key:
        raise AdminFailure(f"the operator key is empty; set {KEY_ENV}")
    return Target(url.rstrip("/"), key)


def _stack_key(info: StackInfo) -> str:
    try:
        return operator_key_from(info)
    except StackFileError as exc:
        raise AdminFailure(str(exc)) from None


def _key_file(path: Path) -> str:
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        raise AdminFailure(
            f"no operator key: set {KEY_ENV}, or run where `modelforge up` keeps it "
            f"({path}; another {DATA_DIR_ENV}?)"
        ) from None
    except OSError as exc:
        raise AdminFailure(f"cannot read the operator key file {path} ({exc.strerror})") from None
    if not key:
        # `up` writes a new one in its place on its next start.
        raise AdminFailure(f"the operator key file {path} is empty; set {KEY_ENV}")
    return key


class AdminClient:
    """Admin calls over one pooled connection; every answer parsed into its wire model."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._http = httpx.Client(
            base_url=target.api_url,
            headers={ADMIN_HEADER: target.operator_key},
            timeout=target.timeout_s,
            # An operator's HTTPS_PROXY is for the internet, not for the control plane
            # beside it; MODELFORGE_API_URL names it directly.
            trust_env=False,
        )

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        content = None
        if isinstance(body, BaseModel):
            content = body.model_dump_json(exclude_unset=True)
        elif body is not None:
            content = json.dumps(body)
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            response = self._http.request(
                method, path, content=content, params=_query(params), headers=headers
            )
        except httpx.RequestError as exc:
            # Not only the connection (TransportError): a body that does not decode or
            # a redirect loop (a proxy in the way) is said in one line too.
            raise AdminFailure(diagnose.transport(exc, self.target.api_url)) from None
        if response.is_error:
            raise refusal(response, self.target.api_url)
        if not diagnose.ours(response):
            # A 200 from another server (a dashboard, a proxy's page) is no answer either.
            raise AdminFailure(diagnose.foreign(response, self.target.api_url))
        return response

    def call(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        body: BaseModel | Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> M:
        response = self.request(method, path, body=body, params=params)
        try:
            return model.model_validate_json(response.content)
        except ValidationError:
            raise AdminFailure(
                f"the API's answer to {method} {path} is not a {model.__name__} "
                f"(a different version?; correlation id "
                f"{response.headers.get(CORRELATION_HEADER, '-')})"
            ) from None

    def get(self, model: type[M], path: str, **params: Any) -> M:
        return self.call(model, "GET", path, params=params)

    def post(
        self, model: type[M], path: str, body: BaseModel | Mapping[str, Any] | None = None
    ) -> M:
        return self.call(model, "POST", path, body=body if body is not None else {})

    def events(
        self, last_event_id: str | None = None, **params: Any
    ) -> Generator[tuple[str, str], None, None]:
        """The admin event stream: ("", "") once it is subscribed, then (event, data)
        for each message until the API ends it; after last_event_id, those published
        since it first (api/admin/events.py: resume)."""
        timeout = httpx.Timeout(self.target.timeout_s, read=None)
        headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else None
        subscribed = False
        try:
            with self._http.stream(
                "GET", ADMIN_EVENTS, params=_query(params), timeout=timeout, headers=headers
            ) as response:
                if response.is_error:
                    response.read()
                    raise refusal(response, self.target.api_url)
                if not diagnose.ours(response):
                    raise AdminFailure(diagnose.foreign(response, self.target.api_url))
                for message in _sse(response.iter_lines()):
                    subscribed = subscribed or message == ("", "")
                    yield message
        except httpx.RequestError as exc:
            where = self.target.api_url
            raise AdminFailure(
                f"the event stream from {where} broke ({type(exc).__name__})"
                if subscribed
                else diagnose.transport(exc, where)
            ) from None


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    fields: dict[str, str] = {}
    for line in lines:
        if line == ": connected":
            yield "", ""
        elif line == "":
            if "event" in fields:
                yield fields["event"], fields.get("data", "")
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def _query(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Unset options are left out rather than sent empty; a value (an enum too, or each
    of a list's) is sent as its string."""
    if params is None:
        return None
    return {
        k: (str(v) if not isinstance(v, list) else v)
        for k, v in params.items()
        if v is not None and v != []
    }


def refusal(response: httpx.Response, api_url: str) -> AdminFailure:
    """The error contract's body as one line; a server that is not ours (no correlation
    id: a proxy's page, another service) said to be so; our own answer without the
    envelope (a proxy in between rewrote it) as its status."""
    if not diagnose.ours(response):
        return AdminFailure(diagnose.foreign(response, api_url))
    correlation = response.headers.get(CORRELATION_HEADER, "-")
    try:
        body = ErrorBody.model_validate_json(response.content)
    except ValidationError:
        pass
    else:
        message = body.message
        if body.details:
            # What to change: the first field refused, where the message alone is general
            # ("the request does not match the schema").
            first = body.details[0]
            where = ".".join(str(p) for p in first.location[1:]) or "body"
            message = f"{message}: {where}: {first.message}"
        return Refused(response.status_code, body.code.value, message, body.correlation_id)
    # A newer API's code this CLI does not know yet still reads as itself.
    try:
        loose = json.loads(response.content)
        code, message = str(loose["code"]), str(loose["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{response.status_code}", response.reason_phrase
    return Refused(response.status_code, code, message, correlation)
