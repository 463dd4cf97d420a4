"""``output_type``: a validated answer, bounded retries with the validation errors, a clear
failure, and a sub-agent that reports its JSON to the parent."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from anabranch import Agent, AnthropicModel, OutputValidationError, RunFailedError, Runtime
from anabranch.messages import ModelRequest
from anabranch.testing import FunctionModel, MessagesServer, TestModel

pytestmark = pytest.mark.anyio


class Finding(pydantic.BaseModel):
    claim: str
    confidence: float = pydantic.Field(ge=0, le=1)


ANALYST = Agent(name="analyst", instructions="Answer with a finding.", output_type=Finding)


async def test_output_type_agent_returns_a_validated_object_through_the_sdk(tmp_path: Path) -> None:
    async with MessagesServer(TestModel()) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="k")
        try:
            async with Runtime(db=tmp_path / "o.db", model=model) as rt:
                result = await rt.run(ANALYST, "Is the tide rising?")
        finally:
            await model.aclose()
    assert isinstance(result.output, Finding)
    assert 0 <= result.output.confidence <= 1
    # the schema travelled in the system prompt
    system = "\n".join(b.text for b in srv.log[0].request.system)  # type: ignore[union-attr]
    assert '"confidence"' in system


async def test_a_bad_answer_goes_back_with_its_errors_then_succeeds(tmp_path: Path) -> None:
    answers = iter(
        ['{"claim": "rising", "confidence": 7}', '{"claim": "rising", "confidence": 0.7}']
    )

    def reply(request: ModelRequest) -> str:
        return next(answers)

    model = FunctionModel(reply)
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        result = await rt.run(ANALYST, "Is the tide rising?")
    assert result.output == Finding(claim="rising", confidence=0.7)
    retry = model.requests[1].messages[-1].text
    assert "confidence: Input should be less than or equal to 1" in retry
    assert "attempt 1 of 3" in retry


async def test_retries_are_bounded_and_the_failure_is_clear(tmp_path: Path) -> None:
    model = FunctionModel(lambda request: "not json at all")
    agent = ANALYST.model_copy(update={"output_retries": 1})
    async with Runtime(db=tmp_path / "f.db", model=model) as rt:
        result = await rt.run(agent, "Is the tide rising?")
        runs = await rt.store.list_runs(result.session_id)
    assert result.status == "failed"
    assert "after 2 attempts" in (result.error or "")
    with pytest.raises(RunFailedError) as caught:
        result.raise_for_status()
    assert isinstance(caught.value.__cause__, OutputValidationError)
    assert len(model.requests) == 2
    assert runs[0].status == "failed"


async def test_a_sub_agent_with_an_output_type_reports_its_json(tmp_path: Path) -> None:
    boss = Agent(name="boss", instructions="Delegate.", subagents=[ANALYST])
    model = TestModel()
    async with Runtime(db=tmp_path / "s.db", model=model) as rt:
        result = await rt.run(boss, "Is the tide rising?")
        runs = await rt.store.list_runs(result.session_id)
    child = next(r for r in runs if r.agent_name == "analyst")
    Finding.model_validate_json(child.output or "")
    reports = [r.content for req in model.requests for m in req.messages for r in m.tool_results]
    assert any('"confidence"' in text for text in reports)
    assert isinstance(result.output, str)


def test_output_type_must_be_a_pydantic_model() -> None:
    with pytest.raises(pydantic.ValidationError, match="output_type must be a pydantic BaseModel"):
        Agent(name="a", output_type=dict)
