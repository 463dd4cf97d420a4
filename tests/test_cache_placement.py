"""Breakpoint placement: at most 4, deterministic, where the design says, 1h before 5m."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from anabranch.context._cache import LOOKBACK_BLOCKS, MAX_BREAKPOINTS, place_breakpoints
from anabranch.messages import (
    Message,
    ModelRequest,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

TOOLS = tuple(
    ToolDefinition(name=f"t{i}", description="d", input_schema={"type": "object"}) for i in range(3)
)
SYSTEM = (SystemBlock(text="static"), SystemBlock(text="dynamic"))


def _tool_turn(n: int, turn: int) -> list[Message]:
    uses = tuple(ToolUseBlock(id=f"toolu_{turn}_{i}", name="t0", input={}) for i in range(n))
    results = tuple(ToolResultBlock(tool_use_id=u.id, content="ok") for u in uses)
    return [Message(role="assistant", content=uses), Message(role="user", content=results)]


def _request(messages: list[Message], system: tuple[SystemBlock, ...] = SYSTEM) -> ModelRequest:
    return ModelRequest(model="m", system=system, tools=TOOLS, messages=tuple(messages))


def test_default_places_four_breakpoints_where_stated() -> None:
    request = place_breakpoints(_request([Message.user("task"), *_tool_turn(2, 1)]), ttl="5m")
    assert request.breakpoint_count() == 4
    assert [t.cache for t in request.tools] == [None, None, "5m"]
    assert [b.cache for b in request.system] == ["5m", "5m"]
    assert request.message_breakpoints == ((2, "5m"),)


def test_existing_marks_are_replaced() -> None:
    marked = ModelRequest(
        model="m",
        system=tuple(b.model_copy(update={"cache": "1h"}) for b in SYSTEM),
        tools=tuple(t.model_copy(update={"cache": "1h"}) for t in TOOLS),
        messages=(Message.user("a"),),
        message_breakpoints=((0, "1h"),),
    )
    placed = place_breakpoints(marked, ttl="5m")
    assert placed.breakpoint_count() == 4
    assert [t.cache for t in placed.tools] == [None, None, "5m"]


def test_long_tool_turn_reanchors_the_previous_breakpoint_instead_of_the_tools() -> None:
    messages = [Message.user("task"), *_tool_turn(LOOKBACK_BLOCKS // 2 + 1, 1)]
    request = place_breakpoints(_request(messages), ttl="5m")
    assert request.breakpoint_count() == MAX_BREAKPOINTS
    assert request.message_breakpoints == ((0, "5m"), (2, "5m"))
    assert all(t.cache is None for t in request.tools)
    assert [b.cache for b in request.system] == ["5m", "5m"]


def test_short_tool_turn_needs_no_anchor() -> None:
    messages = [Message.user("task"), *_tool_turn(3, 1)]
    assert place_breakpoints(_request(messages), ttl="5m").message_breakpoints == ((2, "5m"),)


def test_one_system_block_leaves_room_for_tools_and_anchor() -> None:
    messages = [Message.user("task"), *_tool_turn(15, 1)]
    request = place_breakpoints(_request(messages, SYSTEM[:1]), ttl="5m")
    assert request.breakpoint_count() == 4
    assert request.tools[-1].cache == "5m"
    assert request.message_breakpoints == ((0, "5m"), (2, "5m"))


def test_prefix_ttl_1h_with_messages_5m() -> None:
    request = place_breakpoints(_request([Message.user("x")]), ttl="5m", prefix_ttl="1h")
    assert request.tools[-1].cache == "1h"
    assert [b.cache for b in request.system] == ["1h", "1h"]
    assert request.message_breakpoints == ((0, "5m"),)


def test_1h_never_follows_5m() -> None:
    request = place_breakpoints(_request([Message.user("x")]), ttl="1h", prefix_ttl="5m")
    assert request.message_breakpoints == ((0, "5m"),)


def test_no_ttl_removes_every_breakpoint() -> None:
    marked = place_breakpoints(_request([Message.user("x")]), ttl="5m")
    assert place_breakpoints(marked, ttl=None).breakpoint_count() == 0


def test_empty_last_text_block_gets_no_breakpoint() -> None:
    messages = [Message.user("x"), Message(role="assistant", content=(TextBlock(text=""),))]
    request = place_breakpoints(_request(messages), ttl="5m")
    assert request.message_breakpoints == ()


@st.composite
def requests(draw: st.DrawFn) -> ModelRequest:
    n_tools = draw(st.integers(0, 4))
    n_system = draw(st.integers(0, 3))
    messages = [Message.user("task")]
    for turn in range(draw(st.integers(0, 4))):
        messages += _tool_turn(draw(st.integers(1, 30)), turn)
    return ModelRequest(
        model="m",
        system=tuple(SystemBlock(text=f"s{i}") for i in range(n_system)),
        tools=TOOLS[:n_tools],
        messages=tuple(messages),
    )


@settings(max_examples=150, deadline=None)
@given(
    requests(),
    st.sampled_from(["5m", "1h"]),
    st.sampled_from([None, "5m", "1h"]),
)
def test_placement_invariants(request: ModelRequest, ttl: str, prefix_ttl: str | None) -> None:
    placed = place_breakpoints(request, ttl=ttl, prefix_ttl=prefix_ttl)  # type: ignore[arg-type]
    assert placed.breakpoint_count() <= MAX_BREAKPOINTS
    assert placed == place_breakpoints(request, ttl=ttl, prefix_ttl=prefix_ttl)  # type: ignore[arg-type]
    assert placed.message_breakpoints[-1][0] == len(request.messages) - 1
    ttls = [t.cache for t in placed.tools if t.cache]
    ttls += [b.cache for b in placed.system if b.cache]
    ttls += [ttl_ for _, ttl_ in placed.message_breakpoints]
    first_5m = ttls.index("5m") if "5m" in ttls else len(ttls)
    assert "1h" not in ttls[first_5m:], "1h entries must come before 5m entries"
    if request.system:
        assert placed.system[0].cache is not None
    assert placed.messages == request.messages


def _can_carry(message: Message) -> bool:
    """A message whose last block is no thinking and no empty text."""
    if not message.content:
        return False
    block = message.content[-1]
    return not isinstance(block, ThinkingBlock) and block != TextBlock(text="")


def _by_priority(
    request: ModelRequest, ttl: str | None, prefix_ttl: str | None
) -> tuple[list[str | None], list[str | None], tuple[tuple[int, str], ...]]:
    """The placement as the design states it, from scratch: in priority order the last
    message (if it can carry one), the first and the last system block, the previous
    call's breakpoint when more than ``LOOKBACK_BLOCKS`` blocks follow it, the tool list;
    the first four of those."""
    if ttl is None:
        return [None] * len(request.tools), [None] * len(request.system), ()
    messages, wanted = request.messages, []
    if messages and _can_carry(messages[-1]):
        wanted.append(("message", len(messages) - 1))
    if request.system:
        wanted.append(("system", 0))
    if len(request.system) > 1:
        wanted.append(("system", len(request.system) - 1))
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if assistants and assistants[-1] > 0:
        anchor = assistants[-1] - 1
        blocks = sum(len(m.content) for m in messages[anchor + 1 :])
        if blocks >= LOOKBACK_BLOCKS and _can_carry(messages[anchor]):
            wanted.append(("message", anchor))
    if request.tools:
        wanted.append(("tool", len(request.tools) - 1))
    chosen = wanted[:MAX_BREAKPOINTS]
    head = prefix_ttl or ttl
    tools = [head if ("tool", i) in chosen else None for i in range(len(request.tools))]
    system = [head if ("system", i) in chosen else None for i in range(len(request.system))]
    sent = "5m" if head == "5m" else ttl
    return tools, system, tuple(sorted((i, sent) for kind, i in chosen if kind == "message"))


@st.composite
def contexts(draw: st.DrawFn) -> ModelRequest:
    request = draw(requests())
    ending = draw(st.sampled_from(["none", "text", "empty", "thinking"]))
    extra = {
        "none": (),
        "text": (TextBlock(text="done"),),
        "empty": (TextBlock(text=""),),
        "thinking": (ThinkingBlock(thinking="hm", signature="s"),),
    }[ending]
    if not extra:
        return request
    answer = Message(role="assistant", content=extra)
    return request.model_copy(update={"messages": (*request.messages, answer)})


@settings(max_examples=200, deadline=None)
@given(
    contexts(),
    st.sampled_from([None, "5m", "1h"]),
    st.sampled_from([None, "5m", "1h"]),
)
def test_placement_follows_the_stated_priorities(
    request: ModelRequest, ttl: str | None, prefix_ttl: str | None
) -> None:
    placed = place_breakpoints(request, ttl=ttl, prefix_ttl=prefix_ttl)  # type: ignore[arg-type]
    tools, system, marks = _by_priority(request, ttl, prefix_ttl)
    assert [t.cache for t in placed.tools] == tools
    assert [b.cache for b in placed.system] == system
    assert placed.message_breakpoints == marks
