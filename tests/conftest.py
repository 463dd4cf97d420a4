"""Every async test runs on both anyio backends: asyncio and trio."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_cluster import Cluster, create_database, start_cluster


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _no_real_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never reach a real API: no key, no base URL from the developer's shell."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_OPEN_TELEMETRY", "false")
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One private PostgreSQL cluster for the whole test session (see postgres_cluster.py)."""
    with start_cluster() as cluster:
        yield cluster


@pytest.fixture
def postgres_dsn(postgres_cluster: Cluster) -> str:
    """A DSN (with its password) of a fresh, empty database on the test cluster."""
    return create_database(postgres_cluster)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A fresh database on each backend: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "s.db"
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    return create_database(cluster)
