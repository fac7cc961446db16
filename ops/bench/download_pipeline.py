"""The artifact job's download pipeline alone, against `curl -o`, with no control plane
on the box.

    python ops/bench/download_pipeline.py [--file-mib 256 --rounds 7 --block-mib 1]

ops/bench/jobs.py measures the whole job against the real API on this 2-core host; this
runs the same ArtifactJob (receive, write and hash lanes, stage, verify, promote) with
its reports answered in process, so the figure is the node's own cost. The difference
between the two is what sharing two cores with PostgreSQL, NATS, the API and the worker
costs a transfer that wants both. Alternating rounds, medians; `os.sync()` before each.

It also prints the ceiling any pipeline that hashes every byte has on this host, from the
same bytes in memory with no network and no disk: sha256 of fresh blocks on the thread
that made them (the best case for hashing inline with the receive), and handed from the
event loop to the agent's own hash lane (agent/jobs/lanes.py). Where curl -o is faster than
those, 0.9x of it cannot be reached by hashing in any arrangement.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from agent.jobs.artifact import ArtifactJob, ArtifactSettings
from agent.jobs.lanes import Lanes
from agent.sources.hub import HubSource, source_session
from schemas.artifacts import ArtifactClaim, CompleteAnswer, CompleteReport, ProgressReport
from schemas.jobs import FailAnswer, FailReport, JobState, Lease, ProgressAnswer
from tests.hub_server import HubServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "bench/model"


class Answered:
    """Reports answered in process: the lease is kept, nothing is cancelled."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    async def progress(self, job_id: uuid.UUID, report: ProgressReport) -> ProgressAnswer:
        return ProgressAnswer(job_id=job_id, cancel_requested=False, lease=self.lease)

    async def complete(self, job_id: uuid.UUID, report: CompleteReport) -> CompleteAnswer:
        return CompleteAnswer(job_id=job_id, state=JobState.SUCCEEDED)

    async def fail(self, job_id: uuid.UUID, report: FailReport) -> FailAnswer:
        raise SystemExit(f"the job failed: {report}")


def claim(root: Path, size: int, digest: str) -> ArtifactClaim:
    expires = datetime.now(UTC) + timedelta(minutes=5)
    return ArtifactClaim.model_validate({
        "job_id": str(uuid.uuid4()), "attempt": 1,
        "spec": {
            "repository": REPO, "commit": COMMIT, "target_root": str(root),
            "files": [{"path": "weights.bin", "size": size, "digest": {
                "algorithm": "sha256", "value": digest}}],
            "reserve": {"min_free_bytes": 0},
        },
        "lease": {"lease_id": str(uuid.uuid4()), "epoch": 1,
                  "expires_at": expires.isoformat(), "renew_within_s": 30},
    })  # fmt: skip


async def job(hub: HubServer, root: Path, size: int, digest: str, block_bytes: int) -> float:
    leased = claim(root, size, digest)
    settings = ArtifactSettings([str(root)], block_bytes=block_bytes)
    async with source_session(
        hub.url, stall_s=settings.stall_s, connect_timeout_s=10, trust_env=False
    ) as session:
        work = ArtifactJob(
            leased, Answered(leased.lease), HubSource(hub.url, None, session), settings
        )
        started = time.perf_counter()
        outcome = await work.run()
        elapsed = time.perf_counter() - started
    assert outcome == "completed", outcome
    shutil.rmtree(root / REPO.split("/")[0])
    return elapsed


def curl(hub: HubServer, out: Path) -> float:
    url = f"{hub.url}/{REPO}/resolve/{COMMIT}/weights.bin"
    result = subprocess.run(
        ["curl", "-sS", "-o", str(out), "-w", "%{time_total}", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out.unlink()
    return float(result.stdout)


def hashed(data: bytes, block: int, *, handed: bool) -> float:
    """MiB/s of sha256 over fresh copies of `data`'s blocks (as a receive makes them),
    on the thread that copies them, or handed to the agent's own hash lane."""
    view = memoryview(data)
    digest = hashlib.sha256()

    def step(pieces: list[bytes]) -> None:
        for piece in pieces:
            digest.update(piece)

    async def through_lane() -> None:
        lanes = Lanes(step)
        for at in range(0, len(data), block):
            await lanes.put([bytes(view[at : at + block])])
        await lanes.close()

    started = time.perf_counter()
    if handed:
        asyncio.run(through_lane())
    else:
        for at in range(0, len(data), block):
            digest.update(bytes(view[at : at + block]))
    return len(data) / (1 << 20) / (time.perf_counter() - started)


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-mib", type=int, default=ArtifactSettings([]).block_bytes >> 20)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-pipeline-"))
    root = workdir / "models"
    root.mkdir()
    data = os.urandom(args.file_mib << 20)
    digest = hashlib.sha256(data).hexdigest()
    hub = HubServer()
    hub.state.add(REPO, "main", COMMIT, {"weights.bin": data})
    served = hub.start_process()
    walls: dict[str, list[float]] = {"curl -o": [], "agent job": []}
    ceilings: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[str, list[float]] = {"curl -o": [], "agent job": []}
    try:
        for _ in range(args.rounds):
            os.sync()
            before = cpu(resource.RUSAGE_CHILDREN)
            walls["curl -o"].append(curl(hub, workdir / "curl.bin"))
            cpus["curl -o"].append(cpu(resource.RUSAGE_CHILDREN) - before)
            os.sync()
            before = cpu(resource.RUSAGE_SELF)
            walls["agent job"].append(
                asyncio.run(job(hub, root, len(data), digest, args.block_mib << 20))
            )
            cpus["agent job"].append(cpu(resource.RUSAGE_SELF) - before)
            for handed, runs in ceilings.items():
                runs.append(hashed(data, args.block_mib << 20, handed=handed))
    finally:
        served.terminate()
        shutil.rmtree(workdir, ignore_errors=True)
    mib = args.file_mib
    for name, runs in walls.items():
        print(
            f"{name:9}: median {mib / statistics.median(runs):.0f} MiB/s,"
            f" CPU {statistics.median(cpus[name]) / mib * 1024:.2f} s/GiB;"
            f" per round {' '.join(f'{mib / s:.0f}' for s in runs)}"
        )
    ratio = statistics.median(walls["curl -o"]) / statistics.median(walls["agent job"])
    print(f"agent job / curl -o, {mib} MiB, {args.block_mib} MiB blocks: {ratio:.2f}x")
    wire = mib / statistics.median(walls["curl -o"])
    for handed, label in ((False, "on the thread that made them"), (True, "in a hash lane")):
        rate = statistics.median(ceilings[handed])
        print(
            f"ceiling: sha256 of fresh {args.block_mib} MiB blocks {label}: {rate:.0f} MiB/s,"
            f" {rate / wire:.2f}x curl -o (no network, no disk)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
