"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import mpcml  # noqa: F401  (before crypten: its import hook lets crypten load on current torch)
from tests.support import postgres


@pytest.fixture(scope="session")
def pg_server() -> Iterator[postgres.Server]:
    """A PostgreSQL server for the whole run (tests/support/postgres.py), or a skip saying why."""
    reason = postgres.skip_reason()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server for the store tests: {reason}")
    with postgres.server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: postgres.Server) -> str:
    """A fresh, empty database on it."""
    return pg_server.database()
