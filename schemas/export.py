"""JSON Schema export of every wire model (`modelforge schemas export DIR`)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from schemas import (
    admin,
    agent,
    artifacts,
    deployments,
    errors,
    events,
    gateway,
    gateway_endpoints,
    gateway_fields,
    gateway_tools,
    jobs,
    json_schema,
    overview,
    runtime,
    runtime_local,
    service_clients,
    services,
    usage,
)


def models() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for module in (
        agent, admin, artifacts, deployments, errors, events, gateway, gateway_endpoints,
        gateway_fields, gateway_tools, jobs, json_schema, overview,
        runtime, runtime_local, service_clients, services, usage,
    ):  # fmt: skip
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"] = value
    return found


def render() -> dict[str, str]:
    """File name -> JSON text, deterministic so a stale export shows up as a diff."""
    files: dict[str, str] = {}
    for qualified, model in sorted(models().items()):
        schema = model.model_json_schema(mode="serialization")
        files[f"{qualified}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def export(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    rendered = render()
    for stale in directory.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    for name, text in rendered.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
