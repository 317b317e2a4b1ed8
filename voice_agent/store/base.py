"""The call store's interface: plain dicts in as a call happens, plain dicts out for the API.

Write side: `call_started`, `audit`, `context`, `state`, `turn` and `call_ended` are plain
methods called on the event loop. They serialise their arguments to JSON at once (so a caller
may go on mutating its dicts) and append to an in-memory batch; nothing waits on a database.
A writer task flushes the batch every `flush_interval_s` (0.5 s by default, so that after a
crash everything handed in more than a second earlier is committed even when a write takes a
few hundred milliseconds), soon after a call ends, before every read (so a worker reads its own
writes) and on `aclose()`. A failed write keeps its rows and is retried; see `_flush_locked`.

Read side: `get()` gives the `GET /calls/{id}` document, `list_calls()` a page of summaries.

Interrupted calls. Every store instance is a worker with a random `worker_id`, recorded on each
call it starts, and a row in a workers table with its machine (host name, kernel boot id and pid
namespace), pid and a heartbeat refreshed by every write and at least every `heartbeat_s`.
A worker is gone, and its calls without an end are marked `interrupted`, when
  * its heartbeat is older than `stale_after_s` (it died, hung, or its host went away), or
  * it ran on this machine and its process no longer exists (the common case: a server killed
    with `kill -9` and restarted is found at once, without waiting for the heartbeat to age), or
  * it ran in this very process and was never closed (a store abandoned by a test), or
  * its worker row is missing.
`start()` sweeps once; the writer sweeps again every `stale_after_s`, so calls of a host that
never comes back are marked too. Several workers may share one database: a live worker keeps
its heartbeat fresh and its pid alive, so no other worker marks its calls. The marking is
conditional on the heartbeat the sweeper saw, so a worker that beats in between is left alone;
one that was only stuck past `stale_after_s` re-registers on its next write, and its calls'
real ends overwrite the `interrupted` mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from voice_agent.store.outcomes import INTERRUPTED, OUTCOMES
from voice_agent.store.rows import (
    Batch,
    CallEnd,
    CallFilter,
    CallStart,
    ContextRow,
    EventRow,
    Row,
    StateRow,
    TurnRow,
    WorkerInfo,
    dumps,
    iso,
    machine_id,
    merge_lines,
    now_iso,
    parse_time,
    pid_alive,
    transcript_lines,
)

log = logging.getLogger("voice_agent.store")

DEFAULT_FLUSH_INTERVAL_S = 0.5
HEARTBEAT_S = 5.0
STALE_AFTER_S = 30.0
RETENTION_EVERY_S = 3600.0
END_COALESCE_S = 0.05  # a burst of call ends shares one write
MAX_PENDING = 200_000  # rows kept while the database is unreachable, then events are dropped
SPLIT_AFTER_FAILURES = 3
MAX_LIMIT = 500
PREVIEW_CHARS = 120
LIVE = "live"  # the outcome filter for calls without an end
INTERRUPTED_REASON = "interrupted: the server stopped during the call"

# Stores opened and not yet closed in this process: the liveness test for a worker that has
# this process's pid (the pid of a container's server is the same after every restart).
_OPEN_WORKERS: set[str] = set()


# ---- rows, as the writer gets them ------------------------------------------------------------


@dataclass
class _LiveCall:
    lines: list[tuple[str, str]] = field(default_factory=list)


# ---- the store -------------------------------------------------------------------------------


class CallStore(ABC):
    """Call records in a database; see the module docstring. Backends implement the `_` methods."""

    def __init__(
        self,
        *,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        worker_id: str | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
        retention_days: float | None = None,
    ) -> None:
        self.flush_interval_s = flush_interval_s
        self.worker_id = worker_id or uuid.uuid4().hex
        self.machine = machine_id()
        self.pid = os.getpid()
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.retention_days = retention_days
        self._pending: list[Row] = []
        self._live: dict[str, _LiveCall] = {}
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._stopping = False
        self._closed = False
        self._failures = 0
        self._dropped = 0
        self._last_write = time.monotonic()

    # ---- backend ---------------------------------------------------------------------------

    @abstractmethod
    async def _open(self) -> None:
        """Connect, create the schema if missing, and register this worker."""

    @abstractmethod
    async def _write(self, batch: Batch) -> None:
        """Apply a batch in one transaction and refresh this worker's heartbeat (upsert)."""

    @abstractmethod
    async def _workers(self) -> list[WorkerInfo]:
        """Every other registered worker, and workers named by unfinished calls but unregistered."""

    @abstractmethod
    async def _mark_interrupted(self, gone: list[tuple[WorkerInfo, str]], reason: str) -> int:
        """End the unfinished calls of each (worker, ended_at); forget the worker. Calls marked."""

    @abstractmethod
    async def _get(self, call_id: str) -> dict[str, Any] | None: ...

    @abstractmethod
    async def _list(
        self, where: CallFilter, limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], int]: ...

    @abstractmethod
    async def _delete_before(self, cutoff: datetime) -> int:
        """Delete ended calls started before cutoff, with their events and turns. Calls deleted."""

    @abstractmethod
    async def _close(self) -> None:
        """Forget this worker (it ended cleanly) and close the connections."""

    # ---- write side: called on the event loop; never waits -----------------------------

    def call_started(
        self, call_id: str, *, agent: str, transport: str, started_at: str, state: dict[str, Any]
    ) -> None:
        if self._closed:
            log.warning("call store closed: call %s is not recorded", call_id)
            return
        try:
            started = parse_time(started_at)
        except ValueError:
            started = datetime.now(UTC)
        self._live.setdefault(call_id, _LiveCall())
        self._push(
            CallStart(call_id, agent, transport, started_at, started, dumps(state), self.worker_id)
        )

    def audit(self, call_id: str, event: dict[str, Any]) -> None:
        """One audit event, already redacted (AuditEvent.as_dict())."""
        if call_id not in self._live:
            return
        t = event.get("t")
        self._push(
            EventRow(
                call_id,
                str(event.get("type", "")),
                float(t) if isinstance(t, int | float) else None,
                dumps(event),
            )
        )

    def context(self, call_id: str, messages: list[dict[str, Any]]) -> None:
        """The whole committed context after a turn; the store keeps the latest."""
        live = self._live.get(call_id)
        if live is None:
            return
        merge_lines(live.lines, transcript_lines(messages))
        preview = next((text for role, text in live.lines if role == "user"), None)
        self._push(
            ContextRow(
                call_id,
                dumps(messages),
                "\n".join(text for _, text in live.lines).casefold(),
                preview[:PREVIEW_CHARS] if preview is not None else None,
            )
        )

    def state(self, call_id: str, state: dict[str, Any]) -> None:
        if call_id in self._live:
            self._push(StateRow(call_id, dumps(state)))

    def turn(self, call_id: str, metrics: dict[str, Any]) -> None:
        if call_id in self._live:
            self._push(TurnRow(call_id, dumps(metrics)))

    def call_ended(self, call_id: str, *, ended_at: str, outcome: str, reason: str) -> None:
        if self._live.pop(call_id, None) is None:
            return
        self._push(CallEnd(call_id, ended_at, outcome, reason))
        self._wake.set()

    def live_count(self) -> int:
        """Calls this worker has started and not ended."""
        return len(self._live)

    def _push(self, row: Row) -> None:
        self._pending.append(row)
        if len(self._pending) > MAX_PENDING:
            # The database has been unreachable for long: keep calls, their ends and context,
            # drop the oldest events and turns rather than grow without bound.
            excess = len(self._pending) - MAX_PENDING * 9 // 10
            kept: list[Row] = []
            for item in self._pending:
                if excess > 0 and isinstance(item, EventRow | TurnRow):
                    excess -= 1
                    self._dropped += 1
                    continue
                kept.append(item)
            self._pending = kept
            log.error("call store: database unreachable, %d events dropped so far", self._dropped)

    # ---- flushing ------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write everything handed in so far (errors are logged and the rows kept for a retry)."""
        if not self._started:
            return
        async with self._flush_lock:
            await self._flush_locked(heartbeat=False)

    async def _flush_locked(self, *, heartbeat: bool) -> bool:
        if not self._pending and not heartbeat:
            return True
        rows, self._pending = self._pending, []
        try:
            await self._write(Batch.of(rows))
        except Exception as exc:
            self._pending[:0] = rows  # in front of what came meanwhile: order is kept
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.error("call store: write failed (%d in a row): %s", self._failures, exc)
            if self._failures >= SPLIT_AFTER_FAILURES:
                await self._drop_poison()
            return False
        self._failures = 0
        self._last_write = time.monotonic()
        return True

    async def _drop_poison(self) -> None:
        """A batch keeps failing. While the database takes an empty write, a row is at fault:
        write the rows one by one and drop (and log) those it refuses. Should the database
        itself fail meanwhile, the rows not yet written are kept for later."""
        if not await self._reachable():
            return
        rows, self._pending = self._pending, []
        for index, row in enumerate(rows):
            try:
                await self._write(Batch.of([row]))
            except Exception as exc:
                if not await self._reachable():
                    self._pending[:0] = rows[index:]
                    return
                log.error(
                    "call store: dropped a %s of call %s: %s", type(row).__name__, row.call_id, exc
                )
        self._failures = 0

    async def _reachable(self) -> bool:
        try:
            await self._write(Batch())
        except Exception:
            return False
        return True

    async def _run(self) -> None:
        next_sweep = time.monotonic() + self.stale_after_s
        next_retention = time.monotonic()
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_interval_s):
                    await self._wake.wait()
            if self._wake.is_set() and not self._stopping:
                await asyncio.sleep(END_COALESCE_S)
            self._wake.clear()
            now = time.monotonic()
            async with self._flush_lock:
                await self._safely(
                    self._flush_locked(heartbeat=now - self._last_write >= self.heartbeat_s)
                )
            if now >= next_sweep and not self._stopping:
                next_sweep = now + self.stale_after_s
                await self._safely(self.sweep())
            if self.retention_days is not None and now >= next_retention and not self._stopping:
                next_retention = now + RETENTION_EVERY_S
                await self._safely(self.delete_older_than(self.retention_days))

    async def _safely(self, work: Any) -> None:
        try:
            await work
        except Exception:
            log.exception("call store: background work failed")

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Create the schema, mark the calls of gone workers interrupted, start the writer."""
        await self._open()
        _OPEN_WORKERS.add(self.worker_id)
        self._started = True
        marked = await self.sweep()
        if marked:
            log.warning("call store: %d call(s) of a stopped server marked interrupted", marked)
        self._task = asyncio.create_task(self._run(), name="call-store-writer")

    def _gone(self, worker: WorkerInfo) -> bool:
        if worker.age_s is None or worker.age_s > self.stale_after_s:
            return True
        if worker.machine == self.machine and worker.pid is not None:
            if worker.pid == self.pid:
                return worker.worker_id not in _OPEN_WORKERS
            return not pid_alive(worker.pid)
        return False

    async def sweep(self) -> int:
        """Mark the unfinished calls of gone workers interrupted; returns how many."""
        gone = [worker for worker in await self._workers() if self._gone(worker)]
        if not gone:
            return 0
        now = datetime.now(UTC)
        # A gone worker's last heartbeat is the best guess of when its calls stopped.
        ended = [(w, iso(now - timedelta(seconds=w.age_s or 0.0))) for w in gone]
        return await self._mark_interrupted(ended, INTERRUPTED_REASON)

    async def delete_older_than(self, days: float) -> int:
        """Retention: delete ended calls that started more than `days` ago; returns how many."""
        deleted = await self._delete_before(datetime.now(UTC) - timedelta(days=days))
        if deleted:
            log.info("call store: deleted %d call(s) older than %g days", deleted, days)
        return deleted

    async def aclose(self) -> None:
        """Flush and stop. Calls still live here end as interrupted: their server is stopping."""
        if self._closed:
            return
        self._closed = True
        for call_id in list(self._live):
            self.call_ended(
                call_id, ended_at=now_iso(), outcome=INTERRUPTED, reason=INTERRUPTED_REASON
            )
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            await self._task
            self._task = None
        if self._started:
            async with self._flush_lock:
                if not await self._flush_locked(heartbeat=False):
                    log.error("call store: %d row(s) lost on close", len(self._pending))
            self._started = False  # reads and flushes from now on find no connection
            await self._close()
        _OPEN_WORKERS.discard(self.worker_id)

    async def __aenter__(self) -> CallStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- read side -----------------------------------------------------------------------

    async def get(self, call_id: str) -> dict[str, Any] | None:
        """The `GET /calls/{id}` document with its outcome, or None."""
        await self.flush()
        return await self._get(call_id)

    async def list_calls(
        self,
        *,
        limit: int = 50,
        offset: int = 0,
        agent: str | None = None,
        outcome: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        text: str | None = None,
    ) -> dict[str, Any]:
        """A page of call summaries, newest first: {"calls", "total", "next_offset"}.

        `since`/`until` bound the start time (ISO strings or datetimes; naive means UTC);
        `outcome` is one of OUTCOMES or "live"; `text` is a case-insensitive substring of the
        call's transcript (what the caller and the agent said, the prompt and tools left out).
        The search scans the calls the other filters leave; retention keeps that bounded.
        Raises ValueError for a bad limit, offset, outcome or time.
        """
        if limit < 1 or offset < 0:
            raise ValueError("limit must be at least 1 and offset at least 0")
        if outcome is not None and outcome not in (*OUTCOMES, LIVE):
            raise ValueError(f"outcome must be one of {[*OUTCOMES, LIVE]}, not {outcome!r}")
        where = CallFilter(
            agent=agent,
            outcome=outcome,
            since=parse_time(since) if since is not None else None,
            until=parse_time(until) if until is not None else None,
            text=text.strip().casefold() if text and text.strip() else None,
        )
        limit = min(limit, MAX_LIMIT)
        await self.flush()
        calls, total = await self._list(where, limit, offset)
        following = offset + len(calls)
        return {
            "calls": calls,
            "total": total,
            "next_offset": following if following < total else None,
        }


def event_from_row(type: str, t: float | None, data: str) -> dict[str, Any]:
    """An audit event as stored, its type and time first (jsonb does not keep key order)."""
    return {"type": type, "t": t, **json.loads(data)}


def open_store(url: str, data_dir: Path, **options: Any) -> CallStore:
    """The store a config's `server.store` names; options go to the store (flush_interval_s...).

    "sqlite": calls.db in data_dir. "sqlite:///abs/path.db" or "sqlite://rel/path.db" (relative
    to data_dir): that file. "postgresql://user:password@host:5432/db" (or postgres://): that
    database, through asyncpg.
    """
    if url == "sqlite" or url.startswith("sqlite:"):
        from voice_agent.store.sqlite import SqliteCallStore

        rest = url[len("sqlite:") :].removeprefix("//")
        path = data_dir / (rest or "calls.db")  # an absolute rest replaces data_dir
        return SqliteCallStore(path, **options)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from voice_agent.store.postgres import PostgresCallStore
        except ImportError as exc:  # asyncpg missing
            raise ValueError(
                f"a postgresql store needs asyncpg (pip install asyncpg): {exc}"
            ) from exc
        return PostgresCallStore(url, **options)
    raise ValueError(
        f"unknown call store {url.split('://')[0]!r}: use 'sqlite', 'sqlite:///path/to/calls.db' "
        "or 'postgresql://user:password@host:5432/db'"
    )
