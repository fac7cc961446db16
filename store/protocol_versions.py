"""Protocol version negotiation: v1 only; capabilities are recorded for later additive use.

Checked by the rules that take an agent's protocol version (store/enrollment.py, before
the token is claimed; store/heartbeat.py), refused as a Conflict (409) that names the
supported versions.
"""

from __future__ import annotations

from schemas.agent import PROTOCOL_VERSION
from schemas.errors import ErrorCode
from store.errors import Conflict

SUPPORTED_PROTOCOL_VERSIONS = (PROTOCOL_VERSION,)


def require_supported(protocol_version: int) -> None:
    if protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
        raise Conflict(
            f"protocol_version {protocol_version} is not supported",
            code=ErrorCode.PROTOCOL_VERSION_UNSUPPORTED,
            extra={"supported": list(SUPPORTED_PROTOCOL_VERSIONS)},
        )
