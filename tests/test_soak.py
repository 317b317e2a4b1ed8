"""No leaks: after many short calls the server holds what it held before: the same asyncio tasks,
threads and file descriptors, and about the same memory. The long soak (1,000 sequential and
100 concurrent calls) is `scripts/soak.py`; this is its short form."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.support.configs import default_config_with, serving
from tests.support.rtc_caller import RtcCaller
from tests.support.soak import footprint, short_call
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent


@pytest_asyncio.fixture
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server


async def test_short_calls_leave_nothing_behind(server: VoiceServer) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws"
    for _ in range(3):  # warm: first calls load engines and caches that are meant to stay
        await short_call(url)
    await settle(server)
    before = footprint()
    names_before = task_names()

    for _ in range(40):
        await short_call(url)
    await asyncio.gather(*(short_call(url) for _ in range(15)))
    await settle(server)
    after = footprint()

    assert after.tasks == before.tasks, f"asyncio tasks: {names_before} -> {task_names()}"
    assert after.threads == before.threads, f"threads: {before.threads} -> {after.threads}"
    assert after.fds == before.fds, f"file descriptors: {before.fds} -> {after.fds}"
    assert after.rss_mb <= before.rss_mb * 1.10, f"RSS {before.rss_mb} -> {after.rss_mb} MB"
    assert not server.pipelines and server.live.live_count() == 0


async def test_short_webrtc_calls_leave_nothing_behind(tmp_path: Path) -> None:
    """The same over WebRTC: each call's peer connection, with its ICE, DTLS and SRTP
    transports, codecs and tasks, goes with the call."""
    config = default_config_with(tmp_path, webrtc={"ice_timeout_s": 2})
    async for rtc_server in serving(config):
        url = f"ws://127.0.0.1:{rtc_server.port}/rtc"

        async def rtc_call(url: str = url) -> None:
            rtc = RtcCaller(url, timeout=30)
            await rtc.connect()
            await rtc.wait_loud(300)
            await rtc.hang_up()

        # Warm, as above, and once concurrently as below: the loop's default executor, where
        # aiortc encodes every Opus frame, grows with the concurrency it meets.
        await rtc_call()
        await asyncio.gather(*(rtc_call() for _ in range(3)))
        await settle(rtc_server)
        before = footprint()
        names_before = task_names()
        threads_before = other_threads()

        for _ in range(8):
            await rtc_call()
        await asyncio.gather(*(rtc_call() for _ in range(3)))
        await settle(rtc_server)
        after = footprint()

        assert after.tasks == before.tasks, f"asyncio tasks: {names_before} -> {task_names()}"
        # That executor keeps the workers it grew for the busiest moment, up to its fixed
        # bound; any other thread must be gone.
        assert other_threads() == threads_before, f"threads: {threading.enumerate()}"
        assert executor_threads() <= min(32, (os.cpu_count() or 1) + 4)
        assert after.fds == before.fds, f"file descriptors: {before.fds} -> {after.fds}"
        assert after.rss_mb <= before.rss_mb * 1.10, f"RSS {before.rss_mb} -> {after.rss_mb} MB"
        assert not rtc_server.rtc.peers and not rtc_server.pipelines


async def settle(server: VoiceServer) -> None:
    """Until every call has ended on the server side and no short-lived task is left."""
    assert server._server is not None
    # Finalizers of clients that earlier code dropped schedule their aclose() as tasks: run
    # them now, so they are not counted on one side only.
    gc.collect()
    async with asyncio.timeout(20):
        await asyncio.gather(*(p.finished.wait() for p in list(server.pipelines.values())))
        handlers = [t for t in asyncio.all_tasks() if task_name(t) in CONNECTION_HANDLERS]
        if handlers:
            await asyncio.wait(handlers)
        # The callers' side too: a closed client connection's tasks end a moment later.
        transient = [t for t in asyncio.all_tasks() if any(k in task_name(t) for k in TRANSIENT)]
        if transient:
            await asyncio.wait(transient)
        await server.store.flush()


TRANSIENT = ("Connection", "aclose")
# The task that serves a connection: websockets 16 wraps the server's handler in its own
# coroutine, 17 runs the handler itself as the task.
CONNECTION_HANDLERS = ("Server.conn_handler", "VoiceServer._handler")


def executor_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("asyncio_"))


def other_threads() -> int:
    return threading.active_count() - executor_threads()


def task_name(task: asyncio.Task[object]) -> str:
    return str(getattr(task.get_coro(), "__qualname__", task.get_name()))


def task_names() -> list[str]:
    return sorted(task_name(t) for t in asyncio.all_tasks())
