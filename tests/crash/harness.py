"""The crash-test harness: run a session in subprocesses, SIGKILL them at chosen points,
resume by id until the session is done, and check what the store and the world saw.

Subprocesses are forked from a fork server that has already imported anabranch, so one
attempt costs milliseconds to start instead of seconds; each is still a separate process
that dies by ``SIGKILL`` with no cleanup at all.

Checks after every chain of attempts (``check_chain``):

- the session is done, and its transcripts equal the uninterrupted run's (every run's
  messages, compaction boundaries and outcome, with ids and timestamps normalized away);
- every tool call whose result was committed had its side effect exactly once, and no
  side effect belongs to a call the final transcripts do not contain;
- no finished tool ran again (the tools probe the store, see ``scenario``);
- the server never answered a request with an error (a pairing violation is a 400);
- each run's messages are numbered 0..n-1 without gaps (nothing lost or duplicated).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import signal
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import anyio

from anabranch.context._pairing import pairing_violations
from anabranch.messages import ModelRequest, ModelResponse, canonical_json
from anabranch.models._base import Model
from anabranch.testing._records import RequestRecord
from tests.crash.driver import IN_PROCESS_EVENTS, Spec, child_main
from tests.crash.scenario import SIDE_EFFECT_TOOLS

__all__ = [
    "ALL_EVENTS",
    "KILL_RANGES",
    "Chain",
    "Harness",
    "KillPoint",
    "KillSwitch",
    "Transcript",
    "check_chain",
    "random_kill_points",
    "request_keys",
    "transcript",
]

ALL_EVENTS = (*IN_PROCESS_EVENTS, "server", "timer")
ATTEMPT_TIMEOUT = 120.0
MAX_ATTEMPTS = 60
"""After this many killed attempts a chain's next attempt runs without a kill point."""

_context: ForkServerContext | None = None


def fork_context() -> ForkServerContext:
    """The fork server, started once per process with the driver already imported."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["tests.crash.driver", "tests.crash.worker"])
        _context = context
    return _context


@dataclass(frozen=True)
class KillPoint:
    """Where to SIGKILL one attempt: the ``at``-th ``event`` (``timer``: milliseconds)."""

    event: str
    at: int

    def __str__(self) -> str:
        return f"{self.event}#{self.at}"


KILL_RANGES = {
    "commit": (1, 40),
    "request": (1, 4),
    "stream": (1, 4),
    "response": (1, 4),
    "summary": (1, 2),
    "tool": (1, 8),
    "tool_after": (1, 8),
    "server": (1, 4),
    "timer": (20, 400),
}
"""Where in an attempt each kind of kill point falls (small: most attempts get killed)."""


def random_kill_points(
    rng: random.Random, events: Sequence[str] = ALL_EVENTS
) -> Iterator[KillPoint]:
    """An endless, seeded stream of kill points, taking the events in turn."""
    while True:
        for event in events:
            low, high = KILL_RANGES[event]
            yield KillPoint(event, rng.randint(low, high))


class KillSwitch:
    """The server's policy: ``inner`` answers; when armed, the ``at``-th request that
    reaches the server kills the attempt that sent it (``SIGKILL``) before it is answered."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self._process: Any = None
        self._at = 0
        self._count = 0
        self.kills = 0

    def arm(self, process: Any, at: int) -> None:
        self._process, self._at, self._count = process, at, 0

    def disarm(self) -> None:
        self._process = None

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self._process is not None:
            self._count += 1
            if self._count == self._at and self._process.pid:
                os.kill(self._process.pid, signal.SIGKILL)
                self.kills += 1
                self._process = None
        return await self.inner.request(request)


@dataclass
class Chain:
    """One session driven through killed attempts until it is done."""

    workdir: Path
    session_id: str | None = None
    attempts: int = 0
    kills: list[KillPoint] = field(default_factory=list)
    """Kill points that did kill an attempt (others were not reached: the session finished)."""
    result: dict[str, Any] | None = None
    dsn: str | None = None
    """The PostgreSQL database of the chain, if it does not run on its own SQLite file."""

    @property
    def db(self) -> Path | str:
        return self.dsn if self.dsn is not None else self.workdir / "session.db"


class Harness:
    """Runs chains for one anyio backend against the server at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        backend: str,
        switch: KillSwitch,
        *,
        synchronous: str = "FULL",
        kind: str = "agent",
    ) -> None:
        self.kind = kind
        self.base_url = base_url
        self.backend = backend
        self.switch = switch
        self.synchronous = synchronous

    async def run_chain(self, workdir: Path, kills: Iterable[KillPoint]) -> Chain:
        """Start the session, then resume it after every kill until it is done."""
        workdir.mkdir(parents=True, exist_ok=True)
        chain = Chain(workdir)
        plan = iter(kills)
        while True:
            kill = next(plan, None) if len(chain.kills) < MAX_ATTEMPTS else None
            killed = await self.attempt(chain, kill)
            if not killed:
                break
            assert kill is not None
            chain.kills.append(kill)
            if chain.session_id is None:
                chain.session_id = _session_in(chain)
        result_file = workdir / "result.json"
        chain.result = json.loads(result_file.read_text())
        if chain.session_id is None:
            chain.session_id = chain.result["session_id"]
        return chain

    async def attempt(self, chain: Chain, kill: KillPoint | None) -> bool:
        """One subprocess; True if it was killed, False if it finished the session."""
        chain.attempts += 1
        spec = Spec(
            db=str(chain.db),
            workdir=str(chain.workdir),
            base_url=self.base_url,
            backend=self.backend,
            attempt=chain.attempts,
            session_id=chain.session_id,
            kill_event=kill.event if kill and kill.event in IN_PROCESS_EVENTS else None,
            kill_at=kill.at if kill else 0,
            synchronous=self.synchronous,
            kind=self.kind,
        )
        process = fork_context().Process(target=child_main, args=(spec.to_json(),))
        if kill is not None and kill.event == "server":
            self.switch.arm(process, kill.at)
        process.start()
        try:
            timer = kill is not None and kill.event == "timer"
            timeout = kill.at / 1000.0 if kill is not None and timer else ATTEMPT_TIMEOUT
            # Wait on the sentinel from this thread only: the process object is not
            # thread-safe (two pollers can each read half of its exit status).
            with anyio.move_on_after(timeout) as waited:
                await anyio.wait_readable(process.sentinel)
            if waited.cancelled_caught:
                process.kill()
                await anyio.wait_readable(process.sentinel)
                if not timer:
                    raise AssertionError(f"attempt {chain.attempts} hung: {_log(spec)}")
            process.join()
        finally:
            self.switch.disarm()
        code = process.exitcode
        process.close()
        if code == -signal.SIGKILL:
            return True
        if code != 0:
            raise AssertionError(f"attempt {chain.attempts} failed (exit {code}): {_log(spec)}")
        return False


def _log(spec: Spec) -> str:
    path = spec.log_file()
    return path.read_text()[-4000:] if path.exists() else "(no log)"


def _session_in(chain: Chain) -> str | None:
    """The chain's session id, from the file the child wrote or from its database."""
    file = chain.workdir / "session_id"
    if file.exists():
        return file.read_text().strip()
    if isinstance(chain.db, Path) and not chain.db.exists():
        return None
    with closing(_connect(chain.db)) as conn:
        try:
            row = conn.execute("SELECT id FROM sessions").fetchone()
        except sqlite3.OperationalError:  # killed while the schema was being created
            return None
    return str(row[0]) if row else None


class _Row(dict[str, Any]):
    """A row read by key or by position, like ``sqlite3.Row``."""

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, int):
            return list(self.values())[key]
        return super().__getitem__(key)


class _PostgresReader:
    """Enough of ``sqlite3.Connection`` for the reads below, on a PostgreSQL DSN."""

    def __init__(self, dsn: str) -> None:
        import psycopg
        from psycopg.rows import dict_row

        self.conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        self.conn.execute("SET search_path TO anabranch")
        self.row_factory: Any = None

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> _Rows:
        return _Rows(self.conn.execute(sql.replace("?", "%s"), params))

    def close(self) -> None:
        self.conn.close()


class _Rows:
    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor

    def fetchone(self) -> _Row | None:
        row = self.cursor.fetchone()
        return _Row(row) if row is not None else None

    def fetchall(self) -> list[_Row]:
        return [_Row(row) for row in self.cursor]

    def __iter__(self) -> Iterator[_Row]:
        return (_Row(row) for row in self.cursor)


def _connect(db: Path | str) -> Any:
    if isinstance(db, str) and db.startswith("postgresql://"):
        return _PostgresReader(db)
    return sqlite3.connect(f"{Path(db).absolute().as_uri()}?mode=ro", uri=True, timeout=30)


# ---------------------------------------------------------------- transcripts

_ID = re.compile(r"(?<![0-9A-Za-z])(?:toolu|run|ses|msg|req|out)_[0-9A-Za-z]+")


class _Names:
    """Replaces ids by placeholders numbered in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def __call__(self, text: str | None) -> str | None:
        if text is None:
            return None
        return _ID.sub(self._name, text)

    def _name(self, match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in self.names:
            prefix = found.split("_", 1)[0]
            self.names[found] = f"<{prefix}:{len(self.names)}>"
        return self.names[found]


@dataclass(frozen=True)
class Transcript:
    """Everything a session committed that must not depend on where it was killed."""

    session: tuple[str, str | None]
    runs: tuple[tuple[Any, ...], ...]
    tool_results: dict[str, str]
    """Call id (raw) -> tool name, for every tool call with a committed result."""
    tool_uses: frozenset[str]
    """Call ids (raw) of every tool_use in the committed messages."""
    seq_gaps: tuple[str, ...]


def transcript(db: Path | str, session_id: str) -> Transcript:
    """The session's committed state, normalized so two runs of the scenario compare."""
    names = _Names()
    with closing(_connect(db)) as conn:
        conn.row_factory = sqlite3.Row
        session = conn.execute(
            "SELECT status, output FROM session_events WHERE session_id = ? "
            "ORDER BY id DESC LIMIT 1",
            (session_id,),
        ).fetchone()
        runs = conn.execute(
            "SELECT r.*, e.status AS status, e.output AS output FROM runs r "
            "LEFT JOIN run_ends e ON e.run_id = r.id WHERE r.session_id = ?",
            (session_id,),
        ).fetchall()
        by_parent: dict[str | None, list[sqlite3.Row]] = {}
        for run in runs:
            by_parent.setdefault(run["parent_run_id"], []).append(run)
        out: list[tuple[Any, ...]] = []
        gaps: list[str] = []
        uses: set[str] = set()
        queue = sorted(by_parent.get(None, []), key=lambda r: (r["task_id"] or "", r["agent_name"]))
        keys: dict[str, tuple[str, ...]] = {
            run["id"]: (run["task_id"] or run["agent_name"],) for run in queue
        }
        while queue:
            run = queue.pop(0)
            messages = conn.execute(
                "SELECT seq, role, kind, content FROM messages WHERE run_id = ? ORDER BY seq",
                (run["id"],),
            ).fetchall()
            if [m["seq"] for m in messages] != list(range(len(messages))):
                gaps.append(f"run {keys[run['id']]}: seqs {[m['seq'] for m in messages]}")
            for m in messages:
                for block in json.loads(m["content"]):
                    if block.get("type") == "tool_use":
                        uses.add(block["id"])
            boundaries = conn.execute(
                "SELECT kind, strategy, trigger, status, prefix, ranges, summary "
                "FROM boundaries WHERE run_id = ? ORDER BY id",
                (run["id"],),
            ).fetchall()
            out.append(
                (
                    keys[run["id"]],
                    run["agent_name"],
                    run["status"],
                    names(run["output"]),
                    tuple((m["role"], m["kind"], names(m["content"])) for m in messages),
                    tuple(tuple(names(b[k]) for k in b.keys()) for b in boundaries),
                )
            )
            children = by_parent.get(run["id"], [])
            for child in children:
                keys[child["id"]] = (*keys[run["id"]], str(names(child["parent_call_id"])))
            queue.extend(sorted(children, key=lambda c: keys[c["id"]]))
        results = {
            row[0]: row[1]
            for row in conn.execute(
                "SELECT call_id, name FROM tool_events WHERE event = 'finished' AND run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?)",
                (session_id,),
            )
        }
    return Transcript(
        session=(session["status"], names(session["output"])),
        runs=tuple(sorted(out, key=lambda r: r[0])),
        tool_results=results,
        tool_uses=frozenset(uses),
        seq_gaps=tuple(gaps),
    )


def _effects(workdir: Path) -> list[str]:
    path = workdir / "effects.tsv"
    if not path.exists():
        return []
    return [line.split("\t", 1)[0] for line in path.read_text().splitlines()]


def request_keys(server_log: Sequence[RequestRecord]) -> set[str]:
    """The requests the server saw, each normalized on its own (ids by appearance)."""
    keys = set()
    for record in server_log:
        if record.request is not None:
            keys.add(str(_Names()(canonical_json(record.request.model_dump(mode="json")))))
    return keys


def check_chain(
    chain: Chain,
    reference: Transcript,
    server_log: Sequence[RequestRecord],
    reference_requests: set[str] | None = None,
) -> list[str]:
    """Every way ``chain`` differs from an uninterrupted run; empty when it does not.

    With ``reference_requests`` (``request_keys`` of the uninterrupted run), every request
    the chain sent must be one the uninterrupted run sent too (a request cut off by a kill
    is sent again identically), and every one of those must have been sent.
    """
    problems: list[str] = []
    assert chain.session_id is not None
    got = transcript(chain.db, chain.session_id)
    if got.session != reference.session:
        problems.append(f"session outcome {got.session[0]!r} differs from the reference")
    if got.runs != reference.runs:
        problems.append(_first_difference(got.runs, reference.runs))
    problems += list(got.seq_gaps)
    effects = _effects(chain.workdir)
    repeated = sorted({c for c in effects if effects.count(c) > 1})
    if repeated:
        problems.append(f"side effects happened more than once for {repeated}")
    completed = {c for c, name in got.tool_results.items() if name in SIDE_EFFECT_TOOLS}
    missing = sorted(completed - set(effects))
    if missing:
        problems.append(f"completed tool calls without their side effect: {missing}")
    orphans = sorted(set(effects) - got.tool_uses)
    if orphans:
        problems.append(f"side effects of calls missing from the transcripts: {orphans}")
    violations = chain.workdir / "violations.tsv"
    if violations.exists() and violations.read_text().strip():
        problems.append("finished tools ran again:\n" + violations.read_text())
    if reference_requests is not None:
        sent = request_keys(server_log)
        if sent - reference_requests:
            problems.append(
                f"{len(sent - reference_requests)} requests differ from every request of "
                f"the uninterrupted run, e.g. {min(sent - reference_requests):.1500}"
            )
        if reference_requests - sent:
            problems.append(f"{len(reference_requests - sent)} requests were never sent")
    unpaired = [
        problem
        for record in server_log
        if record.request is not None
        for problem in pairing_violations(record.request.messages)
    ]
    if unpaired:
        problems.append(f"requests broke tool_use/tool_result pairing: {unpaired[:3]}")
    errors = [r for r in server_log if r.status not in (200,) or r.error_type is not None]
    if errors:
        problems.append(
            "the server answered with errors: "
            + "; ".join(f"{r.status} {r.error_type}: {r.error_message}" for r in errors[:3])
        )
    return problems


def _first_difference(got: Sequence[Any], want: Sequence[Any]) -> str:
    if len(got) != len(want):
        return f"{len(got)} runs, the reference has {len(want)}"
    for mine, theirs in zip(got, want, strict=True):
        if mine != theirs:
            for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                if a != b:
                    return (
                        f"run {mine[0]} differs from the reference in field {index}: "
                        f"{a!r:.800} != {b!r:.800}"
                    )
    return "runs differ"
