"""The built-in ``recall`` tool and the FTS5 history index behind it."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from anabranch import Agent, ContextPolicy, Runtime, ToolContext, tool
from anabranch.context._pairing import pairing_violations
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._recall import RecallTool
from anabranch.store import SQLiteStore
from anabranch.store.sqlite._schema import APP_ID, MIGRATIONS
from anabranch.testing import FunctionModel
from anabranch.testing._models import is_summary_request

from .compaction_helpers import Checked, huge, small_agent

pytestmark = pytest.mark.anyio


async def _loaded_run(rt: Runtime, session_id: str, agent: Agent) -> AgentRun:
    runs = await rt.store.list_runs(session_id)
    root = next(r for r in runs if r.parent_run_id is None)
    return await AgentRun.load(rt.environment(session_id), agent, root)


async def _recall(run: AgentRun, **arguments: Any) -> ToolOutcome:
    return await RecallTool().run(
        run, ToolUseBlock(id="toolu_recall", name="recall", input=arguments)
    )


@tool
def notes(topic: str, ctx: ToolContext) -> str:
    """Read the field notes."""
    return f"field notes ({ctx.call_id}): the albatross flies south; " + "filler words " * 40


async def test_search_reaches_compacted_messages_and_fetches_their_originals(
    tmp_path: Path,
) -> None:
    agent = Agent(
        name="worker",
        model="test-model",
        tools=[notes],
        context=small_agent().context,
        max_turns=60,
    )
    checked = Checked(rounds=12)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Investigate the zanzibar migration routes")
        run = await _loaded_run(rt, result.session_id, agent)
        assert run.compactions >= 2
        assert "zanzibar" not in " ".join(m.text for m in run.context[1:-1])
        found = await _recall(run, query="zanzibar migration")
        assert not found.is_error
        ids = re.findall(r"id=(msg-\d+)", found.content)
        assert "msg-0" in ids
        original = await _recall(run, id="msg-0")
        assert original.content == "(user)\nInvestigate the zanzibar migration routes"
        # every compacted tool result is searchable too
        hits = await _recall(run, query="albatross", limit=20)
        assert len(re.findall(r"id=msg-\d+", hits.content)) >= 10
        first_result = await _recall(run, id="msg-2")
        assert "[tool result id=" in first_result.content and "albatross" in first_result.content
        missing = await _recall(run, query="pelican")
        assert "No match" in missing.content


async def test_a_spilled_output_comes_back_page_by_page(tmp_path: Path) -> None:
    agent = Agent(
        name="reader",
        model="test-model",
        tools=[huge],
        context=ContextPolicy(tool_result_max_chars=3000, tool_result_preview_chars=200),
    )
    checked = Checked(rounds=1)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Read it")
        run = await _loaded_run(rt, result.session_id, agent)
        inline = run.context[2].tool_results[0].content
        handle = re.search(r"recall id=(out_[0-9a-f]+)", inline)
        assert handle
        pages, offset = [], 0
        while True:
            page = await _recall(run, id=handle.group(1), offset=offset)
            assert len(page.content) <= 3000  # fits inline: never spilled again
            more = re.search(
                r"\n\[[\d,]+ more characters: recall id=\S+ offset=(\d+)\]$", page.content
            )
            if more is None:
                pages.append(page.content)
                break
            pages.append(page.content[: more.start()])
            offset = int(more.group(1))
        spilled = await rt.store.get_spill(handle.group(1))
    assert "".join(pages) == spilled
    assert spilled is not None and spilled.startswith("BEGIN") and spilled.endswith("END")
    assert len(pages) >= 4


async def test_recall_reaches_reports_in_the_session_but_not_other_sessions(
    tmp_path: Path,
) -> None:
    agent = small_agent()
    async with Runtime(db=tmp_path / "r.db", model=Checked(rounds=1).model) as rt:
        first = await rt.run(agent, "first")
        second = await rt.run(agent, "second")
        # what a spawn_agent report cap stores: the full text under its own handle
        await rt.store.save_spill("rep_full_report", first.run_id, "toolu_x", "the full report")
        run_a = await _loaded_run(rt, first.session_id, agent)
        run_b = await _loaded_run(rt, second.session_id, agent)
        own = await _recall(run_a, id="rep_full_report")
        other = await _recall(run_b, id="rep_full_report")
    assert own.content == "the full report" and not own.is_error
    assert other.is_error and "Nothing is stored" in other.content


async def test_recall_explains_bad_arguments(tmp_path: Path) -> None:
    agent = small_agent()
    async with Runtime(db=tmp_path / "r.db", model=Checked(rounds=1).model) as rt:
        result = await rt.run(agent, "task")
        run = await _loaded_run(rt, result.session_id, agent)
        empty = await _recall(run)
        unknown_field = await _recall(run, handle="x")
        bad_limit = await _recall(run, query="x", limit=0)
        past_end = await _recall(run, id="msg-0", offset=10_000)
        unknown = await _recall(run, id="msg-999")
    assert empty.is_error and "`id`" in empty.content
    assert unknown_field.is_error and bad_limit.is_error
    assert not past_end.is_error and "past the end" in past_end.content
    assert unknown.is_error


async def test_a_model_recalls_what_was_truncated(tmp_path: Path) -> None:
    agent = Agent(
        name="reader",
        model="test-model",
        tools=[huge],
        context=ContextPolicy(tool_result_max_chars=1500, tool_result_preview_chars=100),
    )

    def model(request: ModelRequest) -> Any:
        assert pairing_violations(request.messages) == []
        assert "recall" in [t.name for t in request.tools]
        last = request.messages[-1]
        if len(request.messages) == 1:
            return [ToolUseBlock(id="toolu_1", name="huge", input={"topic": "t"})]
        handle = re.search(r"recall id=(out_[0-9a-f]+)", last.tool_results[0].content)
        if handle and len(request.messages) == 3:
            return [ToolUseBlock(id="toolu_2", name="recall", input={"id": handle.group(1)})]
        content = last.tool_results[0].content
        return [TextBlock(text=f"got {len(content)} characters from {content[:5]}")]

    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(model)) as rt:
        result = await rt.run(agent, "Read it all")
    got = re.fullmatch(r"got (\d+) characters from BEGIN", result.output)
    assert got, result.output
    assert 1300 <= int(got.group(1)) <= 1500  # a full page (not the preview), still inline


async def test_the_history_index_is_built_for_an_existing_v1_database(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    db = sqlite_utils.Database(conn)
    MIGRATIONS[0](db)
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('app', ?), ('schema_version', '1')", (APP_ID,)
    )
    conn.execute(
        "INSERT INTO messages(run_id, seq, role, content, kind, created) "
        "VALUES ('run_old', 0, 'user', ?, 'message', 0)",
        ('[{"type":"text","text":"the quokka report"}]',),
    )
    conn.execute(
        "INSERT INTO spills(handle, run_id, call_id, content, created) "
        "VALUES ('out_1', 'run_old', 't', 'quokka data', 0)"
    )
    conn.commit()
    conn.close()
    store = await SQLiteStore.open(path)
    try:
        hits = await store.search_history("run_old", "quokka")
        version = await store.query("SELECT value FROM meta WHERE key = 'schema_version'")
    finally:
        await store.close()
    assert {(h.source, h.ref) for h in hits} == {("message", "0"), ("spill", "out_1")}
    assert version == [{"value": str(len(MIGRATIONS))}]


async def test_a_parent_recalls_the_full_report_of_a_sub_agent(tmp_path: Path) -> None:
    """spawn_agent cuts long reports and names a handle; recall returns the whole report."""
    child = Agent(name="child", model="child-model", max_report_tokens=50)
    parent = Agent(name="parent", model="parent-model", subagents=[child])
    full_report = "FINDINGS " + "the river floods in spring; " * 60 + "END"

    def model(request: ModelRequest) -> Any:
        assert pairing_violations(request.messages) == []
        if request.model == "child-model":
            return full_report
        last = request.messages[-1]
        if len(request.messages) == 1:
            spawn = {"agent": "child", "task": "Find out when the river floods."}
            return [ToolUseBlock(id="toolu_spawn", name="spawn_agent", input=spawn)]
        handle = re.search(r"full report: recall id=(\S+?)\]", last.tool_results[0].content)
        if len(request.messages) == 3:
            assert handle, last.tool_results[0].content
            return [ToolUseBlock(id="toolu_recall", name="recall", input={"id": handle.group(1)})]
        return last.tool_results[0].content

    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(model)) as rt:
        result = await rt.run(parent, "When does the river flood?")
    assert result.output == full_report


@tool
def survey(topic: str) -> str:
    """Survey one site."""
    return f"site {topic}: the marker zebra{topic} was logged; " + "filler words " * 50


async def test_search_finds_stored_content_not_its_own_call(tmp_path: Path) -> None:
    """The assistant turn holding the query is indexed too; recall leaves it (and its own
    earlier calls and results) out, falls back to any word, and returns the content."""
    agent = Agent(
        name="surveyor",
        model="test-model",
        tools=[survey],
        context=small_agent().context,
        max_turns=20,
    )

    issued = {"surveys": 0, "recalled": False}

    def model(request: ModelRequest) -> Any:
        if is_summary_request(request):
            return "<summary>surveyed some sites</summary>"
        if issued["recalled"]:
            return [TextBlock(text="RECALLED " + request.messages[-1].tool_results[0].content)]
        if issued["surveys"] < 4:
            issued["surveys"] += 1
            n = issued["surveys"]
            return [ToolUseBlock(id=f"toolu_s{n}", name="survey", input={"topic": str(n)})]
        issued["recalled"] = True
        query = "where exactly was zebra1 logged earlier"
        return [ToolUseBlock(id="toolu_r", name="recall", input={"query": query})]

    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(model)) as rt:
        result = await rt.run(agent, "Survey the sites")
        boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    assert any(b.kind == "compaction" and b.status == "ok" for b in boundaries)
    assert result.output.startswith("RECALLED "), result.output
    lines = result.output.splitlines()
    # best first: the stored tool output naming zebra1 (it matches the most words)
    assert "[zebra1]" in lines[1] and "id=msg-2 " in lines[1], result.output
    # the turn holding the query is not a hit (it would match every word)
    assert not any("where" in line or "exactly" in line for line in lines[1:]), result.output
