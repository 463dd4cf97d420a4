"""``anabranch worker``, ``submit``, ``wait`` and ``migrate``: sessions beyond one process.

Workers and queued sessions need PostgreSQL (``--db postgresql://…``) and the
``postgres`` extra; ``migrate`` copies a SQLite file's sessions into PostgreSQL.
"""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from anabranch.cli._common import OFFLINE_MODEL, CliError, add_command
from anabranch.cli._rate_args import add_rate_arguments, call_rate
from anabranch.errors import UserError
from anabranch.runtime._loader import load_module, split_reference
from anabranch.store import describe_db, is_postgres_url

__all__ = ["register"]


if TYPE_CHECKING:
    from anabranch.agents import Agent, Graph


def _require_postgres(db: str, command: str) -> None:
    if not is_postgres_url(db):
        raise CliError(
            f"anabranch {command} needs a PostgreSQL database: --db postgresql://…"
            f" (or ANABRANCH_DB), not {describe_db(db)}"
        )


def _definitions(files: list[str]) -> tuple[list[Agent], list[Graph]]:
    """Every Agent and Graph bound at module level in ``files``, by unique name."""
    from anabranch.agents import Agent, Graph

    agents: dict[str, Agent] = {}
    graphs: dict[str, Graph] = {}
    for file in files:
        module = load_module(Path(file))
        for value in vars(module).values():
            if isinstance(value, Agent | Graph):
                known: dict[str, Any] = graphs if isinstance(value, Graph) else agents
                other = known.get(value.name)
                if other is not None and other is not value:
                    raise CliError(f"two definitions are named {value.name!r} (in {file})")
                known[value.name] = value
    if not agents and not graphs:
        raise CliError(f"no Agent or Graph is defined in {', '.join(files)}")
    return list(agents.values()), list(graphs.values())


def _offline_model(files: list[str], offline: bool) -> Any:
    if not offline:
        return None
    from anabranch.models._base import Model
    from anabranch.testing import TestModel

    for file in files:
        declared = getattr(load_module(Path(file)), OFFLINE_MODEL, None)
        if isinstance(declared, Model):
            return declared
    return TestModel()


def _rate(text: str | None) -> tuple[int, float] | None:
    if text is None:
        return None
    limit, _, period = text.partition("/")
    try:
        parsed = int(limit), float(period or "60")
    except ValueError:
        raise CliError(f"--starts-per expects LIMIT/SECONDS (e.g. 100/60), not {text!r}") from None
    if parsed[0] < 1 or parsed[1] <= 0:
        raise CliError(f"--starts-per needs a positive limit and period, got {text!r}")
    return parsed


async def cmd_worker(args: argparse.Namespace) -> int:
    rate = call_rate(args)  # a bad limit is one line before anything is imported or opened
    from anabranch.runtime._runtime import Runtime

    _require_postgres(args.db, "worker")
    from anabranch.runtime._worker import WorkerOptions, serve

    agents, graphs = _definitions(args.files)
    options = WorkerOptions(
        queue=args.queue,
        concurrency=args.concurrency,
        global_concurrency=args.global_concurrency,
        starts_per_period=_rate(args.starts_per),
        executor_id=args.executor_id or "",
        heartbeat=args.heartbeat,
        dead_after=args.dead_after,
    )
    options.validate(args.lease_ttl)
    stop = anyio.Event()

    def ready(executor_id: str) -> None:
        names = ", ".join(sorted([a.name for a in agents] + [g.name for g in graphs]))
        print(
            f"worker {executor_id} serving queue {options.queue} on {describe_db(args.db)} "
            f"(concurrency {options.concurrency}; defines {names})",
            file=sys.stderr,
            flush=True,
        )

    async def on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                stop.set()
                return

    model = _offline_model(args.files, args.offline)
    async with AsyncExitStack() as stack:
        if rate is not None:
            model = await _rate_limited(stack, model, args.db, rate, args.lease_ttl)
        rt = await stack.enter_async_context(
            Runtime(
                db=args.db,
                model=model,
                tracer_provider=args.tracer_provider,
                agents=agents,
                graphs=graphs,
                lease_ttl=args.lease_ttl,
            )
        )
        async with anyio.create_task_group() as group:
            group.start_soon(on_signal)
            await serve(rt, args.db, options, on_ready=ready, stop=stop)
            group.cancel_scope.cancel()
    return 0


async def _rate_limited(
    stack: AsyncExitStack, model: Any, dsn: str, rate: Any, lease_ttl: float
) -> Any:
    """``model`` (default: the Anthropic client) under ``rate``, shared by every worker on
    the database; closed with ``stack``. A worker frozen inside a grant holds the others
    back no longer than it holds its leases (``lease_ttl``)."""
    from anabranch.models._pg_rate import PostgresCallLimiter
    from anabranch.models._rate import RateLimitedModel

    if model is None:
        from anabranch.models._anthropic import AnthropicModel

        model = AnthropicModel()
    limiter = PostgresCallLimiter(dsn, rate, stall_timeout=lease_ttl)
    await limiter.open()
    stack.push_async_callback(limiter.aclose)
    limited = RateLimitedModel(model, limiter)
    stack.push_async_callback(limited.aclose)
    return limited


async def cmd_submit(args: argparse.Namespace) -> int:
    from anabranch.runtime._runtime import Runtime

    _require_postgres(args.db, "submit")
    from anabranch.agents import Agent, Graph
    from anabranch.runtime._loader import load_object

    path, name = split_reference(args.target)
    definition = load_object(args.target)
    if isinstance(definition, Graph) and args.task is not None:
        raise CliError(f"{args.target} is a Graph: its tasks carry their prompts; drop TASK")
    if isinstance(definition, Agent) and args.task is None:
        raise CliError(f"{args.target} is an Agent: give it a TASK")
    if not isinstance(definition, Agent | Graph):
        raise CliError(
            f"{args.target} is a {type(definition).__name__}: submit takes an Agent or a Graph"
        )
    async with Runtime(db=args.db) as rt:
        session_id = await rt.submit(
            definition, args.task, queue=args.queue, source=f"{path}:{name}"
        )
    print(session_id, flush=True)
    return 0


async def cmd_wait(args: argparse.Namespace) -> int:
    from anabranch.runtime._runtime import Runtime

    if args.timeout is not None and args.timeout <= 0:
        raise CliError(f"--timeout must be positive, got {args.timeout:g}")
    rt = Runtime(db=args.db)
    await rt.open(create=False)
    try:
        result = await rt.wait(args.session_id, timeout=args.timeout)
    finally:
        await rt.aclose()
    if result.status != "done":
        raise CliError(f"session {result.session_id} failed: {result.error}")
    print(result.output)
    return 0


async def cmd_migrate(args: argparse.Namespace) -> int:
    _require_postgres(args.to, "migrate --to")
    from anabranch.store.postgres._import import import_sqlite

    source = Path(args.source)
    try:
        counts = await anyio.to_thread.run_sync(import_sqlite, source, args.to)
    except UserError as exc:
        raise CliError(str(exc)) from None
    print(
        f"copied {counts['sessions']} sessions ({counts['runs']} runs, "
        f"{counts['messages']} messages, {counts['calls']} model calls) from {source} "
        f"to {describe_db(args.to)}"
    )
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from anabranch.cli._tracing import add_trace_arguments

    worker = add_command(
        commands, "worker", cmd_worker, "Run queued sessions (PostgreSQL) until stopped."
    )
    worker.add_argument("files", metavar="FILE", nargs="+", help="definition files to serve")
    worker.add_argument("--concurrency", type=int, default=16, help="sessions at once (16)")
    worker.add_argument("--queue", default="anabranch", help="DBOS queue to serve (anabranch)")
    worker.add_argument(
        "--global-concurrency",
        type=int,
        default=None,
        help="sessions at once across every worker of the queue",
    )
    worker.add_argument(
        "--starts-per",
        metavar="LIMIT/SECONDS",
        default=None,
        help="rate limit on session starts across workers (e.g. 100/60)",
    )
    worker.add_argument(
        "--executor-id",
        default=None,
        help="stable id of this worker ($ANABRANCH_EXECUTOR_ID or host-pid)",
    )
    worker.add_argument("--heartbeat", type=float, default=1.0, help="seconds between heartbeats")
    worker.add_argument(
        "--lease-ttl",
        type=float,
        default=10.0,
        help="session lease ttl; a silent worker is dead after it (10 s)",
    )
    worker.add_argument(
        "--dead-after",
        type=float,
        default=None,
        help="a worker whose heartbeat is older is dead (default: the lease ttl)",
    )
    add_rate_arguments(worker, shared_by="every worker on the database")
    worker.add_argument("--offline", action="store_true", help="Use the built-in TestModel")
    add_trace_arguments(worker)

    submit = add_command(
        commands, "submit", cmd_submit, "Queue a session for the workers; prints its id."
    )
    submit.add_argument(
        "target", metavar="FILE:OBJ", help="Python file and the Agent or Graph in it"
    )
    submit.add_argument(
        "task", nargs="?", default=None, help="the task text (an Agent needs one; a Graph none)"
    )
    submit.add_argument("--queue", default="anabranch", help="DBOS queue (anabranch)")

    wait = add_command(
        commands, "wait", cmd_wait, "Wait for a session to finish; prints its output."
    )
    wait.add_argument("session_id", metavar="ID")
    wait.add_argument("--timeout", type=float, default=None, help="give up after S seconds")

    migrate = commands.add_parser(
        "migrate",
        help="Copy the sessions of a SQLite file into PostgreSQL.",
        description="Copy the sessions of a SQLite file into PostgreSQL.",
    )
    migrate.add_argument("--from", dest="source", required=True, metavar="FILE")
    migrate.add_argument("--to", required=True, metavar="postgresql://…")
    migrate.set_defaults(handler=cmd_migrate)
