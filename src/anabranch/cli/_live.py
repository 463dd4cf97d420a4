"""The live tree ``anabranch run`` draws on a terminal (rich): one row per run with its
status, turn, a context bar against threshold and window, compactions, tokens, cost so
far and retries, updated as events arrive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text
from rich.tree import Tree

from anabranch import events as ev

__all__ = ["LiveTree", "RunState", "context_bar"]

BAR_WIDTH = 20


def _k(tokens: float) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else f"{tokens:.0f}"


def context_bar(tokens: int, threshold: int, window: int, width: int = BAR_WIDTH) -> Text:
    """``[██████····|·····]`` : filled to ``tokens``, ``|`` at the threshold, ends at the window."""
    window = max(window, 1)
    filled = min(width, round(width * tokens / window))
    mark = min(width - 1, round(width * threshold / window)) if threshold else None
    bar = Text("[")
    colour = "red" if threshold and tokens >= threshold else "green"
    for i in range(width):
        if i == mark:
            bar.append("|", style="yellow")
        elif i < filled:
            bar.append("█", style=colour)
        else:
            bar.append("·", style="dim")
    bar.append("]")
    return bar


@dataclass
class RunState:
    """What the tree shows for one run."""

    run_id: str
    agent: str
    parent: str | None
    status: str = "running"
    turn: int = 0
    window: int = 0
    threshold: int = 0
    context: int = 0
    compactions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    retries: int = 0
    note: str = ""
    children: list[str] = field(default_factory=list)

    def line(self) -> Text:
        text = Text()
        style = {"done": "green", "failed": "red", "waiting": "yellow"}.get(self.status, "cyan")
        text.append(f"{self.agent} ", style="bold")
        text.append(f"[{self.status}] ", style=style)
        text.append(f"turn {self.turn} ")
        if self.window:
            text.append_text(context_bar(self.context, self.threshold, self.window))
            text.append(f" {_k(self.context)}/{_k(self.window)} ")
        text.append(
            f"compactions {self.compactions}  in {_k(self.input_tokens)} "
            f"out {_k(self.output_tokens)}  ${self.cost:.4f}"
        )
        if self.retries:
            text.append(f"  retries {self.retries}", style="yellow")
        if self.note:
            text.append(f"  {self.note}", style="dim")
        return text


class LiveTree:
    """An ``on_event`` callback that keeps a rich ``Live`` tree of the session's runs."""

    def __init__(self, out: TextIO, *, force_terminal: bool | None = None) -> None:
        self.console = Console(file=out, force_terminal=force_terminal)
        self.runs: dict[str, RunState] = {}
        self.roots: list[str] = []
        self._live = Live(console=self.console, auto_refresh=False, transient=False)
        self._started = False

    def render(self) -> Tree:
        tree = Tree("session", guide_style="dim")

        def add(branch: Tree, run_id: str) -> None:
            state = self.runs[run_id]
            node = branch.add(state.line())
            for child in state.children:
                add(node, child)

        for root in self.roots:
            add(tree, root)
        return tree

    def __call__(self, event: Any) -> None:
        self.apply(event)
        if not self._started:
            self._live.start()
            self._started = True
        self._live.update(self.render(), refresh=True)
        if isinstance(event, ev.SessionFinished):
            self.close()

    def close(self) -> None:
        if self._started:
            self._live.stop()
            self._started = False

    def apply(self, event: Any) -> None:
        """Fold one event into the tree's state."""
        if event.run_id is None:
            return
        state = self.runs.get(event.run_id)
        if state is None:
            state = RunState(event.run_id, event.agent or "?", event.parent_run_id)
            self.runs[event.run_id] = state
            parent = self.runs.get(event.parent_run_id) if event.parent_run_id else None
            if parent is not None:
                parent.children.append(event.run_id)
            else:
                self.roots.append(event.run_id)
        _fold(state, event)


def _fold(state: RunState, event: Any) -> None:
    if isinstance(event, ev.RunStarted):
        state.status, state.turn = "running", event.turns
        state.window, state.threshold = event.window, event.threshold
    elif isinstance(event, ev.ModelCallStarted) and event.purpose is None:
        state.turn, state.context = event.turn, event.context_tokens
        state.note = "calling the model"
    elif isinstance(event, ev.ModelCallFinished):
        state.input_tokens += event.usage.total_input_tokens
        state.output_tokens += event.usage.output_tokens
        state.cost += event.cost or 0.0
        if event.purpose is None and event.ok:
            state.context = event.usage.total_input_tokens + event.usage.output_tokens
        state.note = ""
    elif isinstance(event, ev.ToolCallStarted):
        state.note = f"running {event.tool}"
    elif isinstance(event, ev.CompactionStarted):
        state.note = "compacting"
    elif isinstance(event, ev.CompactionFinished):
        _fold_compaction(state, event)
    elif isinstance(event, ev.Retry):
        state.retries += 1
        state.note = f"retry: {event.error_type}"
    elif isinstance(event, ev.ApprovalRequested):
        state.status, state.note = "waiting", f"approve {event.tool} ({event.call_id})"
    elif isinstance(event, ev.RunFinished):
        state.status, state.turn, state.note = event.status, event.turns, ""


def _fold_compaction(state: RunState, event: ev.CompactionFinished) -> None:
    if event.status == "ok" and event.boundary_kind == "compaction":
        state.compactions += 1
    if event.tokens_after is not None:
        state.context = event.tokens_after
    state.note = f"compacted {_k(event.tokens_before or 0)} → {_k(event.tokens_after or 0)}"
