"""``Liveness``: a worker's heartbeat and lease renewals, on a thread and a connection of
their own.

They used to ride the event loop and the store's writer queue. An overloaded worker
(thousands of sessions on a share of two cores) queued them behind its own writes for
longer than a lease: it looked dead while it was driving its sessions, and the other
workers took them over (wasted work; fencing held).

What liveness proves: that the process runs **and its event loop turns**. Every beat the
thread asks the loop to run a callback (``call_soon_threadsafe``) and beats (the ``workers``
row, and the renewal of this process's leases that are due) unless a callback it sent has
waited longer than ``stall_after``. A loop that turns slowly (a busy worker) keeps its
sessions, however long its writer queue; a loop that does not turn at all (a tool blocking
it, a deadlock) can advance none of them, so its heartbeat and leases lapse and they fail
over. It does not try to prove that each session progresses: a session may rightly wait
minutes for a model or a tool.

The session driver still renews each lease through the store every third of the ttl: that
renewal is how a driver learns its lease was taken over (and the store's fencing does not
depend on it). This thread only keeps the leases from expiring while that renewal waits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from anabranch.errors import StoreError
from anabranch.store.postgres import Pulse

__all__ = ["Liveness"]

log = logging.getLogger("anabranch.worker")


class Liveness:
    """Beats ``pulse`` every ``interval`` seconds from a thread unless the event loop that
    started it has left a ping unanswered for more than ``stall_after`` seconds. ``start``
    on the loop; ``stop`` joins the thread (call it from a worker thread)."""

    def __init__(self, pulse: Pulse, *, interval: float, stall_after: float) -> None:
        self._pulse = pulse
        self._interval = interval
        self._stall_after = stall_after
        self._stopping = threading.Event()
        self._unanswered_since: float | None = None
        """When the oldest ping the loop has not answered yet was sent."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="anabranch-liveness", daemon=True)
        self.beats = 0
        """Beats recorded so far."""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _answer(self) -> None:  # on the event loop
        self._unanswered_since = None

    def _lag(self) -> float:
        """How long the loop has left a ping unanswered (0: it answered every one); sends
        the next ping if the last one was answered."""
        assert self._loop is not None
        now = time.monotonic()
        since = self._unanswered_since
        if since is not None:
            return now - since
        self._unanswered_since = now
        try:
            self._loop.call_soon_threadsafe(self._answer)
        except RuntimeError:  # the loop is closed
            return float("inf")
        return 0.0

    def _run(self) -> None:
        stalled = False
        try:
            while True:
                lag = self._lag()
                if lag > self._stall_after:
                    if not stalled:
                        log.warning(
                            "the event loop has not turned for %.1f s: no heartbeat, no lease "
                            "renewal until it does",
                            lag,
                        )
                    stalled = True
                else:
                    stalled = False
                    try:
                        self._pulse.beat()
                        self.beats += 1
                    except StoreError as error:  # the database: try again at the next beat
                        log.warning("heartbeat failed, trying again: %s", error)
                if self._stopping.wait(self._interval):
                    return
        finally:
            self._pulse.close()
