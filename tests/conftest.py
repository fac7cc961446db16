"""Test plugins: real PostgreSQL and NATS (tests/services.py) and a real API on loopback
(tests/api_server.py)."""

# contract_helpers: the module-scoped `shared_api` of the error-contract tests.
pytest_plugins = [
    "tests.services",
    "tests.pipeline",
    "tests.api_server",
    "tests.contract_helpers",
    "tests.up_process",
    "tests.worker_processes",
    "tests.hub_server",
]
