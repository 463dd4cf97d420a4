"""Session-level events and the two ways to receive them: ``Runtime.stream`` and
``Runtime(on_event=...)``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from anabranch import events as ev
from anabranch.runtime._events import EventBus, EventCallback, Subscription, deliver
from anabranch.runtime._run_events import run_status_for

if TYPE_CHECKING:
    from anabranch.runtime._results import RunResult

__all__ = ["EventStream", "SessionAnnouncer", "open_stream"]


class SessionAnnouncer:
    """Emits ``session_started``/``session_finished`` for one drive of a session, and
    feeds ``on_event`` from a task of its own (drained before the drive returns)."""

    def __init__(self, bus: EventBus, session_id: str, callback: EventCallback | None) -> None:
        self._bus = bus
        self._session_id = session_id
        self._callback = callback
        self._group: anyio.abc.TaskGroup | None = None
        self._subscription: Subscription | None = None

    async def __aenter__(self) -> SessionAnnouncer:
        if self._callback is not None:
            self._subscription = self._bus.subscribe(Subscription(session_id=self._session_id))
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            self._group.start_soon(deliver, self._subscription, self._callback)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        if self._group is None or self._subscription is None:
            return None
        self._bus.unsubscribe(self._subscription)  # closes it: delivery ends once drained
        if isinstance(exc_info[1], anyio.get_cancelled_exc_class()):
            return await self._group.__aexit__(*exc_info)
        # a failed drive still delivers its last events (session_finished included)
        await self._group.__aexit__(None, None, None)
        return None

    def _emit(self, event_type: type[ev.Event], **fields: Any) -> None:
        if self._bus.active:
            self._bus.publish(event_type(session_id=self._session_id, time=time.time(), **fields))

    def started(self, task: str, *, resumed: bool) -> None:
        self._emit(ev.SessionStarted, task=task, resumed=resumed)

    def finished(self, result: RunResult) -> None:
        self._emit(
            ev.SessionFinished,
            status=result.status,
            output=result.output,
            error=result.error,
            usage=result.usage,
            incomplete=result.incomplete,
            stop_reason=result.stop_reason,
        )

    def failed(self, error: BaseException) -> None:
        status = run_status_for(error)
        self._emit(
            ev.SessionFinished,
            status="failed" if status == "stopped" else status,
            error=f"{type(error).__name__}: {error}",
        )


class EventStream:
    """The events of one session as it runs; iterate with ``async for``.

    Iteration ends after ``session_finished``; then ``result`` is the ``RunResult`` (a
    failed session is a result with ``status="failed"``, as from ``run``). What stops the
    session from being driven at all (bad input, a busy session) is raised from the loop
    after its last events.
    """

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self.result: RunResult | None = None
        self.error: BaseException | None = None

    @property
    def session_id(self) -> str | None:
        """The session's id, known from the moment it is committed."""
        return self._subscription.session_id

    @property
    def merged_deltas(self) -> int:
        """Deltas merged into earlier ones because the consumer lagged behind."""
        return self._subscription.merged

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Any:
        event = await self._subscription.get()
        if event is not None:
            return event
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        raise StopAsyncIteration


@asynccontextmanager
async def open_stream(
    bus: EventBus, drive: Callable[[Callable[[str], None]], Awaitable[RunResult]]
) -> AsyncIterator[EventStream]:
    """Run ``drive`` in the background and stream its session's events.

    ``drive`` receives the function to call with the session id as soon as it is known.
    """
    subscription = bus.subscribe(Subscription())
    stream = EventStream(subscription)

    async def background() -> None:
        try:
            stream.result = await drive(subscription.bind)
        except Exception as exc:
            stream.error = exc
        finally:
            subscription.close()

    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(background)
            try:
                yield stream
            except Exception as exc:  # raised outside the group, not wrapped in a group
                failure = exc
            finally:
                group.cancel_scope.cancel()
    finally:
        bus.unsubscribe(subscription)
    if failure is not None:
        raise failure
