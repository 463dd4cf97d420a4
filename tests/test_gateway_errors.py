"""Context limits, overloads and retries on every channel: the API, a gateway, a cloud."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, ContextPolicy, RetryPolicy, Runtime
from anabranch.errors import (
    ModelAPIError,
    ModelConnectionError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
    RunFailedError,
    ServerError,
)
from anabranch.messages import Message, ModelRequest
from anabranch.models import AnthropicModel
from anabranch.models._errors import api_error, parse_context_limit
from anabranch.models._gateway import detect_gateway, public_channel
from anabranch.testing import MessagesServer, TestModel

from .compaction_helpers import fetch
from .gateway_helpers import gateway_shim, pre_call_message

pytestmark = pytest.mark.anyio

OVERLOADED_VIA_LITELLM = (
    'litellm.InternalServerError: AnthropicError - {"type": "error", "error": {"type": '
    '"overloaded_error", "message": "Overloaded"}, "request_id": "req_0131fe3d5ac0cc454a"}'
    "\n\nLiteLLM: model group 'claude-sonnet-5-5' failed with the error above."
)


@pytest.mark.parametrize(
    ("message", "code", "maximum", "tokens"),
    [
        ("prompt is too long: 7059 tokens > 6000 maximum", None, 6000, 7059),
        (
            'litellm.BadRequestError: AnthropicException - {"type":"error","error":{"type":'
            '"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 '
            'maximum"}}',
            None,
            200_000,
            210_000,
        ),
        (pre_call_message("claude-sonnet-5-5", 6000, 7059), None, 6000, 7059),
        (
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.",
            "context_length_exceeded",
            8192,
            9000,
        ),
        (
            "input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000, "
            "decrease input length or `max_tokens` and try again",
            None,
            180_000,
            187_254,
        ),
        ("Input is too long for requested model.", None, None, None),
        ("Request too long", "context_length_exceeded", None, None),
    ],
)
def test_every_wording_of_a_full_window_is_recognised(
    message: str, code: str | None, maximum: int | None, tokens: int | None
) -> None:
    limit = parse_context_limit(message, code)
    assert limit is not None
    assert (limit.maximum, limit.tokens) == (maximum, tokens)
    error = api_error(
        message,
        status_code=400,
        error_type="invalid_request_error",
        body={"error": {"message": message, "code": code}},
    )
    assert isinstance(error, PromptTooLongError)
    assert (error.maximum, error.tokens) == (maximum, tokens)


@pytest.mark.parametrize(
    "message",
    [
        "This request would exceed the rate limit for your organization of 40,000 input "
        "tokens per minute.",
        "messages.1.content: Field required",
        "max_tokens: 300000 > 128000, which is the maximum allowed number of output tokens",
    ],
)
def test_other_errors_are_not_taken_for_a_full_window(message: str) -> None:
    assert parse_context_limit(message) is None


def test_a_wrapped_overload_is_an_overload_whatever_the_status() -> None:
    headers = {"x-litellm-version": "1.108.7", "x-litellm-call-id": "abc"}
    error = api_error(
        OVERLOADED_VIA_LITELLM, status_code=500, error_type="api_error", headers=headers
    )
    assert isinstance(error, OverloadedError)
    assert error.gateway == "litellm" and error.request_id == "abc"
    plain = api_error("Internal server error", status_code=500, error_type="api_error")
    assert type(plain) is ServerError and plain.gateway is None
    limited = api_error(
        "litellm.RateLimitError: AnthropicError - {...rate_limit_error...}",
        status_code=400,
        error_type="invalid_request_error",
    )
    assert isinstance(limited, RateLimitedError)
    assert type(api_error("bad", status_code=400, error_type=None)) is ModelAPIError


def test_gateways_are_seen_in_their_headers_and_channels_carry_no_secret() -> None:
    assert detect_gateway({"X-LiteLLM-Version": "1"}) == "litellm"
    assert detect_gateway({"request-id": "req_1", "content-type": "x"}) is None
    assert (
        public_channel("https://user:secret@gw.example.com:8443/anthropic/?key=k#x")
        == "https://gw.example.com:8443/anthropic"
    )


def test_retries_do_not_multiply_behind_a_gateway() -> None:
    policy = RetryPolicy(max_attempts=6)
    direct = OverloadedError("Overloaded")
    behind = OverloadedError("Overloaded", gateway="litellm")
    assert policy.attempts_for(direct) == 6
    assert policy.attempts_for(behind) == 2  # 2 of ours x 3 of LiteLLM's = 6 upstream
    assert RetryPolicy(max_attempts=6, gateway_retries=0).attempts_for(behind) == 6
    assert policy.attempts_for(ModelConnectionError("down")) == 6
    # a gateway that dropped retry-after gets a throttled backoff, not the 0.5 s of a 5xx
    assert policy.delay(1, behind) >= 1.5 and policy.delay(1, direct) <= 0.5
    assert policy.delay(1, OverloadedError("x", retry_after=3.0, gateway="litellm")) == 3.0


def _request(text: str) -> ModelRequest:
    return ModelRequest(model="claude-sonnet-5-5", max_tokens=64, messages=(Message.user(text),))


async def test_the_sdk_maps_what_the_gateway_answers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="anabranch.models")
    with anyio.fail_after(20):
        async with MessagesServer(TestModel(), retry_after=3.0) as srv:
            async with gateway_shim(srv.base_url, max_input_tokens=300, ratio=1.6) as gw:
                model = AnthropicModel(base_url=gw.base_url, api_key="test")
                try:
                    response = await model.request(_request("hello"))
                    assert response.content and model.gateway == "litellm"
                    with pytest.raises(PromptTooLongError) as too_long:
                        await model.request(_request("lorem ipsum " * 200))
                    assert too_long.value.maximum == 300
                    assert too_long.value.tokens == gw.refused[0][1] > 300
                    srv.inject("overloaded", retry_after=2.0)
                    with pytest.raises(OverloadedError) as overloaded:
                        await model.request(_request("hello"))
                    assert overloaded.value.status_code == 500
                    assert overloaded.value.retry_after is None  # dropped by the gateway
                    srv.inject("rate_limit")
                    with pytest.raises(RateLimitedError):
                        await model.request(_request("hello"))
                finally:
                    await model.aclose()
    notices = [r for r in caplog.records if "gateway" in r.getMessage()]
    assert len(notices) == 1
    assert "num_retries: 0" in notices[0].getMessage() and gw.base_url in notices[0].getMessage()


def _worker(window: int) -> Agent:
    return Agent(
        name="worker",
        model="claude-sonnet-5-5",
        instructions="Research the topic with your tools, then report.",
        tools=[fetch],
        context=ContextPolicy(
            window=window,
            compact_at=0.7,
            output_reserve=200,
            keep_recent=4,
            tool_result_max_chars=800,
            tool_result_preview_chars=200,
        ),
        max_turns=80,
    )


async def test_a_gateway_window_below_the_declared_one_is_learned_and_compacted_at(
    tmp_path: Path,
) -> None:
    """The gateway refuses at 1,800 by its count (1.6 x ours) a run that declared 100,000."""
    with anyio.fail_after(60):
        async with MessagesServer(TestModel(rounds=10)) as srv:
            async with gateway_shim(srv.base_url, max_input_tokens=1800, ratio=1.6) as gw:
                model = AnthropicModel(base_url=gw.base_url, api_key="test")
                retry = RetryPolicy(max_attempts=3, base_delay=0, max_delay=0)
                try:
                    async with Runtime(db=tmp_path / "r.db", model=model, retry=retry) as rt:
                        result = await rt.run(_worker(100_000), "Research SQLite")
                        limits = rt.pipeline.limits  # type: ignore[attr-defined]
                finally:
                    await model.aclose()
    assert result.status == "done", result.output
    assert gw.refused, "the gateway's window should have been hit"
    # once learned, the window is the gateway's 1,800 in our units (about 1,800 / 1.6)
    learned = limits._limits[("claude-sonnet-5-5", public_channel(gw.base_url))]
    assert learned.maximum == 1800 and 1.4 < learned.ratio < 1.8
    assert learned.window < 1300
    # the pipeline compacted on the one refusal, then always before the gateway's window
    assert len(gw.refused) == 1


async def test_a_sustained_overload_behind_a_gateway_is_tried_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with MessagesServer(TestModel(), fault_rate=1.0, fault_kinds=["overloaded"]) as srv:
            async with gateway_shim(srv.base_url) as gw:
                model = AnthropicModel(base_url=gw.base_url, api_key="test")
                retry = RetryPolicy(max_attempts=6, base_delay=0, max_delay=0)
                try:
                    async with Runtime(db=tmp_path / "r.db", model=model, retry=retry) as rt:
                        with pytest.raises(RunFailedError) as failed:
                            (await rt.run(_worker(100_000), "Research SQLite")).raise_for_status()
                finally:
                    await model.aclose()
    assert isinstance(failed.value.__cause__, OverloadedError)
    # the shim does not retry, so the 2 attempts of ours are all that reached upstream;
    # behind LiteLLM's default 2 retries that is 6 upstream attempts, not 18
    assert len(srv.log) == 2


async def test_the_gateway_is_an_event_on_the_first_call_span_it_was_seen_on(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with anyio.fail_after(30):
        async with MessagesServer(TestModel(rounds=2)) as srv:
            async with gateway_shim(srv.base_url) as gw:
                model = AnthropicModel(base_url=gw.base_url, api_key="test")
                try:
                    async with Runtime(
                        db=tmp_path / "t.db", model=model, tracer_provider=provider
                    ) as rt:
                        result = await rt.run(_worker(100_000), "Research SQLite")
                finally:
                    await model.aclose()
    assert result.status == "done"
    spans = exporter.get_finished_spans()
    events = [(s, e) for s in spans for e in s.events if e.name == "anabranch.gateway"]
    assert len(events) == 1, "said once per channel"
    span, event = events[0]
    assert span.name.startswith("chat ")
    assert dict(event.attributes or {}) == {
        "anabranch.gateway.name": "litellm",
        "anabranch.gateway.channel": public_channel(gw.base_url),
        "anabranch.gateway.version": "1.108.7",
    }
