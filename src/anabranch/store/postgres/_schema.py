"""The PostgreSQL schema (``anabranch``) and its forward-only, versioned migrations.

The same tables as the SQLite store. History tables are append-only, enforced by
triggers: an ``UPDATE``, ``DELETE`` or ``TRUNCATE`` raises. Only ``leases`` (who drives a
session now), ``workers`` (heartbeats), the call-rate tables and ``meta`` change in place.
History search uses PostgreSQL's own full-text search: expression GIN indexes over the
text of each message and spill, so no second copy of the text is stored.
"""

from __future__ import annotations

__all__ = ["APP_ID", "MIGRATIONS", "SCHEMA", "SCHEMA_VERSION", "TEXT_SEARCH_CONFIG"]

APP_ID = "anabranch"
SCHEMA = "anabranch"
TEXT_SEARCH_CONFIG = "simple"
"""No stemming and no stop words, like SQLite's ``unicode61`` tokenizer."""

APPEND_ONLY = (
    "sessions",
    "session_events",
    "runs",
    "run_ends",
    "messages",
    "calls",
    "call_outcomes",
    "tool_events",
    "snapshots",
    "boundaries",
    "spills",
    "cache_breaks",
    "run_spans",
    "context_limits",
)

_V1 = """
CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE sessions (
    id text PRIMARY KEY, created double precision NOT NULL, kind text NOT NULL,
    entry text NOT NULL, task text NOT NULL, source text, definition text);
CREATE INDEX sessions_created ON sessions (created);
CREATE TABLE session_events (
    id bigserial PRIMARY KEY, session_id text NOT NULL REFERENCES sessions (id),
    status text NOT NULL, output text, error text, created double precision NOT NULL);
CREATE INDEX session_events_session ON session_events (session_id, id);
CREATE TABLE leases (
    session_id text PRIMARY KEY, owner text NOT NULL, host text NOT NULL, pid integer NOT NULL,
    expires double precision NOT NULL, epoch bigint NOT NULL DEFAULT 1);
CREATE TABLE runs (
    id text PRIMARY KEY, session_id text NOT NULL REFERENCES sessions (id),
    parent_run_id text, parent_call_id text, task_id text, agent_name text NOT NULL,
    model text NOT NULL, depth integer NOT NULL, mode text NOT NULL,
    created double precision NOT NULL, ord bigserial NOT NULL);
CREATE INDEX runs_session ON runs (session_id, created, ord);
CREATE INDEX runs_parent ON runs (parent_run_id, parent_call_id);
-- a run's status is its latest row here ('running' again once a conversation continues)
CREATE TABLE run_ends (
    id bigserial PRIMARY KEY, run_id text NOT NULL REFERENCES runs (id), status text NOT NULL,
    output text, error text, finished double precision NOT NULL);
CREATE INDEX run_ends_run ON run_ends (run_id, id);
CREATE TABLE messages (
    id bigserial PRIMARY KEY, run_id text NOT NULL REFERENCES runs (id), seq integer NOT NULL,
    role text NOT NULL, content text NOT NULL, kind text NOT NULL,
    created double precision NOT NULL, UNIQUE (run_id, seq));
CREATE TABLE calls (
    id bigserial PRIMARY KEY, run_id text NOT NULL REFERENCES runs (id), turn integer NOT NULL,
    attempt integer NOT NULL, fingerprint text NOT NULL, message_count integer NOT NULL,
    created double precision NOT NULL, snapshot_version integer, compactions integer,
    settings text);
CREATE INDEX calls_run_turn ON calls (run_id, turn, id);
CREATE TABLE call_outcomes (
    id bigserial PRIMARY KEY, call_id bigint NOT NULL UNIQUE REFERENCES calls (id),
    status text NOT NULL, error_type text, error text, response_id text, model text,
    stop_reason text, usage text, message_seq integer, created double precision NOT NULL);
CREATE TABLE tool_events (
    id bigserial PRIMARY KEY, run_id text NOT NULL, call_id text NOT NULL, name text NOT NULL,
    event text NOT NULL, content text, is_error boolean NOT NULL DEFAULT false,
    created double precision NOT NULL, attachments text);
CREATE INDEX tool_events_run_call ON tool_events (run_id, call_id);
CREATE TABLE snapshots (
    id bigserial PRIMARY KEY, run_id text NOT NULL, version integer NOT NULL,
    reason text NOT NULL, system text NOT NULL, tools text NOT NULL,
    created double precision NOT NULL, UNIQUE (run_id, version));
CREATE TABLE boundaries (
    id bigserial PRIMARY KEY, run_id text NOT NULL, kind text NOT NULL, prefix text NOT NULL,
    ranges text NOT NULL, strategy text, trigger text, tokens_before integer,
    tokens_after integer, messages_before integer, messages_after integer, summary text,
    model text, duration double precision, status text NOT NULL, error text, extra text,
    created double precision NOT NULL);
CREATE INDEX boundaries_run ON boundaries (run_id, id);
CREATE TABLE spills (
    handle text PRIMARY KEY, run_id text NOT NULL, call_id text NOT NULL, content text NOT NULL,
    created double precision NOT NULL);
CREATE INDEX spills_run ON spills (run_id);
CREATE TABLE cache_breaks (
    id bigserial PRIMARY KEY, run_id text NOT NULL, call_id bigint NOT NULL, cause text NOT NULL,
    expected_read integer NOT NULL, actual_read integer NOT NULL,
    created double precision NOT NULL);
CREATE INDEX cache_breaks_run ON cache_breaks (run_id);
CREATE TABLE run_spans (
    id bigserial PRIMARY KEY, session_id text NOT NULL, run_id text NOT NULL,
    trace_id text NOT NULL, span_id text NOT NULL, created double precision NOT NULL);
CREATE INDEX run_spans_run ON run_spans (run_id, id);
CREATE TABLE context_limits (
    id bigserial PRIMARY KEY, model text NOT NULL, channel text NOT NULL,
    maximum integer NOT NULL, ratio double precision NOT NULL, "window" integer NOT NULL,
    source text NOT NULL, run_id text, created double precision NOT NULL);
CREATE INDEX context_limits_channel ON context_limits (model, channel, id);
CREATE INDEX context_limits_run ON context_limits (run_id);
CREATE TABLE workers (
    executor_id text PRIMARY KEY, host text NOT NULL, pid integer NOT NULL, queue text NOT NULL,
    started double precision NOT NULL, heartbeat double precision NOT NULL,
    recovered_by text);

CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'anabranch: table % is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END $$;

-- the searchable text of a message's content blocks (text, tool results, tool calls)
CREATE FUNCTION message_text(content text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    blocks jsonb;
BEGIN
    BEGIN
        blocks := content::jsonb;
    EXCEPTION WHEN others THEN
        RETURN content;
    END;
    IF jsonb_typeof(blocks) <> 'array' THEN
        RETURN content;
    END IF;
    RETURN coalesce((
        SELECT string_agg(coalesce(
            b ->> 'text', b ->> 'content', (b ->> 'name') || ' ' || (b ->> 'input')), E'\\n')
        FROM jsonb_array_elements(blocks) AS b), '');
END $$;

CREATE INDEX messages_search ON messages
    USING gin (to_tsvector('simple'::regconfig, message_text(content)))
    WHERE kind = 'message';
CREATE INDEX spills_search ON spills USING gin (to_tsvector('simple'::regconfig, content));
"""


_V2_BUDGETS = """
CREATE TABLE tenant_spend (
    id bigserial PRIMARY KEY, tenant text NOT NULL, session_id text NOT NULL,
    run_id text NOT NULL, tokens bigint NOT NULL, cost_usd double precision NOT NULL,
    created double precision NOT NULL);
CREATE INDEX tenant_spend_period ON tenant_spend (tenant, created);
CREATE TABLE session_budgets (
    id bigserial PRIMARY KEY, session_id text NOT NULL, tenant text, budget text,
    tenant_budget text, created double precision NOT NULL);
CREATE INDEX session_budgets_session ON session_budgets (session_id, id);
"""
"""Tenants' spend (one row per call, summed over a period) and sessions' budgets."""
BUDGET_TABLES = ("tenant_spend", "session_budgets")


_V3_TOOL_RESULT_REFS = """
-- A finished tool's output is stored once: a message's tool_result block may refer to its
-- call's finished event ({"ref": "tool_event"}); the searchable text reads that event.
-- Declared IMMUTABLE for the index: the result a reference stands for never changes
-- (tool_events is append-only, and the loop writes a reference only to a committed event,
-- comparing it with the call's latest finished one, which this reads).
CREATE FUNCTION message_text(run text, content text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$
DECLARE
    blocks jsonb;
BEGIN
    BEGIN
        blocks := content::jsonb;
    EXCEPTION WHEN others THEN
        RETURN content;
    END;
    IF jsonb_typeof(blocks) <> 'array' THEN
        RETURN content;
    END IF;
    RETURN coalesce((
        SELECT string_agg(CASE
            WHEN b ->> 'type' = 'tool_result' AND b ->> 'ref' = 'tool_event' THEN (
                SELECT t.content FROM tool_events t
                WHERE t.run_id = run AND t.call_id = b ->> 'tool_use_id'
                  AND t.event = 'finished'
                ORDER BY t.id DESC LIMIT 1)
            ELSE coalesce(
                b ->> 'text', b ->> 'content', (b ->> 'name') || ' ' || (b ->> 'input'))
            END, E'\\n')
        FROM jsonb_array_elements(blocks) AS b), '');
END $$;

DROP INDEX messages_search;
CREATE INDEX messages_search ON messages
    USING gin (to_tsvector('simple'::regconfig, message_text(run_id, content)))
    WHERE kind = 'message';
"""


_V4_CALL_LIMITS = """
CREATE TABLE call_limits (
    name text PRIMARY KEY, blocked_until double precision NOT NULL DEFAULT 0);
CREATE TABLE call_slots (
    id bigserial PRIMARY KEY, name text NOT NULL REFERENCES call_limits (name),
    granted double precision NOT NULL, tokens bigint NOT NULL);
CREATE INDEX call_slots_window ON call_slots (name, granted);
-- leases held or left unreleased (a released one has expires = 0): workers look for
-- expired ones every heartbeat
CREATE INDEX leases_held ON leases (expires) WHERE expires > 0;
"""
"""Model-call rate limits shared by every worker (``PostgresCallLimiter``): one row per
limit (locked while a call is granted; a pause after a 429) and the calls granted within
its window (older ones are deleted as they leave it: not history). And an index for the
failover of sessions whose lease expired."""


_V5_CALL_CHARGES = """
ALTER TABLE call_slots
    ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0;
"""
"""A granted call's input and output tokens apart (``tokens`` stays their sum), so one
limit can hold input and output tokens per period separately, as the API does."""


_V6_SPILL_REFS = """
-- A spilled tool output is stored once: a spill whose text equals its call's finished
-- event keeps only that event's id (content is NULL). Rows stored so far keep their copy.
ALTER TABLE spills ALTER COLUMN content DROP NOT NULL;
ALTER TABLE spills ADD COLUMN event_id bigint;
ALTER TABLE spills ADD CONSTRAINT spills_text CHECK (content IS NOT NULL OR event_id IS NOT NULL);
-- the searchable text of a spill; IMMUTABLE for the index: tool_events is append-only and a
-- spill refers only to a committed event
CREATE FUNCTION spill_text(event_ref bigint, own_text text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$
BEGIN
    IF own_text IS NOT NULL THEN
        RETURN own_text;
    END IF;
    RETURN (SELECT t.content FROM tool_events t WHERE t.id = event_ref);
END $$;
DROP INDEX spills_search;
CREATE INDEX spills_search ON spills
    USING gin (to_tsvector('simple'::regconfig, spill_text(event_id, content)));
"""


def _append_only_triggers(tables: tuple[str, ...] = APPEND_ONLY) -> str:
    return "\n".join(
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();"
        for table in tables
    )


MIGRATIONS: list[str] = [
    _V1 + _append_only_triggers(),
    _V2_BUDGETS + _append_only_triggers(BUDGET_TABLES),
    _V3_TOOL_RESULT_REFS,
    _V4_CALL_LIMITS,
    _V5_CALL_CHARGES,
    _V6_SPILL_REFS,
]
"""One script per schema version; each runs in one transaction with the previous ones."""
SCHEMA_VERSION = len(MIGRATIONS)
