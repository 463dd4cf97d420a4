"""Rate limits on model calls: the sliding window, one process, and many processes on one
PostgreSQL (each a real subprocess granting calls through the database)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from anabranch.errors import RateLimitedError
from anabranch.messages import ModelRequest, ModelResponse, TextBlock, Usage
from anabranch.models import CallRate, LocalCallLimiter, RateLimitedModel
from anabranch.models._rate import admission_wait


def busiest(times: list[float], period: float) -> int:
    """The most grants in any window of ``period`` seconds (a window starts at a grant)."""
    ordered = sorted(times)
    return max((sum(1 for t in ordered if s <= t < s + period) for s in ordered), default=0)


def heaviest(grants: list[tuple[float, int]], period: float) -> int:
    return max((sum(k for t, k in grants if s <= t < s + period) for s, _ in grants), default=0)


def test_the_window_admits_up_to_the_limit_then_waits_for_the_oldest() -> None:
    rate = CallRate(requests=2, period=10)
    assert admission_wait(100.0, [], rate, 0.0, 1) == 0
    assert admission_wait(100.0, [(95.0, 1)], rate, 0.0, 1) == 0
    wait = admission_wait(100.0, [(95.0, 1), (97.0, 1)], rate, 0.0, 1)
    assert wait == pytest.approx(5.0, abs=0.01)  # until the grant at 95 leaves the window
    assert admission_wait(100.0, [(89.0, 1), (97.0, 1)], rate, 0.0, 1) == 0  # 89 has left


def test_the_window_counts_tokens_and_a_pause() -> None:
    rate = CallRate(tokens=100, period=10)
    window = [(91.0, 60), (95.0, 30)]
    assert admission_wait(100.0, window, rate, 0.0, 10) == 0
    # 20 more need the 60 at 91 to leave: at 101
    assert admission_wait(100.0, window, rate, 0.0, 20) == pytest.approx(1.0, abs=0.01)
    # a call bigger than the whole limit waits for an empty window, then runs
    assert admission_wait(100.0, window, rate, 0.0, 500) == pytest.approx(5.0, abs=0.01)
    assert admission_wait(100.0, [], rate, 0.0, 500) == 0
    assert admission_wait(100.0, [], rate, 103.0, 1) == pytest.approx(3.0, abs=0.01)


def test_a_rate_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="requests or tokens"):
        CallRate()
    with pytest.raises(ValueError):
        CallRate(requests=0)


@pytest.mark.anyio
async def test_one_process_never_exceeds_the_limit() -> None:
    rate = CallRate(requests=3, period=0.5)
    limiter = LocalCallLimiter(rate)
    granted: list[float] = []

    async def call() -> None:
        await limiter.acquire(1)
        granted.append(time.monotonic())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(10):
                group.start_soon(call)
    assert len(granted) == 10
    assert busiest(granted, rate.period) == 3


class _Refusing:
    """A model that refuses its first call with 429 and retry-after, then answers."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after
        self.calls: list[float] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(time.monotonic())
        if len(self.calls) == 1:
            raise RateLimitedError("rate limited", status_code=429, retry_after=self.retry_after)
        return ModelResponse(
            id="m",
            model=request.model,
            content=[TextBlock(text="ok")],
            stop_reason="end_turn",
            usage=Usage(input_tokens=40, output_tokens=2),
        )


@pytest.mark.anyio
async def test_a_429_pauses_every_caller_and_usage_replaces_the_estimate() -> None:
    inner = _Refusing(retry_after=0.4)
    limiter = LocalCallLimiter(CallRate(requests=100, tokens=1000, period=5))
    model = RateLimitedModel(inner, limiter)
    request = ModelRequest(model="m", messages=[], max_tokens=10)
    with pytest.raises(RateLimitedError):
        await model.request(request)
    refused = inner.calls[0]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(model.request, request)
    assert all(t >= refused + 0.4 for t in inner.calls[1:])  # nobody called during the pause
    charged = sorted(slot.tokens for slot in limiter._slots)
    assert charged[1:] == [42, 42, 42]  # the answered calls: their real usage


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_pause_written_by_one_limiter_holds_every_other(postgres_dsn: str) -> None:
    from anabranch.models import PostgresCallLimiter

    rate = CallRate(requests=100, period=5, name="paused")
    async with PostgresCallLimiter(postgres_dsn, rate) as one:
        async with PostgresCallLimiter(postgres_dsn, rate) as other:
            await other.acquire(1)  # the limit exists and grants at once
            await one.pause(0.8)
            start = time.monotonic()
            with anyio.fail_after(30):
                await other.acquire(1)
            assert time.monotonic() - start >= 0.75  # not before the pause ended


GRANTER = """
import json, sys, time, anyio
from anabranch.models import CallRate, PostgresCallLimiter

async def main():
    rate = CallRate(**json.loads(sys.argv[2]))
    async with PostgresCallLimiter(sys.argv[1], rate) as limiter:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(int(sys.argv[3])):
            ticket = await limiter.acquire(int(sys.argv[4]))
            print(json.dumps([time.time(), ticket]), flush=True)
            await limiter.settle(ticket, int(sys.argv[5]))

anyio.run(main)
"""


@pytest.mark.parametrize(
    "rate", [{"requests": 4}, {"requests": 6, "tokens": 200}], ids=["requests", "tokens"]
)
def test_processes_on_one_postgres_share_the_limit(
    postgres_dsn: str, tmp_path: Path, rate: dict[str, int]
) -> None:
    """Three processes grant 6 calls each as fast as they can, under 4 requests (or 200
    tokens at 50 a call) per second: no window of a second ever holds more than 4 grants,
    the limit was what held them back, and every call was granted once."""
    spec: dict[str, object] = {**rate, "period": 1.0, "name": "shared"}
    script = tmp_path / "granter.py"
    script.write_text(textwrap.dedent(GRANTER))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), postgres_dsn, json.dumps(spec), "6", "50", "50"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # start together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert [proc.returncode for proc in procs] == [0, 0, 0]
    grants = [json.loads(line) for out in outputs for line in out.split("\n") if line]
    assert len(grants) == 18 and len({ticket for _, ticket in grants}) == 18
    # the database clock decides; a grant is printed a moment after it: allow for that
    slack = 0.05
    times = [t for t, _ in grants]
    assert busiest(times, 1.0 - slack) <= 4
    assert heaviest([(t, 50) for t in times], 1.0 - slack) <= 200
    assert busiest(times, 1.0 + slack) >= 4  # the limit held them back (not idle)
    assert max(times) - min(times) >= 18 / 4 - 1.0 - slack


def test_a_bad_rate_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    defs = tmp_path / "defs.py"
    defs.write_text("from anabranch import Agent\nhelper = Agent(name='helper')\n")
    for flags in (["--rpm", "0"],):  # the model's own checks are tested above
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "anabranch",
                "worker",
                str(defs),
                "--db",
                "postgresql://nobody@127.0.0.1:1/none",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "bad rate limit" in lines[0], done.stderr
