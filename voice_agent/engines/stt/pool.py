"""Speech recognition in worker processes: pocketsphinx's decoding holds the GIL for as long as it
runs, and a Whisper decoding keeps a core busy for a third of a second, so in threads either would
stall the event loop that carries every call's 20 ms audio frames. Here the loop only queues
audio; worker processes, one per core, decode it on their own GILs.

Per worker, the server process runs two threads: a sender that ships each stream's queued audio
in batches every `batch_ms` (at once when a stream finishes), and a reader that receives partial
and final hypotheses and hands them to the event loop. A worker that dies fails its streams with
SttError (the pipeline reads that as "nothing heard") and is started again; the others go on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any, Literal

from voice_agent.engines.stt.base import SAMPLE_RATE, SttError, Transcript, require_rate
from voice_agent.engines.stt.domain_lm import DomainLm
from voice_agent.engines.stt.pocketsphinx import (
    default_max_idle,
    pocketsphinx_options,
)
from voice_agent.engines.stt.pool_worker import (
    CANCEL,
    END,
    FINAL,
    MORE,
    PARTIAL,
    PAUSE,
    PAUSED,
    WorkerSettings,
)
from voice_agent.engines.stt.whisper import WhisperOptions

log = logging.getLogger(__name__)

# Set by `voice-agent serve --workers N` in each server process (voice_agent/cli.py).
SERVER_WORKERS_ENV = "VOICE_AGENT_WORKERS"


# A worker that lived shorter than this before dying is restarted after a growing delay
# (0.5 s doubling to 30 s), so a worker that cannot start does not spin.
_STABLE_S = 10.0
_MAX_BACKOFF_S = 30.0

# The worker imports only this module's package (numpy, pocketsphinx), not the server's main
# module as multiprocessing's spawn would (the CLI and through it the OpenAI SDK, agent runtime:
# ~1.8 s and ~55 MB more per worker); sys.path is the server's, so it finds the same code.
_WORKER_CODE = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from voice_agent.engines.stt.pool_worker import worker_main; "
    "worker_main(int(sys.argv[2]), int(sys.argv[3]))"
)


def default_processes() -> int:
    """One worker per CPU core this process may use, shared among `--workers` server
    processes (each runs its own pool)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        servers = max(1, int(os.environ.get(SERVER_WORKERS_ENV, "1")))
    except ValueError:
        servers = 1
    return max(1, cores // servers)


# -- the server side (the worker process is pool_worker.py) -------------------------------------


class _State(Enum):
    OPEN = "open"
    FINISHING = "finishing"
    CANCELLED = "cancelled"
    DONE = "done"


class PoolStream:
    """One utterance, pinned to one worker. Everything here runs on the event loop: push only
    queues (the worker's sender thread ships the audio), results arrive via call_soon_threadsafe
    from the worker's reader thread."""

    def __init__(self, sid: int, loop: asyncio.AbstractEventLoop) -> None:
        self.sid = sid
        self.loop = loop
        self.worker: _Worker | None = None
        self._state = _State.OPEN
        self._partial = ""
        self._outcome: Transcript | str | None = None  # str: why it failed
        self._waiter: asyncio.Future[None] | None = None
        self._pauses_sent = 0
        self._pauses_answered = 0
        self._pause_waiter: asyncio.Future[None] | None = None

    @property
    def pid(self) -> int | None:
        """The worker process decoding this stream."""
        return self.worker.pid if self.worker is not None else None

    def push(self, pcm: bytes) -> None:
        worker = self.worker
        if self._state is _State.OPEN and worker is not None and pcm:
            # deque.append is atomic: no lock, no I/O on the loop.
            worker.outbox.append((self.sid, pcm if type(pcm) is bytes else bytes(pcm)))

    def partial(self) -> str:
        return self._partial

    def pause(self) -> None:
        if self._state is _State.OPEN:
            self._pauses_sent += 1
            self._send(PAUSE)

    async def speculation(self) -> str | None:
        if self._pauses_answered < self._pauses_sent and self._outcome is None:
            if self._pause_waiter is None or self._pause_waiter.done():
                self._pause_waiter = self.loop.create_future()
            await self._pause_waiter
        if isinstance(self._outcome, str):
            return None
        return self._partial

    async def finish(self) -> Transcript:
        if self._state is _State.OPEN:
            self._state = _State.FINISHING
            self._send(END)
        while self._outcome is None:
            if self._waiter is None or self._waiter.done():
                self._waiter = self.loop.create_future()
            await self._waiter
        if isinstance(self._outcome, str):
            raise SttError(self._outcome)
        return self._outcome

    def cancel(self) -> None:
        if self._state is _State.CANCELLED or self._outcome is not None:
            return
        self._state = _State.CANCELLED
        self._send(CANCEL)  # the worker frees the decoder
        self._settle(Transcript(""))

    def _send(self, op: int) -> None:
        worker = self.worker
        if worker is not None:
            worker.outbox.append((self.sid, op))
            worker.wake.set()  # now, not at the next batch: the caller waits for the text

    def _settle(self, outcome: Transcript | str) -> None:
        if self._outcome is not None:
            return
        self._outcome = outcome
        if self._state is not _State.CANCELLED:
            self._state = _State.DONE
        if isinstance(outcome, Transcript):
            self._partial = outcome.text
        if self.worker is not None:
            self.worker.forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._wake_pause_waiter()

    def _wake_pause_waiter(self) -> None:
        if self._pause_waiter is not None and not self._pause_waiter.done():
            self._pause_waiter.set_result(None)

    def _event(self, kind: int, data: Any) -> None:
        if self._outcome is not None:
            return
        if kind == PAUSED:
            self._partial = data
            self._pauses_answered += 1
            if self._pauses_answered >= self._pauses_sent:
                self._wake_pause_waiter()
        elif kind == PARTIAL:
            self._partial = data
        elif kind == FINAL:
            self._settle(data)
        else:
            log.error("speech recognition worker %s: %s", self.pid, data)
            self._settle(str(data))


class _WorkerState(Enum):
    STARTING = "starting"  # process started, loading the model
    READY = "ready"
    DEAD = "dead"


class _Worker:
    """One worker process, with its sender and reader threads in the server process."""

    def __init__(self, pool: ProcessPoolStt, index: int) -> None:
        self.pool = pool
        self.index = index
        self.state = _WorkerState.STARTING
        self.stopping = False
        self.failure: str | None = None  # why the worker could not start
        self.started_at = time.monotonic()
        # Guards streams and warmers against the reader declaring the worker dead meanwhile.
        self.lock = threading.Lock()
        self.streams: dict[int, PoolStream] = {}
        self.warmers: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self.outbox: deque[tuple[int, bytes | int]] = deque()  # (stream id, audio or op)
        self.control: deque[tuple[Any, ...]] = deque()
        self.wake = threading.Event()
        self.control.append(("config", pool.settings))
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        try:
            command = [sys.executable, "-c", _WORKER_CODE, json.dumps([str(p) for p in sys.path])]
            self.process = subprocess.Popen(
                [*command, str(to_child), str(from_child)],
                pass_fds=(to_child, from_child),
                stdin=subprocess.DEVNULL,
                # numpy's OpenBLAS would start a thread per core in every worker, unused here.
                env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ},
            )
        except BaseException:
            os.close(self._to_child)
            os.close(self._from_child)
            raise
        finally:
            os.close(to_child)  # the child's ends: our copies would hide its exit from us
            os.close(from_child)
        self.pid = self.process.pid
        self._requests = Connection(self._to_child, readable=False)
        self._results = Connection(self._from_child, writable=False)
        self._sender = threading.Thread(
            target=self._send_forever, name=f"stt-pool-send-{self.pid}", daemon=True
        )
        self._reader = threading.Thread(
            target=self._read_forever, name=f"stt-pool-read-{self.pid}", daemon=True
        )
        self._sender.start()
        self._reader.start()

    # -- on the event loop

    def register(self, stream: PoolStream) -> bool:
        with self.lock:
            if self.state is _WorkerState.DEAD or self.stopping:
                return False
            self.streams[stream.sid] = stream
            stream.worker = self
        self.wake.set()  # the sender may be idle, waiting for streams
        return True

    def forget(self, stream: PoolStream) -> None:
        with self.lock:
            self.streams.pop(stream.sid, None)

    def warm(self, count: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        future: asyncio.Future[None] = loop.create_future()
        with self.lock:
            if self.state is _WorkerState.DEAD or self.stopping:
                future.set_exception(SttError(self._dead_message()))
                return future
            self.warmers.append((loop, future))
            self.control.append(("warm", count))
        self.wake.set()
        return future

    @property
    def load(self) -> int:
        return len(self.streams)

    @property
    def running(self) -> bool:
        return self._reader.is_alive() or self._sender.is_alive()

    def stop(self) -> None:
        """Ship what is queued, then stop: finishing streams still get their text."""
        self.stopping = True
        self.wake.set()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def join(self) -> None:
        self._sender.join()
        self._reader.join()

    # -- the sender thread

    def _send_forever(self) -> None:
        try:
            while True:
                # Read before draining: whatever was queued before stop() goes out.
                stopping = self.stopping
                if self.state is _WorkerState.DEAD:
                    return
                while self.control:
                    self._requests.send(self.control.popleft())
                batch = self._take_batch()
                if batch:
                    self._requests.send(("batch", batch))
                if stopping:
                    self._requests.send(("stop",))
                    return
                idle = not self.streams and not self.outbox and not self.control
                # Idle without streams; otherwise a batch every batch_s (finish() wakes us).
                self.wake.wait(None if idle else self.pool.batch_s)
                self.wake.clear()
        except OSError:
            pass  # the worker is gone: the reader sees it and reports it
        finally:
            self._requests.close()

    def _take_batch(self) -> list[tuple[int, bytes, int]]:
        chunks: dict[int, list[bytes]] = {}
        ops: dict[int, int] = {}
        while True:
            try:
                sid, item = self.outbox.popleft()
            except IndexError:
                break
            if isinstance(item, bytes):
                chunks.setdefault(sid, []).append(item)
            else:
                ops[sid] = max(ops.get(sid, MORE), item)  # a cancel overrides an end
        batch = []
        for sid in {**chunks, **ops}:
            op = ops.get(sid, MORE)
            audio = b"" if op == CANCEL else b"".join(chunks.get(sid, ()))
            batch.append((sid, audio, op))
        return batch

    # -- the reader thread

    def _read_forever(self) -> None:
        try:
            while True:
                self._handle(self._results.recv())
        except (EOFError, OSError):
            pass  # the worker exited (or was killed)
        except Exception:
            log.exception("speech recognition worker %d: bad message", self.pid)
            self.kill()
        finally:
            self._exited()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "events":
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[PoolStream, int, Any]]] = {}
            for sid, event, data in message[1]:
                stream = self.streams.get(sid)
                if stream is not None:  # else cancelled meanwhile
                    by_loop.setdefault(stream.loop, []).append((stream, event, data))
            for loop, items in by_loop.items():
                _call_soon(loop, _deliver, items)
        elif kind == "ready":
            self.state = _WorkerState.READY
            log.debug("speech recognition worker %d ready", self.pid)
        elif kind == "warmed":
            with self.lock:
                loop, future = self.warmers.popleft()
            error = None if message[1] is None else SttError(message[1])
            _call_soon(loop, _resolve, future, error)
        elif kind == "failed":
            self.failure = message[1]

    def _exited(self) -> None:
        with self.lock:
            self.state = _WorkerState.DEAD
            streams = list(self.streams.values())
            self.streams.clear()
            warmers = list(self.warmers)
            self.warmers.clear()
        self.wake.set()  # the sender stops too
        self._results.close()
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed its pipe but lives on
            self.process.kill()
            code = self.process.wait()
        expected = self.stopping or self.pool.closed
        message = self._dead_message(code)
        if not expected:
            log.error("%s; %d utterance(s) lost; starting a new one", message, len(streams))
        for loop, items in _by_loop((stream.loop, stream) for stream in streams).items():
            _call_soon(loop, _fail_streams, items, message)
        for loop, futures in _by_loop(warmers).items():
            for future in futures:
                _call_soon(loop, _resolve, future, SttError(message))
        if not expected:
            self.pool.restart(self)

    def _dead_message(self, code: int | None = None) -> str:
        if self.pool.closed or self.stopping:
            return "speech recognition is closed"
        if self.failure is not None:
            return f"speech recognition worker {self.pid} failed to start: {self.failure}"
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return f"speech recognition worker {self.pid} died ({how})"


def _by_loop(
    pairs: Iterable[tuple[asyncio.AbstractEventLoop, Any]],
) -> dict[asyncio.AbstractEventLoop, list[Any]]:
    grouped: dict[asyncio.AbstractEventLoop, list[Any]] = {}
    for loop, item in pairs:
        grouped.setdefault(loop, []).append(item)
    return grouped


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass  # the loop is closed: nobody waits for these results any more


def _deliver(items: list[tuple[PoolStream, int, Any]]) -> None:
    for stream, kind, data in items:
        stream._event(kind, data)


def _fail_streams(streams: list[PoolStream], message: str) -> None:
    for stream in streams:
        stream._settle(message)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class ProcessPoolStt:
    """pocketsphinx (domain LM or full model, as PocketsphinxStt) or, given `whisper`, Whisper
    decoding in `processes` worker processes (default: one per core). Each utterance goes to
    the least busy worker.

    A Whisper worker holds one model (tiny.en: ~75 MB on disk, ~150 MB resident) and decodes
    one utterance at a time, when it ends or when the caller pauses (PoolStream.pause).

    Per worker: a Python interpreter with numpy and pocketsphinx, plus its decoders (a domain
    LM one ~7.5 MB, a full-model one ~89 MB, one per utterance it decodes at once; `max_idle`
    kept). `batch_ms`: how often queued audio is shipped to the workers, and so how fresh
    partials are. `noise_floor_db`, `decoder_options`: as PocketsphinxStt. `nice`: the workers'
    lower CPU priority, so that when the cores are busy the event loop (every call's audio) and
    speech synthesis go first and recognition waits: on 2 busy cores, 5 took the loop's worst
    wake-up delay from 10-13 ms to 7-9 ms.
    """

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        domain_lm: DomainLm | None = None,
        *,
        processes: int | None = None,
        batch_ms: int = 80,
        max_idle: int | None = None,
        noise_floor_db: float | None = -36.0,
        decoder_options: dict[str, Any] | None = None,
        nice: int = 5,
        stop_timeout_s: float = 5.0,
        whisper: WhisperOptions | None = None,
    ) -> None:
        self.domain_lm = domain_lm
        self.whisper = whisper
        self.language_model: Literal["domain", "full"] = (
            "domain" if domain_lm is not None else "full"
        )
        self.processes = default_processes() if processes is None else processes
        if self.processes < 1:
            raise SttError(f"a process pool needs at least one process, not {self.processes}")
        self.batch_s = max(10, batch_ms) / 1000
        self.settings = WorkerSettings(
            # The domain LM was built (or found in the cache) here: workers load it by path.
            options={} if whisper else pocketsphinx_options(domain_lm, decoder_options),
            max_idle=default_max_idle(domain_lm) if max_idle is None else max_idle,
            noise_floor_db=noise_floor_db,
            warm=1,
            nice=nice,
            whisper=whisper,
        )
        self.closed = False
        self._stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()  # the workers list against aclose
        self._closing = threading.Event()  # cuts restart delays short
        self._ids = itertools.count(1)
        self._backoff = [0.0] * self.processes
        self._workers: list[_Worker] = []
        try:
            for index in range(self.processes):
                self._workers.append(_Worker(self, index))
        except OSError as e:
            self.closed = True
            for worker in self._workers:
                worker.stop()
            raise SttError(f"cannot start speech recognition workers: {e}") from e

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes now (a dead one until it is replaced)."""
        return [worker.pid for worker in self._workers]

    @property
    def loads(self) -> list[int]:
        """Streams pinned to each worker (started, not yet finished or cancelled)."""
        return [worker.load for worker in self._workers]

    @property
    def ready(self) -> int:
        """How many workers have loaded the model."""
        return sum(worker.state is _WorkerState.READY for worker in self._workers)

    def start(self, sample_rate: int = SAMPLE_RATE) -> PoolStream:
        require_rate("whisper" if self.whisper else "pocketsphinx", sample_rate)
        if self.closed:
            raise SttError("speech recognition is closed")
        stream = PoolStream(next(self._ids), asyncio.get_running_loop())
        # Least busy first, preferring workers that have loaded the model over starting ones.
        candidates = sorted(
            self._workers,
            key=lambda w: (w.state is not _WorkerState.READY, w.load, w.index),
        )
        if not any(worker.register(stream) for worker in candidates):
            stream._settle("no speech recognition worker is running")
        return stream

    async def warm_up(self, count: int = 1) -> None:
        """Wait until every worker has loaded the model and holds idle decoders for its share
        of `count` utterances (a worker makes one as it starts)."""
        if self.closed:
            raise SttError("speech recognition is closed")
        loop = asyncio.get_running_loop()
        share = max(1, -(-count // self.processes))
        await asyncio.gather(*(worker.warm(share, loop) for worker in list(self._workers)))

    def restart(self, dead: _Worker) -> None:
        """Replace a worker that died (on its reader thread, which ends after this)."""
        index = dead.index
        lived = time.monotonic() - dead.started_at
        if dead.failure is None and lived >= _STABLE_S:
            self._backoff[index] = 0.0
        delay = self._backoff[index]
        self._backoff[index] = min(_MAX_BACKOFF_S, max(0.5, delay * 2))
        while not self._closing.wait(delay):
            with self._lock:
                if self.closed:
                    return
                try:
                    self._workers[index] = _Worker(self, index)
                    return
                except OSError as e:
                    log.error("cannot start a speech recognition worker: %s", e)
            delay = self._backoff[index]
            self._backoff[index] = min(_MAX_BACKOFF_S, delay * 2)

    async def aclose(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            workers = list(self._workers)
        self._closing.set()
        for worker in workers:
            worker.stop()
        # Polled rather than joined in a thread: closing must leave no thread behind, and
        # the workers are quick to stop (what was queued is decoded first).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stop_timeout_s
        killed = False
        while any(worker.running for worker in workers):
            if not killed and loop.time() >= deadline:
                log.warning("speech recognition workers did not stop in time: killing them")
                for worker in workers:
                    worker.kill()
                killed = True
            await asyncio.sleep(0.01)
        for worker in workers:
            worker.join()
