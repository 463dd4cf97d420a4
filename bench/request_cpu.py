"""Micro-benchmark: the CPU the loop spends per model call building, fingerprinting and
encoding a run's request and records (no event loop, no store, no spans).

The requests are those of one real run of ``bench.concurrency``'s worker agent (captured
from the runtime: its prompt snapshot and its 10 calls, 1 to 19 messages). They are then
replayed for ``runs`` runs interleaved call by call, as the concurrency bench interleaves
them: every run has its own user and tool-result message objects; the assistant messages
are shared, as the bench's model answers every run with the same response objects. Per
call, what the loop does outside awaits:

- ``build``: the request with its cache marks (``run_request(..., placed=True)``) and its
  fingerprint (the call row's);
- ``records``: the call's settings key, the assistant message's stored JSON and the usage
  JSON (the outcome row), and the tool-result message's record (its results stored as
  references to their tool events).

Prints one JSON line: microseconds per call of each part (the median of ``repeat``
rounds, each with new message objects) and the load average.

Run: ``PYTHONPATH=src:. python -m bench.request_cpu [runs] [repeat]``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from anabranch import Runtime
from anabranch.messages import Message, ModelRequest, ModelResponse, message_content_json
from anabranch.runtime._history import message_json, message_records, usage_json
from anabranch.runtime._run_prompt import run_request
from bench.concurrency import CALLS_PER_RUN, LatencyModel, worker_agent


class _Recording(LatencyModel):
    def __init__(self) -> None:
        super().__init__(0.0)
        self.requests: list[ModelRequest] = []
        self.answers: list[ModelResponse] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        response = await super().request(request)
        self.answers.append(response)
        return response


async def _capture() -> tuple[list[ModelRequest], list[ModelResponse]]:
    with tempfile.TemporaryDirectory(prefix="request-cpu-") as folder:
        model = _Recording()
        async with Runtime(Path(folder) / "capture.db", model=model) as rt:  # type: ignore[arg-type]
            await rt.run(worker_agent(), "task 0: work through the steps")
    assert len(model.requests) == CALLS_PER_RUN
    return model.requests, model.answers


def _fresh(message: Message) -> Message:
    """An equal message in a new object (what each run of the bench holds)."""
    return Message.model_validate_json(
        f'{{"role":"{message.role}","content":{message_content_json(message)}}}'
    )


def _round(
    requests: list[ModelRequest], answers: list[ModelResponse], runs: int
) -> dict[str, float]:
    agent = worker_agent()
    last = requests[-1]
    system, tools = last.system, last.tools
    shared = {id(a.to_message()): a.to_message() for a in answers}
    transcripts = [
        [m if id(m) in shared else _fresh(m) for m in last.messages] for _ in range(runs)
    ]
    contexts: list[list[Message]] = [[t[0]] for t in transcripts]
    results = [  # what the loop keeps: the results as their finished events hold them
        {b.tool_use_id: b for m in t if m.role == "user" for b in m.tool_results}
        for t in transcripts
    ]
    build = records = 0.0
    for step in range(CALLS_PER_RUN):
        answer = answers[step]
        started = time.process_time()
        sent = [  # every run's call of this step, alive together as they are in the bench
            run_request(agent, system, tools, context, last_response_id=None, placed=True)
            for context in contexts
        ]
        for request in sent:
            request.fingerprint()
        middle = time.process_time()
        for index, request in enumerate(sent):
            request.settings.cache_key()
            message_json(answer.to_message())
            usage_json(answer.usage)
            if step < CALLS_PER_RUN - 1:
                seq = len(contexts[index]) + 1
                result = transcripts[index][seq]
                message_records(f"run-{index}", seq, [result], committed=results[index])
        records += time.process_time() - middle
        build += middle - started
        if step < CALLS_PER_RUN - 1:
            for index, context in enumerate(contexts):
                context += transcripts[index][len(context) : len(context) + 2]
    calls = runs * CALLS_PER_RUN
    return {"build": build / calls * 1e6, "records": records / calls * 1e6}


def measure(runs: int = 1000, repeat: int = 5) -> dict[str, Any]:
    """Microseconds per call of each part (median of ``repeat`` rounds)."""
    requests, answers = anyio.run(_capture)
    rounds = [_round(requests, answers, runs) for _ in range(repeat)]
    out: dict[str, Any] = {
        part: round(statistics.median(r[part] for r in rounds), 2) for part in rounds[0]
    }
    out["total"] = round(out["build"] + out["records"], 2)
    out["runs"], out["repeat"] = runs, repeat
    out["load"] = os.getloadavg()[0]
    return out


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(measure(*arguments)))
