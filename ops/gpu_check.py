"""GPU check: run the agent's NVML collector for real and print what it found.

    python ops/gpu_check.py

Prints one JSON document: the host facts, the GPU inventory and one telemetry sample,
exactly as the agent would publish them, and exits 0. When NVML is unavailable (no
driver, no libnvidia-ml) or failing, it prints "NVML unavailable: <reason>" (or "NVML
failing: ...") on stderr and exits 2: the agent would then send its inventory with
complete=false, which keeps the control plane's last-good GPU state.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.collectors.host import host_facts, host_telemetry
from agent.collectors.nvml import NvmlCollector


def main() -> int:
    collector = NvmlCollector()
    try:
        inventory = collector.inventory()
        telemetry = collector.telemetry() if inventory.gpus else []
    finally:
        collector.close()
    host = host_telemetry()
    report = {
        "complete": inventory.complete,
        "problem": inventory.problem,
        "host": host_facts().model_dump(mode="json"),
        "gpus": [gpu.model_dump(mode="json") for gpu in inventory.gpus],
        "telemetry": {
            "ram_total_bytes": host.ram_total_bytes,
            "ram_used_bytes": host.ram_used_bytes,
            "gpus": [sample.model_dump(mode="json") for sample in telemetry],
        },
    }
    print(json.dumps(report, indent=2))
    if not inventory.complete:
        print(inventory.problem or "NVML unavailable: unknown reason", file=sys.stderr)
        return 2
    print(f"NVML found {len(inventory.gpus)} GPU(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
