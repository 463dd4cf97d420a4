"""A supervisor that splits a question between two researchers with their own tools.

Run offline:  anabranch run examples/research.py:supervisor "Compare SQLite and DuckDB" --offline
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from anabranch import Agent, ContextPolicy, ToolContext, tool

# A tiny offline "corpus" so the example is reproducible without a network.
_NOTES = {
    "sqlite": "SQLite is an embedded, serverless SQL database; one file, ACID, WAL mode.",
    "duckdb": "DuckDB is an embedded analytical (OLAP) database with columnar execution.",
    "postgres": "PostgreSQL is a client-server relational database with MVCC.",
}


@tool
async def search_notes(
    query: Annotated[str, Field(description="Words to look for in the notes")],
    ctx: ToolContext,
) -> str:
    """Search the local research notes and return matching lines."""
    words = query.lower().split()
    hits = [
        text for key, text in _NOTES.items() if any(w in key or w in text.lower() for w in words)
    ]
    ctx.logger.info("search_notes %r -> %d hits", query, len(hits))
    return "\n".join(hits) or f"No notes match {query!r}. Known topics: {', '.join(_NOTES)}."


@tool
def word_count(text: Annotated[str, Field(description="Text to measure")]) -> int:
    """Count the words in a piece of text."""
    return len(text.split())


@tool
async def benchmark_lookup(
    system: Annotated[str, Field(description="Database name, e.g. sqlite")],
    workload: Annotated[str, Field(description="oltp or olap")] = "oltp",
) -> dict[str, str]:
    """Look up a qualitative benchmark verdict for a database and workload."""
    verdicts = {
        ("sqlite", "oltp"): "fast for single-writer transactional work",
        ("duckdb", "olap"): "fast for scans and aggregations",
    }
    key = (system.lower(), workload.lower())
    return {"system": system, "workload": workload, "verdict": verdicts.get(key, "no data")}


literature_researcher = Agent(
    name="literature_researcher",
    model="claude-sonnet-5-5",
    description="Finds and summarises what the notes say about a topic.",
    instructions="You research one question in the notes and report findings with sources.",
    tools=[search_notes, word_count],
    context=ContextPolicy(window=64_000, compact_at=0.7, keep_recent=6),
    max_report_tokens=400,
)

benchmark_researcher = Agent(
    name="benchmark_researcher",
    model="claude-haiku-5-5",
    description="Looks up performance verdicts for databases and workloads.",
    instructions="You look up benchmark verdicts and report them with their workload.",
    tools=[benchmark_lookup],
    context=ContextPolicy(window=32_000, compact_at=0.6, keep_recent=4),
    max_report_tokens=300,
)

supervisor = Agent(
    name="supervisor",
    model="claude-opus-5-5",
    instructions="Split the question, delegate to your researchers, then write the final answer.",
    subagents=[literature_researcher, benchmark_researcher],
    tools=[search_notes],
    context=ContextPolicy(window=128_000),
)
