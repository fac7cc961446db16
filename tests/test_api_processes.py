"""`modelforge api --processes N`: several API processes on one port (api/processes.py).

Which process answers is the kernel's choice per connection, so the tests keep one
kept-alive client per process (told apart by who holds the client's connection) and
ask each process through its own client: its node cache, its metrics, its refusals.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import pytest

from schemas.protocol import HEARTBEAT
from tests.agent.harness import wait_until
from tests.api_processes import answered_from_cache, api_processes, enrolled, refuse
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


def client_per_process(url: str, pids: list[int], stack: ExitStack) -> dict[int, httpx.Client]:
    """A kept-alive client whose connection each of pids accepted (new connections until
    every process has taken one)."""
    clients: dict[int, httpx.Client] = {}
    for _ in range(200):
        client = stack.enter_context(httpx.Client(base_url=url, timeout=10))
        response = client.get("/healthz")
        assert response.status_code == 200, response.text
        client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        pid = holder_of(client_port, pids)
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
