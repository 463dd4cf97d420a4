"""``CompactionStep``: a run's view advanced by the commits a pipeline step has decided.

A step may decide several things in a row (clear old results, then compact; a failed
attempt, the breaker opening, then the fallback): each later decision must see the context
the earlier ones leave, before the loop has committed any of them. ``CompactionStep`` is
that view (it implements ``ContextView``), plus the ordered list of ``BoundaryCommit`` it
returns as one ``ContextChange``. It belongs to one pipeline call and never to the run.

``boundary_commit`` turns a rebuilt context into the commit the loop persists: spills,
then the boundary row with its derived messages (one transaction), then the new context.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from anyio.abc import TaskGroup

from anabranch.agents import Agent
from anabranch.context._compaction import Rebuilt
from anabranch.context._content import attachments_handle, attachments_to_json
from anabranch.context._digest import Manifest
from anabranch.context._layout import encode_layout, expand_ranges
from anabranch.context._tokens import estimate_request
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    SystemBlock,
    ToolDefinition,
    messages_to_json,
)
from anabranch.runtime._context_view import (
    BoundaryCommit,
    ContextChange,
    ContextStore,
    ContextView,
    SpillWrite,
)
from anabranch.runtime._history import boundary_prefix, boundary_ranges, message_records
from anabranch.runtime._thinking_view import floor_after_compaction
from anabranch.store import BoundaryRecord
from anabranch.traces import Tracing

__all__ = ["CompactionStep", "boundary_commit", "manifest_of"]


class CompactionStep:
    """``view`` as it will be once the commits decided so far are applied."""

    def __init__(self, view: ContextView) -> None:
        self.view = view
        self._context = tuple(view.context)
        self._next_seq = view.next_seq
        self._tokens = view.context_tokens
        self._compactions = view.compactions
        self._floor = view.thinking_floor
        self._seqs: list[int | None] | None = None
        self._commits: list[BoundaryCommit] = []
        self._rebuild = False

    # ------------------------------------------------------------------ ContextView
    @property
    def id(self) -> str:
        return self.view.id

    @property
    def session_id(self) -> str:
        return self.view.session_id

    @property
    def agent(self) -> Agent:
        return self.view.agent

    @property
    def system(self) -> tuple[SystemBlock, ...]:
        return self.view.system

    @property
    def tools(self) -> tuple[ToolDefinition, ...]:
        return self.view.tools

    @property
    def context(self) -> tuple[Message, ...]:
        return self._context

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def compactions(self) -> int:
        return self._compactions

    @property
    def thinking_floor(self) -> int:
        return self._floor

    @property
    def context_tokens(self) -> int:
        return self._tokens

    @property
    def threshold(self) -> int:
        return self.view.threshold

    @property
    def channel(self) -> str | None:
        return self.view.channel

    @property
    def configured_window(self) -> int | None:
        return self.view.configured_window

    @property
    def served_model(self) -> str | None:
        return self.view.served_model

    @property
    def background(self) -> TaskGroup | None:
        return self.view.background

    @property
    def store(self) -> ContextStore:
        return self.view.store

    @property
    def tracing(self) -> Tracing:
        return self.view.tracing

    def estimate_tokens(self, context: Sequence[Message]) -> int:
        return self.view.estimate_tokens(context)

    def clearable(self, tool_name: str) -> bool:
        return self.view.clearable(tool_name)

    async def call_summarizer(
        self, request: ModelRequest, *, purpose: str = "compaction"
    ) -> ModelResponse:
        return await self.view.call_summarizer(request, purpose=purpose)

    # ------------------------------------------------------------------ pending
    async def context_seqs(self) -> list[int | None]:
        """The stored seq of every message in ``context`` (``None``: derived)."""
        if self._seqs is None:
            boundary = await self.store.latest_boundary(self.id)
            if boundary is None:
                self._seqs = list(range(self.next_seq))
            else:
                prefix = boundary_prefix(boundary)
                self._seqs = expand_ranges(len(prefix), boundary_ranges(boundary), self.next_seq)
        if len(self._seqs) != len(self._context):
            raise RuntimeError(
                f"run {self.id}: context has {len(self._context)} messages but the store "
                f"describes {len(self._seqs)}"
            )
        return list(self._seqs)

    async def boundaries(self) -> list[BoundaryRecord]:
        """The run's boundary rows: the stored ones, then those decided in this step."""
        stored = await self.store.list_boundaries(run_id=self.id)
        return stored + [commit.boundary for commit in self._commits]

    def pending_spills(self) -> dict[str, str]:
        """Spills decided in this step, by handle (not yet in the store)."""
        return {s.handle: s.content for c in self._commits for s in c.spills}

    def record(self, boundary: BoundaryRecord) -> None:
        """A row that leaves the context as it is (a failed attempt, the breaker opening)."""
        self._commits.append(BoundaryCommit(boundary=boundary))

    def apply(self, commit: BoundaryCommit, seqs: list[int | None], *, rebuild: bool) -> None:
        """Take ``commit``'s context as the one later decisions see."""
        assert commit.context is not None and commit.next_seq is not None
        self._commits.append(commit)
        self._floor = floor_after_compaction(self._context, commit.context, self._floor)
        self._context = commit.context
        self._next_seq = commit.next_seq
        self._seqs = seqs
        self._tokens = self.view.estimate_tokens(commit.context)
        self._compactions += 1
        self._rebuild = self._rebuild or rebuild

    @property
    def decided(self) -> bool:
        """Whether this step has decided anything to commit."""
        return bool(self._commits)

    def change(self, *, failure: str | None = None, fail_run: str | None = None) -> ContextChange:
        return ContextChange(
            commits=tuple(self._commits),
            rebuild_prompt=self._rebuild and fail_run is None,
            failure=failure,
            fail_run=fail_run,
        )


def boundary_commit(
    step: CompactionStep,
    rebuilt: Rebuilt,
    seqs: Sequence[int | None],
    *,
    kind: str,
    strategy: str,
    trigger: str,
    tokens_before: int,
    started: float,
    threshold: int,
    details: dict[str, Any] | None = None,
    manifest: Manifest | None = None,
) -> tuple[BoundaryCommit, list[int | None]]:
    """The commit of ``rebuilt`` (and the stored seqs of its messages once committed)."""
    details = details if details is not None else {}
    new_seqs = [seqs[i] if i is not None else None for i in rebuilt.sources]
    layout = encode_layout(rebuilt.messages, new_seqs, step.next_seq)
    spills: list[SpillWrite] = []
    for spill in rebuilt.spills:
        spills.append(SpillWrite(spill.handle, spill.call_id, spill.content))
        if spill.attachments:  # images and documents leave whole and stay recallable
            spills.append(
                SpillWrite(
                    attachments_handle(spill.handle),
                    spill.call_id,
                    attachments_to_json(spill.attachments),
                )
            )
    rows = message_records(step.id, step.next_seq, layout.new_rows, "context")
    after = ModelRequest(
        model=step.agent.model, system=step.system, tools=step.tools, messages=rebuilt.messages
    )
    tokens_after = estimate_request(after)
    if kind == "compaction" and tokens_after >= threshold:
        details["ineffective"] = True
    summary = details.pop("summary", None)
    model = details.pop("model", None)
    boundary = BoundaryRecord(
        run_id=step.id,
        kind=kind,
        prefix=messages_to_json(list(layout.prefix)),
        ranges=json.dumps([list(r) for r in layout.ranges]),
        created=time.time(),
        strategy=strategy,
        trigger=trigger,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        messages_before=len(step.context),
        messages_after=len(rebuilt.messages),
        summary=summary,
        model=model,
        duration=time.monotonic() - started,
        status="ok",
        extra=json.dumps({**details, "next_seq": step.next_seq, "kept": rebuilt.kept}),
    )
    commit = BoundaryCommit(
        boundary=boundary,
        rows=tuple(rows),
        spills=tuple(spills),
        context=rebuilt.messages,
        next_seq=layout.next_seq,
        manifest=manifest,
    )
    return commit, expand_ranges(len(layout.prefix), layout.ranges, layout.next_seq)


def manifest_of(details: dict[str, Any]) -> dict[str, Any]:
    """The manifest dict a rebuild left in ``details`` (empty when none)."""
    found = details.get("manifest")
    return found if isinstance(found, dict) else {}
