"""Test plugins: real PostgreSQL and NATS (tests/services.py) and a real API on loopback
(tests/api_server.py)."""

pytest_plugins = ["tests.services", "tests.api_server"]
