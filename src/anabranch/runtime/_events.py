"""The event bus: the runtime publishes, subscribers read at their own pace.

Publishing never waits: each subscriber has its own buffer. While a subscriber lags, a
text or thinking delta is merged into the newest waiting delta of the same run and kind
(as long as no other event of that run came after it), so a consumer that never keeps up
holds at most a few deltas per run plus the lifecycle events, which are never dropped.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from anabranch.events import DELTA_KINDS, AnyEvent, Event, TextDelta, ThinkingDelta

__all__ = ["EventBus", "EventCallback", "Subscription", "deliver"]

_log = logging.getLogger("anabranch.events")

EventCallback = Callable[[Any], Awaitable[None] | None]
"""``Runtime(on_event=...)``: a plain or async function taking one event."""

DEFAULT_MAX_DELTAS = 256
"""Deltas one subscriber may hold before later ones are merged further back."""


class Subscription:
    """One consumer's buffer. Iterate it; it ends once closed and drained."""

    def __init__(self, *, session_id: str | None = None, max_deltas: int = DEFAULT_MAX_DELTAS):
        self.session_id = session_id
        """Only events of this session are kept (``None``: none until ``bind``)."""
        self.max_deltas = max_deltas
        self._items: deque[Event] = deque()
        self._deltas = 0
        self._closed = False
        self._wakeup: anyio.Event | None = None
        self.merged = 0
        """How many deltas were merged into an earlier one (the consumer lagged)."""

    def bind(self, session_id: str) -> None:
        """Start keeping the events of ``session_id`` (e.g. from ``on_session``)."""
        self.session_id = session_id

    def __len__(self) -> int:
        return len(self._items)

    def put(self, event: Event) -> None:
        if self._closed or event.session_id != self.session_id:
            return
        if event.kind in DELTA_KINDS and self._merge(event):
            self.merged += 1
            return
        if event.kind in DELTA_KINDS:
            self._deltas += 1
        self._items.append(event)
        if self._wakeup is not None:
            self._wakeup.set()

    def _merge(self, event: Event) -> bool:
        """Fold ``event`` into a waiting delta of the same run and kind, if allowed."""
        items = self._items
        if not items:
            return False
        searched = items if self._deltas >= self.max_deltas else (items[-1],)
        for index in range(len(searched) - 1, -1, -1):
            waiting = searched[index]
            if waiting.run_id != event.run_id:
                continue
            if waiting.kind != event.kind:
                return False  # another event of this run came after: keep the order
            position = len(items) - len(searched) + index
            items[position] = _joined(waiting, event)
            return True
        return False

    def close(self) -> None:
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.set()

    async def get(self) -> Event | None:
        """The next event; ``None`` once closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
            self._wakeup = None
        event = self._items.popleft()
        if event.kind in DELTA_KINDS:
            self._deltas -= 1
        return event

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        event = await self.get()
        if event is None:
            raise StopAsyncIteration
        return event


def _joined(first: Event, second: Event) -> Event:
    assert isinstance(first, TextDelta | ThinkingDelta)
    assert isinstance(second, TextDelta | ThinkingDelta)
    return first.model_copy(update={"text": first.text + second.text})


class EventBus:
    """Fans events out to subscriptions; ``active`` is False when nobody listens."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []
        self.active = False
        """Whether anybody listens (kept with the list: read several times per model call)."""

    def subscribe(self, subscription: Subscription) -> Subscription:
        self._subscriptions.append(subscription)
        self.active = True
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscription.close()
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        self.active = bool(self._subscriptions)

    def publish(self, event: AnyEvent | Event) -> None:
        for subscription in self._subscriptions:
            subscription.put(event)


async def deliver(subscription: Subscription, callback: EventCallback) -> None:
    """Hand every event of ``subscription`` to ``callback`` until it is closed.

    A callback that raises is logged once and gets no further events: a consumer's bug
    never stops the run.
    """
    async for event in subscription:
        try:
            result = callback(event)
            if inspect.isawaitable(result):
                await result
        except Exception:
            _log.exception("on_event callback failed; it gets no further events")
            subscription.close()
            return
