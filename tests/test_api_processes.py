"""`modelforge api --processes N`: several API processes on one port (api/processes.py).

Which process answers is the kernel's choice per connection, so the tests keep one
kept-alive client per process (told apart by who holds the client's connection) and
ask each process through its own client: its node cache, its refusals. Metrics are the
port's: every process answers the sum over all of them (api/metrics.py).
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import pytest

from api.metrics import MULTIPROCESS_DIR_ENV
from schemas.protocol import HEARTBEAT
from tests.agent.harness import wait_until
from tests.api_processes import answered_from_cache, api_processes, enrolled, refuse, samples
from tests.flows import EnrolledNode, heartbeat_body

BOUND_S = 1.0
PROCESSES = 2


def serving_processes(supervisor: int) -> list[int]:
    return [child.pid for child in psutil.Process(supervisor).children()]


def holder_of(client_port: int, pids: list[int]) -> int | None:
    """The API process that accepted the connection from client_port."""
    for pid in pids:
        for connection in psutil.Process(pid).net_connections("tcp"):
            if connection.raddr and connection.raddr.port == client_port:
                return pid
    return None


def answered_by(response: httpx.Response, pids: list[int]) -> int | None:
    """The one of pids that accepted the connection this response came over."""
    client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
    return holder_of(client_port, pids)


def client_per_process(url: str, pids: list[int], stack: ExitStack) -> dict[int, httpx.Client]:
    """A kept-alive client whose connection each of pids accepted (new connections until
    every process has taken one)."""
    clients: dict[int, httpx.Client] = {}
    for _ in range(200):
        client = stack.enter_context(httpx.Client(base_url=url, timeout=10))
        response = client.get("/healthz")
        assert response.status_code == 200, response.text
        pid = answered_by(response, pids)
        if pid is not None and pid not in clients:
            clients[pid] = client
        if len(clients) == len(pids):
            return clients
    raise AssertionError(f"only {sorted(clients)} of {pids} took a connection in 200")


@pytest.fixture
def shared_port(database_url: str, nats_url: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """(URL, supervisor pid) of one `modelforge api --processes 2`."""
    with api_processes(1, database_url, nats_url, tmp_path, processes=PROCESSES) as [(url, sup)]:
        wait_until(lambda: len(serving_processes(sup.pid)) == PROCESSES, 30, "both API processes")
        yield url, sup.pid


def test_every_process_on_the_port_refuses_a_revocation_within_a_second(
    shared_port: tuple[str, int],
) -> None:
    url, supervisor = shared_port
    pids = serving_processes(supervisor)
    with ExitStack() as stack:
        clients = client_per_process(url, pids, stack)
        operator = clients[pids[0]]
        node_id, credential = enrolled(operator, "shared-port")
        node = EnrolledNode(node_id, credential)
        # Each process has made the node's heartbeats routine: only its notification
        # can tell it of the revocation, not a database read.
        for client in clients.values():
            answered_from_cache(client, node)
        refuse(operator, node_id, "revoke")
        for pid, client in clients.items():

            def refused(client: httpx.Client = client) -> bool:
                response = client.post(
                    HEARTBEAT, json=heartbeat_body(node_id), headers=node.headers
                )
                if response.status_code == 200:
                    return False
                assert response.status_code == 401, response.text
                assert response.json()["code"] == "credential_revoked"
                return True

            wait_until(refused, BOUND_S, f"API process {pid} refusing the revoked node")


def test_a_killed_process_is_replaced_and_the_port_keeps_answering(
    shared_port: tuple[str, int],
) -> None:
    url, supervisor = shared_port
    before = serving_processes(supervisor)
    os.kill(before[0], signal.SIGKILL)
    # The listener is the supervisor's: the survivor answers every new connection
    # while the dead one is replaced.
    for _ in range(20):
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/healthz").status_code == 200

    def replaced() -> bool:
        now = serving_processes(supervisor)
        return len(now) == PROCESSES and before[0] not in now

    wait_until(replaced, 30, "the killed API process replaced")
    with ExitStack() as stack:
        assert len(client_per_process(url, serving_processes(supervisor), stack)) == PROCESSES


# GETs of a path no route matches: counted under route="unmatched", which nothing else
# the tests send (health checks, scrapes) is.
UNKNOWN_PATH = "/no-such-route"
UNMATCHED = {"route": "unmatched", "method": "GET"}


def unmatched(client: httpx.Client) -> tuple[float, float]:
    """(requests counted, latencies observed) of UNKNOWN_PATH, from one scrape."""
    found = samples(client)
    requests = frozenset({**UNMATCHED, "status": "404"}.items())
    return (
        found.get(("modelforge_http_requests_total", requests), 0.0),
        found.get(
            ("modelforge_http_request_duration_seconds_count", frozenset(UNMATCHED.items())), 0.0
        ),
    )


def send_unknown(clients: dict[int, httpx.Client], each: int) -> None:
    for client in clients.values():
        for _ in range(each):
            assert client.get(UNKNOWN_PATH).status_code == 404


def scrapes_agree(url: str, clients: dict[int, httpx.Client], expected: float) -> None:
    """Every process (over its kept-alive connection) and new connections answer the
    same sums, once the last request is counted (after its response has gone)."""

    def counted() -> bool:
        now = unmatched(next(iter(clients.values())))
        assert max(now) <= expected, now
        return now == (expected, expected)

    wait_until(counted, 10, f"{expected} requests counted")
    for client in clients.values():
        assert unmatched(client) == (expected, expected)
    for _ in range(4):
        with httpx.Client(base_url=url, timeout=10) as fresh:
            assert unmatched(fresh) == (expected, expected)


def test_metrics_on_the_port_are_the_sum_of_every_process_and_survive_a_killed_one(
    shared_port: tuple[str, int],
) -> None:
    url, supervisor = shared_port
    pids = serving_processes(supervisor)
    directory = Path(psutil.Process(pids[0]).environ()[MULTIPROCESS_DIR_ENV])
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    each = 20
    with ExitStack() as stack:
        clients = client_per_process(url, pids, stack)
        send_unknown(clients, each)
        scrapes_agree(url, clients, PROCESSES * each)
    os.kill(pids[0], signal.SIGKILL)

    def replacement() -> int | None:
        """The new process, once it has answered a scrape. Until then, and then: the
        dead process's counts stay in the sum."""
        new = [pid for pid in serving_processes(supervisor) if pid not in pids]
        with httpx.Client(base_url=url, timeout=10) as fresh:
            assert unmatched(fresh) == (PROCESSES * each,) * 2
            return answered_by(fresh.get("/healthz"), new)

    new = wait_until(replacement, 60, "the killed API process replaced and serving")
    with ExitStack() as stack:
        clients = client_per_process(url, serving_processes(supervisor), stack)
        assert new in clients
        send_unknown(clients, each)
        scrapes_agree(url, clients, 2 * PROCESSES * each)
    # The directory is the supervisor's, gone once it has stopped.
    os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: not directory.exists(), 60, f"{directory} removed")
