"""``MessagesServer``: a local, faithful Anthropic Messages API for tests and demos.

A real HTTP/1.1 server (anyio + h11, so it runs in-process on asyncio and trio) that the
official SDK talks to unchanged::

    async with MessagesServer(policy=TestModel()) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="test")
        ...
        srv.log  # one RequestRecord per request

Answers come from a policy (any ``Model``, or a list of responses); the server validates
requests with the API's rules and wording, does prompt-cache accounting, and injects faults.
Run ``python -m anabranch.testing --port 0`` to serve from the command line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskGroup

from anabranch.models._base import Model
from anabranch.models._rate import CallRate
from anabranch.testing._app import AppSettings, MessagesApp
from anabranch.testing._cache import PromptCache
from anabranch.testing._faults import ERROR_FAULTS, Fault, FaultKind, FaultPlan
from anabranch.testing._http import serve_connection
from anabranch.testing._policies import ScriptEntry, as_policy
from anabranch.testing._rate_limits import ProviderBuckets
from anabranch.testing._records import RequestRecord

__all__ = ["MessagesServer"]

log = logging.getLogger(__name__)


class MessagesServer:
    """The Messages API on ``127.0.0.1`` (ephemeral port by default), as an async context.

    Args:
        policy: what answers: any ``Model`` (``TestModel()``, ``FunctionModel(fn)``), or a
            list of ``ModelResponse``/strings/block lists played in order. Default
            ``TestModel()``. A policy raising a ``ModelAPIError`` produces the matching HTTP
            error; ``ModelConnectionError`` drops the connection.
        context_limit: prompts above this many tokens get ``prompt is too long``.
        model_limits: a smaller (or larger) limit for some models, by name: each model
            has its own window, as on the real API.
        min_cache_tokens: shortest prefix a cache breakpoint will store.
        latency_ms: delay added before every ``/v1/messages`` answer.
        fault_rate: probability that a ``/v1/messages`` request gets a random fault.
        seed: seeds the random fault choice.
        faults: one-shot faults queued for the next requests, in order.
        fault_kinds: kinds random faults are drawn from (default: every failing kind).
        retry_after: ``retry-after`` seconds of a 429 whose fault does not set one.
        rate_limits: the organisation's limits, as the API enforces them: token buckets
            of ``requests``, ``input_tokens`` and ``output_tokens`` per ``period`` (a
            ``CallRate``; ``tokens`` is refused). Over a limit: 429 with ``retry-after``.
            Every answer then carries ``anthropic-ratelimit-*`` headers.
        api_key: when set, any other key is rejected with 401 (by default any key works).
        clock: monotonic seconds for cache TTLs (pass a ``ManualClock`` to control expiry).
        host, port: where to listen.
    """

    def __init__(
        self,
        policy: Model | Iterable[ScriptEntry] | None = None,
        *,
        context_limit: int = 200_000,
        model_limits: Mapping[str, int] | None = None,
        min_cache_tokens: int = 1024,
        latency_ms: float = 0.0,
        fault_rate: float = 0.0,
        seed: int | None = None,
        faults: Iterable[Fault | FaultKind] = (),
        fault_kinds: Sequence[FaultKind] = ERROR_FAULTS,
        retry_after: float = 1.0,
        rate_limits: CallRate | None = None,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.policy: Model = as_policy(policy)
        self.cache = PromptCache(min_tokens=min_cache_tokens, clock=clock)
        self.faults = FaultPlan(faults, rate=fault_rate, seed=seed, kinds=fault_kinds)
        self.log: list[RequestRecord] = []
        """Every request served, in arrival order."""
        self._app = MessagesApp(
            policy=self.policy,
            cache=self.cache,
            faults=self.faults,
            settings=AppSettings(
                context_limit=context_limit,
                model_limits=dict(model_limits or {}),
                latency=latency_ms / 1000.0,
                retry_after=retry_after,
                api_key=api_key,
                rate_limits=ProviderBuckets(rate_limits) if rate_limits is not None else None,
            ),
            log=self.log,
        )
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._stack: AsyncExitStack | None = None
        self._task_group: TaskGroup | None = None

    @property
    def port(self) -> int:
        """The port the server listens on (only while running)."""
        if self._port is None:
            raise RuntimeError("the server is not running; use `async with MessagesServer()`")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://host:port`` for ``AsyncAnthropic(base_url=...)``."""
        return f"http://{self.host}:{self.port}"

    def inject(
        self,
        kind: FaultKind | Fault,
        *,
        retry_after: float | None = None,
        delay: float | None = None,
    ) -> None:
        """Queue a one-shot fault for the next ``/v1/messages`` request.

        ``srv.inject("rate_limit", retry_after=0.01)``, ``srv.inject("latency", delay=0.2)``.
        """
        if isinstance(kind, Fault):
            self.faults.push(kind)
        else:
            self.faults.push(Fault(kind=kind, retry_after=retry_after, delay=delay))

    async def _handle(self, stream: SocketStream) -> None:
        try:
            await serve_connection(stream, self._app.handle)
        except Exception:  # one broken connection must not stop the server
            log.exception("error while serving a connection")

    async def __aenter__(self) -> MessagesServer:
        if self._stack is not None:
            raise RuntimeError("the server is already running")
        stack = AsyncExitStack()
        try:
            listener = await anyio.create_tcp_listener(
                local_host=self.host, local_port=self._requested_port, reuse_port=False
            )
            await stack.enter_async_context(listener)
            self._port = int(listener.extra(SocketAttribute.local_port))
            task_group = await stack.enter_async_context(anyio.create_task_group())
            task_group.start_soon(listener.serve, self._handle)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._task_group = stack, task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack, task_group = self._stack, self._task_group
        self._stack = self._task_group = None
        self._port = None
        if task_group is not None:
            task_group.cancel_scope.cancel()
        if stack is not None:
            await stack.aclose()

    async def serve_forever(self) -> None:
        """Run until cancelled."""
        async with self:
            await anyio.sleep_forever()
