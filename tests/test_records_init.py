"""The hot records' ``__init__`` (``_direct_init``: one ``__dict__`` update instead of
one ``object.__setattr__`` per field) takes the same parameters as the dataclass's own
and builds the same object: equal, with the same hash and ``__dict__`` (in field order),
still frozen, copied by ``replace`` and pickled as before."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from anabranch.store import CallRecord, MessageRecord, ToolEventRecord

HOT = (MessageRecord, CallRecord, ToolEventRecord)


def _plain(cls: type[Any]) -> type[Any]:
    """The same record as a plain frozen dataclass (its generated ``__init__``)."""
    return dataclasses.make_dataclass(
        cls.__name__,
        [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(cls)],
        frozen=True,
    )


@pytest.mark.parametrize("cls", HOT)
def test_the_parameters_are_the_dataclass_ones(cls: type[Any]) -> None:
    ours = inspect.signature(cls).parameters
    theirs = inspect.signature(_plain(cls)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


def _examples() -> list[tuple[type[Any], tuple[Any, ...], dict[str, Any]]]:
    return [
        (MessageRecord, ("run_1", 3, "user", "[]"), {"created": 2.0}),
        (MessageRecord, ("run_1", 3), {"role": "assistant", "content": "[]", "kind": "context"}),
        (CallRecord, ("run_1", 1, 2, "ab", 5, 1.0), {"settings": "s", "compactions": 1}),
        (CallRecord, ("run_1", 1, 2, "ab", 5, 1.0, 7, "ok"), {}),
        (ToolEventRecord, ("run_1", "toolu_1", "t", "started", 1.0), {}),
        (ToolEventRecord, ("run_1", "toolu_1", "t", "finished", 1.0, "x", True), {"id": 4}),
    ]


@pytest.mark.parametrize(("cls", "args", "kwargs"), _examples())
def test_a_record_is_the_same_object_as_before(
    cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    record, plain = cls(*args, **kwargs), _plain(cls)(*args, **kwargs)
    assert list(vars(record).items()) == list(vars(plain).items())
    assert dataclasses.astuple(record) == dataclasses.astuple(plain)
    assert record == cls(*args, **kwargs) and hash(record) == hash(cls(*args, **kwargs))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.run_id = "other"
    assert dataclasses.replace(record, run_id="run_2").run_id == "run_2"
    assert pickle.loads(pickle.dumps(record)) == record


@pytest.mark.parametrize("cls", HOT)
def test_wrong_arguments_fail_as_before(cls: type[Any]) -> None:
    with pytest.raises(TypeError):
        cls()
    with pytest.raises(TypeError):
        cls("run_1", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
    with pytest.raises(TypeError):
        cls(run_id="run_1", no_such_field=1)
