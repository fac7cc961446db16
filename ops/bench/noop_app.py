"""Baseline for ops/bench/heartbeats.py: a FastAPI app that does nothing but validate.

One POST route taking a heartbeat-sized JSON body into a pydantic model and answering
a small JSON object, served by uvicorn exactly as `modelforge api` serves the real app
(one worker, no access log), so the difference between the two is our own work.

    python ops/bench/noop_app.py --port 8081
"""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict


class Beat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_id: uuid.UUID
    protocol_version: int
    agent_version: str
    capabilities: list[str] = []


class BeatAck(BaseModel):
    node_id: uuid.UUID
    received_at: datetime


app = FastAPI()


@app.post("/noop")
async def noop(body: Beat) -> BeatAck:
    return BeatAck(node_id=body.node_id, received_at=datetime.now(UTC))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
