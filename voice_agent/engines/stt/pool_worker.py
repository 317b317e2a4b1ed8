"""A speech-recognition worker process of the pool (voice_agent.engines.stt.pool): its entry, the
loop that decodes the batches the server sends and answers with partial and final hypotheses,
and the messages both sides speak."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Protocol

from voice_agent.engines.stt.base import Transcript
from voice_agent.engines.stt.pocketsphinx import (
    NOISE_SEED,
    DecoderPool,
    UtteranceDecoder,
    create_decoder,
)
from voice_agent.engines.stt.whisper import WhisperOptions

# What follows a stream's audio in a batch; of two in one batch, the larger wins.
MORE, PAUSE, END, CANCEL = 0, 1, 2, 3

# Events from a worker, per stream.
PARTIAL, FINAL, ERROR, PAUSED = 0, 1, 2, 3


class _Utterance(Protocol):
    """One stream's decoding in a worker: pocketsphinx's UtteranceDecoder, WhisperUtterance."""

    partial: str

    def feed(self, chunk: bytes) -> str: ...
    def pause(self) -> str: ...
    def end(self) -> Transcript: ...
    def drop(self) -> None: ...
    def discard(self) -> None: ...


@dataclass(frozen=True)
class WorkerSettings:
    options: dict[str, Any]  # pocketsphinx Config parameters, the LM and dictionary by path
    max_idle: int
    noise_floor_db: float | None
    warm: int  # decoders made as the worker starts
    nice: int
    whisper: WhisperOptions | None = None  # set: the worker runs Whisper, not pocketsphinx


def worker_main(read_fd: int, write_fd: int) -> None:
    """A worker process's entry: decode batches from `read_fd`, reply on `write_fd`."""
    # Ctrl-C in a terminal reaches the whole process group, and so does SIGTERM from systemd
    # (its default KillMode) or `kill -- -PGID`; the server then drains its live calls, which
    # still need their decoders. The server decides when we stop: it closes our pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    requests = Connection(read_fd, writable=False)
    results = Connection(write_fd, readable=False)
    try:
        _serve(requests, results)
    except (EOFError, BrokenPipeError):
        pass  # the server process is gone: so are its calls


def _serve(requests: Connection, results: Connection) -> None:
    _, settings = requests.recv()
    try:
        os.nice(settings.nice)
    except OSError:  # a negative value needs privileges: run at the server's priority
        pass
    pool: DecoderPool | None = None
    try:
        if settings.whisper is not None:
            from voice_agent.engines.stt.whisper import WhisperDecoder, WhisperUtterance

            new_utterance: Callable[[], _Utterance] = partial(
                WhisperUtterance, WhisperDecoder(settings.whisper)
            )
        else:
            pool = DecoderPool(
                partial(create_decoder, settings.options), max_idle=settings.max_idle
            )
            pool.fill(settings.warm)
            # Slicing bounds GIL stalls in-process; a worker has no loop to keep waiting.
            new_utterance = partial(
                UtteranceDecoder,
                pool,
                slice_bytes=1 << 30,
                noise_floor_db=settings.noise_floor_db,
                # The in-process engine's seed: the same audio gives the same text either way.
                seed=NOISE_SEED,
            )
    except Exception as e:
        results.send(("failed", str(e)))
        return
    results.send(("ready", os.getpid()))
    utterances: dict[int, _Utterance | None] = {}  # None: failed, error reported
    while True:
        message = requests.recv()
        if message[0] == "batch":
            events = _decode_batch(message[1], utterances, new_utterance)
            if events:
                results.send(("events", events))
        elif message[0] == "warm":
            try:
                if pool is not None:  # a Whisper worker's one model is loaded at start
                    pool.fill(message[1])
                results.send(("warmed", None))
            except Exception as e:
                results.send(("warmed", str(e)))
        elif message[0] == "stop":
            return


def _decode_batch(
    batch: list[tuple[int, bytes, int]],
    utterances: dict[int, _Utterance | None],
    new_utterance: Callable[[], _Utterance],
) -> list[tuple[int, int, Any]]:
    events: list[tuple[int, int, Any]] = []
    for sid, pcm, op in batch:
        if op == CANCEL:
            cancelled = utterances.pop(sid, None)
            if cancelled is not None:
                try:
                    cancelled.drop()
                except Exception:
                    cancelled.discard()
            continue
        if sid not in utterances:
            utterances[sid] = new_utterance()
        utterance = utterances[sid]
        if utterance is None:  # failed earlier: the rest of its audio is dropped
            if op == END:
                del utterances[sid]
            continue
        try:
            before = utterance.partial
            if pcm:
                utterance.feed(pcm)
            if op == PAUSE:
                utterance.pause()
                # Answered whatever the text: the server awaits it (PoolStream.speculation).
                events.append((sid, PAUSED, utterance.partial))
            elif utterance.partial != before and op != END:
                events.append((sid, PARTIAL, utterance.partial))
            if op == END:
                del utterances[sid]
                events.append((sid, FINAL, utterance.end()))
        except Exception as e:
            utterance.discard()
            if op == END:
                utterances.pop(sid, None)
            else:
                utterances[sid] = None
            events.append((sid, ERROR, f"pocketsphinx decoding failed: {e}"))
    return events
