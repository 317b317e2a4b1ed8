"""Streaming pocketsphinx STT: audio is decoded in batches on worker threads while the caller
speaks, by pooled decoders with a domain language model or the wheel's full en-us model."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from enum import Enum
from typing import Any, Literal

import numpy as np
from pocketsphinx import Decoder

from voice_agent.engines.stt.base import (
    SAMPLE_RATE,
    SAMPLE_WIDTH,
    SttError,
    Transcript,
    require_rate,
)
from voice_agent.engines.stt.domain_lm import DomainLm

log = logging.getLogger(__name__)

# Words the decoder emits that are not speech.
_FILLERS = {"<s>", "</s>", "<sil>"}
NOISE_SEED = 0x5EED
_SILENT_RMS = 8.0  # about -72 dBFS: below any real line noise
_FRAME_SAMPLES = SAMPLE_RATE // 100
_FRAME_BYTES = _FRAME_SAMPLES * SAMPLE_WIDTH


class DecoderPool:
    """Idle decoders of one configuration. acquire/release may be called from any thread; a
    decoder is used by one thread at a time because only its current holder has it."""

    def __init__(self, factory: Callable[[], Decoder], *, max_idle: int) -> None:
        self._factory = factory
        self._max_idle = max_idle
        self._idle: list[Decoder] = []
        self._lock = threading.Lock()
        self.created = 0

    def acquire(self) -> Decoder:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._create()

    def _create(self) -> Decoder:
        decoder = self._factory()
        with self._lock:
            self.created += 1
        return decoder

    def release(self, decoder: Decoder) -> None:
        # Live cepstral mean normalisation carries its estimate (mean and weight) over from the
        # last utterance, another caller's. A fresh front end (0.2 ms) makes a stream's text
        # depend on its audio alone; set_cmn() restores the mean but not the weight.
        decoder.reinit_feat()
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(decoder)

    def fill(self, count: int) -> None:
        """Create decoders until `count` are idle (or max_idle)."""
        while self.idle < min(count, self._max_idle):
            self.release(self._create())

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()


class _State(Enum):
    OPEN = "open"
    FINISHING = "finishing"
    CANCELLED = "cancelled"
    DONE = "done"


class UtteranceDecoder:
    """The decoding of one utterance: takes a pooled decoder at its first audio, adds the noise
    floor, and gives the decoder back at end() or drop(). Not thread-safe: one thread at a time
    (a drain job in-process, or a worker process's only thread, see pool.py)."""

    def __init__(
        self,
        pool: DecoderPool,
        *,
        slice_bytes: int,
        noise_floor_db: float | None,
        seed: int = NOISE_SEED,
    ) -> None:
        self._pool = pool
        self._slice_bytes = slice_bytes
        self._noise_ratio = 0.0 if noise_floor_db is None else 10 ** (noise_floor_db / 20)
        self._level = 0.0  # RMS of the loudest 10 ms frame so far
        self._half = b""  # a byte short of a whole sample, held for the next chunk
        self._carry = b""  # audio short of a whole frame, held for the next chunk
        self._rng = np.random.default_rng(seed)
        self._decoder: Decoder | None = None
        self.partial = ""  # the best hypothesis so far

    def feed(self, chunk: bytes) -> str:
        """Decode `chunk` (any length: a split sample waits for its other byte); the partial."""
        if self._half:
            chunk = self._half + chunk
        whole = len(chunk) - len(chunk) % SAMPLE_WIDTH
        if whole < len(chunk):
            chunk, self._half = chunk[:whole], chunk[whole:]
        else:
            self._half = b""
        if chunk:
            self._decode(chunk)
        return self.partial

    def _decode(self, chunk: bytes, *, last: bool = False) -> None:
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = self._pool.acquire()
            decoder.start_utt()
        if self._noise_ratio > 0:
            # Whole 10 ms frames only, the rest held for the next chunk: the noise (and so the
            # text) must not depend on how pushes happened to be batched.
            chunk = self._carry + chunk
            whole = len(chunk) if last else len(chunk) - len(chunk) % _FRAME_BYTES
            chunk, self._carry = chunk[:whole], chunk[whole:]
            chunk = self._add_noise_floor(chunk) if chunk else chunk
        # Small slices bound how long each GIL-holding call keeps the event loop waiting.
        for start in range(0, len(chunk), self._slice_bytes):
            decoder.process_raw(chunk[start : start + self._slice_bytes])
        hyp = decoder.hyp()
        self.partial = hyp.hypstr if hyp is not None else ""

    def _add_noise_floor(self, chunk: bytes) -> bytes:
        # Phone audio upsampled to 16 kHz has no energy above 4 kHz, and synthetic or codec
        # audio has spectral holes; the wideband acoustic model's log-spectral features then
        # take extreme values and recognition collapses (WER 0.40 -> 0.06 on 8 kHz speech).
        # Faint white noise fills the holes. Its level follows the loudest 10 ms frame so far:
        # a fixed level that suits loud speech drowns quiet speech. (Near-)digital silence is
        # left alone: hiss there after a loud sound reads as fricatives (a cough became "half").
        samples = np.frombuffer(chunk, dtype=np.int16).astype(np.float32)
        count = -(-samples.shape[0] // _FRAME_SAMPLES)
        frames = np.zeros(count * _FRAME_SAMPLES, dtype=np.float32)
        frames[: samples.shape[0]] = samples  # only the utterance's last frame can be short
        frames = frames.reshape(count, _FRAME_SAMPLES)
        rms = np.sqrt(np.mean(frames * frames, axis=1))
        levels = np.maximum.accumulate(np.maximum(rms, self._level))
        self._level = float(levels[-1])
        levels[rms < _SILENT_RMS] = 0.0
        noise = self._rng.standard_normal(frames.shape, dtype=np.float32)
        frames += noise * (levels * self._noise_ratio)[:, None]
        out = frames.reshape(-1)[: samples.shape[0]]
        return np.clip(out, -32768, 32767).astype(np.int16).tobytes()

    def end(self) -> Transcript:
        """End of utterance: the final text; the decoder goes back to the pool."""
        if self._carry:
            self._decode(b"", last=True)
        decoder = self._decoder
        if decoder is None:
            return Transcript("")
        decoder.end_utt()
        hyp = decoder.hyp()
        text = hyp.hypstr if hyp is not None else ""
        # Mean word posterior (the binding gives probabilities, not logs): the sentence
        # posterior, hyp.prob, shrinks with every word.
        posteriors = [
            min(1.0, segment.prob)
            for segment in (decoder.seg() if text else ())
            if segment.word not in _FILLERS and not segment.word.startswith("[")
        ]
        self._release(end=False)
        confidence = sum(posteriors) / len(posteriors) if text and posteriors else None
        self.partial = text
        return Transcript(text, confidence, tuple(text.split()))

    def pause(self) -> str:
        """The caller paused: nothing to do, pocketsphinx decodes as the audio comes."""
        return self.partial

    def drop(self) -> None:
        """Cancelled: the decoder goes back to the pool, its utterance ended unread."""
        self._release(end=True)

    def discard(self) -> None:
        """After a failure: the decoder's state is unknown, so it is dropped, not pooled."""
        self._decoder = None

    def _release(self, *, end: bool) -> None:
        decoder, self._decoder = self._decoder, None
        if decoder is None:
            return
        if end:
            decoder.end_utt()
        self._pool.release(decoder)


class PocketsphinxStream:
    """One utterance. push/partial/finish/cancel run on the event loop; decoding runs in one drain
    job at a time on the executor, so the stream's decoder is never used by two threads."""

    def __init__(
        self,
        pool: DecoderPool,
        executor: Executor,
        *,
        batch_bytes: int,
        slice_bytes: int,
        noise_floor_db: float | None,
        seed: int,
    ) -> None:
        self._executor = executor
        self._batch_bytes = batch_bytes
        self._utterance = UtteranceDecoder(
            pool, slice_bytes=slice_bytes, noise_floor_db=noise_floor_db, seed=seed
        )
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._state = _State.OPEN
        self._scheduled = False  # a drain job is queued or running
        self._partial = ""
        self._result: Future[Transcript] = Future()

    def push(self, pcm: bytes) -> None:
        with self._lock:
            if self._state is not _State.OPEN:
                return
            self._pending += pcm
            if self._scheduled or len(self._pending) < self._batch_bytes:
                return
            self._scheduled = True
        self._submit()

    def partial(self) -> str:
        return self._partial

    def pause(self) -> None:
        pass  # decoding keeps up with the audio: nothing to start early

    async def speculation(self) -> str | None:
        return self._partial

    async def finish(self) -> Transcript:
        with self._lock:
            submit = self._state is _State.OPEN and not self._scheduled
            if self._state is _State.OPEN:
                self._state = _State.FINISHING
                self._scheduled = True
        if submit:
            self._submit()
        return await asyncio.wrap_future(self._result)

    def cancel(self) -> None:
        with self._lock:
            if self._state in (_State.CANCELLED, _State.DONE):
                return
            self._state = _State.CANCELLED
            self._pending.clear()
            submit = not self._scheduled
            self._scheduled = True
        if submit:
            self._submit()

    def _submit(self) -> None:
        try:
            self._executor.submit(self._drain)
        except RuntimeError as e:  # executor shut down: the engine was closed
            self._fail(SttError(f"speech recognition is closed: {e}"))

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self._state = _State.DONE
            self._pending.clear()
        if not self._result.done():
            self._result.set_exception(error)

    def _drain(self) -> None:
        """Decode what is pending until nothing is; end the utterance when asked to."""
        try:
            while True:
                with self._lock:
                    state = self._state
                    chunk = bytes(self._pending)
                    self._pending.clear()
                    if not chunk and state is _State.OPEN:
                        self._scheduled = False
                        return
                if state is _State.CANCELLED:
                    self._utterance.drop()
                    self._complete(Transcript(""))
                    return
                if chunk:
                    self._partial = self._utterance.feed(chunk)
                elif state is _State.FINISHING:
                    self._complete(self._utterance.end())
                    return
        except Exception as e:
            log.exception("pocketsphinx decoding failed")
            self._utterance.discard()
            self._fail(SttError(f"pocketsphinx decoding failed: {e}"))

    def _complete(self, transcript: Transcript) -> None:
        with self._lock:
            self._state = _State.DONE
            self._pending.clear()
        self._partial = transcript.text
        if not self._result.done():
            self._result.set_result(transcript)


def pocketsphinx_options(
    domain_lm: DomainLm | None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """pocketsphinx Config parameters for the domain LM (or the full model when None)."""
    options: dict[str, Any] = {"loglevel": "ERROR"}
    if domain_lm is not None:
        options |= {"lm": str(domain_lm.lm_path), "dict": str(domain_lm.dict_path)}
        # A small in-domain LM deserves more trust than the default 6.5: on 8 kHz phone
        # speech this took WER from 0.06 to 0.01, with 16 kHz speech unchanged. Without the
        # second (flat-lexicon) pass, end_utt takes 2-4 ms instead of 50-100 ms (one
        # GIL-holding call at end of turn) for about the same WER on the fixtures.
        options |= {"lw": 10.0, "fwdflat": False}
    return options | (overrides or {})


def create_decoder(options: dict[str, Any]) -> Decoder:
    try:
        return Decoder(**options)
    except (RuntimeError, ValueError) as e:
        raise SttError(f"cannot create a pocketsphinx decoder: {e}") from e


def default_max_idle(domain_lm: DomainLm | None) -> int:
    # A domain-LM decoder is small (~7.5 MB), a full-model one ~89 MB.
    return 16 if domain_lm is not None else 2


class PocketsphinxStt:
    """pocketsphinx speech recognition with a domain LM (`domain_lm`) or the full en-us model.

    Decoders are pooled, not made per utterance. Measured on 2 cores (pocketsphinx 5.1.1): a
    full-model decoder takes 0.55-0.8 s and ~89 MB to create, a domain-LM one 20-30 ms and
    ~7.5 MB, while decoding allocates little. A stream takes an idle decoder (or creates one)
    when its first audio is decoded and gives it back at finish/cancel; `max_idle` stay pooled.

    pocketsphinx holds the GIL inside every call (its Cython wrapper never releases it), so the
    worker threads keep decoding off the event loop's stack but not off its clock: each call
    stalls the loop for as long as it runs. Audio therefore goes in `slice_ms` slices, and
    decoders are best created before calls arrive with `warm_up()`, above all the full model's
    (its creation is one 0.55-0.8 s stall; its end_utt up to 0.5 s). `ProcessPoolStt` (pool.py)
    runs the same decoding in worker processes, off the loop's clock too.

    `batch_ms`: audio gathered before a decoding job is queued. `noise_floor_db`: white noise
    added relative to the loudest 10 ms so far (None: off), see
    `UtteranceDecoder._add_noise_floor`.
    `decoder_options`: extra pocketsphinx Config parameters, overriding ours.
    """

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        domain_lm: DomainLm | None = None,
        *,
        executor: Executor | None = None,
        max_idle: int | None = None,
        batch_ms: int = 100,
        slice_ms: int = 40,
        noise_floor_db: float | None = -36.0,
        decoder_options: dict[str, Any] | None = None,
    ) -> None:
        self.domain_lm = domain_lm
        self.language_model: Literal["domain", "full"] = (
            "domain" if domain_lm is not None else "full"
        )
        self._own_executor = executor is None
        # Two workers: decoding is GIL-bound, so more threads would not decode faster, but a
        # second one keeps streams moving while the first creates a decoder.
        self._executor = executor or ThreadPoolExecutor(2, thread_name_prefix="stt-pocketsphinx")
        self._options = pocketsphinx_options(domain_lm, decoder_options)
        if max_idle is None:
            max_idle = default_max_idle(domain_lm)
        self.pool = DecoderPool(self._create_decoder, max_idle=max_idle)
        bytes_per_ms = SAMPLE_RATE * SAMPLE_WIDTH // 1000
        self._batch_bytes = max(1, batch_ms) * bytes_per_ms
        self._slice_bytes = max(10, slice_ms) * bytes_per_ms
        self._noise_floor_db = noise_floor_db
        self._closed = False

    def _create_decoder(self) -> Decoder:
        return create_decoder(self._options)

    async def warm_up(self, count: int = 1) -> None:
        """Create `count` idle decoders now (on the executor), so first utterances need not."""
        await asyncio.wrap_future(self._executor.submit(self.pool.fill, count))

    def start(self, sample_rate: int = SAMPLE_RATE) -> PocketsphinxStream:
        require_rate("pocketsphinx", sample_rate)
        if self._closed:
            raise SttError("speech recognition is closed")
        return PocketsphinxStream(
            self.pool,
            self._executor,
            batch_bytes=self._batch_bytes,
            slice_bytes=self._slice_bytes,
            noise_floor_db=self._noise_floor_db,
            # One seed for all: a stream's text then depends on its audio alone.
            seed=NOISE_SEED,
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._own_executor:
            # Queued drains still run, so finishing streams get their text; later ones fail.
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        self.pool.clear()
