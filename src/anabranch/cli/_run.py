"""``anabranch run`` and ``anabranch resume``: the commands that execute definitions.

``run FILE:OBJ`` (or ``MODULE:OBJ``) imports that file, which runs its code. ``resume ID``
runs only code the user chose: the definition named on its command line, or else the file
recorded when the session started, and only while that file is byte for byte unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anabranch.cli._budget import add_budget_arguments
from anabranch.cli._common import (
    OFFLINE_MODEL,
    CliError,
    Started,
    add_command,
    add_progress_arguments,
    check_db,
    open_store,
    output_text,
)
from anabranch.cli._rate_args import add_rate_arguments, call_rate
from anabranch.cli._tracing import add_trace_arguments

if TYPE_CHECKING:
    from anabranch.runtime._runtime import Runtime

__all__ = ["register"]

OVERRIDES_KEY = "cli_overrides"
"""Where ``--model`` / ``--max-turns`` are recorded in a session's outline (for resume)."""


def _model_for(args: argparse.Namespace, source: str | None) -> Any:
    """``AnthropicModel()`` (credentials checked now, before any file or session is created)
    unless ``--offline``: then the file's ``OFFLINE_MODEL`` (read only from a file the user
    chose or that was verified) or a plain ``TestModel``."""
    if not getattr(args, "offline", False):
        from anabranch.models import AnthropicModel

        return AnthropicModel()
    from anabranch.models import Model
    from anabranch.runtime._loader import load_object, parse_reference

    if source:
        ref = parse_reference(source)
        where = ref.path if ref.path is not None else ref.module
        try:
            declared = load_object(f"{where}:{OFFLINE_MODEL}")
        except Exception:  # no such name (or not loadable): the plain test model
            declared = None
        if isinstance(declared, Model):
            return declared
    from anabranch.testing import TestModel

    return TestModel()


def _rate_limited(model: Any, rate: Any) -> Any:
    """``model`` under the ``--rpm``/``--itpm``/``--otpm``/``--tpm`` limit of this process."""
    if rate is None or model is None:
        return model
    from anabranch.models._rate import LocalCallLimiter, RateLimitedModel

    return RateLimitedModel(model, LocalCallLimiter(rate))


def _runtime(args: argparse.Namespace, model: Any) -> Runtime:
    """The runtime ``run`` and ``resume`` drive a session with (not opened yet)."""
    from anabranch.cli._progress import event_printer
    from anabranch.runtime._runtime import Runtime

    return Runtime(
        db=args.db,
        model=model,
        tracer_provider=args.tracer_provider,
        on_event=event_printer(args),
    )


def _load_definition(reference: str) -> Any:
    from anabranch.agents import Agent, Graph
    from anabranch.runtime._loader import load_object

    obj = load_object(reference)
    if not isinstance(obj, Agent | Graph):
        raise CliError(f"{reference} is a {type(obj).__name__}, not an Agent or a Graph")
    return obj


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(
            f"the task {where} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); convert it first (e.g. iconv -t UTF-8)"
        ) from None


def read_task(args: argparse.Namespace) -> str | None:
    """The task from the argument, ``-`` (stdin) or ``--task-file``; always valid UTF-8."""
    if args.task_file is not None and args.task is not None:
        raise CliError("give the task as an argument or with --task-file, not both")
    if args.task_file is not None:
        try:
            data = Path(args.task_file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read the task file {args.task_file}: {exc.strerror}") from None
        return _decode(data, f"in {args.task_file}")
    if args.task == "-":
        return _decode(sys.stdin.buffer.read(), "on stdin")
    if args.task is not None:
        # a command line that is not UTF-8 arrives with surrogate escapes
        return _decode(args.task.encode("utf-8", "surrogateescape"), "argument")
    return None


def _override(definition: Any, overrides: dict[str, Any]) -> Any:
    """The root agent with ``--model`` / ``--max-turns`` applied (validated like a new one)."""
    from anabranch.agents import Agent

    if not overrides:
        return definition
    if not isinstance(definition, Agent):
        raise CliError("--model and --max-turns apply to an Agent, not a Graph")
    fields = {name: getattr(definition, name) for name in type(definition).model_fields}
    return Agent(**{**fields, **overrides})


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if args.model is not None:
        found["model"] = args.model
    if args.max_turns is not None:
        if args.max_turns < 1:
            raise CliError("--max-turns must be at least 1")
        found["max_turns"] = args.max_turns
    return found


async def cmd_run(args: argparse.Namespace) -> int:
    from anabranch.agents import Graph
    from anabranch.runtime._loader import parse_reference

    check_db(args.db)
    rate = call_rate(args)  # a bad limit is one line before anything is read or imported
    task = read_task(args)
    overrides = _overrides(args)
    source = str(parse_reference(args.target))
    definition = _override(_load_definition(args.target), overrides)
    if isinstance(definition, Graph) and task:
        raise CliError(f"{args.target} is a Graph: its tasks carry their prompts; drop TASK")
    if not isinstance(definition, Graph) and not task:
        raise CliError(f"{args.target} is an Agent: give it a TASK (or - to read it from stdin)")
    model = _model_for(args, source)  # before any file or session: credentials checked here
    model = _rate_limited(model, rate)
    started: Started = args.started

    def announce(session_id: str) -> None:
        started.session_id = session_id
        print(f"session {session_id}", file=sys.stderr, flush=True)

    if isinstance(definition, Graph):
        async with _runtime(args, model) as rt:
            graph_result = await rt.run_graph(
                definition,
                source=source,
                on_session=announce,
                budget=args.budget,
                tenant=args.tenant,
            )
        if not args.events:
            print(graph_result.output)
        graph_result.raise_for_status()
        return 0
    assert task is not None
    async with _runtime(args, model) as rt:
        if overrides:
            rt.session_notes[OVERRIDES_KEY] = overrides
        result = await rt.run(
            definition,
            task,
            source=source,
            on_session=announce,
            budget=args.budget,
            tenant=args.tenant,
        )
    result.raise_for_status()
    _note_incomplete(result)
    if not args.events:
        print(output_text(result.output))
    return 0


def _note_incomplete(result: Any) -> None:
    if result.incomplete:
        print(
            f"incomplete: stopped by a limit ({result.stop_reason}); continue it with "
            f"anabranch resume {result.session_id} --budget ...",
            file=sys.stderr,
        )


async def cmd_resume(args: argparse.Namespace) -> int:
    from anabranch.agents import Agent
    from anabranch.runtime._history import session_outline
    from anabranch.runtime._loader import load_recorded, recorded_digest

    check_db(args.db)
    rate = call_rate(args)
    args.started.session_id = args.session_id
    async with open_store(args.db, read_only=True) as store:
        session = await store.get_session(args.session_id)
    if session is None:
        from anabranch.errors import SessionNotFoundError

        raise SessionNotFoundError(args.session_id)
    finished = session.status in ("done", "failed") and session.finished is not None
    definition = None
    source = session.source
    if args.target is not None:
        definition = _load_definition(args.target)
        source = args.target
    elif not finished and session.source:
        definition = load_recorded(
            session.source, recorded_digest(session.definition), f"session {session.id}"
        )
    if definition is not None and session.definition:
        overrides = session_outline(session).get(OVERRIDES_KEY) or {}
        definition = _override(definition, overrides)
    # a finished session is answered from the store: no model, no file to run
    model = None if finished else _model_for(args, source if definition else None)
    if finished and args.offline:
        from anabranch.testing import TestModel

        model = TestModel()
    rt = _runtime(args, _rate_limited(model, rate))
    await rt.open(create=False)
    try:
        if definition is not None:
            rt.register(definition)
        agent = definition if isinstance(definition, Agent) else None
        result = await rt.resume(args.session_id, agent, budget=args.budget)
    finally:
        await rt.aclose()
    _note_incomplete(result)
    result.raise_for_status()
    if not args.events:
        print(output_text(result.output))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run`` and ``resume`` to the ``anabranch`` command."""
    run = add_command(
        commands,
        "run",
        cmd_run,
        "Run an agent on a task (or a task graph) in a new session. This imports FILE "
        "(or MODULE), which runs its code.",
    )
    run.add_argument(
        "target",
        metavar="FILE:OBJ",
        help="a Python file (or an importable module) and the Agent or Graph in it",
    )
    run.add_argument(
        "task", nargs="?", help="the task text (an Agent needs one; a Graph none); - reads stdin"
    )
    run.add_argument("--task-file", metavar="PATH", help="read the task from a UTF-8 file")
    run.add_argument("--model", help="use this model for the root agent")
    run.add_argument("--max-turns", type=int, help="the root agent's max_turns")
    run.add_argument("--offline", action="store_true", help="use the built-in TestModel")
    add_progress_arguments(run)
    add_budget_arguments(run, tenant=True)
    add_rate_arguments(run, shared_by="this run's model calls")
    add_trace_arguments(run)

    resume = add_command(
        commands,
        "resume",
        cmd_resume,
        "Continue a session by its id. Runs FILE:OBJ if given; else the file recorded at "
        "the start, only if it is unchanged.",
    )
    resume.add_argument("session_id", metavar="ID")
    resume.add_argument(
        "target",
        metavar="FILE:OBJ",
        nargs="?",
        help="the definition to continue with (default: the recorded file, if unchanged)",
    )
    resume.add_argument("--offline", action="store_true", help="use the built-in TestModel")
    add_progress_arguments(resume)
    add_budget_arguments(resume, tenant=False)
    add_rate_arguments(resume, shared_by="this resume's model calls")
    add_trace_arguments(resume)
