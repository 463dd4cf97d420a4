"""Micro-benchmark: the CPU of one model call's spans, without the rest of the runtime.

One "pair" is what the agent loop does per tool round of ``bench/concurrency.py``: a
``chat {model}`` span (``Tracing.model_call`` + ``model_response``) and an
``execute_tool {tool}`` span (``Tracing.tool_call`` + ``tool_result``), both nested under an
``invoke_agent`` span, on the real SDK ``TracerProvider``. Measured per pair: process CPU
(best of several repeats; the collector is off while timing, as its cost is measured
separately by ``objects_held``) and the GC-tracked objects a chat span holds while it is
open (the model call awaits there, so these objects survive into older generations).

Processors: ``simple`` is the concurrency benchmark's (a ``SimpleSpanProcessor`` and a
dropping exporter); ``batch`` is what a production exporter runs behind (a
``BatchSpanProcessor``, same dropping exporter). ``off`` is a ``NoOpTracerProvider``.
``--openinference minimal,full`` measures each recording processor with both attribute
sets (the default without the OpenInference keys Phoenix derives, and with them); each line
also gives the attributes one pair sets.

    PYTHONPATH=src:. python -m bench.spans [--pairs 20000] [--repeats 5] [--openinference full]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider

from anabranch import ModelResponse, Usage
from anabranch.messages import Message, TextBlock, ToolUseBlock
from anabranch.traces import OpenInference, Tracing
from bench.common import DropExporter, noop_tracer_provider

MODEL = "bench-model"
SESSION = "session-0123456789abcdef"


def _response(step: int) -> ModelResponse:
    return ModelResponse(
        id=f"msg_{step}",
        model=MODEL,
        content=(ToolUseBlock(id=f"toolu_{step}", name="note", input={"text": "x" * 80}),),
        stop_reason="tool_use",
        usage=Usage(input_tokens=500, output_tokens=50),
    )


_MESSAGES = (Message(role="user", content=(TextBlock(text="task: work through the steps"),)),)


def chat_span(
    tracing: Tracing, response: ModelResponse, inside: Callable[[], None] | None = None
) -> None:
    """The chat span of one model call, as the loop makes it (``inside``: called last,
    while the span is still open)."""
    with tracing.model_call(
        model=MODEL,
        session_id=SESSION,
        agent="worker",
        attempt=1,
        compacted=False,
        messages=_MESSAGES,
        system=(),
        purpose=None,
    ) as span:
        tracing.model_response(
            span,
            response_id=response.id,
            response_model=response.model,
            stop_reason=response.stop_reason,
            usage=response.usage,
            output=response.to_message(),
        )
        if inside is not None:
            inside()


def one_pair(tracing: Tracing, response: ModelResponse) -> None:
    """The span calls the loop makes for one model call and its tool call."""
    chat_span(tracing, response)
    use = response.content[0]
    assert isinstance(use, ToolUseBlock)
    with tracing.tool_call(
        tool=use.name,
        call_id=use.id,
        session_id=SESSION,
        description="Record a note; returns a short acknowledgement.",
        arguments=use.input,
    ) as span:
        tracing.tool_result(span, "noted: step", False, ())


def _held_by_open_chat_span(tracing: Tracing, response: ModelResponse) -> int:
    """GC-tracked objects alive inside an open chat span (after its response is set)."""
    counts: list[int] = []

    def count() -> None:
        counts.append(gc.get_count()[0])

    gc.collect()
    gc.disable()
    try:
        count()  # made before counting starts: the probe itself is not counted
        chat_span(tracing, response, count)
    finally:
        gc.enable()
    return counts[1] - counts[0]


def _attributes_per_pair(openinference: OpenInference) -> int:
    """The attributes one pair's two spans carry (content capture off)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    one_pair(Tracing(provider, capture_content=False, openinference=openinference), _response(0))
    provider.shutdown()
    return sum(len(span.attributes or {}) for span in exporter.get_finished_spans())


def measure(
    processor: str, pairs: int, repeats: int, openinference: OpenInference = "minimal"
) -> dict[str, Any]:
    provider: Any
    if processor == "simple":
        provider, _ = noop_tracer_provider()
    elif processor == "batch":
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=pairs * 4))
    else:
        provider = NoOpTracerProvider()
    tracing = Tracing(provider, capture_content=False, openinference=openinference)
    responses = [_response(step) for step in range(9)]
    best = float("inf")
    with tracing.agent_run(
        agent="worker", run_id="run-0", session_id=SESSION, model=MODEL, task="task"
    ):
        for response in responses:  # warm up
            one_pair(tracing, response)
        held = _held_by_open_chat_span(tracing, responses[0])
        for _ in range(repeats):
            gc.collect()
            gc.disable()
            try:
                cpu0 = time.process_time()
                for i in range(pairs):
                    one_pair(tracing, responses[i % 9])
                cpu = time.process_time() - cpu0
            finally:
                gc.enable()
            best = min(best, cpu)
    if hasattr(provider, "shutdown"):
        provider.shutdown()
    return {
        "processor": processor,
        "openinference": openinference,
        "attributes_per_pair": _attributes_per_pair(openinference) if processor != "off" else 0,
        "us_per_pair": round(best / pairs * 1e6, 2),
        "objects_held_by_open_chat_span": held,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--processors", default="simple,batch,off")
    parser.add_argument("--openinference", default="minimal", help="minimal, full or both")
    args = parser.parse_args()
    modes: list[OpenInference] = ["minimal", "full"]
    chosen = [m for m in modes if m in args.openinference.split(",")]
    for processor in args.processors.split(","):
        for mode in chosen if processor != "off" else chosen[:1]:
            print(json.dumps(measure(processor, args.pairs, args.repeats, mode)))


if __name__ == "__main__":
    main()
