"""Fixtures of the runtime worker's tests: a real llama-server and a real model."""

from __future__ import annotations

from tests.runtime.harness import instruct_model, llama_server, runtimes

__all__ = ["instruct_model", "llama_server", "runtimes"]
