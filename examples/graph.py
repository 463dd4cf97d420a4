"""A diamond-shaped task graph: plan -> two research branches (in parallel) -> synthesis.

Each task is its own agent run with its own context; a task receives the final reports
(not the transcripts) of the tasks it depends on.

Run offline:  anabranch run examples/graph.py:graph --offline
Then:         anabranch show <ID>
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from anabranch import Agent, ContextPolicy, Graph, Task, tool

_FACTS = {
    "sqlite": "SQLite: embedded, one file, ACID, WAL mode; great for single-writer OLTP.",
    "duckdb": "DuckDB: embedded, columnar, vectorized; great for analytical scans.",
}


@tool
def read_fact_sheet(
    system: Annotated[str, Field(description="Database name, e.g. sqlite or duckdb")],
) -> str:
    """Return the fact sheet of one database."""
    return _FACTS.get(system.lower(), f"No fact sheet for {system!r}; known: {', '.join(_FACTS)}.")


@tool
async def estimate_scan_speed(
    system: Annotated[str, Field(description="Database name")],
    rows: Annotated[int, Field(description="Rows scanned", gt=0)] = 1_000_000,
) -> str:
    """Give a rough, qualitative speed estimate for a full-table scan."""
    fast = system.lower() == "duckdb"
    return f"{system}: scanning {rows} rows is {'fast (columnar)' if fast else 'row-by-row'}."


planner = Agent(
    name="planner",
    model="claude-sonnet-5-5",
    instructions="Break the question into two research questions, one per database.",
    context=ContextPolicy(window=32_000),
    max_report_tokens=300,
)

sqlite_researcher = Agent(
    name="sqlite_researcher",
    model="claude-haiku-5-5",
    description="Researches SQLite.",
    instructions="Answer the SQLite question from the plan using your tools.",
    tools=[read_fact_sheet],
    context=ContextPolicy(window=32_000, compact_at=0.6),
    max_report_tokens=400,
)

duckdb_researcher = Agent(
    name="duckdb_researcher",
    model="claude-haiku-5-5",
    description="Researches DuckDB.",
    instructions="Answer the DuckDB question from the plan using your tools.",
    tools=[read_fact_sheet, estimate_scan_speed],
    context=ContextPolicy(window=48_000, compact_at=0.7),
    max_report_tokens=400,
)

writer = Agent(
    name="writer",
    model="claude-sonnet-5-5",
    instructions="Write a short comparison from the research reports you are given.",
    context=ContextPolicy(window=64_000),
)

QUESTION = "Should a small analytics team use SQLite or DuckDB?"

graph = Graph(
    name="db-comparison",
    tasks=[
        Task(id="plan", agent=planner, prompt=f"Plan the research for: {QUESTION}"),
        Task(
            id="sqlite",
            agent=sqlite_researcher,
            prompt="Research SQLite for the plan.",
            depends_on=["plan"],
        ),
        Task(
            id="duckdb",
            agent=duckdb_researcher,
            prompt="Research DuckDB for the plan.",
            depends_on=["plan"],
        ),
        Task(
            id="synthesis",
            agent=writer,
            prompt=f"Answer the question: {QUESTION}",
            depends_on=["sqlite", "duckdb"],
        ),
    ],
    max_concurrency=2,
)
