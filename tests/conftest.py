"""Every async test runs on both anyio backends: asyncio and trio."""

from __future__ import annotations

import os

import pytest


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
