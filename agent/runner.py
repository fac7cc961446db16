"""The agent process: state dir, enrollment (first start only), then the publishing loops.

Exit statuses: 0 stopped by a signal; 1 configuration or state problem; 3 the control
plane rejected this node (revoked, disabled, decommissioned, ...) or refused the protocol:
restarting alone will not help, the log line says what the operator should do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from agent import AGENT_VERSION, CAPABILITIES
from agent.client import ProtocolClient, make_http_client
from agent.collectors.base import GpuCollector, NoGpus
from agent.collectors.host import LocalHost, reported_hostname
from agent.collectors.nvml import NvmlCollector
from agent.collectors.simulated import SimulatedCollector
from agent.config import AgentConfig
from agent.diagnostics import failure_line
from agent.errors import (
    AgentError,
    ConfigError,
    Rejected,
    RequestFailed,
    StateError,
    Transient,
    advice_for,
)
from agent.jobs.artifact import ArtifactContext, ArtifactSettings
from agent.jobs.dispatch import FamilyJobs, declared_in
from agent.jobs.loop import claim_loop
from agent.jobs.sweep import StagingSweep
from agent.jobs.wakeups import Wakeups, listen
from agent.publisher import Publisher, Timing
from agent.retry import Stopped, interruptible_sleep, retry_transient
from agent.sources.hub import HubSource, source_session
from agent.state import Identity, Sequences, StateDir
from schemas.agent import PROTOCOL_VERSION, EnrollRequest
from schemas.artifacts import ARTIFACT_FAMILY
from schemas.hub import source_shown

logger = logging.getLogger("modelforge.agent")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REJECTED = 3
RELOAD_POLL_S = 0.25
# The package whose modules declare the executors of the artifact kinds this agent runs
# (agent/jobs/dispatch.py: declared_in).
ARTIFACT_EXECUTORS_PACKAGE: Final = "agent.jobs"


def make_collector(config: AgentConfig, node_id: uuid.UUID) -> GpuCollector:
    if config.collector == "simulated":
        return SimulatedCollector(config.simulated_seed or str(node_id), config.simulated_gpus)
    if config.collector == "none":
        return NoGpus()
    return NvmlCollector()


def timing_of(config: AgentConfig) -> Timing:
    return Timing(
        heartbeat_interval_s=config.heartbeat_interval_s,
        telemetry_interval_s=config.telemetry_interval_s,
        inventory_check_interval_s=config.inventory_check_interval_s,
        inventory_interval_s=config.inventory_interval_s,
        retry_initial_s=config.retry_initial_s,
        retry_max_s=config.retry_max_s,
        retry_max_attempts=config.retry_max_attempts,
    )


def warn_missing_roots(roots: list[str]) -> None:
    """A root is offered in the inventory whether or not it exists (an operator may
    mount it later); a job for a missing one fails `path_not_allowed`, so say it now."""
    for root in roots:
        if not Path(root).is_dir():
            logger.warning(
                "artifact root %s does not exist or is not a directory: artifact jobs for "
                "it fail (path_not_allowed) until it is created",
                root,
            )


class _Refused(Exception):
    """Enrollment was refused; already logged."""


class _Unreachable(Exception):
    """Enrollment ran out of attempts; already logged."""


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.state = StateDir(config.state_dir)
        self._reload_lock = asyncio.Lock()
        self._gave_up = False

    async def run(self, stop: asyncio.Event) -> int:
        """Run until stop is set or the control plane rejects this node; the exit status."""
        self.state.prepare()
        self.state.acquire()
        try:
            return await self._run(stop)
        finally:
            self.state.release()

    async def _run(self, stop: asyncio.Event) -> int:
        config = self.config
        # Secrets print as '**********' in a dump: SecretStr.
        logger.debug("configuration: %s", config.model_dump(mode="json"))
        if config.api_url.startswith("http://"):
            logger.warning("api_url is plain http: use https with a CA bundle outside development")
            if config.ca_bundle or config.client_cert:
                logger.warning("ca_bundle/client_cert are not used with a plain http api_url")
        warn_missing_roots(config.artifact_roots)
        try:
            tls = config.tls
            http = make_http_client(
                config.api_url,
                tls=tls,
                timeout_s=config.request_timeout_s,
                trust_env=config.trust_env,
                failover=config.api_urls,
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot set up TLS (ca_bundle, client_cert, client_key): {exc}"
            ) from None
        async with http:
            client = ProtocolClient(http)
            identity = self.state.load_identity()
            server_interval: float | None = None
            if identity is None:
                try:
                    identity, server_interval = await self._enroll(client, stop)
                except Stopped:
                    return EXIT_OK
                except _Refused:
                    return EXIT_REJECTED
                except _Unreachable:
                    return EXIT_ERROR
            else:
                self._resume(identity)
            client.credential = identity.credential
            collector = make_collector(config, identity.node_id)
            publisher = Publisher(
                client=client,
                node_id=identity.node_id,
                sequences=Sequences(self.state, block=config.sequence_block),
                collector=collector,
                host=LocalHost(config.hostname, config.storage_paths, config.artifact_roots),
                timing=timing_of(config),
                server_heartbeat_interval_s=server_interval,
                reload_credential=lambda error, generation: self._reload(
                    client, publisher, error, generation, stop
                ),
            )
            logger.info(
                "publishing as node %s to %s (collector %s)",
                identity.node_id,
                config.api_url,
                collector.name,
            )
            try:
                error = await self._publish_and_work(client, publisher, stop)
            finally:
                collector.close()
        if error is None:
            logger.info("stopped; nothing more is published")
            return EXIT_OK
        logger.error(
            "publishing stopped for good; exiting with status %d. What to do: %s",
            EXIT_REJECTED,
            advice_for(error),
        )
        return EXIT_REJECTED

    async def _publish_and_work(
        self, client: ProtocolClient, publisher: Publisher, stop: asyncio.Event
    ) -> AgentError | None:
        """Publishing, and beside it the job loop when the config offers artifact roots;
        the job loop ends with the publisher."""
        config = self.config
        if not config.artifact_roots:
            return await publisher.run(stop)
        done = asyncio.Event()
        # Which source the files come from, named at start: offline, a Hub left in place
        # of a mirror fails every job only later, as `source_unavailable`.
        logger.info(
            "artifact jobs into %s, files from %s (artifact_source_url)",
            ", ".join(str(root) for root in config.artifact_roots),
            source_shown(config.artifact_source_url),
        )
        token = (
            config.artifact_source_token_file.read_text().strip()
            if config.artifact_source_token_file
            else None
        )
        session = source_session(
            config.artifact_source_url,
            stall_s=config.artifact_stall_s,
            connect_timeout_s=config.request_timeout_s,
            trust_env=config.trust_env,
        )
        async with session:
            source = HubSource(config.artifact_source_url, token, session)
            settings = ArtifactSettings(
                roots=list(config.artifact_roots),
                stall_s=config.artifact_stall_s,
                progress_interval_s=config.artifact_progress_interval_s,
            )
            # The artifact kinds, each run by the executor its module declares.
            served = FamilyJobs(
                client,
                ARTIFACT_FAMILY,
                declared_in(ARTIFACT_EXECUTORS_PACKAGE, ARTIFACT_FAMILY),
                ArtifactContext(source, settings),
            )
            sweep = StagingSweep(
                served.reports,
                list(config.artifact_roots),
                period_s=config.artifact_staging_sweep_s,
                max_age_s=config.artifact_staging_max_age_s,
            )

            wakeups = Wakeups()
            tasks = [
                asyncio.create_task(
                    claim_loop(
                        served.what,
                        served.next_job,
                        done,
                        poll_s=config.job_poll_interval_s,
                        wake=wakeups.loop_for(ARTIFACT_FAMILY.kinds),
                        # Between jobs: only then is no staging in use.
                        between=sweep.when_due,
                    )
                ),
                asyncio.create_task(listen(client, wakeups, done)),
            ]
            try:
                return await publisher.run(stop)
            finally:
                # A download in progress is abandoned, not finished: its staged part
                # stays, and the job's next attempt resumes it once the lease expires.
                done.set()
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def _resume(self, identity: Identity) -> None:
        logger.info(
            "resuming as node %s (enrolled %s; credential id %s) from %s",
            identity.node_id,
            identity.enrolled_at.isoformat(timespec="seconds"),
            identity.credential_id,
            self.state.path,
        )
        if self.config.enrollment_token is not None or self.config.enrollment_token_file:
            logger.info("the state dir holds an identity: the enrollment token is not used")
        if identity.api_url not in (self.config.api_url, *self.config.api_urls):
            logger.warning(
                "this node enrolled with %s but api_url is now %s",
                identity.api_url,
                self.config.api_url,
            )

    async def _enroll(self, client: ProtocolClient, stop: asyncio.Event) -> tuple[Identity, float]:
        token = self.config.enrollment_token_value()
        if token is None:
            raise StateError(
                f"{self.state.path} holds no identity and no enrollment token is configured "
                "(enrollment_token, enrollment_token_file or MODELFORGE_AGENT_ENROLLMENT_TOKEN)"
            )
        try:
            request = EnrollRequest(
                enrollment_token=token,
                protocol_version=PROTOCOL_VERSION,
                agent_version=AGENT_VERSION,
                hostname=reported_hostname(self.config.hostname),
                capabilities=list(CAPABILITIES),
            )
        except ValidationError:
            raise ConfigError("the enrollment token is not a valid token value") from None
        logger.info("no identity in %s: enrolling with the enrollment token", self.state.path)
        try:
            answer = await retry_transient(
                "enroll",
                lambda: client.enroll(request),
                stop=stop,
                initial_s=self.config.retry_initial_s,
                max_s=self.config.retry_max_s,
                max_attempts=self.config.enroll_max_attempts,
            )
        except Transient as error:
            attempts = self.config.enroll_max_attempts
            logger.error(
                "%s",
                failure_line("enroll", error, f"not enrolled: gave up after {attempts} attempts"),
            )
            raise _Unreachable from None
        except RequestFailed as error:
            logger.error("%s", failure_line("enroll", error, f"not enrolled: {advice_for(error)}"))
            raise _Refused from None
        identity = Identity(
            node_id=answer.node_id,
            credential_id=answer.credential_id,
            credential=answer.credential,
            enrolled_at=datetime.now(UTC),
            api_url=self.config.api_url,
        )
        # Before anything else: the credential is shown once.
        self.state.save_identity(identity)
        logger.info(
            "enrolled as node %s (credential id %s); identity saved in %s",
            identity.node_id,
            identity.credential_id,
            self.state.path,
        )
        return identity, answer.heartbeat_interval_s

    async def _reload(
        self,
        client: ProtocolClient,
        publisher: Publisher,
        error: Rejected,
        generation: int,
        stop: asyncio.Event,
    ) -> bool:
        """After a 401: has an operator installed a new credential? Wait a while for one."""
        async with self._reload_lock:
            if publisher.credential_generation != generation:
                return True  # another loop already picked it up
            if self._gave_up or stop.is_set():
                return False
            wait_s = self.config.credential_reload_wait_s
            deadline = time.monotonic() + wait_s
            announced = False
            while True:
                try:
                    installed = self.state.load_identity()
                except StateError:
                    installed = None
                if (
                    installed is not None
                    and installed.node_id == publisher.node_id
                    and installed.credential != client.credential
                ):
                    client.credential = installed.credential
                    logger.info(
                        "picked up the credential installed in %s (credential id %s); "
                        "publishing resumes",
                        self.state.path,
                        installed.credential_id,
                    )
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or stop.is_set():
                    self._gave_up = True
                    return False
                if not announced:
                    announced = True
                    outcome = (
                        f"credential refused ({error.kind.value}); waiting up to {wait_s:.0f}s "
                        "for a replacement installed with `modelforge agent install-credential "
                        f"--state-dir {self.state.path}`"
                    )
                    logger.warning("%s", failure_line("publication", error, outcome))
                await interruptible_sleep(stop, min(RELOAD_POLL_S, remaining))
