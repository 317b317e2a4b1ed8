"""The call store: both backends through the same tests, and a kill -9 mid-call."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.postgres import postgres_cluster, postgres_url  # noqa: F401  (fixtures)
from voice_agent.server.drain import REASON as DRAIN_REASON
from voice_agent.store import OUTCOMES, CallStore, open_store, outcome_for
from voice_agent.store.base import INTERRUPTED_REASON
from voice_agent.store.postgres import PostgresCallStore
from voice_agent.store.rows import Batch, merge_lines
from voice_agent.store.sqlite import SqliteCallStore

ROOT = Path(__file__).resolve().parent.parent
FAST = 0.05  # flush interval for tests that wait on the background writer

MakeStore = Callable[..., CallStore]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'calls.db'}"
    value: str = request.getfixturevalue("postgres_url")
    return value


@pytest.fixture
async def make_store(url: str, tmp_path: Path) -> AsyncIterator[MakeStore]:
    opened: list[CallStore] = []

    def make(**options: Any) -> CallStore:
        store = open_store(url, tmp_path, **{"flush_interval_s": FAST, **options})
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.aclose()


@pytest.fixture
async def store(make_store: MakeStore) -> CallStore:
    store = make_store()
    await store.start()
    return store


def at(minutes_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes_ago)).isoformat(timespec="milliseconds")


def record_call(
    store: CallStore,
    call_id: str,
    *,
    agent: str = "booking",
    transport: str = "ws",
    started_at: str | None = None,
    lines: tuple[str, ...] = ("I'd like a table", "For how many?"),
    turns: int = 1,
    reason: str | None = "caller hung up",
) -> None:
    """A call as the server would report it: user and agent lines alternate."""
    store.call_started(
        call_id, agent=agent, transport=transport, started_at=started_at or at(0), state={}
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You book tables."}]
    for index, line in enumerate(lines):
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": line})
    store.context(call_id, messages)
    for turn in range(turns):
        store.turn(call_id, {"turn": turn})
    if reason is not None:
        store.call_ended(call_id, ended_at=at(0), outcome=outcome_for(reason), reason=reason)


# ---- one call, written and read back ----------------------------------------------------------


async def test_a_call_reads_back_as_the_api_shows_it(store: CallStore) -> None:
    started = "2030-05-01T10:00:00.000+00:00"
    store.call_started("c1", agent="booking", transport="twilio", started_at=started, state={})
    events = [
        {"type": "call_started", "t": 0.0, "call_id": "c1", "agent": "booking", "state": {}},
        {"type": "user_utterance", "t": 1.25, "text": "table for two", "agent": "booking"},
        {
            "type": "state_change",
            "t": 1.5,
            "source": "book",
            "diff": {"n": {"old": None, "new": 2}},
        },
        {"type": "call_ended", "t": 3.0, "reason": "caller hung up", "state": {"n": 2}},
    ]
    for event in events[:3]:
        store.audit("c1", event)
    store.state("c1", {"n": 1})
    store.state("c1", {"n": 2, "name": "Zoë"})  # the latest state wins
    messages = [
        {"role": "system", "content": "You book tables."},
        {"role": "user", "content": "table for two"},
        {"role": "assistant", "content": "For when?"},
    ]
    store.context("c1", messages[:2])
    store.context("c1", messages)
    metrics: list[dict[str, Any]] = [
        {"speech_end_to_first_audio_ms": 612.5, "stt_final_ms": None},
        {"x": 1},
    ]
    for turn in metrics:
        store.turn("c1", turn)
    store.audit("c1", events[3])
    store.call_ended(
        "c1", ended_at="2030-05-01T10:00:03.000+00:00", outcome="caller_hung_up", reason="bye"
    )

    call = await store.get("c1")
    assert call == {
        "call_id": "c1",
        "agent": "booking",
        "transport": "twilio",
        "started_at": started,
        "ended_at": "2030-05-01T10:00:03.000+00:00",
        "end_reason": "bye",
        "outcome": "caller_hung_up",
        "state": {"n": 2, "name": "Zoë"},
        "context": {"messages": messages},
        "audit": events,
        "turns": metrics,
    }
    assert list(call["audit"][1])[:2] == ["type", "t"]
    assert await store.get("nope") is None


async def test_a_live_call_is_readable_before_it_ends(store: CallStore) -> None:
    record_call(store, "live", reason=None)
    store.audit("live", {"type": "event", "t": 0.1, "name": "welcome"})
    call = await store.get("live")
    assert call is not None
    assert call["ended_at"] is None and call["outcome"] is None
    assert [event["type"] for event in call["audit"]] == ["event"]
    page = await store.list_calls(outcome="live")
    assert [c["call_id"] for c in page["calls"]] == ["live"]
    assert store.live_count() == 1


async def test_values_neither_database_takes_as_they_are_are_stored(store: CallStore) -> None:
    store.call_started(
        "odd", agent="a", transport="ws", started_at=at(0), state={"x": float("nan")}
    )
    store.audit("odd", {"type": "user_utterance", "t": 1, "text": "nul\x00here \ud800 \\u0000"})
    store.context("odd", [{"role": "user", "content": "nul\x00here"}])
    store.turn("odd", {"ms": float("inf")})
    call = await store.get("odd")
    assert call is not None
    assert call["state"] == {"x": None}
    assert call["turns"] == [{"ms": None}]
    text = call["audit"][0]["text"]
    assert text.startswith("nul") and text.endswith("here ? \\u0000")  # an escaped backslash stays


# ---- listing -------------------------------------------------------------------------------


async def test_list_filters_by_agent_outcome_time_and_text(store: CallStore) -> None:
    record_call(store, "old", agent="booking", started_at=at(120), reason="completed")
    record_call(
        store,
        "mid",
        agent="support",
        started_at=at(60),
        lines=("My ORDER never came", "Sorry to hear that"),
        turns=3,
        reason="agent ended the call",
    )
    record_call(store, "new", agent="booking", started_at=at(1), reason="connection lost")
    record_call(store, "live", agent="support", started_at=at(0), reason=None)

    async def ids(**filters: Any) -> list[str]:
        page = await store.list_calls(**filters)
        return [call["call_id"] for call in page["calls"]]

    assert await ids() == ["live", "new", "mid", "old"]  # newest first
    assert await ids(agent="booking") == ["new", "old"]
    assert await ids(outcome="agent_ended") == ["mid"]
    assert await ids(outcome="error") == ["new"]
    assert await ids(outcome="live") == ["live"]
    assert await ids(since=at(90)) == ["live", "new", "mid"]
    assert await ids(until=datetime.now(UTC) - timedelta(minutes=30)) == ["mid", "old"]
    assert await ids(since=at(90), until=at(30), agent="support") == ["mid"]
    assert await ids(text="order never") == ["mid"]
    assert await ids(text="sorry TO HEAR") == ["mid"]  # the agent's lines count, any case
    assert await ids(text="you book tables") == []  # the prompt is not the transcript
    assert await ids(text="table", agent="booking", outcome="completed") == ["old"]

    page = await store.list_calls(agent="support", outcome="agent_ended")
    assert page["calls"] == [
        {
            "call_id": "mid",
            "agent": "support",
            "transport": "ws",
            "started_at": page["calls"][0]["started_at"],
            "ended_at": page["calls"][0]["ended_at"],
            "outcome": "agent_ended",
            "end_reason": "agent ended the call",
            "turns": 3,
            "preview": "My ORDER never came",
        }
    ]
    assert page["total"] == 1 and page["next_offset"] is None


async def test_pages_follow_one_another(store: CallStore) -> None:
    for index in range(7):
        record_call(store, f"c{index}", started_at=at(10 - index))
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = await store.list_calls(limit=3, offset=offset)
        assert page["total"] == 7
        seen.extend(call["call_id"] for call in page["calls"])
        offset = page["next_offset"]
    assert seen == [f"c{index}" for index in reversed(range(7))]
    assert (await store.list_calls(limit=3, offset=6))["next_offset"] is None
    assert (await store.list_calls(limit=3, offset=20))["calls"] == []


async def test_text_search_is_a_literal_case_insensitive_substring(store: CallStore) -> None:
    record_call(store, "zoe", lines=("This is ZOË speaking", "Hello Zoë"))
    record_call(store, "pct", lines=("is it 100% sure", "yes"))
    record_call(store, "under", lines=("snake_case", "ok"))
    record_call(store, "plain", lines=("1000 sure", "snakeXcase"))

    async def ids(text: str) -> set[str]:
        return {call["call_id"] for call in (await store.list_calls(text=text))["calls"]}

    assert await ids("zoë") == {"zoe"}
    assert await ids("100%") == {"pct"}
    assert await ids("e_c") == {"under"}
    assert await ids("  ") == {"zoe", "pct", "under", "plain"}  # blank: no text filter


async def test_search_keeps_lines_a_transfer_trimmed_from_the_context(store: CallStore) -> None:
    store.call_started("t", agent="a", transport="ws", started_at=at(0), state={})
    first = [{"role": "user", "content": "my account number is 42"}]
    first.append({"role": "assistant", "content": "Let me transfer you"})
    store.context("t", first)
    # The next agent keeps only the last message, then the call goes on.
    store.context("t", [first[-1], {"role": "user", "content": "billing question"}])
    assert [c["call_id"] for c in (await store.list_calls(text="account number"))["calls"]] == ["t"]
    call = await store.get("t")
    assert call is not None and len(call["context"]["messages"]) == 2
    summary = (await store.list_calls())["calls"][0]
    assert summary["preview"] == "my account number is 42"


def test_merge_lines_appends_only_what_is_new() -> None:
    known: list[tuple[str, str]] = []
    merge_lines(known, [("user", "a"), ("assistant", "b")])
    merge_lines(known, [("user", "a"), ("assistant", "b"), ("user", "a")])
    merge_lines(known, [("user", "a"), ("assistant", "c")])  # trimmed to the last "a"
    merge_lines(known, [("user", "x")])  # no overlap at all
    assert known == [
        ("user", "a"),
        ("assistant", "b"),
        ("user", "a"),
        ("assistant", "c"),
        ("user", "x"),
    ]


async def test_bad_list_arguments_are_refused(store: CallStore) -> None:
    with pytest.raises(ValueError, match="limit"):
        await store.list_calls(limit=0)
    with pytest.raises(ValueError, match="offset"):
        await store.list_calls(offset=-1)
    with pytest.raises(ValueError, match="outcome"):
        await store.list_calls(outcome="happy")
    with pytest.raises(ValueError):
        await store.list_calls(since="yesterday")


# ---- retention -----------------------------------------------------------------------------


async def test_retention_deletes_ended_calls_older_than_the_age(store: CallStore) -> None:
    days = 24 * 60
    record_call(store, "ancient", started_at=at(40 * days))
    record_call(store, "old", started_at=at(31 * days))
    record_call(store, "old-live", started_at=at(31 * days), reason=None)
    record_call(store, "recent", started_at=at(29 * days))
    store.audit("ancient", {"type": "x", "t": 0})
    await store.flush()
    assert await store.delete_older_than(30) == 2
    remaining = [call["call_id"] for call in (await store.list_calls())["calls"]]
    assert remaining == ["recent", "old-live"]  # a live call is never deleted under it
    assert await store.get("ancient") is None


async def test_the_writer_applies_retention_itself(make_store: MakeStore) -> None:
    store = make_store(retention_days=1)
    await store.start()
    record_call(store, "old", started_at=at(2 * 24 * 60))
    await store.flush()
    # Retention runs on the writer's first round after start, then hourly.
    for _ in range(40):
        if await store.get("old") is None:
            break
        await asyncio.sleep(FAST)
    assert await store.get("old") is None


# ---- batching, off the hot path ----------------------------------------------------------


async def test_the_writer_flushes_on_its_interval_and_at_call_end(make_store: MakeStore) -> None:
    writer = make_store(flush_interval_s=0.1)
    slow = make_store(flush_interval_s=30.0)
    reader = make_store()
    for each in (writer, slow, reader):
        await each.start()
    writer.call_started("w", agent="a", transport="ws", started_at=at(0), state={})
    writer.audit("w", {"type": "x", "t": 0})
    slow.call_started("s", agent="a", transport="ws", started_at=at(0), state={})
    # Another worker reads the database, not this one's batch; nothing is there at once.
    assert await reader.get("w") is None
    await asyncio.sleep(0.3)
    assert await reader.get("w") is not None
    assert await reader.get("s") is None  # its interval is 30 s...
    slow.call_ended("s", ended_at=at(0), outcome="completed", reason="completed")
    await asyncio.sleep(0.3)
    ended = await reader.get("s")  # ...but a call's end is written soon
    assert ended is not None and ended["outcome"] == "completed"


async def test_a_busy_database_does_not_hold_up_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Writes fail while another process holds the lock; they are kept, retried, and land.
    # A write waits 0.3 s for the lock, then fails: on the event loop, that would show.
    monkeypatch.setattr("voice_agent.store.sqlite.BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "calls.db"
    store = SqliteCallStore(path, flush_interval_s=FAST)
    await store.start()
    try:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        record_call(store, "busy", reason=None)
        lags: list[float] = []
        started = time.perf_counter()
        for n in range(50):
            store.audit("busy", {"type": "tick", "t": n, "n": n})
            before = time.perf_counter()
            await asyncio.sleep(0.015)
            lags.append(time.perf_counter() - before - 0.015)
        assert time.perf_counter() - started > 0.7  # several write attempts failed meanwhile
        assert max(lags) < 0.2, f"the event loop stalled {max(lags):.3f} s"
        assert "database is locked" in caplog.text
        blocker.execute("ROLLBACK")
        blocker.close()
        call = await store.get("busy")
        assert call is not None
        assert [event["n"] for event in call["audit"]] == list(range(50))
    finally:
        await store.aclose()


async def test_a_row_the_database_refuses_is_dropped_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteCallStore(tmp_path / "calls.db", flush_interval_s=FAST)
    write = store._write

    async def refusing(batch: Batch) -> None:
        if any(event.type == "poison" for event in batch.events):
            raise sqlite3.DataError("refused")
        await write(batch)

    monkeypatch.setattr(store, "_write", refusing)
    await store.start()
    try:
        record_call(store, "p", reason=None)
        for kind in ("before", "poison", "after"):
            store.audit("p", {"type": kind, "t": 0})
        # Each read flushes: it fails a few times, then the rows go one by one.
        for _ in range(10):
            call = await store.get("p")
            if call is not None:
                break
        assert call is not None
        assert [event["type"] for event in call["audit"]] == ["before", "after"]
    finally:
        await store.aclose()


# ---- interrupted calls ---------------------------------------------------------------------


async def test_a_live_worker_s_calls_are_left_alone(make_store: MakeStore) -> None:
    first = make_store()
    await first.start()
    record_call(first, "ongoing", reason=None)
    await first.flush()
    second = make_store()
    await second.start()  # another worker on the same database, same host
    assert await second.sweep() == 0
    call = await second.get("ongoing")
    assert call is not None and call["outcome"] is None


async def test_a_worker_whose_heartbeat_stopped_has_its_calls_interrupted(
    make_store: MakeStore,
) -> None:
    hung = make_store(heartbeat_s=60.0, flush_interval_s=60.0)
    await hung.start()
    record_call(hung, "stuck", reason=None)
    await hung.flush()
    await asyncio.sleep(0.3)
    sweeper = make_store(stale_after_s=0.2)
    await sweeper.start()  # start() sweeps
    call = await sweeper.get("stuck")
    assert call is not None
    assert call["outcome"] == "interrupted" and call["end_reason"] == INTERRUPTED_REASON
    assert call["ended_at"] is not None
    # Had it only been stuck, its call's real end still lands.
    hung.call_ended("stuck", ended_at=at(0), outcome="completed", reason="completed")
    await hung.flush()
    call = await sweeper.get("stuck")
    assert call is not None and call["outcome"] == "completed"


async def test_closing_ends_live_calls_as_interrupted(make_store: MakeStore) -> None:
    store = make_store()
    await store.start()
    record_call(store, "cut", reason=None)
    await store.aclose()
    reader = make_store()
    await reader.start()
    call = await reader.get("cut")
    assert call is not None and call["outcome"] == "interrupted"


async def test_workers_starting_together_create_the_schema_once(make_store: MakeStore) -> None:
    stores = [make_store() for _ in range(3)]
    await asyncio.gather(*(each.start() for each in stores))
    record_call(stores[0], "one")
    await stores[0].flush()
    assert await stores[2].get("one") is not None


async def test_sqlite_workers_starting_together_on_a_new_file_all_start(tmp_path: Path) -> None:
    # Switching a new file to WAL raced: about one start in six of three at once failed with
    # "database is locked". Forty fresh files make a regression all but certain to show.
    for round_ in range(40):
        folder = tmp_path / str(round_)
        stores = [
            open_store(f"sqlite://{folder / 'calls.db'}", folder, flush_interval_s=FAST)
            for _ in range(3)
        ]
        try:
            await asyncio.gather(*(each.start() for each in stores))
        finally:
            for each in stores:
                await each.aclose()


# ---- kill -9 -------------------------------------------------------------------------------

CHILD = r"""
import asyncio, sys, time
from datetime import UTC, datetime
from pathlib import Path
from voice_agent.store import open_store

async def main(url, data_dir):
    store = open_store(url, Path(data_dir))  # the defaults, as the server runs it
    await store.start()
    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    store.call_started("killed", agent="a", transport="ws", started_at=started, state={})
    n = 0
    while True:
        store.audit("killed", {"type": "tick", "t": n / 200, "n": n})
        if n % 20 == 0:
            store.state("killed", {"n": n})
            store.context("killed", [{"role": "user", "content": f"line {n}"}])
            store.turn("killed", {"n": n})
        print(n, time.time(), flush=True)
        n += 1
        await asyncio.sleep(0.005)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_kill_9_mid_call_loses_at_most_the_last_second(url: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        url,
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    assert child.stdout is not None and child.stderr is not None
    handed: dict[int, float] = {}
    first: float | None = None
    try:
        while first is None or time.time() - first < 1.8:
            line = await asyncio.wait_for(child.stdout.readline(), 10)
            if not line:
                error = (await child.stderr.read()).decode()
                pytest.fail(f"the writer process died on its own:\n{error}")
            n, stamp = line.split()
            handed[int(n)] = float(stamp)
            first = first or time.time()
    finally:
        killed_at = time.time()
        child.kill()  # SIGKILL: no flush, no close
        await child.wait()
    for line in (await child.stdout.read()).splitlines():
        n, stamp = line.split()
        handed[int(n)] = float(stamp)

    if url.startswith("sqlite"):
        path = tmp_path / "calls.db"
        with sqlite3.connect(path) as con:
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

    store = open_store(url, tmp_path)
    await store.start()  # marks the dead worker's call
    try:
        call = await store.get("killed")
        assert call is not None
        assert call["outcome"] == "interrupted" and call["end_reason"] == INTERRUPTED_REASON
        stored = [event["n"] for event in call["audit"]]
        assert stored == list(range(len(stored)))  # in order, no gaps
        required = [n for n, stamp in handed.items() if stamp < killed_at - 1.1]
        assert len(required) > 20
        missing = sorted(set(required) - set(stored))
        assert not missing, f"{len(missing)} events handed in over 1 s before the kill are lost"
        assert call["state"]["n"] == max(n for n in stored if n % 20 == 0)
        assert json.dumps(call["context"])  # a whole document, not a torn one
    finally:
        await store.aclose()


# ---- outcomes and URLs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [
        ("completed", "completed"),
        ("call ended", "completed"),
        ("agent ended the call", "agent_ended"),
        ("caller hung up", "caller_hung_up"),
        ("caller hung up before the call connected", "caller_hung_up"),
        ("transferred to +15551234567", "transferred"),
        ("connection lost", "error"),
        ("protocol error: bad frame", "error"),
        ("ice failed: the browser did not connect within 10 s", "error"),
        ("client is not reading: outbound buffer full", "error"),
        ("server shutting down", "interrupted"),
        (DRAIN_REASON, "interrupted"),
        (INTERRUPTED_REASON, "interrupted"),
        ("something new", "error"),
    ],
)
def test_outcome_for(reason: str, outcome: str) -> None:
    assert outcome_for(reason) == outcome
    assert outcome in OUTCOMES


def test_open_store_picks_the_backend_from_the_url(tmp_path: Path) -> None:
    default = open_store("sqlite", tmp_path)
    assert isinstance(default, SqliteCallStore) and default.path == tmp_path / "calls.db"
    absolute = open_store(f"sqlite://{tmp_path / 'x' / 'c.db'}", Path("/elsewhere"))
    assert isinstance(absolute, SqliteCallStore) and absolute.path == tmp_path / "x" / "c.db"
    relative = open_store("sqlite://sub/c.db", tmp_path)
    assert isinstance(relative, SqliteCallStore) and relative.path == tmp_path / "sub" / "c.db"
    assert isinstance(open_store("postgresql://u:p@db:5432/calls", tmp_path), PostgresCallStore)
    assert isinstance(open_store("postgres://db/calls", tmp_path), PostgresCallStore)
    with pytest.raises(ValueError, match="mysql"):
        open_store("mysql://db/calls", tmp_path)
