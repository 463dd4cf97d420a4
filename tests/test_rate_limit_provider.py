"""The provider's word on rate limits: the local server limits like the API (token buckets
per requests, input and output tokens, ``anthropic-ratelimit-*`` headers, 429 with
``retry-after``), and callers sharing a limit hold back when it says so: the real
``anthropic`` SDK over HTTP, checked at the server's own log."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import anthropic
import anyio
import pytest
from anyio.abc import Process

from anabranch.errors import ModelError
from anabranch.messages import Message, ModelRequest, TextBlock
from anabranch.models import (
    AnthropicModel,
    CallRate,
    LocalCallLimiter,
    ProviderLimits,
    RateLimitedModel,
    RetryPolicy,
)
from anabranch.models._retry import retrying
from anabranch.testing import FunctionModel, MessagesServer, RequestRecord, TestModel

# as the API sent them (a captured answer: 1000 RPM, 80k ITPM, 16k OTPM)
REAL_HEADERS = {
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "80000",
    "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "16000",
    "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-tokens-limit": "96000",
    "anthropic-ratelimit-tokens-remaining": "96000",
    "anthropic-ratelimit-tokens-reset": "2025-08-21T12:40:59Z",
    "request-id": "req_011CSLsW7mFqvHHnzrKdKjAE",
}
RESET = 1755780060.0  # 2025-08-21T12:41:00Z


def test_the_headers_read_as_typed_limits() -> None:
    limits = ProviderLimits.of(REAL_HEADERS)
    assert limits.limits["requests"].limit == 1000
    assert limits.limits["requests"].remaining == 999
    assert limits.limits["output-tokens"].reset == RESET
    assert limits.exhausted_until() is None and limits.wait(RESET - 30) == 0
    exhausted = ProviderLimits.of(
        {**REAL_HEADERS, "anthropic-ratelimit-output-tokens-remaining": "0"}
    )
    assert exhausted.exhausted_until() == RESET
    assert exhausted.wait(RESET - 30) == pytest.approx(30)
    assert exhausted.wait(RESET + 5) == 0  # a reset in the past asks nothing
    told = ProviderLimits.of({"retry-after": "7"})
    assert told.retry_after == 7 and told.wait(0) == 7
    # what cannot be read is left out, never guessed
    odd = ProviderLimits.of(
        {
            "anthropic-ratelimit-requests-remaining": "-1",
            "anthropic-ratelimit-requests-reset": "12:40",
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:41:00",  # no offset
        }
    )
    assert odd.exhausted_until() is None
    assert ProviderLimits.of(None) == ProviderLimits.of({}) == ProviderLimits()


def _params(max_tokens: int = 64, text: str = "hello") -> dict[str, Any]:
    return {
        "model": "claude-sonnet-5-5",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
    }


@pytest.mark.anyio
async def test_the_server_limits_requests_like_the_api() -> None:
    """Two requests per 4 s: each answer says what is left; the third is a 429 with
    retry-after and the same headers, naming the limit it would exceed."""
    async with MessagesServer(TestModel(), rate_limits=CallRate(requests=2, period=4)) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)
        with anyio.fail_after(30):
            first = await client.messages.with_raw_response.create(**_params())
            second = await client.messages.with_raw_response.create(**_params())
            with pytest.raises(anthropic.RateLimitError) as refused:
                await client.messages.create(**_params())
        assert first.headers["anthropic-ratelimit-requests-limit"] == "2"
        assert first.headers["anthropic-ratelimit-requests-remaining"] == "1"
        assert second.headers["anthropic-ratelimit-requests-remaining"] == "0"
        error = refused.value
        assert 1 <= int(error.response.headers["retry-after"]) <= 4
        assert error.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert "2 requests per 4 seconds" in str(error)
        limits = ProviderLimits.of(dict(second.headers))
        until = limits.exhausted_until()
        assert until is not None and time.time() < until <= time.time() + 5
        await client.close()
    assert [r.status for r in srv.log] == [200, 200, 429]


@pytest.mark.anyio
async def test_the_server_charges_max_tokens_while_a_call_runs() -> None:
    """OTPM as the API counts it: a call takes its max_tokens when it starts (so a second
    one does not fit while it runs) and gives back what it did not use when it ends."""
    entered, release = anyio.Event(), anyio.Event()

    async def slow(request: ModelRequest) -> str:
        entered.set()
        await release.wait()
        return "done"

    rate = CallRate(output_tokens=4000, input_tokens=100_000, period=60)
    async with MessagesServer(FunctionModel(slow), rate_limits=rate) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(lambda: client.messages.create(**_params(max_tokens=3000)))
                await entered.wait()  # admitted, and holding 3000 of the 4000
                with pytest.raises(anthropic.RateLimitError) as refused:
                    await client.messages.create(**_params(max_tokens=3000))
                release.set()
            # the first ended with a few tokens: what it did not use is back
            answer = await client.messages.with_raw_response.create(**_params(max_tokens=3000))
        await client.close()
    assert "4,000 output tokens per 60 seconds" in str(refused.value)
    assert refused.value.response.headers["anthropic-ratelimit-output-tokens-remaining"] == "1000"
    remaining = int(answer.headers["anthropic-ratelimit-output-tokens-remaining"])
    assert remaining == 4000  # rounded to the nearest thousand, as the API rounds it
    assert [r.status for r in srv.log] == [429, 200, 200]
    assert all(0 < r.output_tokens < 100 for r in srv.log[1:])


class _Outsider:
    """Another client on the same organisation, outside our limiter (the raw SDK)."""

    def __init__(self, base_url: str) -> None:
        self.client = anthropic.AsyncAnthropic(base_url=base_url, api_key="k", max_retries=0)

    async def spend(self, requests: int) -> None:
        for _ in range(requests):
            await self.client.messages.create(**_params())


def _request(text: str = "hi") -> ModelRequest:
    return ModelRequest(
        model="claude-sonnet-5-5",
        messages=[Message(role="user", content=[TextBlock(text=text)])],
        max_tokens=64,
    )


async def _calls_with_retries(models: list[RateLimitedModel], calls: int) -> list[str]:
    """``calls`` concurrent calls spread over ``models``, each retried as the runtime
    retries (honouring retry-after); returns what each ended with."""
    policy = RetryPolicy(max_attempts=6, base_delay=0.05)
    ended: list[str] = []

    async def one(model: RateLimitedModel, n: int) -> None:
        request = _request(f"call {n}")
        call: Callable[[int], Awaitable[Any]] = lambda _attempt: model.request(request)  # noqa: E731
        try:
            await retrying(policy, call)
            ended.append("ok")
        except ModelError as exc:
            ended.append(type(exc).__name__)

    async with anyio.create_task_group() as group:
        for n in range(calls):
            group.start_soon(one, models[n % len(models)], n)
    return ended


How = Literal["exhausted", "refused", "overloaded"]
PROVIDER = CallRate(requests=3, period=6, name="org")
"""The provider's limit, and ours: a bucket of 3 requests, one back every 2 s."""


async def _provider_says_wait(srv: MessagesServer, how: How, first: RateLimitedModel) -> float:
    """Bring the provider to say "wait" to ``first``: its answer says no request is left
    (``exhausted``, reset about 6 s away), or refuses it with a 429 (``refused``: retry-after
    2 s, the reset about 6 s away) or a 529 with retry-after 3 s (``overloaded``). Returns
    the least wait that leaves (a slow machine may take up to 2 s between the calls)."""
    outsider = _Outsider(srv.base_url)
    if how == "exhausted":
        await outsider.spend(2)  # 3 a bucket: ours takes the last
        await first.request(_request("first"))
    else:
        if how == "refused":
            await outsider.spend(3)
        else:
            srv.inject("overloaded", retry_after=3)
        with pytest.raises(ModelError):
            await first.request(_request("first"))
    await outsider.client.close()
    return 2.9 if how == "overloaded" else 3.9


def _ours(srv: MessagesServer) -> list[RequestRecord]:
    """The requests our models sent (the outsider asks "hello")."""

    def text(record: RequestRecord) -> str:
        first = record.request.messages[0].content[0] if record.request else None
        return first.text if isinstance(first, TextBlock) else ""

    return [r for r in srv.log if text(r) not in ("", "hello")]


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["exhausted", "refused", "overloaded"])
async def test_when_the_provider_says_wait_every_caller_waits(how: How) -> None:
    """3 requests per 6 s at the provider, and our own limit the same: another client
    spends the provider's budget behind our back. Once one of our calls hears "wait"
    (no request left until the reset, a 429 or a 529 with retry-after), none of three
    concurrent callers reaches the provider before that time, and none is refused."""
    async with MessagesServer(TestModel(), rate_limits=PROVIDER) as srv:
        inner = AnthropicModel(base_url=srv.base_url, api_key="k")
        model = RateLimitedModel(inner, LocalCallLimiter(PROVIDER))
        with anyio.fail_after(60):
            least = await _provider_says_wait(srv, how, model)
            told = _ours(srv)[-1].timestamp
            ended = await _calls_with_retries([model], 3)
        await model.aclose()
    assert ended == ["ok"] * 3
    later = _ours(srv)[1:]
    assert len(later) == 3 and all(r.status == 200 for r in later)  # none refused
    assert min(r.timestamp for r in later) >= told + least


CALLER = """
import json, sys, anyio
from anabranch.errors import ModelError
from anabranch.messages import Message, ModelRequest, TextBlock
from anabranch.models import AnthropicModel, CallRate, PostgresCallLimiter, RateLimitedModel
from anabranch.models import RetryPolicy
from anabranch.models._retry import retrying

async def main():
    dsn, base_url, rate, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    async with PostgresCallLimiter(dsn, CallRate(**rate)) as limiter:
        model = RateLimitedModel(AnthropicModel(base_url=base_url, api_key="k"), limiter)
        print("ready", flush=True)
        sys.stdin.readline()
        ended = []

        async def one(n):
            request = ModelRequest(
                model="claude-sonnet-5-5", max_tokens=64,
                messages=[Message(role="user", content=[TextBlock(text=f"child call {n}")])],
            )
            try:
                await retrying(RetryPolicy(max_attempts=6, base_delay=0.05),
                               lambda attempt: model.request(request))
                ended.append("ok")
            except ModelError as exc:
                ended.append(type(exc).__name__)

        async with anyio.create_task_group() as group:
            for n in range(int(calls)):
                group.start_soon(one, n)
        await model.aclose()
        print(json.dumps(ended), flush=True)

anyio.run(main)
"""


async def _start_callers(script: Path, argv: list[str], count: int) -> list[Process]:
    """``count`` caller processes, started together, each once it has said ready."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    processes = [
        await anyio.open_process([sys.executable, str(script), *argv], env=env)
        for _ in range(count)
    ]
    for process in processes:
        assert process.stdout is not None
        seen = b""
        while not seen.endswith(b"ready\n"):
            seen += await process.stdout.receive()
    return processes


async def _finish_caller(process: Process) -> list[str]:
    assert process.stdin is not None and process.stdout is not None
    await process.stdin.send(b"go\n")
    out = b""
    async for chunk in process.stdout:
        out += chunk
    assert await process.wait() == 0
    return list(json.loads(out.decode().strip().splitlines()[-1]))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the callers are subprocesses
async def test_a_provider_wait_heard_by_one_process_holds_every_process(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """Three processes on one PostgreSQL limit, each with its own SDK client: a 429 with
    retry-after heard by one (this test's process) holds the callers of all three: none of
    their calls reaches the provider before the wait is over, none is refused."""
    from anabranch.models import PostgresCallLimiter

    rate = PROVIDER
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    async with MessagesServer(TestModel(), rate_limits=rate) as srv:
        argv = [postgres_dsn, srv.base_url, rate.model_dump_json(), "1"]
        with anyio.fail_after(120):
            children = await _start_callers(script, argv, 2)
            try:
                async with PostgresCallLimiter(postgres_dsn, rate) as limiter:
                    model = RateLimitedModel(
                        AnthropicModel(base_url=srv.base_url, api_key="k"), limiter
                    )
                    least = await _provider_says_wait(srv, "refused", model)
                    told = _ours(srv)[-1].timestamp
                    ended: list[list[str]] = []

                    async def finish(child: Process) -> None:
                        ended.append(await _finish_caller(child))

                    async with anyio.create_task_group() as group:
                        for child in children:
                            group.start_soon(finish, child)
                        ended.append(await _calls_with_retries([model], 1))
                    await model.aclose()
            finally:
                for child in children:
                    if child.returncode is None:
                        child.kill()
                        await child.wait()
                    await child.aclose()
    assert ended == [["ok"]] * 3  # this process's call and each child's
    later = _ours(srv)[1:]
    assert len(later) == 3 and all(r.status == 200 for r in later)  # none refused
    assert min(r.timestamp for r in later) >= told + least


class _InFlight:
    """A policy that counts the calls it is answering at once."""

    def __init__(self) -> None:
        self.now = self.most = 0

    async def __call__(self, request: ModelRequest) -> str:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await anyio.sleep(0.05)  # an answer takes a moment (overlap, not ordering)
        finally:
            self.now -= 1
        return "done"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["input", "output"])
async def test_our_token_limits_never_overrun_the_providers_same_limits(kind: str) -> None:
    """Our limit and the provider's, the same: 10,000 input (or output) tokens per 2 s,
    and 8 concurrent calls of ~3,000 (a 12,000-character prompt, or max_tokens=3000).
    At most 3 are ever in flight, as the charge at the grant allows (the answers use a
    few output tokens: OTPM gives the rest back when a call ends, so output calls come
    3 at a time; input stays charged, so input calls come 3 per 2 s), and the provider,
    which counts the same way, refuses none."""
    limit = {f"{kind}_tokens": 10_000}
    rate = CallRate(requests=1000, period=2, **limit)
    policy = _InFlight()
    text = "x" * 12_000 if kind == "input" else "x"
    max_tokens = 3000 if kind == "output" else 64
    async with MessagesServer(FunctionModel(policy), rate_limits=rate) as srv:
        model = RateLimitedModel(
            AnthropicModel(base_url=srv.base_url, api_key="k"), LocalCallLimiter(rate)
        )
        request = ModelRequest(
            model="claude-sonnet-5-5",
            messages=[Message(role="user", content=[TextBlock(text=text)])],
            max_tokens=max_tokens,
        )
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for _ in range(8):
                    group.start_soon(model.request, request)
        await model.aclose()
    assert [r.status for r in srv.log] == [200] * 8  # the provider refused none
    assert policy.most == 3  # the limit bound (3 fit, never 4)
    if kind == "input":
        starts = sorted(r.timestamp for r in srv.log)
        assert max(sum(1 for t in starts if s <= t < s + 2 - 0.05) for s in starts) <= 3


DEFINITION = """
from anabranch import Agent, tool

@tool
def note(text: str) -> str:
    "Write a note."
    return "noted"

writer = Agent(name="writer", model="claude-sonnet-5-5", tools=[note])
"""


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a subprocess: one backend is enough
async def test_run_holds_its_calls_to_rpm(tmp_path: Path) -> None:
    """``anabranch run --rpm 2 --rate-period 2`` against the local API: a run of five
    model calls never has three in any 2 s at the server, and the limit bound (the five
    took at least 4 s, where unlimited they take a fraction of one)."""
    defs = tmp_path / "defs.py"
    defs.write_text(DEFINITION)
    with anyio.fail_after(120):
        async with MessagesServer(TestModel(rounds=4)) as srv:
            env = {**os.environ, "ANTHROPIC_BASE_URL": srv.base_url, "ANTHROPIC_API_KEY": "t"}
            done = await anyio.run_process(
                [sys.executable, "-m", "anabranch", "run", f"{defs}:writer", "take notes",
                 "--db", str(tmp_path / "runs.db"), "--rpm", "2", "--rate-period", "2"],
                env=env,
                check=False,
            )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    starts = sorted(r.timestamp for r in srv.log if r.endpoint == "messages")
    assert len(starts) == 5 and all(r.status == 200 for r in srv.log)
    assert max(sum(1 for t in starts if s <= t < s + 2 - 0.05) for s in starts) <= 2
    assert starts[-1] - starts[0] >= 4 - 0.05
