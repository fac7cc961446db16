"""The dashboard's paths, cookies and header (api/ui/), in one place: the API's routes, its
operator check (api/deps.py) and the tests read them from here, and the browser's script
reads the admin API's paths from UI_PATHS rather than spelling them out again."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from schemas.admin import AUDIT_HEALTH_CHECK_KINDS
from schemas.base import WireModel
from schemas.events import NOT_AUDITED, EventType
from schemas.overview import OVERVIEW, OVERVIEW_HISTORY
from schemas.protocol import (
    ADMIN_EVENTS,
    ADMIN_EVENTS_OVERFLOW,
    ARTIFACT_JOBS,
    AUDIT,
    DEPLOYMENT_JOBS,
    DEPLOYMENTS,
    FLEET,
    NODES,
    SERVICES,
)
from schemas.usage import USAGE

UI_PREFIX: Final = "/ui"
UI_LOGIN: Final = f"{UI_PREFIX}/login"
UI_LOGOUT: Final = f"{UI_PREFIX}/logout"
UI_ASSETS: Final = f"{UI_PREFIX}/static"
UI_PATHS: Final = f"{UI_PREFIX}/paths.json"

# The session: HttpOnly, so no script (ours or an injected one) can read it.
SESSION_COOKIE: Final = "modelforge_session"
# The CSRF token: readable by our script, which echoes it in CSRF_HEADER on every
# request that changes something. Another site can neither read it nor set the header.
CSRF_COOKIE: Final = "modelforge_csrf"
CSRF_HEADER: Final = "X-ModelForge-CSRF"
# The login form's field for the operator key (a POST body, never a query string).
LOGIN_FIELD: Final = "operator_key"


class UiPaths(WireModel):
    """The admin API's paths, as the dashboard's script calls them."""

    nodes: str = NODES
    artifact_jobs: str = ARTIFACT_JOBS
    deployment_jobs: str = DEPLOYMENT_JOBS
    deployments: str = DEPLOYMENTS
    services: str = SERVICES
    incidents: str = f"{FLEET}/incidents"
    overview: str = OVERVIEW
    overview_history: str = OVERVIEW_HISTORY
    usage: str = USAGE
    audit: str = AUDIT
    events: str = ADMIN_EVENTS
    logout: str = UI_LOGOUT
    login: str = UI_LOGIN
    csrf_cookie: str = CSRF_COOKIE
    csrf_header: str = CSRF_HEADER
    # EventSource delivers a named event only to a listener for that name: the script
    # listens for each of these (the `event:` of ADMIN_EVENTS is the CloudEvent type).
    event_types: list[str] = Field(
        default_factory=lambda: [kind.cloudevent_type for kind in EventType]
    )
    overflow_event: str = ADMIN_EVENTS_OVERFLOW
    # The audit view shows a stream event on top of its page only when the log would
    # hold it: never these actions, and the health checks only when asked for.
    not_audited: list[str] = Field(default_factory=lambda: sorted(NOT_AUDITED))
    audit_health_check_kinds: list[str] = Field(
        default_factory=lambda: list(AUDIT_HEALTH_CHECK_KINDS)
    )
