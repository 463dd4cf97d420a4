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
from typing import Any

import anyio
import pytest

from anabranch.errors import RateLimitedError, StoreError
from anabranch.messages import Message, ModelRequest, ModelResponse, TextBlock, Usage
from anabranch.models import CallRate, Charge, LocalCallLimiter, RateLimitedModel
from anabranch.models._rate import admission_wait
from anabranch.testing import FunctionModel
from tests.databases import rows
from tests.test_workers import poll

ONE = Charge(1, 0)


def busiest(times: list[float], period: float) -> int:
    """The most grants in any window of ``period`` seconds (a window starts at a grant)."""
    ordered = sorted(times)
    return max((sum(1 for t in ordered if s <= t < s + period) for s in ordered), default=0)


def heaviest(grants: list[tuple[float, int]], period: float) -> int:
    return max((sum(k for t, k in grants if s <= t < s + period) for s, _ in grants), default=0)


def test_the_window_admits_up_to_the_limit_then_waits_for_the_oldest() -> None:
    rate = CallRate(requests=2, period=10)
    assert admission_wait(100.0, [], rate, 0.0, ONE) == 0
    assert admission_wait(100.0, [(95.0, ONE)], rate, 0.0, ONE) == 0
    wait = admission_wait(100.0, [(95.0, ONE), (97.0, ONE)], rate, 0.0, ONE)
    assert wait == pytest.approx(5.0, abs=0.01)  # until the grant at 95 leaves the window
    assert admission_wait(100.0, [(89.0, ONE), (97.0, ONE)], rate, 0.0, ONE) == 0  # 89 left


def test_the_window_counts_tokens_and_a_pause() -> None:
    rate = CallRate(tokens=100, period=10)
    window = [(91.0, Charge(50, 10)), (95.0, Charge(20, 10))]
    assert admission_wait(100.0, window, rate, 0.0, Charge(5, 5)) == 0
    # 20 more need the 60 at 91 to leave: at 101
    assert admission_wait(100.0, window, rate, 0.0, Charge(10, 10)) == pytest.approx(1.0, abs=0.01)
    # a call bigger than the whole limit waits for an empty window, then runs
    assert admission_wait(100.0, window, rate, 0.0, Charge(500)) == pytest.approx(5.0, abs=0.01)
    assert admission_wait(100.0, [], rate, 0.0, Charge(500)) == 0
    assert admission_wait(100.0, [], rate, 103.0, ONE) == pytest.approx(3.0, abs=0.01)


def test_input_and_output_are_limited_apart() -> None:
    """ITPM counts the input side only, OTPM the output side only (max_tokens at grant)."""
    rate = CallRate(input_tokens=100, output_tokens=50, period=10)
    window = [(91.0, Charge(90, 0)), (95.0, Charge(0, 40))]
    # plenty of output left, but the input needs the 90 at 91 to leave: at 101
    assert admission_wait(100.0, window, rate, 0.0, Charge(20, 0)) == pytest.approx(1.0, abs=0.01)
    # plenty of input left, but 40 of 50 output is taken until 105
    assert admission_wait(100.0, window, rate, 0.0, Charge(5, 20)) == pytest.approx(5.0, abs=0.01)
    assert admission_wait(100.0, window, rate, 0.0, Charge(10, 10)) == 0
    # both over: the later of the two
    assert admission_wait(100.0, window, rate, 0.0, Charge(20, 20)) == pytest.approx(5.0, abs=0.01)


def test_a_charge_is_estimated_from_max_tokens_and_settled_from_usage() -> None:
    request = ModelRequest(
        model="m", messages=[Message(role="user", content=[TextBlock(text="x" * 400)])],
        max_tokens=321,
    )
    estimate = Charge.estimate(request)
    assert estimate.output == 321 and estimate.input > 50
    used = Charge.used(
        Usage(
            input_tokens=7,
            cache_read_input_tokens=5000,  # free, as under the API's input limit
            cache_creation_input_tokens=30,
            output_tokens=12,
        )
    )
    assert used == Charge(37, 12) and used.tokens == 49


def test_a_rate_needs_a_limit_and_says_which_field_is_wrong() -> None:
    with pytest.raises(ValueError, match="requests, input_tokens, output_tokens or tokens"):
        CallRate()
    for field in ("requests", "input_tokens", "output_tokens", "tokens"):
        with pytest.raises(ValueError, match=field):
            CallRate(**{field: 0})
    with pytest.raises(ValueError, match="period"):
        CallRate(requests=1, period=0)
    with pytest.raises(ValueError, match="extra"):
        CallRate(requests=1, itpm=5)  # type: ignore[call-arg]


@pytest.mark.anyio
async def test_one_process_never_exceeds_the_limit() -> None:
    rate = CallRate(requests=3, period=0.5)
    limiter = LocalCallLimiter(rate)
    granted: list[float] = []

    async def call() -> None:
        await limiter.acquire(ONE)
        granted.append(time.monotonic())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(10):
                group.start_soon(call)
    assert len(granted) == 10
    assert busiest(granted, rate.period) == 3


@pytest.mark.anyio
async def test_the_windows_totals_follow_grants_settles_and_expiry() -> None:
    """The quick check reads running totals: they stay the sum of the live slots through
    grants, settles (up and down) and slots leaving the window."""
    now = [100.0]
    limiter = LocalCallLimiter(
        CallRate(input_tokens=1000, output_tokens=1000, period=10), clock=lambda: now[0]
    )

    def totals_match() -> bool:
        slots = list(limiter._slots)
        return (limiter._input, limiter._output) == (
            sum(s.charge.input for s in slots),
            sum(s.charge.output for s in slots),
        )

    first = await limiter.acquire(Charge(300, 400))
    now[0] = 105.0
    second = await limiter.acquire(Charge(300, 400))
    await limiter.settle(first, Charge(500, 20))  # input above its estimate, output below
    assert totals_match() and (limiter._input, limiter._output) == (800, 420)
    with anyio.fail_after(5):  # fits only because the first call gave output back
        await limiter.acquire(Charge(100, 500))
    now[0] = 110.5  # the first grant (at 100) has left the window
    await limiter.acquire(Charge(10, 10))
    await limiter.settle(second, Charge(250, 30))
    await limiter.settle(999, Charge(1, 1))  # an unknown ticket changes nothing
    assert totals_match() and len(limiter._slots) == 3


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
    charged = sorted(slot.charge for slot in limiter._slots)
    assert charged[0] == Charge(0, 10)  # the refused call keeps its estimate: max_tokens
    assert charged[1:] == [Charge(40, 2)] * 3  # the answered calls: their real usage


@pytest.mark.anyio
async def test_each_model_class_has_its_own_limit() -> None:
    """Opus at 1 call per 10 minutes, every other model (the default limiter) unlimited
    in effect: a second Opus call waits while Sonnet and Haiku calls go on."""
    answered: list[str] = []

    async def answer(request: ModelRequest) -> str:
        answered.append(request.model)
        return "ok"

    opus = LocalCallLimiter(CallRate(requests=1, period=600, name="opus"))
    default = LocalCallLimiter(CallRate(requests=1000, name="default"))
    model = RateLimitedModel(
        FunctionModel(answer), default, by_model={"claude-opus": opus, "claude-opus-5": opus}
    )
    assert model.limiter_for("claude-opus-5-5") is opus
    assert model.limiter_for("claude-sonnet-5-5") is default

    def ask(name: str) -> ModelRequest:
        return ModelRequest(model=name, messages=[], max_tokens=10)

    with anyio.fail_after(10):
        await model.request(ask("claude-opus-5-5"))
        async with anyio.create_task_group() as group:
            waiting = anyio.Event()

            async def second_opus() -> None:
                waiting.set()
                await model.request(ask("claude-opus-4-8"))

            group.start_soon(second_opus)
            await waiting.wait()
            for name in ("claude-sonnet-5-5", "claude-haiku-4-5", "claude-sonnet-5-5"):
                await model.request(ask(name))
            group.cancel_scope.cancel()  # the second Opus call would wait ten minutes
    assert answered == ["claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-4-5"] + [
        "claude-sonnet-5-5"
    ]
    with pytest.raises(ValueError, match="prefixes"):
        RateLimitedModel(FunctionModel(answer), default, by_model={"": opus})


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_pause_written_by_one_limiter_holds_every_other(postgres_dsn: str) -> None:
    from anabranch.models import PostgresCallLimiter

    rate = CallRate(requests=100, period=5, name="paused")
    async with PostgresCallLimiter(postgres_dsn, rate) as one:
        async with PostgresCallLimiter(postgres_dsn, rate) as other:
            await other.acquire(ONE)  # the limit exists and grants at once
            await one.pause(0.8)
            start = time.monotonic()
            with anyio.fail_after(30):
                await other.acquire(ONE)
            assert time.monotonic() - start >= 0.75  # not before the pause ended


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_process_frozen_mid_grant_holds_the_others_only_for_its_stall_timeout(
    postgres_dsn: str,
) -> None:
    """A process stopped inside a grant's transaction keeps the limit's row locked; its
    limiter's session is ended by the server after ``stall_timeout``, so the others go on
    (before: they waited for as long as it stayed frozen)."""
    from anabranch.models import PostgresCallLimiter

    rate = CallRate(requests=100, period=5, name="frozen")
    async with PostgresCallLimiter(postgres_dsn, rate, stall_timeout=1.0) as frozen:
        async with PostgresCallLimiter(postgres_dsn, rate) as other:
            await other.acquire(ONE)  # the limit's row exists

            def stop_mid_grant(conn: Any) -> None:  # what SIGSTOP inside a grant leaves
                conn.execute("BEGIN")
                conn.execute("SELECT 1 FROM call_limits WHERE name = 'frozen' FOR UPDATE")

            await frozen._run(stop_mid_grant)

            async def frozen_session_ended() -> bool:
                idle = rows(
                    postgres_dsn,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name"
                    " = 'anabranch-limiter' AND state = 'idle in transaction'",
                )
                return bool(idle[0][0] == 0)

            await poll(frozen_session_ended, deadline=30)  # the server ends it, not us
            with anyio.fail_after(30):  # and the row it had locked is free again
                await other.acquire(ONE)
            with anyio.fail_after(30):  # the frozen one reconnects when it runs again
                while True:
                    try:
                        await frozen.acquire(ONE)
                        break
                    except StoreError:
                        continue
    with pytest.raises(ValueError, match="stall_timeout must be > 0"):
        PostgresCallLimiter(postgres_dsn, rate, stall_timeout=0)


GRANTER = """
import json, sys, time, anyio
from anabranch.models import CallRate, Charge, PostgresCallLimiter

async def main():
    rate = CallRate(**json.loads(sys.argv[2]))
    charge = Charge(*json.loads(sys.argv[4]))
    async with PostgresCallLimiter(sys.argv[1], rate) as limiter:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(int(sys.argv[3])):
            ticket = await limiter.acquire(charge)
            print(json.dumps([time.time(), ticket]), flush=True)
            await limiter.settle(ticket, charge)

anyio.run(main)
"""


SHARED_LIMITS = {
    # limit per second, and each call's (input, output) charge: 4 calls a second each way
    "requests": ({"requests": 4}, (50, 50)),
    "input": ({"requests": 100, "input_tokens": 200}, (50, 500)),
    "output": ({"requests": 100, "output_tokens": 200}, (500, 50)),
    "tokens": ({"requests": 6, "tokens": 200}, (30, 20)),
}


@pytest.mark.parametrize("kind", sorted(SHARED_LIMITS))
def test_processes_on_one_postgres_share_the_limit(
    postgres_dsn: str, tmp_path: Path, kind: str
) -> None:
    """Three processes grant 6 calls each as fast as they can, under a limit that admits
    4 calls a second (4 requests, or 200 input, output or all tokens at 50 a call; the
    other side of each call is large and unlimited): no window of a second ever holds more
    than 4 grants, the limit was what held them back, and every call was granted once."""
    rate, charge = SHARED_LIMITS[kind]
    spec: dict[str, object] = {**rate, "period": 1.0, "name": f"shared-{kind}"}
    script = tmp_path / "granter.py"
    script.write_text(textwrap.dedent(GRANTER))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), postgres_dsn, json.dumps(spec), "6", json.dumps(charge)],
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
    # the database clock decides; a grant is printed a moment after it, and on a loaded
    # machine a process may print late: allow for that (unlimited, the 18 come in ~0.1 s)
    slack = 0.2
    times = [t for t, _ in grants]
    assert busiest(times, 1.0 - slack) <= 4
    assert busiest(times, 1.0 + slack) >= 4  # the limit held them back (not idle)
    assert max(times) - min(times) >= 18 / 4 - 1.0 - slack


@pytest.mark.parametrize(
    ("command", "flags", "says"),
    [
        ("worker", ["--rpm", "0"], "(--rpm): Input should be greater than or equal to 1"),
        ("worker", ["--otpm", "x"], "(--otpm): expected a whole number, not 'x'"),
        ("run", ["--itpm", "-5"], "(--itpm): Input should be greater than or equal to 1"),
        ("run", ["--rate-period", "0", "--tpm", "9"], "(--rate-period): Input should be greater"),
        ("resume", ["--rate-period", "5"], "--rate-period and --rate-name need a limit"),
    ],
)
def test_a_bad_rate_is_one_line_before_anything_starts(
    tmp_path: Path, command: str, flags: list[str], says: str
) -> None:
    """Nothing is imported, connected to or created: the definition file would write a
    marker if imported, the database would be a new file."""
    defs = tmp_path / "defs.py"
    marker = tmp_path / "imported"
    defs.write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from anabranch import Agent\nhelper = Agent(name='helper')\n"
    )
    target = {
        "worker": [str(defs), "--db", "postgresql://nobody@127.0.0.1:1/none"],
        "run": [f"{defs}:helper", "a task", "--offline", "--db", str(tmp_path / "r.db")],
        "resume": ["ses_nothing", "--offline", "--db", str(tmp_path / "r.db")],
    }[command]
    done = subprocess.run(
        [sys.executable, "-m", "anabranch", command, *target, *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad rate limit" in lines[0] and says in lines[0], done.stderr
    assert not marker.exists() and not (tmp_path / "r.db").exists()
