"""What the agent reports: host facts (host.py) and GPUs from NVML (nvml.py) or a
simulation (simulated.py), behind the GpuCollector protocol (base.py)."""
