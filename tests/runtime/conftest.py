"""Fixtures of the runtime worker's tests: a real llama-server and a real model, and
(for the end-to-end probes) real agent processes."""

from __future__ import annotations

from tests.agent.harness import agents
from tests.runtime.harness import instruct_model, llama_server, runtimes
from tests.runtime.probing import probe_api, probe_node

__all__ = ["agents", "instruct_model", "llama_server", "probe_api", "probe_node", "runtimes"]
