"""The state-store tests run on both backends: the SQLite file under GPUCLOUD_HOME and a real
PostgreSQL server (tests/support/postgres_server.py), each test on a fresh database of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres_server import PostgresServer, have_postgres, missing


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    if not have_postgres():
        pytest.skip(missing())
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """GPUCLOUD_STATE unset (SQLite) or a fresh PostgreSQL database; the tests and the CLIs they
    start see the same store."""
    if request.param == "postgresql":
        server = request.getfixturevalue("pg_server")
        monkeypatch.setenv("GPUCLOUD_STATE", server.fresh_database())
    else:
        monkeypatch.delenv("GPUCLOUD_STATE", raising=False)
    return str(request.param)
