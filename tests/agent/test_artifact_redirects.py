"""Where an artifact source may send the agent (agent/sources/reach.py): in this process
against the real API and a real Hub-layout server, a redirect to a CDN is followed with
the token kept to the endpoint's origin, and a redirect to the metadata service, a
redirect loop or an unreadable Location fails the job for good before any request is
made there. The rules themselves are checked one by one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from agent.jobs.paths import artifact_dir
from agent.sources.reach import GuardedResolver, Reach, reach_of, redirect_refusal
from tests.agent.claimed_jobs import one_file_job, running_job
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import content, get_job
from tests.flows import EnrolledNode
from tests.hub_server import HubServer

REPO = "acme/cdn-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NAME = "model.gguf"
DATA = content("cdn model", 3 << 20)
TOKEN = "hf_test_token"
RESOLVE = f"/{REPO}/resolve/{COMMIT}/{NAME}"


def setup(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> tuple[RunningApi, EnrolledNode, Path, str]:
    hub.state.add(REPO, "main", COMMIT, {NAME: DATA})
    hub.state.token = TOKEN
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory(job_lease_s=30)
    node, job_id = one_file_job(api, root, REPO, COMMIT, NAME, DATA, max_attempts=3)
    return api, node, root, job_id


async def test_a_redirect_to_the_cdn_is_followed_and_the_token_stays_with_the_endpoint(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    api, node, root, _ = setup(api_factory, hub, tmp_path)
    port = URL(hub.url).port
    # Another origin (a name, not the address), as the Hub's CDN is.
    hub.state.redirects[NAME] = f"http://localhost:{port}{RESOLVE}?signed=1"
    async with running_job(api, node, hub, root, TOKEN) as job:
        assert await job.run() == "completed"
    assert (artifact_dir(root, REPO, COMMIT) / NAME).read_bytes() == DATA
    asked, followed = hub.state.authorizations[-2:]
    assert asked == (f"127.0.0.1:{port}", f"Bearer {TOKEN}")
    assert followed == (f"localhost:{port}", ""), "the token went to another origin"


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/", "link-local"),
        ("http://[fe80::1]/x", "link-local"),
        ("http://0.0.0.0:1/x", "link-local"),
        ("file:///etc/shadow", "not an http or https address"),
        (RESOLVE, "more than 5 redirects"),  # to itself, for ever
        ("http://[::1", "no URL"),
    ],
)
async def test_a_redirect_the_agent_may_not_follow_fails_the_job_for_good(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path, location: str, why: str
) -> None:
    api, node, root, job_id = setup(api_factory, hub, tmp_path)
    hub.state.redirects[NAME] = location
    async with running_job(api, node, hub, root, TOKEN) as job:
        assert await job.run() == "source_unavailable"
    with api.client() as operator:
        failed = get_job(operator, api, job_id)
    assert failed["state"] == "failed", "a refused redirect is not retried"
    assert "redirect refused" in failed["failure"]["detail"]
    assert why in failed["failure"]["detail"]
    downloads = [path for path in hub.state.requests if path == RESOLVE]
    assert len(downloads) == (6 if why.startswith("more than") else 1)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("endpoint", "target", "refused"),
    [
        ("https://huggingface.co", "https://cdn-lfs.hf.co/x", None),
        ("https://huggingface.co", "http://cdn-lfs.hf.co/x", "down to plain http"),
        ("https://huggingface.co", "https://10.1.2.3/x", "private"),
        ("https://huggingface.co", "https://127.0.0.1/x", "loopback"),
        ("https://huggingface.co", "https://localhost/x", "loopback"),
        ("https://huggingface.co", "https://[::ffff:169.254.169.254]/x", "link-local"),
        ("http://10.0.0.5:8080", "http://10.0.0.6/x", None),
        ("http://10.0.0.5:8080", "http://127.0.0.1/x", "loopback"),
        ("http://127.0.0.1:9", "http://10.0.0.6/x", None),
        ("http://127.0.0.1:9", "ftp://127.0.0.1/x", "not an http"),
    ],
)
def test_the_redirect_rule(endpoint: str, target: str, refused: str | None) -> None:
    why = redirect_refusal(URL(endpoint), URL(target))
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


@pytest.mark.fast
def test_the_reach_of_a_host() -> None:
    assert reach_of("huggingface.co") == Reach.PUBLIC
    assert reach_of("8.8.8.8") == Reach.PUBLIC
    assert reach_of("192.168.1.4") == Reach.PRIVATE
    assert reach_of("[::1]") == Reach.LOOPBACK
    assert reach_of("api.localhost") == Reach.LOOPBACK
    assert reach_of("169.254.169.254") is None
    assert reach_of("224.0.0.1") is None
    assert reach_of(None) is None


class Answering(AbstractResolver):
    """A name server's answers (the network's edge): what hostile DNS records hold."""

    def __init__(self, **zone: str) -> None:
        # A name's dots are written as underscores here: `hub_example="..."`.
        self.zone = {name.replace("_", "."): addresses.split() for name, addresses in zone.items()}
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.zone:
            raise OSError(f"{host}: no such name")
        return [
            ResolveResult(hostname=host, host=a, port=port, family=family, proto=0, flags=0)
            for a in self.zone[host]
        ]

    async def close(self) -> None:
        return None


async def addresses(resolver: GuardedResolver, host: str) -> list[str]:
    return [result["host"] for result in await resolver.resolve(host, 443)]


@pytest.mark.fast
async def test_a_name_that_resolves_to_the_metadata_service_is_refused() -> None:
    zone = Answering(metadata_evil="169.254.169.254", m="169.254.169.254 10.0.0.7")
    with pytest.raises(OSError, match="no artifact source is at"):
        await GuardedResolver(inner=zone).resolve("metadata.evil", 80)
    assert await addresses(GuardedResolver(inner=zone), "m") == ["10.0.0.7"]
    real = await GuardedResolver().resolve("localhost", 80)
    assert real and all(r["host"] in ("127.0.0.1", "::1") for r in real)


@pytest.mark.fast
async def test_a_public_hub_cannot_send_the_agent_to_a_name_on_the_lan_or_loopback() -> None:
    zone = Answering(
        hub_example="93.184.215.14", cdn_example="151.101.1.1",
        intranet_evil="10.0.0.7", loop_evil="127.0.0.1", mixed_evil="151.101.1.2 10.0.0.8",
    )  # fmt: skip
    guarded = GuardedResolver(URL("https://hub.example"), zone)
    # Asked about another name first, it learns the endpoint's own reach on the spot.
    assert await addresses(guarded, "cdn.example") == ["151.101.1.1"]
    assert zone.asked == ["cdn.example", "hub.example"]
    for inner in ("intranet.evil", "loop.evil"):
        with pytest.raises(OSError, match="no artifact source is at"):
            await guarded.resolve(inner, 443)
    assert await addresses(guarded, "mixed.evil") == ["151.101.1.2"]
    assert await addresses(guarded, "hub.example") == ["93.184.215.14"]


@pytest.mark.fast
async def test_a_mirror_on_the_lan_may_send_the_agent_within_the_lan_but_not_to_loopback() -> None:
    zone = Answering(mirror_lan="10.0.0.5", cdn_lan="10.0.0.9", loop_evil="127.0.0.1")
    guarded = GuardedResolver(URL("http://mirror.lan:8000"), zone)
    assert await addresses(guarded, "mirror.lan") == ["10.0.0.5"]
    assert await addresses(guarded, "cdn.lan") == ["10.0.0.9"]
    with pytest.raises(OSError, match="no artifact source is at"):
        await guarded.resolve("loop.evil", 443)
    # An endpoint written as an address: its reach is known without asking.
    on_loopback = GuardedResolver(URL("http://127.0.0.1:8000"), zone)
    assert await addresses(on_loopback, "loop.evil") == ["127.0.0.1"]
    # An endpoint whose name does not resolve: no other name is allowed either.
    unknown = GuardedResolver(URL("https://gone.example"), zone)
    with pytest.raises(OSError, match="no artifact source is at"):
        await unknown.resolve("cdn.lan", 443)
