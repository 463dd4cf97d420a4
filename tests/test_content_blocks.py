"""Images and documents: in tasks and tool results, through the real SDK to the local
server, stored once by content hash, counted at their token cost, kept out of spans."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import anthropic
import pydantic
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, AnthropicModel, Document, Image, Runtime, UserError, tool
from anabranch.context._content import (
    DOCUMENT_PAGE_TOKENS,
    IMAGE_TOKENS,
    message_attachment_tokens,
)
from anabranch.context._tokens import estimate_messages
from anabranch.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from anabranch.store import ToolEventRecord
from anabranch.testing import MessagesServer, TestModel

from .helpers import attributes

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
JPEG = b"\xff\xd8\xff\xe0" + b"\x10" * 500
PDF = (
    b"%PDF-1.4\n1 0 obj << /Type /Pages >>\n2 0 obj << /Type /Page >>\n"
    b"3 0 obj << /Type /Page >>\n%%EOF"
)
SCREENSHOT = Image(data=PNG, media_type="image/png")


@tool
def screenshot(url: str) -> list[Any]:
    """Render a page and return it as an image."""
    return ["The page as rendered:", SCREENSHOT]


VIEWER = Agent(name="viewer", instructions="Look, then describe.", tools=[screenshot])


async def _run(tmp_path: Path, agent: Agent, task: Any, **runtime: Any) -> tuple[Any, Any, Path]:
    db = tmp_path / "c.db"
    async with MessagesServer(TestModel(rounds=2)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="k")
        try:
            async with Runtime(db=db, model=model, **runtime) as rt:
                result = await rt.run(agent, task)
        finally:
            await model.aclose()
    return srv, result, db


async def test_tool_images_reach_the_model_and_are_stored_once(tmp_path: Path) -> None:
    srv, result, db = await _run(tmp_path, VIEWER, "Describe example.com")
    assert result.status == "done"
    requests = [r.request for r in srv.log if r.status == 200]
    results = [
        b for m in requests[-1].messages for b in m.content if isinstance(b, ToolResultBlock)
    ]
    assert [r.attachments for r in results] == [(SCREENSHOT,), (SCREENSHOT,)]
    assert results[0].content == "The page as rendered:"
    with sqlite3.connect(db) as conn:
        blobs = conn.execute("SELECT data, size FROM blobs").fetchall()
        stored = [row[0] for row in conn.execute("SELECT content FROM messages")]
    assert blobs == [(base64.b64encode(PNG).decode(), len(PNG))]  # two results, one blob
    assert not any(base64.b64encode(PNG).decode() in text for text in stored)


async def test_a_task_may_carry_images_and_documents(tmp_path: Path) -> None:
    chart = Image(data=JPEG, media_type="image/jpeg")
    report = Document(data=PDF, title="report.pdf")
    notes = Document(text="tides: twice a day")
    srv, result, _ = await _run(
        tmp_path, Agent(name="reader"), ["Describe this chart:", chart, report, notes]
    )
    first = srv.log[0].request.messages[0]
    assert first.content == (TextBlock(text="Describe this chart:"), chart, report, notes)
    assert result.output.startswith("Report on: Describe this chart:")


async def test_bad_tasks_get_a_one_line_error(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "b.db", model=TestModel()) as rt:
        with pytest.raises(UserError, match="task item 1 is a int"):
            await rt.run(VIEWER, ["look", 3])  # type: ignore[list-item]
        with pytest.raises(UserError, match="non-empty"):
            await rt.run(VIEWER, [])
        assert await rt.store.list_sessions() == []


def test_images_and_documents_are_checked_when_made() -> None:
    with pytest.raises(
        pydantic.ValidationError, match="given as image/jpeg but its bytes are a image/png"
    ):
        Image(data=PNG, media_type="image/jpeg")
    with pytest.raises(pydantic.ValidationError, match="exactly one of data= or url="):
        Image(media_type="image/png")
    with pytest.raises(pydantic.ValidationError, match="must be a PDF"):
        Document(data=b"plain bytes")
    assert Image(url="https://example.com/a.png").size == 0


def test_token_estimate_counts_images_and_pdf_pages() -> None:
    text = Message.user("x" * 400)
    with_image = Message(role="user", content=(TextBlock(text="x" * 400), SCREENSHOT))
    with_pdf = Message(role="user", content=(TextBlock(text="x" * 400), Document(data=PDF)))
    base = estimate_messages([text])
    assert estimate_messages([with_image]) == base + IMAGE_TOKENS
    assert estimate_messages([with_pdf]) == base + 2 * DOCUMENT_PAGE_TOKENS
    # inside a tool result, after blocks that carry none: counted all the same
    use = ToolUseBlock(id="t", name="shot", input={})
    results = Message(
        role="user",
        content=(
            ToolResultBlock(tool_use_id="s", content="no image"),
            ToolResultBlock(tool_use_id="t", content="", attachments=(SCREENSHOT,)),
        ),
    )
    plain = Message(role="user", content=(ToolResultBlock(tool_use_id="s", content="no image"),))
    tokens = estimate_messages([results]) - estimate_messages([plain])
    assert message_attachment_tokens(results) == IMAGE_TOKENS and tokens >= IMAGE_TOKENS
    assert message_attachment_tokens(Message(role="assistant", content=(use,))) == 0


def _image_turn(source: dict[str, Any], in_tool_result: bool) -> list[dict[str, Any]]:
    image = {"type": "image", "source": source}
    if not in_tool_result:
        return [{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}]
    use = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {"url": "u"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}
    return [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]


@pytest.mark.parametrize("in_tool_result", [False, True])
async def test_server_rejects_invalid_image_sources_as_the_api_does(in_tool_result: bool) -> None:
    wrong = {"type": "base64", "media_type": "image/jpeg", "data": base64.b64encode(PNG).decode()}
    where = (
        "messages.2.content.0.tool_result.content.0" if in_tool_result else "messages.0.content.0"
    )
    async with MessagesServer(TestModel()) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)
        try:
            with pytest.raises(anthropic.BadRequestError) as caught:
                await client.messages.create(
                    model="claude-sonnet-5-5",
                    max_tokens=100,
                    messages=_image_turn(wrong, in_tool_result),  # type: ignore[arg-type]
                    tools=[
                        {
                            "name": "screenshot",
                            "description": "s",
                            "input_schema": {"type": "object"},
                        }
                    ],
                )
            message = caught.value.body["error"]["message"]  # type: ignore[index]
            assert message == (
                f"{where}.image.source.base64: The image was specified using the image/jpeg "
                "media type, but the image appears to be a image/png image"
            )
            bad_type = {"type": "base64", "media_type": "image/bmp", "data": "AAAA"}
            with pytest.raises(anthropic.BadRequestError, match="Input should be 'image/jpeg'"):
                await client.messages.create(
                    model="claude-sonnet-5-5",
                    max_tokens=100,
                    messages=_image_turn(bad_type, False),  # type: ignore[arg-type]
                )
            good = {
                "type": "base64",
                "media_type": "image/png",
                "data": base64.b64encode(PNG).decode(),
            }
            counted = await client.messages.count_tokens(
                model="claude-sonnet-5-5",
                messages=_image_turn(good, False),  # type: ignore[arg-type]
            )
            assert counted.input_tokens >= IMAGE_TOKENS
        finally:
            await client.close()


async def test_finished_tool_events_keep_their_attachments(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "e.db", model=TestModel()) as rt:
        store = rt.store
        adapter = pydantic.TypeAdapter(list[Image])
        await store.record_tool_event(
            ToolEventRecord(
                run_id="run_1",
                call_id="toolu_1",
                name="screenshot",
                event="finished",
                created=1.0,
                content="shot",
                attachments=adapter.dump_json([SCREENSHOT]).decode(),
            )
        )
        (event,) = await store.tool_events("run_1", ["toolu_1"])
    assert adapter.validate_json(event.attachments or "[]") == [SCREENSHOT]


async def test_spans_show_image_type_and_size_never_bytes(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await _run(tmp_path, VIEWER, "Describe", tracer_provider=provider, capture_content=True)
    spans = exporter.get_finished_spans()
    encoded = base64.b64encode(PNG).decode()
    dumped = json.dumps([attributes(s) for s in spans], default=str)
    assert encoded[:40] not in dumped
    tools = [s for s in spans if s.name == "execute_tool screenshot"]
    assert attributes(tools[0])["anabranch.tool.attachments"] == (
        f"image image/png {len(PNG)} bytes",
    )
    chats = [s for s in spans if s.name.startswith("chat")]
    assert f'"size":{len(PNG)}' in str(attributes(chats[-1])["input.value"])
