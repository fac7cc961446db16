"""The model that placement tests and the placement benchmark place (shared by
tests/test_service_placement.py and ops/bench/service_placement.py): its artifact, and a
template whose estimate needs a given number of bytes on one device."""

from __future__ import annotations

import uuid

from schemas.services import MemoryEstimate, ServiceTemplate

DIGEST = "c" * 64
REPO = "org/model"
COMMIT = "d" * 40
PATH = "model.gguf"


def sized_template(
    need: int, profile_id: uuid.UUID, environment_id: uuid.UUID | None = None
) -> ServiceTemplate:
    """The model as a service's template, its estimate (as if read from the GGUF header)
    all weights: `need` bytes."""
    estimate = MemoryEstimate(
        weights_bytes=need,
        kv_cache_bytes=0,
        compute_bytes=0,
        total_bytes=need,
        source="gguf_header",
    )
    return ServiceTemplate(
        artifact={
            "repository": REPO,
            "revision": "main",
            "commit": COMMIT,
            "path": PATH,
            "size_bytes": need,
            "sha256": DIGEST,
        },
        profile_id=profile_id,
        profile_version=1,
        environment_id=environment_id,
        max_concurrent=4,
        estimate=estimate,
    )
