"""The ModelForge node agent: enrollment, persisted identity, heartbeat, inventory and
telemetry over outbound HTTPS only.

It imports nothing of the server stack (api, store, workers, broker): only schemas/ (the
wire models), the standard library and its own dependencies.
"""

AGENT_VERSION = "0.1.0"
CAPABILITIES = ("hardware.inventory", "hardware.telemetry", "artifact.acquire.v1")
