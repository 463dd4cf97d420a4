"""The blocking serve entry: ``PORT=`` first on stdout, answers requests, stops on SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anthropic
import anyio
import pytest

from anabranch.testing._command import cmd_serve, register

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def anyio_backend() -> str:
    """One subprocess run is enough: the server's own backend is not under test here."""
    return "asyncio"


@pytest.mark.anyio
async def test_serve_prints_port_first_and_answers() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        *(sys.executable, "-m", "anabranch.testing", "--port", "0", "--rounds", "0"),
        *("--rpm", "1", "--rate-period", "600"),  # one request, then a 429
    ]
    process = await anyio.open_process(command, env=env)
    try:
        assert process.stdout is not None
        buffered = b""
        with anyio.fail_after(30):
            while b"\n" not in buffered:
                buffered += await process.stdout.receive()
        first_line = buffered.split(b"\n", 1)[0].decode()
        assert first_line.startswith("PORT=")
        port = int(first_line.removeprefix("PORT="))
        client = anthropic.AsyncAnthropic(
            base_url=f"http://127.0.0.1:{port}", api_key="test", max_retries=0
        )
        ping: dict[str, Any] = {
            "model": "m",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "ping"}],
        }
        try:
            raw = await client.messages.with_raw_response.create(**ping)
            message = await raw.parse()
            with pytest.raises(anthropic.RateLimitError):
                await client.messages.create(**ping)
        finally:
            await client.close()
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert message.content[0].type == "text"
        assert "ping" in message.content[0].text
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


def test_register_adds_testing_serve_with_its_options() -> None:
    parser = argparse.ArgumentParser(prog="anabranch")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["testing", "serve", "--port", "0", "--fault-rate", "0.2", "--seed", "3", "--rounds", "2"]
    )
    assert args.handler is cmd_serve
    assert (args.port, args.host, args.fault_rate, args.seed, args.rounds) == (
        0,
        "127.0.0.1",
        0.2,
        3,
        2,
    )
    assert (args.context_limit, args.min_cache_tokens, args.latency_ms) == (200_000, 1024, 0.0)
