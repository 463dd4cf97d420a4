"""Usage summed in SQL: what a resumed session has spent, per run and model, without a row
per call in Python."""

from __future__ import annotations

import json
import time
from typing import Literal

import pytest

from anabranch.store import CallRecord, CallUsageSum, MessageRecord, Store
from tests.store_conformance.conftest import add_run, add_session

pytestmark = pytest.mark.anyio

KEYS = ("input_tokens", "output_tokens", "thinking_tokens")


async def finished_call(
    store: Store,
    run_id: str,
    turn: int,
    status: Literal["ok", "error"],
    model: str | None,
    usage: dict[str, int],
) -> None:
    call = CallRecord(
        run_id=run_id,
        turn=turn,
        attempt=1,
        fingerprint="f",
        message_count=turn,
        created=time.time(),
    )
    message = MessageRecord(
        run_id=run_id, seq=2 * turn, role="user", content='[{"type": "text", "text": "go"}]'
    )
    call_id = await store.begin_call(call, [message])
    answer = MessageRecord(
        run_id=run_id,
        seq=2 * turn + 1,
        role="assistant",
        content='[{"type": "text", "text": "ok"}]',
    )
    await store.finish_call(
        call_id,
        status=status,
        message=answer if status == "ok" else None,
        model=model,
        usage=json.dumps(usage),
    )


async def test_usage_is_summed_per_run_and_model_over_successful_calls(store: Store) -> None:
    await add_session(store)
    await add_session(store, "ses_2")
    await add_run(store, "run_a")
    await add_run(store, "run_b")
    await add_run(store, "run_other", session_id="ses_2")
    await finished_call(store, "run_a", 1, "ok", "big", {"input_tokens": 100, "output_tokens": 10})
    await finished_call(store, "run_a", 2, "ok", "big", {"input_tokens": 200, "thinking_tokens": 4})
    await finished_call(store, "run_a", 3, "ok", "small", {"input_tokens": 7, "output_tokens": 1})
    await finished_call(store, "run_a", 4, "error", "big", {"input_tokens": 999})  # not spent
    await finished_call(store, "run_b", 1, "ok", None, {"output_tokens": 5})
    await finished_call(store, "run_other", 1, "ok", "big", {"input_tokens": 50})  # another session

    sums = await store.call_usage_by_run("ses_1", KEYS)

    assert sums == [
        CallUsageSum(
            "run_a", "big", {"input_tokens": 300, "output_tokens": 10, "thinking_tokens": 4}
        ),
        CallUsageSum(
            "run_a", "small", {"input_tokens": 7, "output_tokens": 1, "thinking_tokens": 0}
        ),
        CallUsageSum("run_b", None, {"input_tokens": 0, "output_tokens": 5, "thinking_tokens": 0}),
    ]
    # the same totals as the session-wide sum
    total = await store.sum_call_usage("ses_1", KEYS)
    assert total == {key: sum(s.sums[key] for s in sums) for key in KEYS}
    assert await store.call_usage_by_run("ses_missing", KEYS) == []


async def test_a_usage_key_is_checked_before_it_reaches_sql(store: Store) -> None:
    await add_session(store)
    with pytest.raises(ValueError, match="not a usage key"):
        await store.call_usage_by_run("ses_1", ["input_tokens') FROM x; --"])


async def test_sums_up_to_a_call_id_leave_out_the_calls_begun_after_it(store: Store) -> None:
    assert await store.last_call_id() == 0
    await add_session(store)
    await add_run(store, "run_a")
    await finished_call(store, "run_a", 1, "ok", "big", {"input_tokens": 100})
    mark = await store.last_call_id()
    await finished_call(store, "run_a", 2, "ok", "big", {"input_tokens": 20})
    assert await store.last_call_id() > mark

    before = await store.call_usage_by_run("ses_1", ("input_tokens",), up_to=mark)
    every = await store.call_usage_by_run("ses_1", ("input_tokens",))

    assert before == [CallUsageSum("run_a", "big", {"input_tokens": 100})]
    assert every == [CallUsageSum("run_a", "big", {"input_tokens": 120})]
