"""The call store on PostgreSQL, for several hosts sharing one database; driver: asyncpg.

Same tables as the SQLite store (store/schema.py), in Postgres types: timestamptz for the start
time, jsonb for state, context, events and metrics. The writer is the base class's asyncio
task; each batch is one transaction of `executemany`s on a pooled connection, so nothing
blocks the event loop. Heartbeats use the database's clock, so hosts with skewed clocks judge
one another alike. Text search is a LIKE on the case-folded transcript, as in SQLite, so both
behave the same.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import asyncpg

from voice_agent.store.base import LIVE, CallStore, event_from_row
from voice_agent.store.rows import Batch, CallFilter, WorkerInfo
from voice_agent.store.schema import POSTGRES, schema

POOL_SIZE = 4
# A hung connection must not stall the writer for good: the batch fails, is kept and retried.
COMMAND_TIMEOUT_S = 30.0
DELETE_CHUNK = 1000
SCHEMA_LOCK = 0x766F6963  # pg_advisory_xact_lock key: workers starting together create it once

SCHEMA = schema(POSTGRES)

INSERT_CALL = """
INSERT INTO calls (call_id, agent, transport, started_at, started, state, worker_id)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
ON CONFLICT (call_id) DO UPDATE SET
    agent = excluded.agent, transport = excluded.transport, worker_id = excluded.worker_id,
    ended_at = NULL, outcome = NULL, end_reason = NULL
"""
HEARTBEAT = """
INSERT INTO call_workers (worker_id, machine, pid) VALUES ($1, $2, $3)
ON CONFLICT (worker_id) DO UPDATE SET heartbeat = now()
"""
SUMMARY = """
SELECT c.call_id, c.agent, c.transport, c.started_at, c.ended_at, c.outcome, c.end_reason,
       (SELECT count(*) FROM call_turns t WHERE t.call_id = c.call_id)::int AS turns, c.preview
FROM calls c
"""

# jsonb cannot hold U+0000 and text cannot hold NUL: drop the escape (not an escaped backslash
# followed by "u0000", hence the even run of backslashes before it) and the character.
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _json(text: str) -> str:
    return _NUL_ESCAPE.sub(r"\1", text) if "u0000" in text else text


def _text(text: str | None) -> str | None:
    return text.replace("\x00", "") if text is not None else None


class PostgresCallStore(CallStore):
    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(**options)
        self.url = url
        self._pool: asyncpg.Pool | None = None

    def _p(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the call store is not started")
        return self._pool

    # ---- lifecycle -------------------------------------------------------------------------

    async def _open(self) -> None:
        self._pool = await asyncpg.create_pool(
            self.url, min_size=1, max_size=POOL_SIZE, command_timeout=COMMAND_TIMEOUT_S
        )
        async with self._p().acquire() as con, con.transaction():
            await con.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
            await con.execute(SCHEMA)
            await con.execute(HEARTBEAT, self.worker_id, self.machine, self.pid)

    async def _close(self) -> None:
        pool = self._p()
        try:
            await pool.execute("DELETE FROM call_workers WHERE worker_id = $1", self.worker_id)
        finally:
            await pool.close()

    # ---- writes ----------------------------------------------------------------------------

    async def _write(self, batch: Batch) -> None:
        async with self._p().acquire() as con, con.transaction():
            if batch.starts:
                await con.executemany(
                    INSERT_CALL,
                    [
                        (
                            s.call_id,
                            _text(s.agent),
                            _text(s.transport),
                            _text(s.started_at),
                            s.started,
                            _json(s.state),
                            s.worker_id,
                        )
                        for s in batch.starts
                    ],
                )
            if batch.events:
                await con.executemany(
                    "INSERT INTO call_events (call_id, type, t, data) "
                    "VALUES ($1, $2, $3, $4::jsonb)",
                    [(e.call_id, _text(e.type), e.t, _json(e.data)) for e in batch.events],
                )
            if batch.turns:
                await con.executemany(
                    "INSERT INTO call_turns (call_id, metrics) VALUES ($1, $2::jsonb)",
                    [(t.call_id, _json(t.metrics)) for t in batch.turns],
                )
            if batch.contexts:
                await con.executemany(
                    "UPDATE calls SET messages = $1::jsonb, search_text = $2, preview = $3 "
                    "WHERE call_id = $4",
                    [
                        (_json(c.messages), _text(c.search_text), _text(c.preview), c.call_id)
                        for c in batch.contexts
                    ],
                )
            if batch.states:
                await con.executemany(
                    "UPDATE calls SET state = $1::jsonb WHERE call_id = $2",
                    [(_json(s.state), s.call_id) for s in batch.states],
                )
            if batch.ends:
                await con.executemany(
                    "UPDATE calls SET ended_at = $1, outcome = $2, end_reason = $3 "
                    "WHERE call_id = $4",
                    [(e.ended_at, e.outcome, _text(e.reason), e.call_id) for e in batch.ends],
                )
            await con.execute(HEARTBEAT, self.worker_id, self.machine, self.pid)

    # ---- workers ---------------------------------------------------------------------------

    async def _workers(self) -> list[WorkerInfo]:
        async with self._p().acquire() as con:
            rows = await con.fetch(
                "SELECT worker_id, machine, pid, "
                "extract(epoch FROM now() - heartbeat)::float8 AS age, heartbeat "
                "FROM call_workers WHERE worker_id != $1",
                self.worker_id,
            )
            orphans = await con.fetch(
                "SELECT DISTINCT worker_id FROM calls WHERE ended_at IS NULL AND worker_id != $1 "
                "AND worker_id NOT IN (SELECT worker_id FROM call_workers)",
                self.worker_id,
            )
        workers = [
            WorkerInfo(r["worker_id"], r["machine"], r["pid"], r["age"], r["heartbeat"])
            for r in rows
        ]
        workers.extend(WorkerInfo(r["worker_id"], None, None, None) for r in orphans)
        return workers

    async def _mark_interrupted(self, gone: list[tuple[WorkerInfo, str]], reason: str) -> int:
        marked = 0
        async with self._p().acquire() as con, con.transaction():
            for worker, ended_at in gone:
                # Only if its heartbeat has not moved since it was judged gone.
                if worker.heartbeat is not None:
                    deleted = await con.fetchval(
                        "WITH d AS (DELETE FROM call_workers WHERE worker_id = $1 "
                        "AND heartbeat = $2 RETURNING 1) SELECT count(*) FROM d",
                        worker.worker_id,
                        worker.heartbeat,
                    )
                    if not deleted:
                        continue
                marked += await con.fetchval(
                    "WITH u AS (UPDATE calls SET ended_at = $1, outcome = 'interrupted', "
                    "end_reason = $2 WHERE worker_id = $3 AND ended_at IS NULL RETURNING 1) "
                    "SELECT count(*) FROM u",
                    ended_at,
                    reason,
                    worker.worker_id,
                )
        return marked

    # ---- reads -----------------------------------------------------------------------------

    async def _get(self, call_id: str) -> dict[str, Any] | None:
        async with self._p().acquire() as con, con.transaction(isolation="repeatable_read"):
            row = await con.fetchrow(
                "SELECT call_id, agent, transport, started_at, ended_at, end_reason, outcome, "
                "state::text, messages::text FROM calls WHERE call_id = $1",
                call_id,
            )
            if row is None:
                return None
            events = await con.fetch(
                "SELECT type, t, data::text FROM call_events WHERE call_id = $1 ORDER BY id",
                call_id,
            )
            turns = await con.fetch(
                "SELECT metrics::text FROM call_turns WHERE call_id = $1 ORDER BY id", call_id
            )
        return {
            "call_id": row["call_id"],
            "agent": row["agent"],
            "transport": row["transport"],
            "started_at": row["started_at"],
            "ended_at": row["ended_at"],
            "end_reason": row["end_reason"],
            "outcome": row["outcome"],
            "state": json.loads(row["state"]),
            "context": {"messages": json.loads(row["messages"])},
            "audit": [event_from_row(e[0], e[1], e[2]) for e in events],
            "turns": [json.loads(t[0]) for t in turns],
        }

    async def _list(
        self, where: CallFilter, limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], int]:
        clauses: list[str] = []
        params: list[Any] = []

        def param(value: Any) -> str:
            params.append(value)
            return f"${len(params)}"

        if where.agent is not None:
            clauses.append(f"c.agent = {param(where.agent)}")
        if where.outcome == LIVE:
            clauses.append("c.ended_at IS NULL")
        elif where.outcome is not None:
            clauses.append(f"c.outcome = {param(where.outcome)}")
        if where.since is not None:
            clauses.append(f"c.started >= {param(where.since)}")
        if where.until is not None:
            clauses.append(f"c.started < {param(where.until)}")
        pattern = where.like_pattern()
        if pattern is not None:
            # search_text is case-folded, so LIKE matches as SQLite's store does.
            clauses.append(f"c.search_text LIKE {param(_text(pattern))} ESCAPE '\\'")
        condition = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        filters = list(params)
        page = (
            f"{SUMMARY}{condition} ORDER BY c.started DESC, c.call_id DESC "
            f"LIMIT {param(limit)} OFFSET {param(offset)}"
        )
        async with self._p().acquire() as con, con.transaction(isolation="repeatable_read"):
            total = await con.fetchval(f"SELECT count(*) FROM calls c{condition}", *filters)
            rows = await con.fetch(page, *params)
        return [dict(row) for row in rows], int(total)

    # ---- retention -------------------------------------------------------------------------

    async def _delete_before(self, cutoff: datetime) -> int:
        deleted = 0
        while True:
            async with self._p().acquire() as con, con.transaction():
                ids = [
                    r["call_id"]
                    for r in await con.fetch(
                        "SELECT call_id FROM calls WHERE started < $1 AND ended_at IS NOT NULL "
                        "LIMIT $2",
                        cutoff,
                        DELETE_CHUNK,
                    )
                ]
                if not ids:
                    return deleted
                for table in ("call_events", "call_turns", "calls"):
                    await con.execute(f"DELETE FROM {table} WHERE call_id = ANY($1::text[])", ids)
                deleted += len(ids)
