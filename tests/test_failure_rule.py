"""One failure rule for run, resume and run_graph: a failed session is a result with
``status="failed"``; ``raise_for_status()`` raises ``RunFailedError`` carrying it."""

from __future__ import annotations

from pathlib import Path

import anthropic
import anyio
import pytest

from anabranch import Agent, Graph, RetryPolicy, Runtime, Task, tool
from anabranch.errors import MaxTurnsExceeded, ModelAPIError, RunFailedError
from anabranch.messages import ModelRequest
from anabranch.models import AnthropicModel
from anabranch.testing import FunctionModel

from .helpers import call, failed_with

pytestmark = pytest.mark.anyio

NO_RETRY = RetryPolicy(max_attempts=1, base_delay=0.0, max_delay=0.0)


@tool
def once_more() -> str:
    """Ask for another turn."""
    return "again"


def _agent(name: str = "worker") -> Agent:
    return Agent(name=name, model="test-model", instructions="Work.")


async def test_one_failing_session_through_run_then_resume(tmp_path: Path) -> None:
    answers: list[str | None] = [None, None, "recovered"]  # None: the API refuses

    def model_answer(request: ModelRequest) -> str:
        answer = answers.pop(0)
        if answer is None:
            raise ModelAPIError("invalid request", status_code=400)
        return answer

    db = tmp_path / "rule.db"
    with anyio.fail_after(30):
        async with Runtime(db=db, model=FunctionModel(model_answer), retry=NO_RETRY) as rt:
            first = await rt.run(_agent(), "do it")  # does not raise
            cause = failed_with(first, ModelAPIError, match="invalid request")
            assert cause.session_id == first.session_id
            again = await rt.resume(first.session_id)  # the same rule: a result
            failed_with(again, ModelAPIError)
            assert again.session_id == first.session_id and again.run_id == first.run_id
            stored = await rt.store.get_session(first.session_id)
            assert stored is not None and stored.status == "failed"
            done = await rt.resume(first.session_id)
    assert done.raise_for_status() is done
    assert (done.status, done.output, done.error) == ("done", "recovered", None)


async def test_a_finished_failed_session_resumes_to_the_same_failure(tmp_path: Path) -> None:
    def refuse(request: ModelRequest) -> str:
        raise AssertionError("a finished session must not call the model")

    looping = FunctionModel(lambda request: [call("once_more")])
    agent = Agent(
        name="worker",
        model="test-model",
        instructions="Work.",
        tools=[once_more],
        max_turns=2,
        on_limit="fail",
    )
    db = tmp_path / "rule.db"
    with anyio.fail_after(30):
        async with Runtime(db=db, model=looping) as rt:
            first = await rt.run(agent, "do it")
        async with Runtime(db=db, model=FunctionModel(refuse), agents=[agent]) as rt:
            again = await rt.resume(first.session_id)
    failed_with(first, MaxTurnsExceeded)
    assert (again.status, again.error, again.run_id) == (first.status, first.error, first.run_id)
    with pytest.raises(RunFailedError) as caught:  # read back from the store: no live cause
        again.raise_for_status()
    assert caught.value.result is again and caught.value.__cause__ is None


async def test_a_failed_graph_is_a_result_by_the_same_rule(tmp_path: Path) -> None:
    def answer(request: ModelRequest) -> str:
        if "Break." in request.system[0].text:
            raise ModelAPIError("bad task", status_code=400)
        return "fine"

    graph = Graph(
        name="g",
        tasks=[
            Task(id="ok", agent=_agent("good"), prompt="Go."),
            Task(id="bad", agent=Agent(name="bad", model="m", instructions="Break."), prompt="Go."),
        ],
    )
    with anyio.fail_after(30):
        async with Runtime(db=tmp_path / "g.db", model=FunctionModel(answer), retry=NO_RETRY) as rt:
            result = await rt.run_graph(graph)
            assert result.status == "failed" and result.tasks["ok"].status == "done"
            with pytest.raises(RunFailedError, match="bad task") as caught:
                result.raise_for_status()
            assert caught.value.result is result
            again = await rt.resume(result.session_id)
    assert again.status == "failed" and again.error == result.error


async def test_aclose_closes_the_client_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "unused")  # the default model needs credentials
    async with Runtime(db=tmp_path / "c.db") as rt:
        model = rt.model
        assert isinstance(model, AnthropicModel)
        client = model._client
        assert isinstance(client, anthropic.AsyncAnthropic) and not client.is_closed()
    assert client.is_closed()


async def test_aclose_leaves_a_given_client_open(tmp_path: Path) -> None:
    client = anthropic.AsyncAnthropic(api_key="unused", base_url="http://127.0.0.1:9")
    given = AnthropicModel(client=client)
    async with Runtime(db=tmp_path / "c.db", model=given) as rt:
        assert rt.model is given
    assert not client.is_closed()
    await client.close()
