"""The default call store: one SQLite file in WAL mode, nothing to install.

Writes run on one writer thread with its own connection, reads on one reader thread with
another, so the event loop never waits on the disk. WAL lets the reader see committed data
while a write is going on, and several processes on one host may share the file.

`synchronous=NORMAL` with WAL: a commit is not fsynced, only checkpoints are. A crash of the
process (`kill -9`) loses nothing committed, since the WAL write is in the OS's page cache,
and the database stays consistent; only a power cut or kernel crash may lose the last commits,
never corrupting the file. That is the trade the issue asks for at a fraction of FULL's cost.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from voice_agent.store.base import LIVE, CallStore, event_from_row
from voice_agent.store.rows import Batch, CallFilter, WorkerInfo
from voice_agent.store.schema import SQLITE, schema

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000  # another process's write on a shared file
DELETE_CHUNK = 500  # calls per retention transaction, so writes are not held up long

SCHEMA = schema(SQLITE)

# A reused call id (a reconnecting stream) continues the call under its new worker.
INSERT_CALL = """
INSERT INTO calls (call_id, agent, transport, started_at, started_ms, state, worker_id)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (call_id) DO UPDATE SET
    agent = excluded.agent, transport = excluded.transport, worker_id = excluded.worker_id,
    ended_at = NULL, outcome = NULL, end_reason = NULL
"""
HEARTBEAT = """
INSERT INTO call_workers (worker_id, machine, pid, started, heartbeat) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (worker_id) DO UPDATE SET heartbeat = excluded.heartbeat
"""
SUMMARY = """
SELECT c.call_id, c.agent, c.transport, c.started_at, c.ended_at, c.outcome, c.end_reason,
       (SELECT count(*) FROM call_turns t WHERE t.call_id = c.call_id), c.preview
FROM calls c
"""
SUMMARY_KEYS = (
    "call_id",
    "agent",
    "transport",
    "started_at",
    "ended_at",
    "outcome",
    "end_reason",
    "turns",
    "preview",
)


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    # Autocommit (isolation_level None): transactions are explicit BEGIN ... COMMIT.
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    if readonly:
        con.execute("PRAGMA query_only = ON")
    return con


def _use_wal(con: sqlite3.Connection) -> None:
    """Switch the file to WAL (a no-op once it is). The switch needs the file to itself for a
    moment and SQLite does not apply the busy timeout to it, so workers starting together on a
    new file got "database is locked" (55 of 300 trials with three at once); they retry."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            con.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)  # on the store's writer thread, never the event loop


class _Transaction:
    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        # IMMEDIATE takes the write lock up front: no deadlock between two writing processes.
        self.con.execute("BEGIN IMMEDIATE")
        return self.con

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self.con.execute("COMMIT")
        elif self.con.in_transaction:  # some errors (disk full, I/O) have rolled back already
            self.con.execute("ROLLBACK")


class SqliteCallStore(CallStore):
    def __init__(self, path: Path, **options: Any) -> None:
        super().__init__(**options)
        self.path = path
        # One thread each: a connection stays on its thread, and writes stay in order.
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="call-store-write")
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix="call-store-read")
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None

    async def _on(self, pool: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    def _w(self) -> sqlite3.Connection:
        if self._writer is None:
            raise RuntimeError("the call store is not started")
        return self._writer

    def _r(self) -> sqlite3.Connection:
        if self._reader is None:
            raise RuntimeError("the call store is not started")
        return self._reader

    # ---- lifecycle -------------------------------------------------------------------------

    async def _open(self) -> None:
        await self._on(self._writer_pool, self._open_writer)
        self._reader = await self._on(self._reader_pool, lambda: _connect(self.path, readonly=True))

    def _open_writer(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = _connect(self.path, readonly=False)
        _use_wal(con)
        con.execute("PRAGMA synchronous = NORMAL")
        with _Transaction(con):
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    con.execute(statement)
            now = time.time()
            con.execute(HEARTBEAT, (self.worker_id, self.machine, self.pid, now, now))
        self._writer = con

    async def _close(self) -> None:
        def close_writer() -> None:
            con = self._w()
            with _Transaction(con):
                con.execute("DELETE FROM call_workers WHERE worker_id = ?", (self.worker_id,))
            con.close()

        try:
            await self._on(self._writer_pool, close_writer)
            await self._on(self._reader_pool, self._r().close)
        finally:
            self._writer_pool.shutdown(wait=False)
            self._reader_pool.shutdown(wait=False)

    # ---- writes ----------------------------------------------------------------------------

    async def _write(self, batch: Batch) -> None:
        await self._on(self._writer_pool, lambda: self._write_now(batch))

    def _write_now(self, batch: Batch) -> None:
        now = time.time()
        with _Transaction(self._w()) as con:
            con.executemany(
                INSERT_CALL,
                [
                    (
                        s.call_id,
                        s.agent,
                        s.transport,
                        s.started_at,
                        _ms(s.started),
                        s.state,
                        s.worker_id,
                    )
                    for s in batch.starts
                ],
            )
            con.executemany(
                "INSERT INTO call_events (call_id, type, t, data) VALUES (?, ?, ?, ?)",
                [(e.call_id, e.type, e.t, e.data) for e in batch.events],
            )
            con.executemany(
                "INSERT INTO call_turns (call_id, metrics) VALUES (?, ?)",
                [(t.call_id, t.metrics) for t in batch.turns],
            )
            con.executemany(
                "UPDATE calls SET messages = ?, search_text = ?, preview = ? WHERE call_id = ?",
                [(c.messages, c.search_text, c.preview, c.call_id) for c in batch.contexts],
            )
            con.executemany(
                "UPDATE calls SET state = ? WHERE call_id = ?",
                [(s.state, s.call_id) for s in batch.states],
            )
            con.executemany(
                "UPDATE calls SET ended_at = ?, outcome = ?, end_reason = ? WHERE call_id = ?",
                [(e.ended_at, e.outcome, e.reason, e.call_id) for e in batch.ends],
            )
            con.execute(HEARTBEAT, (self.worker_id, self.machine, self.pid, now, now))

    # ---- workers ---------------------------------------------------------------------------

    async def _workers(self) -> list[WorkerInfo]:
        def read() -> list[WorkerInfo]:
            con = self._r()
            now = time.time()
            workers = [
                WorkerInfo(worker_id, machine, pid, now - heartbeat, heartbeat)
                for worker_id, machine, pid, heartbeat in con.execute(
                    "SELECT worker_id, machine, pid, heartbeat FROM call_workers "
                    "WHERE worker_id != ?",
                    (self.worker_id,),
                )
            ]
            orphans = con.execute(
                "SELECT DISTINCT worker_id FROM calls WHERE ended_at IS NULL AND worker_id != ? "
                "AND worker_id NOT IN (SELECT worker_id FROM call_workers)",
                (self.worker_id,),
            )
            workers.extend(WorkerInfo(worker_id, None, None, None) for (worker_id,) in orphans)
            return workers

        return await self._on(self._reader_pool, read)

    async def _mark_interrupted(self, gone: list[tuple[WorkerInfo, str]], reason: str) -> int:
        def mark() -> int:
            marked = 0
            with _Transaction(self._w()) as con:
                for worker, ended_at in gone:
                    # Only if its heartbeat has not moved since it was judged gone.
                    if worker.heartbeat is not None:
                        deleted = con.execute(
                            "DELETE FROM call_workers WHERE worker_id = ? AND heartbeat = ?",
                            (worker.worker_id, worker.heartbeat),
                        ).rowcount
                        if not deleted:
                            continue
                    marked += con.execute(
                        "UPDATE calls SET ended_at = ?, outcome = 'interrupted', end_reason = ? "
                        "WHERE worker_id = ? AND ended_at IS NULL",
                        (ended_at, reason, worker.worker_id),
                    ).rowcount
            return marked

        return await self._on(self._writer_pool, mark)

    # ---- reads -----------------------------------------------------------------------------

    async def _get(self, call_id: str) -> dict[str, Any] | None:
        def read() -> dict[str, Any] | None:
            con = self._r()
            # One read transaction: the call, its events and turns from one snapshot.
            con.execute("BEGIN")
            try:
                row = con.execute(
                    "SELECT call_id, agent, transport, started_at, ended_at, end_reason, outcome, "
                    "state, messages FROM calls WHERE call_id = ?",
                    (call_id,),
                ).fetchone()
                if row is None:
                    return None
                events = con.execute(
                    "SELECT type, t, data FROM call_events WHERE call_id = ? ORDER BY id",
                    (call_id,),
                ).fetchall()
                turns = con.execute(
                    "SELECT metrics FROM call_turns WHERE call_id = ? ORDER BY id", (call_id,)
                ).fetchall()
            finally:
                con.execute("COMMIT")
            keys = ("call_id", "agent", "transport", "started_at", "ended_at", "end_reason")
            return {
                **dict(zip(keys, row[:6], strict=True)),
                "outcome": row[6],
                "state": json.loads(row[7]),
                "context": {"messages": json.loads(row[8])},
                "audit": [event_from_row(*event) for event in events],
                "turns": [json.loads(metrics) for (metrics,) in turns],
            }

        return await self._on(self._reader_pool, read)

    async def _list(
        self, where: CallFilter, limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], int]:
        clauses: list[str] = []
        params: list[Any] = []
        if where.agent is not None:
            clauses.append("c.agent = ?")
            params.append(where.agent)
        if where.outcome == LIVE:
            clauses.append("c.ended_at IS NULL")
        elif where.outcome is not None:
            clauses.append("c.outcome = ?")
            params.append(where.outcome)
        if where.since is not None:
            clauses.append("c.started_ms >= ?")
            params.append(_ms(where.since))
        if where.until is not None:
            clauses.append("c.started_ms < ?")
            params.append(_ms(where.until))
        pattern = where.like_pattern()
        if pattern is not None:
            # search_text is case-folded, so a plain LIKE is case-insensitive beyond ASCII too.
            clauses.append("c.search_text LIKE ? ESCAPE '\\'")
            params.append(pattern)
        condition = f" WHERE {' AND '.join(clauses)}" if clauses else ""

        def read() -> tuple[list[dict[str, Any]], int]:
            con = self._r()
            con.execute("BEGIN")
            try:
                (total,) = con.execute(
                    f"SELECT count(*) FROM calls c{condition}", params
                ).fetchone()
                rows = con.execute(
                    f"{SUMMARY}{condition} ORDER BY c.started_ms DESC, c.call_id DESC "
                    "LIMIT ? OFFSET ?",
                    [*params, limit, offset],
                ).fetchall()
            finally:
                con.execute("COMMIT")
            return [dict(zip(SUMMARY_KEYS, row, strict=True)) for row in rows], total

        return await self._on(self._reader_pool, read)

    # ---- retention -------------------------------------------------------------------------

    async def _delete_before(self, cutoff: datetime) -> int:
        def delete() -> int:
            deleted = 0
            while True:
                with _Transaction(self._w()) as con:
                    ids = [
                        call_id
                        for (call_id,) in con.execute(
                            "SELECT call_id FROM calls WHERE started_ms < ? "
                            "AND ended_at IS NOT NULL LIMIT ?",
                            (_ms(cutoff), DELETE_CHUNK),
                        )
                    ]
                    if not ids:
                        return deleted
                    marks = ", ".join("?" * len(ids))
                    for table in ("call_events", "call_turns", "calls"):
                        con.execute(f"DELETE FROM {table} WHERE call_id IN ({marks})", ids)
                    deleted += len(ids)

        return await self._on(self._writer_pool, delete)
