"""``@tool(clearable=...)``: clearing old tool results touches only the clearable ones.

Through the real SDK against the local server, in a small window: an agent reads pages
(large, read-type output: clearable by default) and takes checksums of them (small, dense
results). Above ``clear_at`` the old page reads become stubs with their recall handle; the
checksums declared ``clearable=False`` stay word for word. The same run with the checksums
left at the default shows that the flag is what keeps them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, AnthropicModel, Runtime, tool
from anabranch.agents import Tool
from anabranch.context._budget import is_cleared
from anabranch.errors import ToolDefinitionError
from anabranch.messages import ModelRequest, ToolResultBlock, ToolUseBlock
from anabranch.testing import FunctionModel, MessagesServer

from .compaction_helpers import FAST_RETRY, small_policy

pytestmark = pytest.mark.anyio

PAGES = 5


@tool
def read_page(n: int) -> str:
    """Read one page of the manual."""
    return f"page {n}: PAGE-{n} " + "reference text for the reader " * 40


def _digest(n: int) -> str:
    sha = hashlib.sha256(str(n).encode()).hexdigest()
    return f"page {n} sha256={sha} md5={sha[:32]} crc={sha[:8]} size={4096 + n} lines={80 + n}"


@tool(clearable=False)
def checksum(n: int) -> str:
    """Checksum of one page (dense: kept in the context)."""
    return _digest(n)


@tool(name="checksum")
def checksum_default(n: int) -> str:
    """Checksum of one page (left at the default)."""
    return _digest(n)


def _model() -> FunctionModel:
    """Reads page n, then takes its checksum, for n = 1..PAGES; then answers."""

    def answer(request: ModelRequest) -> Any:
        done = sum(1 for m in request.messages for b in m.content if isinstance(b, ToolResultBlock))
        if done >= 2 * PAGES:
            return "All pages read and checked."
        n, step = divmod(done, 2)
        name = "read_page" if step == 0 else "checksum"
        return [ToolUseBlock(id=f"toolu_{name}_{n + 1}", name=name, input={"n": n + 1})]

    return FunctionModel(answer)


async def _run(tmp_path: Path, checksum_tool: Tool) -> tuple[list[ModelRequest], list[Any]]:
    agent = Agent(
        name="reader",
        model="test-model",
        tools=[read_page, checksum_tool],
        context=small_policy(
            window=6_000,
            compact_at=0.95,
            clear_at=0.25,
            clear_tool_results_after=1,
            tool_result_max_chars=5_000,
        ),
        max_turns=30,
    )
    with anyio.fail_after(60):
        async with MessagesServer(_model()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "c.db", model=model, retry=FAST_RETRY) as rt:
                    result = await rt.run(agent, "Read the manual and checksum every page")
                    boundaries = await rt.store.list_boundaries(session_id=result.session_id)
            finally:
                await model.aclose()
    assert result.status == "done", result.error
    requests = [r.request for r in server.log if r.status == 200 and r.request is not None]
    return requests, boundaries


def _results(request: ModelRequest) -> dict[str, ToolResultBlock]:
    return {
        b.tool_use_id: b
        for m in request.messages
        for b in m.content
        if isinstance(b, ToolResultBlock)
    }


async def test_clearing_stubs_old_reads_and_keeps_dense_results(tmp_path: Path) -> None:
    requests, boundaries = await _run(tmp_path, checksum)
    assert any(b.kind == "clear" and b.status == "ok" for b in boundaries)
    last = _results(requests[-1])
    reads = [last[f"toolu_read_page_{n}"] for n in range(1, PAGES + 1)]
    checks = [last[f"toolu_checksum_{n}"] for n in range(1, PAGES + 1)]
    assert all(is_cleared(r) for r in reads[:-1]), "old page reads are cleared"
    assert all("recall id=out_" in r.content for r in reads[:-1])
    # every checksum reached the model word for word, on every request after its call
    assert [c.content for c in checks] == [_digest(n) for n in range(1, PAGES + 1)]
    for request in requests:
        for block in _results(request).values():
            if block.tool_use_id.startswith("toolu_checksum_"):
                assert not is_cleared(block)


async def test_a_checksum_left_clearable_is_cleared_like_any_result(tmp_path: Path) -> None:
    requests, _ = await _run(tmp_path, checksum_default)
    last = _results(requests[-1])
    assert any(is_cleared(last[f"toolu_checksum_{n}"]) for n in range(1, PAGES))


def test_clearable_must_be_a_bool() -> None:
    with pytest.raises(ToolDefinitionError, match="clearable must be True or False"):
        tool(clearable="no")(_digest)  # type: ignore[call-overload]
    assert read_page.clearable and not checksum.clearable
