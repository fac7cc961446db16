"""The installed package's version, as `modelforge --version` prints it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("modelforge")
    except PackageNotFoundError:
        # Run from a checkout that was never installed (PYTHONPATH=.).
        return "(not installed)"
