"""Reliability tests: the runtime's behaviour under faults, run in child interpreters."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long runs, deselect with -m 'not slow'")
