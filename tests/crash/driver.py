"""What runs inside each crash-test subprocess: start or resume the session, and SIGKILL
this process at the planned point.

Kill points inside the process (counted from this process's start):

- ``commit``: right after the n-th store transaction committed;
- ``request``: the n-th model request, after its call row was committed, before sending;
- ``stream``: the n-th response, after its first bytes arrived (mid-stream);
- ``response``: the n-th response, complete but not yet committed;
- ``summary``: the n-th compaction summary request (mid-compaction);
- ``tool`` / ``tool_after``: the n-th tool call, before / after its side effect.

Points outside it (``server``: the n-th request reached the server; ``timer``) are the
harness's: it sends the SIGKILL itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import anyio
import httpx2

from anabranch import RunResult, Runtime
from anabranch.messages import Message, ModelRequest, ModelResponse, TextBlock, ToolUseBlock
from anabranch.models._anthropic import AnthropicModel
from anabranch.models._base import Model
from anabranch.models._retry import RetryPolicy
from anabranch.store.sqlite._group_commit import GroupCommitConnection
from anabranch.testing._models import is_summary_request
from anabranch.testing._wire import sse_event, stream_events
from tests.crash import scenario

__all__ = ["IN_PROCESS_EVENTS", "Spec", "child_main"]

IN_PROCESS_EVENTS = ("commit", "request", "stream", "response", "summary", "tool", "tool_after")
T = TypeVar("T")


@dataclass(frozen=True)
class Spec:
    """One attempt: which session, where, and where to die."""

    db: str
    workdir: str
    base_url: str
    backend: str
    attempt: int
    session_id: str | None = None
    kill_event: str | None = None
    kill_at: int = 0
    synchronous: str = "FULL"
    kind: str = "agent"
    """``agent``: the supervisor session; ``graph``: the task-graph session."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        return cls(**json.loads(text))

    @property
    def session_file(self) -> Path:
        return Path(self.workdir) / "session_id"

    @property
    def result_file(self) -> Path:
        return Path(self.workdir) / "result.json"

    @property
    def effects_file(self) -> Path:
        return Path(self.workdir) / "effects.tsv"

    @property
    def violations_file(self) -> Path:
        return Path(self.workdir) / "violations.tsv"

    def log_file(self) -> Path:
        return Path(self.workdir) / f"attempt-{self.attempt:03d}.log"


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _Counter:
    def __init__(self, spec: Spec, event: str) -> None:
        self.active = spec.kill_event == event
        self.at = spec.kill_at
        self.count = 0

    def tick(self) -> None:
        """Count one occurrence; die if it is the planned one."""
        if self.active:
            self.count += 1
            if self.count == self.at:
                _die()


def _install_commit_kill(spec: Spec) -> None:
    counter = _Counter(spec, "commit")
    if not counter.active:
        return
    original = GroupCommitConnection.write

    async def write(self: GroupCommitConnection, fn: Callable[[Any], T]) -> T:
        result = await original(self, fn)
        counter.tick()
        return result

    GroupCommitConnection.write = write  # type: ignore[method-assign]


class _DieMidStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk
            _die()  # the client has the first bytes of the answer, not the rest

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Transport(httpx2.AsyncBaseTransport):
    def __init__(self, spec: Spec) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.counter = _Counter(spec, "stream")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if self.counter.active and request.url.path.rstrip("/").endswith("/v1/messages"):
            self.counter.count += 1
            if self.counter.count == self.counter.at:
                response.stream = _DieMidStream(response.stream)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _KillingModel:
    """The real client, with kill points before sending and after receiving."""

    def __init__(self, inner: Model, spec: Spec) -> None:
        self.inner = inner
        self.before = _Counter(spec, "request")
        self.after = _Counter(spec, "response")
        self.summary = _Counter(spec, "summary")

    async def request(self, request: ModelRequest) -> ModelResponse:
        if is_summary_request(request):
            self.summary.tick()
        self.before.tick()
        response = await self.inner.request(request)
        self.after.tick()
        return response


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


async def _main(spec: Spec) -> None:
    scenario.configure(
        effects=spec.effects_file,
        violations=spec.violations_file,
        db=Path(spec.db),
        event=spec.kill_event,
        at=spec.kill_at,
    )
    _install_commit_kill(spec)
    client = anthropic.AsyncAnthropic(
        base_url=spec.base_url,
        api_key="crash-test",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=_Transport(spec), timeout=60.0),
    )
    model = _KillingModel(AnthropicModel(client=client), spec)
    retry = RetryPolicy(base_delay=0.01, max_delay=0.05)
    async with Runtime(
        db=spec.db,
        model=model,
        retry=retry,
        agents=scenario.AGENTS,
        graphs=[scenario.GRAPH],
        synchronous=spec.synchronous,  # type: ignore[arg-type]
    ) as rt:

        def announce(session_id: str) -> None:
            _write_atomically(spec.session_file, session_id)

        result: RunResult
        if spec.session_id is None and spec.kind == "graph":
            result = await rt.run_graph(scenario.GRAPH, on_session=announce)
        elif spec.session_id is None:
            result = await rt.run(scenario.ROOT, scenario.TASK, on_session=announce)
        else:
            result = await rt.resume(spec.session_id)
    _write_atomically(spec.result_file, result.model_dump_json())


def child_main(spec_json: str) -> None:
    """Entry point of one attempt (runs in a fresh process forked from the fork server)."""
    spec = Spec.from_json(spec_json)
    log = open(spec.log_file(), "w", buffering=1)  # open for the life of the process
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    anyio.run(_main, spec, backend=spec.backend)


def _warm_up() -> None:
    """Do once, in the fork server, the slow set-up every attempt would otherwise repeat:
    the SSL context, and the SDK's lazily built response models (one streamed answer)."""
    answer = ModelResponse(
        id="msg_warm",
        model="warm",
        content=(TextBlock(text="warm"), ToolUseBlock(id="toolu_warm", name="t", input={})),
        stop_reason="tool_use",
    )
    body = b"".join(sse_event(event) for event in stream_events(answer))

    def reply(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async def stream_once() -> None:
        client = anthropic.AsyncAnthropic(
            base_url="http://warm.invalid",
            api_key="warm",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(reply)),
        )
        async with client:
            request = ModelRequest(model="warm", messages=(Message.user("warm"),))
            await AnthropicModel(client=client).request(request)

    httpx2.AsyncHTTPTransport()
    anyio.run(stream_once)


_warm_up()
