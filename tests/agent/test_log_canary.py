"""M16 diagnostics: a whole lifecycle at DEBUG with real secrets as canaries.

The agent enrolls with a real enrollment token (given through the environment), gets a
real credential, and then meets every failure class through a fault proxy that echoes
the request body and Authorization header in its error bodies: 503, 429, a timeout,
connection refused, and finally revocation. No log line may contain the token or the
credential (nor their secret parts), the redacting formatter must never have had to act,
and every failure line must name status, method, path and failure class.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.harness import (
    FAST_API,
    AgentProcess,
    admin,
    advancing,
    identity,
    new_token,
    write_config,
)
from tests.agent.proxy import FaultProxy
from tests.api_server import RunningApi
from tests.flows import NODES

ApiFactory = Callable[..., RunningApi]
StartAgent = Callable[..., AgentProcess]
FAILURE = re.compile(r" failed: method=(\S+) path=(\S+) status=(\S+) class=(\S+)")


@pytest.fixture
def proxies() -> Iterator[Callable[[str], FaultProxy]]:
    made: list[FaultProxy] = []

    def make(upstream: str) -> FaultProxy:
        made.append(FaultProxy(upstream).start())
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


def test_no_secret_reaches_any_log_line_through_a_failing_lifecycle(
    api_factory: ApiFactory,
    agents: StartAgent,
    proxies: Callable[[str], FaultProxy],
    tmp_path: Path,
) -> None:
    api = api_factory(**FAST_API)
    proxy = proxies(api.base_url)
    token = new_token(api)
    state = tmp_path / "state"
    config = write_config(
        tmp_path / "agent.yaml",
        api_url=proxy.url,
        state_dir=str(state),
        request_timeout_s=1.0,
        log_level="DEBUG",
    )
    proxy.mode = "503"  # the enrollment itself fails first, its body echoed back
    agent = agents(config, MODELFORGE_AGENT_ENROLLMENT_TOKEN=token)
    agent.wait_for_log(r"enroll failed: method=POST path=/api/v1/agent/enroll status=503")
    proxy.mode = "forward"
    agent.wait_for_log(r"enrolled as node")
    node_id = identity(state)["node_id"]
    credential = identity(state)["credential"]
    advancing(api, node_id)

    proxy.mode = "503"
    agent.wait_for_log(r"heartbeat failed: method=POST path=/api/v1/agent/heartbeat status=503")
    proxy.mode = "429"
    agent.wait_for_log(r"failed: method=\S+ path=\S+ status=429 class=http")
    proxy.mode = "hang"
    agent.wait_for_log(r"failed: method=\S+ path=\S+ status=none class=timeout")
    proxy.mode = "forward"
    advancing(api, node_id)
    proxy.stop()
    agent.wait_for_log(r"failed: method=\S+ path=\S+ status=none class=refused")
    proxy.start()
    advancing(api, node_id)
    admin(api, "POST", f"{NODES}/{node_id}/credential/revoke")
    assert agent.wait() == 3

    lines = agent.output.splitlines()
    assert any(" DEBUG " in line for line in lines), "the agent did not run at DEBUG"
    secrets = {token, credential, token.split(".")[-1], credential.split(".")[-1]}
    for line in lines:
        for secret in secrets:
            assert secret not in line, f"a secret reached the log: {line}"
        # The redactor is a second line of defence: it never had to act.
        assert "[redacted]" not in line and "Bearer" not in line, line
        # HTTP libraries stay at WARNING even with the agent at DEBUG.
        assert " httpx " not in line and " httpcore" not in line, line
        assert '"extra"' not in line and "echo" not in line, f"a body reached the log: {line}"

    failures = [FAILURE.search(line) for line in lines if " failed: " in line]
    assert failures and all(failures), [line for line in lines if " failed: " in line]
    seen = {(m.group(3), m.group(4)) for m in failures if m}
    assert {("503", "http"), ("429", "http"), ("none", "timeout"), ("none", "refused")} <= seen
    assert ("401", "http") in seen
    assert "code=credential_revoked" in agent.output
