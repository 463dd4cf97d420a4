"""Bedrock and Vertex AI through the SDK's own clients, against the local stand-in.

The real clouds cannot be reached here: the ``MessagesServer`` serves their paths
(``/model/{id}/invoke-with-response-stream`` with SigV4 and AWS event-stream frames,
``.../publishers/anthropic/models/{id}:streamRawPredict`` with a bearer token) and refuses
what they refuse. Bedrock requests are really signed by botocore, with fake credentials.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import anyio
import pytest

from anabranch import Agent, ContextPolicy, RetryPolicy, Runtime
from anabranch.context._pricing import PriceTable
from anabranch.errors import (
    ModelAPIError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
    UserError,
)
from anabranch.messages import Message, ModelRequest
from anabranch.models import AnthropicModel
from anabranch.testing import MessagesServer, TestModel

from .compaction_helpers import fetch

pytestmark = pytest.mark.anyio

SONNET_ON_BEDROCK = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
OLD_ON_BEDROCK = "anthropic.claude-sonnet-4-20250514-v1:0"
SONNET_ON_VERTEX = "claude-sonnet-4-5@20250929"


def _bedrock(base_url: str, **kwargs: object) -> AnthropicModel:
    client = anthropic.AsyncAnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key="not-a-real-secret",
        aws_region="us-east-1",
        base_url=base_url,
        max_retries=0,
    )
    return AnthropicModel(client=client, **kwargs)  # type: ignore[arg-type]


def _vertex(base_url: str, **kwargs: object) -> AnthropicModel:
    client = anthropic.AsyncAnthropicVertex(
        region="us-east5",
        project_id="anabranch-test",
        access_token="not-a-real-token",
        base_url=base_url + "/v1",
        max_retries=0,
    )
    return AnthropicModel(client=client, **kwargs)  # type: ignore[arg-type]


def _request(model: str, text: str = "hello", ttl: str | None = None) -> ModelRequest:
    request = ModelRequest(model=model, max_tokens=64, messages=(Message.user(text),))
    if ttl is not None:
        request = request.model_copy(update={"message_breakpoints": ((0, ttl),)})
    return request


async def test_bedrock_calls_are_signed_streamed_as_event_frames_and_mapped() -> None:
    with anyio.fail_after(30):
        async with MessagesServer(TestModel(), context_limit=300) as srv:
            model = _bedrock(srv.base_url, model_ids={"claude-sonnet-4-5": SONNET_ON_BEDROCK})
            try:
                assert model.provider == "bedrock" and model.channel == "bedrock:us-east-1"
                response = await model.request(_request("claude-sonnet-4-5"))
                assert response.content and response.usage.input_tokens > 0
                assert srv.log[-1].model == SONNET_ON_BEDROCK and srv.log[-1].stream
                srv.inject("rate_limit", retry_after=2)
                with pytest.raises(RateLimitedError) as limited:
                    await model.request(_request("claude-sonnet-4-5"))
                assert limited.value.status_code == 429 and limited.value.retry_after == 2
                srv.inject("overloaded")
                with pytest.raises(OverloadedError) as overloaded:
                    await model.request(_request("claude-sonnet-4-5"))
                assert overloaded.value.status_code == 503
                srv.inject("stream_error")  # an exception frame in the middle of the stream
                with pytest.raises(OverloadedError):
                    await model.request(_request("claude-sonnet-4-5"))
                with pytest.raises(PromptTooLongError) as too_long:
                    await model.request(_request("claude-sonnet-4-5", "lorem ipsum " * 200))
                assert too_long.value.maximum == 300 and too_long.value.tokens
                with pytest.raises(ModelAPIError, match="not supported in Bedrock"):
                    await model.count_tokens(_request("claude-sonnet-4-5"))
            finally:
                await model.aclose()


async def test_bedrock_gets_no_1h_ttl_for_a_model_that_refuses_it() -> None:
    with anyio.fail_after(30):
        async with MessagesServer(TestModel()) as srv:
            model = _bedrock(srv.base_url)
            try:
                await model.request(_request(OLD_ON_BEDROCK, ttl="1h"))  # sent as 5m
                await model.request(_request(SONNET_ON_BEDROCK, ttl="1h"))  # kept
            finally:
                await model.aclose()
            # the stand-in refuses a 1h TTL for the older model, as Bedrock does
            raw = anthropic.AsyncAnthropicBedrock(
                aws_access_key="AKIDEXAMPLE",
                aws_secret_key="not-a-real-secret",
                aws_region="us-east-1",
                base_url=srv.base_url,
                max_retries=0,
            )
            try:
                with pytest.raises(anthropic.BadRequestError, match="1h cache TTL"):
                    await raw.messages.create(
                        model=OLD_ON_BEDROCK,
                        max_tokens=16,
                        messages=[
                            {
                                "role": "user",
                                "content": [
                                    {
                                        "type": "text",
                                        "text": "hi",
                                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                                    }
                                ],
                            }
                        ],
                    )
            finally:
                await raw.close()
    old, new = (r for r in srv.log if r.status == 200)
    assert old.request is not None and new.request is not None
    assert old.request.message_breakpoints == ((0, "5m"),)
    assert new.request.message_breakpoints == ((0, "1h"),)


async def test_an_unsigned_bedrock_call_is_refused() -> None:
    async with MessagesServer(TestModel()) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="x", max_retries=0)
        try:
            response = await client.post(
                f"/model/{SONNET_ON_BEDROCK}/invoke",
                body={"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "messages": []},
                cast_to=object,
            )
        except anthropic.PermissionDeniedError as exc:
            assert exc.status_code == 403
        else:  # pragma: no cover - the assertion below explains the failure
            raise AssertionError(f"an unsigned call was answered: {response!r}")


async def test_vertex_calls_reach_the_publisher_path_with_a_bearer_token() -> None:
    with anyio.fail_after(30):
        async with MessagesServer(TestModel()) as srv:
            model = _vertex(srv.base_url, model_ids={"claude-sonnet-4-5": SONNET_ON_VERTEX})
            try:
                assert model.provider == "vertex"
                assert model.channel == "vertex:us-east5/anabranch-test"
                response = await model.request(_request("claude-sonnet-4-5", ttl="1h"))
                assert response.content
                assert srv.log[-1].model == SONNET_ON_VERTEX
                srv.inject("overloaded")
                with pytest.raises(OverloadedError) as overloaded:
                    await model.request(_request("claude-sonnet-4-5"))
                assert overloaded.value.status_code == 529
            finally:
                await model.aclose()


async def test_a_session_runs_on_bedrock_and_is_priced(tmp_path: Path) -> None:
    agent = Agent(
        name="worker",
        model="claude-sonnet-4-5",
        instructions="Research the topic with your tools, then report.",
        tools=[fetch],
        context=ContextPolicy(window=200_000),
    )
    with anyio.fail_after(60):
        async with MessagesServer(TestModel(rounds=2)) as srv:
            model = _bedrock(srv.base_url, model_ids={"claude-sonnet-4-5": SONNET_ON_BEDROCK})
            try:
                async with Runtime(db=tmp_path / "b.db", model=model, retry=RetryPolicy()) as rt:
                    result = await rt.run(agent, "Research SQLite")
                    calls = await rt.store.session_calls(result.session_id)
            finally:
                await model.aclose()
    assert result.status == "done"
    assert calls and all(c.model == SONNET_ON_BEDROCK for c in calls if c.status == "ok")
    assert PriceTable().price(SONNET_ON_BEDROCK) is not None


def test_cloud_model_ids_are_priced_with_the_regional_premium() -> None:
    table = PriceTable()
    direct = table.price("claude-sonnet-4-5")
    assert direct is not None
    global_ = table.price("global.anthropic.claude-sonnet-4-5-20250929-v1:0")
    regional = table.price("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    older = table.price("us.anthropic.claude-sonnet-4-20250514-v1:0")
    assert global_ == direct
    assert regional is not None and regional.input == pytest.approx(direct.input * 1.1)
    assert regional.read_rate == pytest.approx(direct.read_rate * 1.1)
    assert older == table.price("claude-sonnet-4")  # no premium before the 4.5 generation
    assert table.price(SONNET_ON_VERTEX) == direct
    assert table.price("us.anthropic.nothing-v1:0") is None


def test_a_provider_that_does_not_match_its_client_is_refused() -> None:
    client = anthropic.AsyncAnthropic(api_key="x")
    with pytest.raises(UserError, match="does not match"):
        AnthropicModel(client=client, provider="bedrock")
    with pytest.raises(UserError, match="provider must be"):
        AnthropicModel(api_key="x", provider="azure")  # type: ignore[arg-type]


async def test_provider_bedrock_uses_the_aws_credential_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
    with anyio.fail_after(30):
        async with MessagesServer(TestModel()) as srv:
            model = AnthropicModel(provider="bedrock", region="eu-west-1", base_url=srv.base_url)
            try:
                assert model.channel == "bedrock:eu-west-1"
                assert (await model.request(_request(SONNET_ON_BEDROCK))).content
            finally:
                await model.aclose()
