"""Lease expiry in real `modelforge worker` processes: a lease nobody reports on comes
back to the queue (attempt + 1, after its backoff), the holder that lost it is fenced
off, and after the last attempt the job fails `lease_expired`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from stack.embedded_nats import EmbeddedNats
from tests.api_server import ApiFactory
from tests.artifact_flows import (
    claim,
    claimed,
    complete,
    created,
    fence,
    get_job,
    node_with_roots,
    progress,
)
from tests.worker_processes import Workers

T = TypeVar("T")

LEASE_S = 1.0


def _wait_for(check: Callable[[], T | bool | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found  # type: ignore[return-value]
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s}s")


def test_an_unreported_lease_expires_retries_then_fails(
    api_factory: ApiFactory, workers: Workers, nats_server: EmbeddedNats
) -> None:
    lease_settings = {
        "MODELFORGE_JOB_LEASE_S": str(LEASE_S),
        "MODELFORGE_JOB_RETRY_BASE_S": "0.2",
        "MODELFORGE_LEASE_SWEEP_PERIOD_S": "0.2",
    }
    workers.env.update(lease_settings)
    workers.start(1)
    # The worker processes are this stack's whole pipeline (relay, consumers, sweeps).
    api = api_factory(
        pipeline=False, nats_url=nats_server.url, job_lease_s=LEASE_S, job_retry_base_s=0.2
    )
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node, max_attempts=2)
        first = claimed(client, node)
        # Reports keep the lease alive past its original expiry.
        for _ in range(3):
            time.sleep(LEASE_S / 2)  # an agent's pace, past the first expiry: not a wait
            assert progress(client, node, job_id, fence(first), 100).status_code == 200
        assert get_job(client, api, job_id)["state"] == "leased"
        # Silence: a worker takes the lease back.
        second_response = _wait_for(
            lambda: (r := claim(client, node)).status_code == 200 and r,
            10,
            "the expired job claimable again",
        )
        second = second_response.json()
        assert second["attempt"] == 2 and second["lease"]["epoch"] == 2
        stale = progress(client, node, job_id, fence(first), 200)
        assert stale.status_code == 409 and stale.json()["code"] == "lease_stale"
        assert complete(client, node, job_id, fence(first)).status_code == 409
        # The last attempt expires too: the job fails for good.
        view = _wait_for(
            lambda: (v := get_job(client, api, job_id))["state"] == "failed" and v,
            10,
            "the job failed after its last attempt",
        )
        assert view["failure"]["code"] == "lease_expired" and view["attempt"] == 2
    assert "Traceback" not in workers.logs()
