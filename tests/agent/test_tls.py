"""TLS with a private CA on loopback: a freshly minted CA (ops/pki/mint.py), the real API
process (`python -m cli.main api`) serving HTTPS and requiring client certificates, and a
real agent that verifies the API against the CA bundle and presents its own certificate."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from agent.client import ProtocolClient, TlsOptions, make_http_client
from agent.errors import FailureClass, Transient
from schemas.agent import EnrollRequest
from tests.agent.harness import REPO, AgentProcess, clean_env, identity, wait_until, write_config
from tests.api_server import OPERATOR_KEY, free_port
from tests.flows import NODES, TOKENS
from tests.pipeline import RunningPipeline

StartAgent = Callable[..., AgentProcess]


def mint(directory: Path, *clients: str) -> Path:
    args = [arg for client in clients for arg in ("--client", client)]
    subprocess.run(
        [sys.executable, "ops/pki/mint.py", str(directory), *args],
        cwd=REPO,
        env=clean_env(),
        check=True,
        capture_output=True,
        timeout=60,
    )
    return directory


def client_context(pki: Path, client: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    context.load_cert_chain(pki / f"client-{client}.pem", pki / f"client-{client}.key")
    return context


@pytest.fixture
def tls_api(
    database_url: str, nats_url: str, tmp_path: Path, pipeline: RunningPipeline
) -> Iterator[tuple[str, Path]]:
    """(https base URL, PKI dir) of a real API process that requires client certificates."""
    pki = mint(tmp_path / "pki", "agent-1", "operator")
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    env = clean_env(
        MODELFORGE_DATABASE_URL=database_url,
        MODELFORGE_NATS_URL=nats_url,
        MODELFORGE_OPERATOR_API_KEY=OPERATOR_KEY,
        MODELFORGE_PORT=str(port),
        MODELFORGE_HEARTBEAT_INTERVAL_S="0.3",
        MODELFORGE_STALE_AFTER_S="1",
        MODELFORGE_OFFLINE_AFTER_S="2",
        MODELFORGE_DB_POOL_SIZE="5",
        MODELFORGE_TLS_CERT_FILE=str(pki / "server.pem"),
        MODELFORGE_TLS_KEY_FILE=str(pki / "server.key"),
        MODELFORGE_TLS_CLIENT_CA_FILE=str(pki / "ca.pem"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "api"], cwd=REPO, env=env, stdout=log, stderr=log
    )
    base = f"https://127.0.0.1:{port}"
    try:
        context = client_context(pki, "operator")
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "api.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", verify=context, timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()
            time.sleep(0.2)
        yield base, pki
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_agent_over_tls_with_a_private_ca_and_client_certificates(
    tls_api: tuple[str, Path], agents: StartAgent, tmp_path: Path
) -> None:
    base, pki = tls_api
    admin = httpx.Client(
        base_url=base,
        verify=client_context(pki, "operator"),
        headers={"X-ModelForge-Admin-Token": OPERATOR_KEY},
        timeout=30,
    )
    with admin:
        # Without a client certificate the API does not even answer.
        with pytest.raises(httpx.HTTPError):
            httpx.get(
                f"{base}/healthz",
                verify=ssl.create_default_context(cafile=str(pki / "ca.pem")),
                timeout=5,
            ).raise_for_status()
        token = admin.post(TOKENS, json={}).json()["secret"]
        state = tmp_path / "state"
        config = write_config(
            tmp_path / "agent.yaml",
            api_url=base.replace("127.0.0.1", "localhost"),
            state_dir=str(state),
            enrollment_token=token,
            ca_bundle=str(pki / "ca.pem"),
            client_cert=str(pki / "client-agent-1.pem"),
            client_key=str(pki / "client-agent-1.key"),
        )
        agent = agents(config)
        agent.wait_for_log("enrolled as node")
        node_id = identity(state)["node_id"]

        def online() -> bool:
            detail = admin.get(f"{NODES}/{node_id}").json()
            stream = detail["telemetry_stream"] or {}
            return (
                detail["liveness"] == "online"
                and stream.get("cursor", 0) > 0
                and len(detail["gpus"]) == 2
            )

        wait_until(online, what="node online over TLS")
        assert agent.stop() == 0
        assert "plain http" not in agent.output and "failed:" not in agent.output


async def test_tls_failures_are_named_as_tls(tls_api: tuple[str, Path], tmp_path: Path) -> None:
    base, pki = tls_api
    other = mint(tmp_path / "other-ca", "agent-x")
    request = EnrollRequest(
        enrollment_token="mfe.x.y", protocol_version=1, agent_version="0.1.0", hostname="h"
    )
    cases = {
        # The API's certificate is not signed by the CA we trust.
        "unknown CA": TlsOptions(other / "ca.pem"),
        # Our client certificate is signed by a CA the API does not accept.
        "foreign client": TlsOptions(
            pki / "ca.pem", other / "client-agent-x.pem", other / "client-agent-x.key"
        ),
        # No client certificate at all.
        "no client": TlsOptions(pki / "ca.pem"),
    }
    for name, tls in cases.items():
        async with make_http_client(base, tls=tls, timeout_s=5, trust_env=False) as http:
            with pytest.raises(Transient) as caught:
                await ProtocolClient(http).enroll(request)
        error = caught.value
        # A refused client certificate (TLS 1.3) may surface as an alert or as a reset.
        assert error.failure_class in (FailureClass.TLS, FailureClass.CONNECTION), (name, error)
        if name == "unknown CA":
            assert error.failure_class is FailureClass.TLS
            assert error.detail is not None and "certificate verify failed" in error.detail
