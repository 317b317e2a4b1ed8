"""pocketsphinx in worker processes (ProcessPoolStt): the in-process engine's transcripts, many
streams at once, cancel, an event loop left free while decoding, a killed worker replaced, and
nothing left running after aclose."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import report
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.engines.stt import (
    DomainLm,
    PocketsphinxStt,
    ProcessPoolStt,
    SttConfig,
    SttError,
    Transcript,
    build_domain_lm,
    default_processes,
    make_stt,
)
from voice_agent.engines.stt.base import SttStream

RATE = 16000
FRAME = RATE * 2 // 50  # 20 ms of PCM16
ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "audio"
# Eight caller lines of 1.2-3.9 s, as phone audio (8 kHz mu-law, resampled to 16 kHz).
LINES = (
    "joe_book1",
    "joe_book2",
    "joe_book3",
    "joe_change1",
    "joe_change2",
    "joe_change3",
    "joe_cancel1",
    "joe_change4",
)


def fixture_pcm(name: str) -> bytes:
    """A fixture as the pipeline gives it to STT: 16 kHz PCM16 (8 kHz mu-law resampled up)."""
    path = FIXTURES / name
    if path.suffix == ".wav":
        return read_wav(path)[0]
    return resample(ulaw_decode(path.read_bytes()), 8000, RATE)


def push_all(stream: SttStream, pcm: bytes, size: int = FRAME) -> None:
    for start in range(0, len(pcm), size):
        stream.push(pcm[start : start + size])


async def transcribe(stt: ProcessPoolStt | PocketsphinxStt, pcm: bytes) -> Transcript:
    stream = stt.start()
    push_all(stream, pcm)
    return await stream.finish()


def child_pids() -> set[int]:
    """This process's child processes, zombies included."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == os.getpid():
            children.add(int(stat.parent.name))
    return children


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def agent_lm(tmp_path_factory: pytest.TempPathFactory) -> DomainLm:
    """The domain model the server builds for the default agent: its intents' phrases."""
    intents = yaml.safe_load((ROOT / "config" / "booking_intents.yaml").read_text())["intents"]
    phrases = [phrase for intent in intents.values() for phrase in intent["phrases"]]
    return build_domain_lm(phrases, cache_dir=tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def audio() -> dict[str, bytes]:
    return {name: fixture_pcm(name + ".ulaw") for name in LINES}


@pytest.fixture(scope="module")
def reference(agent_lm: DomainLm, audio: dict[str, bytes]) -> dict[str, Transcript]:
    """What the in-process engine makes of each line."""

    async def run() -> dict[str, Transcript]:
        stt = PocketsphinxStt(agent_lm)
        try:
            return {name: await transcribe(stt, pcm) for name, pcm in audio.items()}
        finally:
            await stt.aclose()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def pool(agent_lm: DomainLm) -> Iterator[ProcessPoolStt]:
    # Not bound to an event loop: each test's loop gets its streams' results.
    stt = ProcessPoolStt(agent_lm, processes=2)
    asyncio.run(stt.warm_up(8))
    yield stt
    asyncio.run(stt.aclose())


async def test_pool_gives_the_in_process_engines_transcripts(
    pool: ProcessPoolStt, agent_lm: DomainLm
) -> None:
    threads = PocketsphinxStt(agent_lm)
    try:
        # 16 kHz recordings here; the phone audio of LINES in the tests below.
        for name in ("joe_book1.wav", "joe_book2.wav"):
            pcm = fixture_pcm(name)
            in_process = await transcribe(threads, pcm)
            in_workers = await transcribe(pool, pcm)
            print(f"{name}: {in_workers}")
            # The same decoding and noise floor: the same text and confidence.
            assert in_workers == in_process
            assert in_workers.text
    finally:
        await threads.aclose()
    assert (await transcribe(pool, fixture_pcm("joe_book2.wav"))).text == "my name is john smith"
    assert await pool.start().finish() == Transcript("")  # nothing said


async def test_interleaved_streams_each_get_their_own_text(
    pool: ProcessPoolStt, audio: dict[str, bytes], reference: dict[str, Transcript]
) -> None:
    streams = {name: pool.start() for name in audio}
    # Spread over both workers, least busy first.
    pids = [stream.pid for stream in streams.values()]
    assert set(pids) == set(pool.worker_pids) and abs(pids.count(pids[0]) * 2 - len(pids)) <= 1
    longest = max(len(pcm) for pcm in audio.values())
    for start in range(0, longest, FRAME):  # interleaved, as live calls arrive
        for index, (name, stream) in enumerate(streams.items()):
            # Odd pushes for some: a sample split across pushes (and batches) must not matter.
            size = FRAME if index % 2 else 333
            pcm = audio[name][start : start + FRAME]
            for offset in range(0, len(pcm), size):
                stream.push(pcm[offset : offset + size])
    long_line = streams["joe_change2"]
    await wait_for(lambda: len(long_line.partial().split()) >= 3, 5.0)  # partials come back
    results = await asyncio.gather(*(stream.finish() for stream in streams.values()))
    together = dict(zip(streams, results, strict=True))
    for name, result in together.items():
        print(f"{name}: {result.text!r}")
    assert together == reference
    for stream, result in zip(streams.values(), results, strict=True):
        assert stream.partial() == result.text
    memory = ", ".join(f"{rss_mb(pid):.0f} MB" for pid in pool.worker_pids)
    report(f"STT process pool: worker RSS {memory} (domain LM, 8 decoders warm)")


async def test_cancel_drops_the_utterance(
    pool: ProcessPoolStt, audio: dict[str, bytes], reference: dict[str, Transcript]
) -> None:
    pcm = audio["joe_book1"]
    stream = pool.start()
    push_all(stream, pcm[: len(pcm) // 2])
    await asyncio.sleep(0.2)  # the worker is decoding it
    stream.cancel()
    stream.push(pcm)  # ignored once cancelled
    assert await stream.finish() == Transcript("")
    # Cancelled while finishing: still nothing.
    stream = pool.start()
    push_all(stream, pcm)
    finishing = asyncio.ensure_future(stream.finish())
    await asyncio.sleep(0)
    stream.cancel()
    assert await finishing == Transcript("")
    # A cancel after the final changes nothing.
    stream = pool.start()
    push_all(stream, audio["joe_book2"])
    result = await stream.finish()
    stream.cancel()
    assert result == reference["joe_book2"] == await stream.finish()
    # Nothing is left pinned to the workers.
    assert pool.loads == [0, 0]
    assert await transcribe(pool, pcm) == reference["joe_book1"]


async def feed_live(
    stt: ProcessPoolStt | PocketsphinxStt, audio: dict[str, bytes]
) -> tuple[list[float], float, dict[str, Transcript]]:
    """Every line at once in real time (20 ms frames, staggered starts), as live calls send
    them, while a probe measures how late the event loop wakes it (sorted lags in ms). Also
    the CPU seconds this process spent."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    probing = True

    async def probe() -> None:
        while probing:
            before = loop.time()
            await asyncio.sleep(0.005)
            lags.append((loop.time() - before - 0.005) * 1000)

    cpu = time.process_time()
    prober = asyncio.ensure_future(probe())
    streams = {name: stt.start() for name in audio}
    finishing: dict[str, asyncio.Future[Transcript]] = {}
    t0 = loop.time()
    tick = 0
    while len(finishing) < len(streams):
        for index, (name, stream) in enumerate(streams.items()):
            frame = tick - index * 5  # starts 100 ms apart
            if name in finishing or frame < 0:
                continue
            pcm = audio[name][frame * FRAME : (frame + 1) * FRAME]
            if pcm:
                stream.push(pcm)
                stream.partial()  # as the pipeline asks every frame
            else:
                finishing[name] = asyncio.ensure_future(stream.finish())
        tick += 1
        await asyncio.sleep(max(0.0, t0 + tick * 0.02 - loop.time()))
    results = {name: await future for name, future in finishing.items()}
    probing = False
    await prober
    return sorted(lags), time.process_time() - cpu, results


async def test_event_loop_stays_free_while_eight_streams_decode(
    pool: ProcessPoolStt,
    agent_lm: DomainLm,
    audio: dict[str, bytes],
    reference: dict[str, Transcript],
) -> None:
    lags, cpu, results = await feed_live(pool, audio)
    assert results == reference
    threads = PocketsphinxStt(agent_lm)
    try:
        await threads.warm_up(8)
        thread_lags, thread_cpu, _ = await feed_live(threads, audio)
    finally:
        await threads.aclose()

    def summary(lags: list[float], cpu: float) -> str:
        p99 = lags[len(lags) * 99 // 100]
        return f"max {lags[-1]:.1f} ms, p99 {p99:.1f} ms, server process CPU {cpu:.2f} s"

    report(f"STT loop lag, 8 live streams, process pool: {summary(lags, cpu)}")
    report(f"STT loop lag, 8 live streams, threads:      {summary(thread_lags, thread_cpu)}")
    # Decoding is off this process: the loop only queues audio and takes results. The CPU
    # time says so regardless of how busy the machine is...
    assert cpu < thread_cpu / 3
    # ...and the loop wakes on time: the 99th percentile, as a single late wake-up can be the
    # machine's doing (a no-op engine sees the same when other processes load the cores).
    assert lags[len(lags) * 99 // 100] < 20


async def test_a_killed_worker_is_replaced_and_others_go_on(
    agent_lm: DomainLm,
    audio: dict[str, bytes],
    reference: dict[str, Transcript],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stt = ProcessPoolStt(agent_lm, processes=2)
    try:
        await stt.warm_up()
        victim, survivor = stt.start(), stt.start()
        assert victim.pid != survivor.pid
        dead_pid = victim.pid
        assert dead_pid is not None
        first, second = audio["joe_book1"], audio["joe_book3"]
        push_all(victim, first[: len(first) // 2])
        push_all(survivor, second[: len(second) // 2])
        await wait_for(lambda: victim.partial() != "", 5.0)
        with caplog.at_level(logging.ERROR, logger="voice_agent.engines.stt.pool"):
            os.kill(dead_pid, signal.SIGKILL)
            push_all(victim, first[len(first) // 2 :])
            push_all(survivor, second[len(second) // 2 :])
            with pytest.raises(SttError, match="died"):
                await victim.finish()
            assert await survivor.finish() == reference["joe_book3"]
        assert f"worker {dead_pid} died (killed by signal 9)" in caplog.text
        # A new worker takes the dead one's place and works.
        await wait_for(lambda: dead_pid not in stt.worker_pids and stt.ready == 2, 10.0)
        streams = [stt.start(), stt.start()]
        assert {stream.pid for stream in streams} == set(stt.worker_pids)
        for stream in streams:
            push_all(stream, audio["joe_book2"])
        assert await asyncio.gather(*(s.finish() for s in streams)) == [reference["joe_book2"]] * 2
        assert dead_pid not in child_pids()  # reaped
    finally:
        await stt.aclose()


async def test_a_worker_outlives_a_sigterm_meant_for_the_whole_server(
    agent_lm: DomainLm,
    audio: dict[str, bytes],
    reference: dict[str, Transcript],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # systemd (KillMode=control-group) and `kill -- -PGID` signal every process of the server
    # at once; the server drains its live calls, whose speech still needs decoding.
    stt = ProcessPoolStt(agent_lm, processes=1)
    try:
        await stt.warm_up()
        stream = stt.start()
        pid = stream.pid
        assert pid is not None
        with caplog.at_level(logging.ERROR, logger="voice_agent.engines.stt.pool"):
            os.kill(pid, signal.SIGTERM)
            push_all(stream, audio["joe_book2"])
            assert await stream.finish() == reference["joe_book2"]
        assert stt.worker_pids == [pid] and "died" not in caplog.text
    finally:
        await stt.aclose()
    assert pid not in child_pids()  # closing the pool still ends it


async def test_aclose_finishes_what_was_asked_and_leaves_nothing_running(
    agent_lm: DomainLm, audio: dict[str, bytes], reference: dict[str, Transcript]
) -> None:
    threads_before = set(threading.enumerate())
    children_before = child_pids()
    fds_before = len(os.listdir("/proc/self/fd"))
    stt = ProcessPoolStt(agent_lm, processes=2)
    await stt.warm_up()
    pids = set(stt.worker_pids)
    assert pids <= child_pids()
    finishing, open_stream = stt.start(), stt.start()
    push_all(finishing, audio["joe_book2"])
    push_all(open_stream, audio["joe_book1"])
    final = asyncio.ensure_future(finishing.finish())
    await asyncio.sleep(0)
    await stt.aclose()
    assert await final == reference["joe_book2"]  # asked before close: decoded
    with pytest.raises(SttError, match="closed"):
        await open_stream.finish()
    with pytest.raises(SttError, match="closed"):
        stt.start()
    await stt.aclose()  # twice is fine
    assert set(threading.enumerate()) == threads_before
    assert child_pids() == children_before
    assert multiprocessing.active_children() == []
    assert len(os.listdir("/proc/self/fd")) == fds_before  # the pipes are closed


async def test_a_worker_that_cannot_start_fails_warm_up_and_streams() -> None:
    stt = ProcessPoolStt(None, processes=1, decoder_options={"hmm": "/nonexistent/model"})
    try:
        with pytest.raises(SttError, match="failed to start"):
            await stt.warm_up()
        stream = stt.start()
        with pytest.raises(SttError):
            await stream.finish()
    finally:
        started = time.monotonic()
        await stt.aclose()  # does not wait out the restart delay
        assert time.monotonic() - started < 2


async def test_make_stt_runs_pocketsphinx_in_processes_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_process = make_stt(SttConfig(processes=0), phrases=["book a table"])
    assert isinstance(in_process, PocketsphinxStt) and in_process.domain_lm is not None
    full = make_stt(SttConfig(language_model="full", processes=1))
    assert isinstance(full, ProcessPoolStt) and full.processes == 1 and full.domain_lm is None
    default = make_stt(SttConfig(), phrases=["book a table"])
    assert isinstance(default, ProcessPoolStt) and default.processes == default_processes()
    assert default.domain_lm is not None and "table" in default.domain_lm.words
    with pytest.raises(SttError):
        make_stt(SttConfig(processes=-1))
    for engine in (in_process, full, default):
        await engine.aclose()
    # With `--workers N`, the server processes share the cores.
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("VOICE_AGENT_WORKERS", "2")
    assert default_processes() == max(1, cores // 2)
    monkeypatch.setenv("VOICE_AGENT_WORKERS", str(cores * 4))
    assert default_processes() == 1
