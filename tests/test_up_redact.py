"""What `modelforge up` shows of a server's URL (its banner, stack.json): every secret in
it as ***, the rest as given, so the URL still says where the server is."""

from __future__ import annotations

import pytest

from stack.up import _redact

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+asyncpg://mf:s3cret@db:5432/mf", "postgresql+asyncpg://mf:***@db:5432/mf"),
        ("postgresql+asyncpg://mf:p%40ss@db/mf", "postgresql+asyncpg://mf:***@db/mf"),
        ("postgresql+asyncpg://mf:@db/mf", "postgresql+asyncpg://mf:***@db/mf"),
        (
            "postgresql+asyncpg://mf@db/mf?password=s3cret&ssl=require",
            "postgresql+asyncpg://mf@db/mf?password=***&ssl=require",
        ),
        ("postgresql+asyncpg://postgres@127.0.0.1:5432/mf", "postgresql+asyncpg://postgres@127.0.0.1:5432/mf"),
        # A NATS URL's lone user is its token.
        ("nats://t0ken@nats:4222", "nats://***@nats:4222"),
        ("nats://u:p@a:4222,nats://u:q@b:4222", "nats://u:***@a:4222,nats://u:***@b:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ],
)  # fmt: skip
def test_a_secret_in_a_url_is_shown_as_stars(url: str, shown: str) -> None:
    assert _redact(url) == shown
    for secret in ("s3cret", "p%40ss", "t0ken", ":p@", ":q@"):
        assert secret not in _redact(url)
