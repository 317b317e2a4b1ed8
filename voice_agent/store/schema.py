"""The call store's tables, written once for both stores: SQLite (the default) and PostgreSQL
(several hosts). Each dialect fills in its own words; the tables, columns and indexes are the
same, so a column added for one store is there for the other.

The dialects differ in their types (JSON as text or jsonb, times as numbers or timestamptz),
in how a row id is made, and in the start time's column: SQLite keeps milliseconds in
`started_ms`, PostgreSQL a timestamptz in `started`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Dialect:
    text: str
    integer: str
    real: str
    json: str
    row_id: str  # a row id the database assigns, with its PRIMARY KEY
    started: str  # the name of the calls' start-time column
    started_type: str
    moment: str  # a point in time (a worker's start, its heartbeat)
    now_default: str  # what a moment column defaults to, as " DEFAULT ..." ("" for none)


SQLITE = Dialect(
    text="TEXT",
    integer="INTEGER",
    real="REAL",
    json="TEXT",
    row_id="INTEGER PRIMARY KEY",
    started="started_ms",
    started_type="INTEGER",
    moment="REAL",
    now_default="",
)
POSTGRES = Dialect(
    text="text",
    integer="integer",
    real="double precision",
    json="jsonb",
    row_id="bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    started="started",
    started_type="timestamptz",
    moment="timestamptz",
    now_default=" DEFAULT now()",
)

_TABLES = """
CREATE TABLE IF NOT EXISTS calls (
    call_id {text} PRIMARY KEY,
    agent {text} NOT NULL,
    transport {text} NOT NULL,
    started_at {text} NOT NULL,
    {started} {started_type} NOT NULL,
    ended_at {text},
    outcome {text},
    end_reason {text},
    worker_id {text} NOT NULL,
    state {json} NOT NULL DEFAULT '{{}}',
    messages {json} NOT NULL DEFAULT '[]',
    search_text {text} NOT NULL DEFAULT '',
    preview {text}
);
CREATE INDEX IF NOT EXISTS calls_started ON calls ({started});
CREATE INDEX IF NOT EXISTS calls_agent ON calls (agent, {started});
CREATE INDEX IF NOT EXISTS calls_outcome ON calls (outcome, {started});
CREATE INDEX IF NOT EXISTS calls_unfinished ON calls (worker_id) WHERE ended_at IS NULL;
CREATE TABLE IF NOT EXISTS call_events (
    id {row_id},
    call_id {text} NOT NULL,
    type {text} NOT NULL,
    t {real},
    data {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS call_events_call ON call_events (call_id, id);
CREATE TABLE IF NOT EXISTS call_turns (
    id {row_id},
    call_id {text} NOT NULL,
    metrics {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS call_turns_call ON call_turns (call_id, id);
CREATE TABLE IF NOT EXISTS call_workers (
    worker_id {text} PRIMARY KEY,
    machine {text} NOT NULL,
    pid {integer} NOT NULL,
    started {moment} NOT NULL{now_default},
    heartbeat {moment} NOT NULL{now_default}
);
"""


def schema(dialect: Dialect) -> str:
    """The statements that create what is missing, separated by semicolons."""
    return _TABLES.format(**asdict(dialect))
