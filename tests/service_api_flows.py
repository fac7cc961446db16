"""Model-service steps shared by the API and CLI tests of the services resource: a
repository the local Hub server (tests/hub_server.py) serves with a real, tiny GGUF, a
service's body, its events in the outbox, and a replica written as the reconciler
would write one (the tests of the resource do not run the reconciler)."""

from __future__ import annotations

import struct
import tempfile
import uuid
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.api_server import RunningApi
from tests.artifact_flows import content
from tests.services import db_fetch, run_async

REPO = "acme/served-model"
COMMIT = "1111111111111111111111111111111111111111"
COMMIT_V2 = "2222222222222222222222222222222222222222"


def tiny_gguf() -> tuple[bytes, int]:
    """A real GGUF (llama.cpp's own writer): two layers' worth of metadata and two
    tensors; with the bytes their data takes by the header's sizes."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_block_count(2)
        writer.add_context_length(256)
        writer.add_embedding_length(64)
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
        embeddings = np.zeros((32, 64), dtype=np.float32)
        output = np.zeros((32, 64), dtype=np.float16)
        writer.add_tensor("token_embd.weight", embeddings)
        writer.add_tensor("output.weight", output)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes(), embeddings.nbytes + output.nbytes


GGUF_BYTES, TENSOR_BYTES = tiny_gguf()
FILES = {
    "model.gguf": GGUF_BYTES,
    # Not a GGUF (and below the LFS threshold: no sha256 from the source).
    "notes.gguf": content("notes.gguf", 900),
    "config.json": content("config.json", 100),
}


def service_body(profile_id: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "served",
        "artifact": {
            "repository": REPO,
            "revision": "main",
            "path": extra.pop("path", "model.gguf"),
        },
        "profile_id": profile_id,
    }
    return body | extra


def service_events(api: RunningApi, service_id: str) -> list[tuple[str, str]]:
    """(type, action) of each of the service's events in the outbox, in order."""
    rows = run_async(
        lambda: db_fetch(
            api.settings.database_url,
            "SELECT envelope->>'action' AS type, envelope->'data'->>'action' AS action"
            " FROM outbox WHERE subject LIKE $1 AND envelope->>'action' IN"
            " ('service.created', 'service.changed') ORDER BY position",
            f"modelforge.v1.service.{service_id}.%",
        )
    )
    return [(row["type"], row["action"]) for row in rows]


def db_value(api: RunningApi, sql: str, *args: Any) -> Any:
    [row] = run_async(lambda: db_fetch(api.settings.database_url, sql, *args))
    return row[0]


def add_replica(
    api: RunningApi, service_id: str, node_id: str, device_id: str, *, generation: int, phase: str
) -> str:
    """A replica row as the reconciler writes one (this resource's tests run none)."""
    replica_id = str(uuid.uuid4())
    run_async(
        lambda: db_fetch(
            api.settings.database_url,
            "INSERT INTO service_replicas (id, service_id, generation, node_id, device_id,"
            " phase, created_at, updated_at, phase_changed_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, now(), now(), now())",
            uuid.UUID(replica_id),
            uuid.UUID(service_id),
            generation,
            uuid.UUID(node_id),
            device_id,
            phase,
        )
    )
    return replica_id


def _gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def hostile_gguf(
    metadata: dict[str, int | str], dims: tuple[int, ...] = (32, 64), *, padding: int = 0
) -> bytes:
    """A GGUF header as an untrusted source may serve it: every value as given (signed
    64-bit integers, so a count may be negative; unsigned when past that range), one F32
    tensor of `dims` (each as large as a u64 holds), then `padding` zero bytes."""
    body = b""
    for key, value in metadata.items():
        body += _gguf_string(key)
        if isinstance(value, str):
            body += struct.pack("<I", gguf.GGUFValueType.STRING) + _gguf_string(value)
        elif value >= 1 << 63:
            body += struct.pack("<IQ", gguf.GGUFValueType.UINT64, value)
        else:
            body += struct.pack("<Iq", gguf.GGUFValueType.INT64, value)
    body += _gguf_string("weight") + struct.pack("<I", len(dims))
    body += b"".join(struct.pack("<Q", dim) for dim in dims)
    body += struct.pack("<IQ", gguf.GGMLQuantizationType.F32, 0)
    header = struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 1, len(metadata))
    return header + body + b"\0" * padding
