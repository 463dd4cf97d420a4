"""Pure compaction logic: splits, strategies, budgets and layouts never break the API rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anabranch.context._budget import (
    clear_tool_results,
    is_cleared,
    preview,
    spill_handle,
)
from anabranch.context._compaction import (
    Split,
    SummaryError,
    choose_split,
    cleared_context,
    context_violations,
    extract_summary,
    is_compaction_message,
    split_points,
    summarized_context,
    summary_request,
    verbatim_context,
    windowed_context,
)
from anabranch.context._layout import close_ranges, encode_layout, expand_ranges
from anabranch.context._pairing import pairing_violations
from anabranch.context._tokens import estimate_messages
from anabranch.messages import (
    Block,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

words = st.text(alphabet="abcdefgh ", min_size=1, max_size=60).map(lambda s: s.strip() or "x")


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """A valid context ending on a user turn: parallel tool calls, errors, new requests."""
    ids = itertools.count()
    messages = [Message.user(draw(words))]
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.booleans()) or len(messages) == 1:
            uses = [
                ToolUseBlock(id=f"toolu_{next(ids)}", name=draw(st.sampled_from("abc")), input={})
                for _ in range(draw(st.integers(1, 4)))
            ]
            lead: list[Block] = [TextBlock(text=draw(words))] if draw(st.booleans()) else []
            messages.append(Message(role="assistant", content=(*lead, *uses)))
            results: list[Block] = [
                ToolResultBlock(
                    tool_use_id=u.id,
                    content=draw(words) * draw(st.integers(1, 30)),
                    is_error=draw(st.booleans()),
                )
                for u in draw(st.permutations(uses))
            ]
            if draw(st.booleans()):
                results.append(TextBlock(text=draw(words)))
            messages.append(Message(role="user", content=tuple(results)))
        else:
            messages.append(Message(role="assistant", content=(TextBlock(text=draw(words)),)))
            messages.append(Message.user(draw(words)))
    if draw(st.booleans()) and len(messages) > 2:
        split = Split.at(messages, split_points(messages)[0])
        messages = list(summarized_context(split, "earlier work").messages)
    assert pairing_violations(messages) == []
    return messages


def _check_rebuilt(
    old: list[Message], messages: tuple[Message, ...], sources: tuple[int | None, ...]
) -> None:
    assert context_violations(messages) == []
    assert len(sources) == len(messages)
    for message, source in zip(messages, sources, strict=True):
        if source is not None:
            assert old[source] == message


# ------------------------------------------------------------------ properties
@PROPERTY
@given(histories())
def test_every_split_point_gives_valid_contexts_for_every_strategy(messages: list[Message]) -> None:
    for index in split_points(messages):
        split = Split.at(messages, index)
        assert split.head + ((split.carry,) if split.carry else ()) + split.tail == tuple(messages)
        for rebuilt in (
            summarized_context(split, "the summary"),
            windowed_context(split),
            verbatim_context(split, "run_1"),
        ):
            _check_rebuilt(messages, rebuilt.messages, rebuilt.sources)
            assert is_compaction_message(rebuilt.messages[0])
            assert rebuilt.messages[-len(split.tail) :] == split.tail if split.tail else True


@PROPERTY
@given(histories(), st.integers(0, 12), st.integers(0, 3000))
def test_chosen_split_respects_limits_or_keeps_the_fewest(
    messages: list[Message], keep: int, max_tail: int
) -> None:
    split = choose_split(messages, keep_recent=keep, max_tail_tokens=max_tail)
    points = split_points(messages)
    if not points:
        assert split is None
        return
    assert split is not None
    fits = split.kept <= keep and estimate_messages(messages[split.index :]) <= max_tail
    assert fits or split.index == points[-1]
    _check_rebuilt(messages, *_as_pair(summarized_context(split, "s")))


def _as_pair(rebuilt: object) -> tuple[tuple[Message, ...], tuple[int | None, ...]]:
    return rebuilt.messages, rebuilt.sources  # type: ignore[attr-defined]


@PROPERTY
@given(histories(), st.integers(0, 6))
def test_clearing_keeps_structure_and_the_last_k_results(
    messages: list[Message], keep: int
) -> None:
    rebuilt = cleared_context(messages, keep_last=keep, run_id="run_1")
    _check_rebuilt(messages, rebuilt.messages, rebuilt.sources)
    assert [m.role for m in rebuilt.messages] == [m.role for m in messages]
    old_results = [r for m in messages for r in m.tool_results]
    new_results = [r for m in rebuilt.messages for r in m.tool_results]
    assert [r.tool_use_id for r in new_results] == [r.tool_use_id for r in old_results]
    if keep:
        assert new_results[-keep:] == old_results[-keep:]
    for spill in rebuilt.spills:
        assert spill.handle == spill_handle("run_1", spill.call_id)
    again = cleared_context(rebuilt.messages, keep_last=keep, run_id="run_1")
    assert again.messages == rebuilt.messages and not again.spills


@PROPERTY
@given(histories())
def test_summarizer_input_is_valid_api_input(messages: list[Message]) -> None:
    for index in split_points(messages):
        head = list(Split.at(messages, index).head)
        request = summary_request(head, "keep ids")
        assert pairing_violations(request) == []
        assert "<summary>" in request[-1].text
        assert request[-1].text.rstrip().endswith("keep ids")


@PROPERTY
@given(histories(), st.data())
def test_layout_encoding_round_trips(messages: list[Message], data: st.DataObject) -> None:
    """Whatever mix of stored and derived messages a context has, its layout rebuilds it."""
    stored = {seq: m for seq, m in enumerate(messages)}
    next_seq = len(messages)
    seqs: list[int | None] = [
        None if data.draw(st.booleans()) else seq for seq in range(len(messages))
    ]
    layout = encode_layout(messages, seqs, next_seq)
    for offset, message in enumerate(layout.new_rows):
        stored[layout.first_new_seq + offset] = message
    rebuilt = list(layout.prefix)
    for first, last in layout.ranges:
        end = layout.next_seq - 1 if last is None else last
        rebuilt.extend(stored[s] for s in range(first, end + 1))
    assert rebuilt == messages
    assert layout.ranges[-1][1] is None
    positions = expand_ranges(len(layout.prefix), layout.ranges, layout.next_seq)
    assert len(positions) == len(messages)
    # a message appended later joins the open range
    stored[layout.next_seq] = Message.user("later")
    later = expand_ranges(len(layout.prefix), layout.ranges, layout.next_seq + 1)
    assert later[-1] == layout.next_seq


# ------------------------------------------------------------------ examples
def _tool_turn(call_id: str, output: str) -> list[Message]:
    use = ToolUseBlock(id=call_id, name="fetch", input={"url": "u"})
    return [
        Message(role="assistant", content=(use,)),
        Message(role="user", content=(ToolResultBlock(tool_use_id=call_id, content=output),)),
    ]


def test_summary_opening_is_marked_and_the_tail_starts_on_an_assistant_turn() -> None:
    messages = [Message.user("task"), *_tool_turn("t1", "a" * 50), *_tool_turn("t2", "b")]
    split = choose_split(messages, keep_recent=2, max_tail_tokens=10_000)
    assert split is not None and split.index == 3
    rebuilt = summarized_context(split, "Request: task")
    opening = rebuilt.messages[0]
    assert opening.role == "user" and is_compaction_message(opening)
    assert 'strategy="summarize" replaced_messages="3"' in opening.text
    assert "Request: task" in opening.text
    assert rebuilt.messages[1].role == "assistant"
    assert rebuilt.sources == (None, 3, 4)
    assert rebuilt.kept == 2


def test_a_split_on_a_plain_user_turn_merges_it_into_the_opening() -> None:
    messages = [
        Message.user("first task"),
        Message(role="assistant", content=(TextBlock(text="done"),)),
        Message.user("second task"),
    ]
    split = Split.at(messages, 2)
    assert split.carry == messages[2] and split.tail == ()
    rebuilt = summarized_context(split, "first task was done")
    assert len(rebuilt.messages) == 1
    assert rebuilt.messages[0].content[-1] == TextBlock(text="second task")
    assert context_violations(rebuilt.messages) == []


def test_nested_compactions_count_every_original_message() -> None:
    messages = [Message.user("task"), *_tool_turn("t1", "x"), *_tool_turn("t2", "y")]
    first = summarized_context(Split.at(messages, 3), "s1")
    again = [*first.messages, *_tool_turn("t3", "z")]
    second = summarized_context(Split.at(list(again), 3), "s2")
    assert 'replaced_messages="5"' in second.messages[0].text  # 3 + assistant + user


def test_cannot_split_inside_a_tool_pair() -> None:
    messages = [Message.user("task"), *_tool_turn("t1", "x")]
    with pytest.raises(ValueError, match="tool pair"):
        Split.at(messages, 2)
    assert split_points(messages) == [1]


def test_a_lone_previous_opening_is_not_compacted_again() -> None:
    messages = [Message.user("task"), *_tool_turn("t1", "x"), *_tool_turn("t2", "y")]
    compacted = list(summarized_context(Split.at(messages, 3), "s").messages)
    assert split_points(compacted) == []  # only the opening could be replaced


def test_window_keeps_the_first_request_and_verbatim_keeps_prose() -> None:
    messages = [
        Message.user("Find the bug in parser.py"),
        Message(
            role="assistant",
            content=(
                TextBlock(text="Let me read it."),
                ToolUseBlock(id="t1", name="read", input={"p": "parser.py"}),
            ),
        ),
        Message(role="user", content=(ToolResultBlock(tool_use_id="t1", content="x" * 500),)),
        *_tool_turn("t2", "y"),
    ]
    split = Split.at(messages, 3)
    window = windowed_context(split)
    assert "Find the bug in parser.py" in window.messages[0].text
    assert 'dropped_messages="2"' in window.messages[0].text
    verbatim = verbatim_context(split, "run_1")
    prose = [b.text for m in verbatim.messages for b in m.content if isinstance(b, TextBlock)]
    assert "Find the bug in parser.py" in prose and "Let me read it." in prose
    assert not verbatim.messages[1].tool_uses and not verbatim.messages[2].tool_results
    handle = spill_handle("run_1", "t1")
    assert f"recall id={handle}" in verbatim.messages[2].text
    assert [(s.call_id, s.content) for s in verbatim.spills] == [("t1", "x" * 500)]
    assert verbatim.messages[3:] == tuple(messages[3:])


def test_preview_keeps_the_head_and_errors_keep_head_and_tail() -> None:
    content = "HEAD" + "." * 1000 + "TAIL"
    assert preview(content, is_error=False, max_chars=2000, preview_chars=100, handle="h") is None
    ok = preview(content, is_error=False, max_chars=500, preview_chars=100, handle="out_1")
    assert ok is not None and ok.startswith("HEAD") and "TAIL" not in ok
    assert "recall id=out_1" in ok and "1,008" in ok
    error = preview(content, is_error=True, max_chars=500, preview_chars=100, handle="out_2")
    assert error is not None and error.startswith("HEAD") and error.endswith("TAIL")
    assert "recall id=out_2" in error
    assert len(error) < 300


def test_spill_handles_are_deterministic_and_distinct() -> None:
    assert spill_handle("run_a", "t1") == spill_handle("run_a", "t1")
    assert spill_handle("run_a", "t1") != spill_handle("run_b", "t1")
    assert spill_handle("run_a", "t1") != spill_handle("run_a", "t2")


def test_clear_skips_results_shorter_than_their_stub() -> None:
    messages = [Message.user("task"), *_tool_turn("t1", "short"), *_tool_turn("t2", "z" * 400)]
    cleared, spills = clear_tool_results(messages, keep_last=0, run_id="r")
    assert cleared[2] is messages[2]
    assert is_cleared(cleared[4].tool_results[0])
    assert [s.call_id for s in spills] == ["t2"]


def test_extract_summary_drops_the_analysis() -> None:
    text = "<analysis>thinking</analysis>\n<summary>\nRequest: x\n</summary>"
    assert extract_summary(text) == "Request: x"
    assert (
        extract_summary("<analysis>a</analysis><summary>cut off by max_tok") == "cut off by max_tok"
    )
    assert extract_summary("plain summary without tags") == "plain summary without tags"
    with pytest.raises(SummaryError):
        extract_summary("<analysis>only thinking</analysis>")
    with pytest.raises(SummaryError):
        extract_summary("   ")


def test_close_ranges_cuts_the_open_range() -> None:
    assert close_ranges([[0, 3], [7, None]], 10) == [(0, 3), (7, 9)]
    assert close_ranges([[7, None]], 7) == []


def test_context_violations_reports_a_misplaced_opening() -> None:
    messages = [Message.user("task"), *_tool_turn("t1", "x"), *_tool_turn("t2", "y")]
    opening = summarized_context(Split.at(messages, 3), "s").messages[0]
    bad = [Message.user("task"), Message(role="assistant", content=(TextBlock(text="a"),)), opening]
    assert any("must come first" in p for p in context_violations(bad))
