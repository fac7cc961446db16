"""The ModelForge node agent: enrollment, persisted identity, heartbeat, inventory and
telemetry over outbound HTTPS only.

It imports nothing of the server stack (api, store, workers, broker): only schemas/ (the
wire models), the standard library and its own dependencies.
"""

from schemas.job_families import capabilities

AGENT_VERSION = "0.1.0"
# The node's own reports, then a capability per job kind that declares one (the
# runtime worker's kinds declare none: it advertises nothing): the control plane hands
# a node only the kinds it advertises.
CAPABILITIES = ("hardware.inventory", "hardware.telemetry", *capabilities())
