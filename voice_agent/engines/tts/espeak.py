"""eSpeak NG text-to-speech through ctypes on the libespeak-ng that `espeakng_loader` ships,
streamed chunk by chunk with word timings taken from the library's word and phoneme events."""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import ctypes
import re
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import espeakng_loader

from voice_agent.engines.tts.base import TtsChunk, TtsConfig, TtsError, WordTiming, shared_executor
from voice_agent.errors import ConfigError

SAMPLE_RATE = 22050
DEFAULT_VOICE = "en-us"
DEFAULT_WPM = 175
MIN_WPM = 80
# Above 450 wpm libespeak-ng needs the sonic speed-up library, which this build may lack.
MAX_WPM = 450
# The library hands audio to the callback in buffers of this length: it bounds how much audio
# is synthesized before the first chunk can go out, and how late a cancellation takes effect.
_BUFFER_MS = 100

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_ENDPAUSE = 0x1000
_PARAM_RATE = 1
_EV_LIST_TERMINATED = 0
_EV_WORD = 1
_EV_SENTENCE = 2
_EV_END = 5
_EV_MSG_TERMINATED = 6
_EV_PHONEME = 7
_EE_OK = 0

# Punctuation around a word is not part of what is heard: "(really)," is the word "really".
_STRIP = "\"'`()[]{}<>.,;:!?…“”‘’«»—–-"


class _Event(ctypes.Structure):
    # espeak_EVENT; `id` is a union of int, const char* and char[8]: phoneme events use the
    # char[8] (the phoneme mnemonic), which is the only member read here.
    _fields_ = (
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    )


_Callback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)

# libespeak-ng is not thread-safe: its voice, parameters, synth callback, text reader and wave
# generator all live in C globals (speech.c keeps `synth_callback`, `my_mode`, `out_samplerate`
# as file statics; the translator and phoneme queue are globals too), and espeak_SetSynthCallback
# takes no context pointer. So the process has one library, one callback, and every call into
# the library (initialise, select a voice, synthesize) holds this lock. A synthesis holds it only
# while it computes (1 to 2 ms per second of speech here), never while a consumer is slow.
_LOCK = threading.Lock()
_library: _Library | None = None


@dataclass
class _OpenWord:
    """The word being spoken: tokens `first`..`last` of the text (several when the library says
    them as one, like "in the"), its start, and where it ends if nothing sounds after that."""

    first: int
    last: int
    start_ms: float
    end_ms: float | None = None


class _Job:
    """One utterance being synthesized: turns the callback's audio and events into chunks.

    Runs on the synthesis thread. A word is sent once its end is known, and a chunk carries the
    words that start in it, so audio from the start of the still-open word on is held back; the
    hold costs compute time only (the next event is a few ms of CPU away), not audio time.
    """

    def __init__(self, text: str, emit: Callable[[object], None]) -> None:
        self.text = text
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self.emit = emit
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        self._token_starts = [start for start, _ in spans]
        self._token_ends = [end for _, end in spans]
        self._tokens = [text[start:end].strip(_STRIP) for start, end in spans]
        self._pending = bytearray()  # PCM not sent yet, starting at sample `_sent`
        self._sent = 0
        self._total = 0
        self._done: list[WordTiming] = []  # words with an end, not sent yet
        self._open: _OpenWord | None = None

    def on_audio(self, wav: Any, count: int, events: Any) -> int:
        if count > 0 and wav:
            self._pending += ctypes.string_at(wav, count * 2)
            self._total += count
        i = 0
        while events[i].type != _EV_LIST_TERMINATED:
            self._on_event(events[i])
            i += 1
        self._flush(final=False)
        return 1 if self.cancelled.is_set() else 0

    def finish(self) -> None:
        """After the library returns: the last word takes the tokens left and ends with the
        audio at the latest; send everything."""
        self._close_word(self._total_ms(), len(self._tokens))
        self._flush(final=True)

    def _total_ms(self) -> float:
        return self._total * 1000.0 / SAMPLE_RATE

    def _on_event(self, event: _Event) -> None:
        kind = event.type
        at_ms = min(float(event.audio_position), self._total_ms())
        word = self._open
        if kind == _EV_WORD:
            token = self._token_at(event.text_position - 1)
            if token is None:
                return
            if word is not None and token <= word.last:
                return  # one token can make several words ("1234", "$20"): keep the first start
            self._close_word(at_ms, token)
            self._open = _OpenWord(token, token, at_ms)
        elif word is None:
            return
        elif kind == _EV_PHONEME:
            if not event.id.startswith(b"_"):
                word.end_ms = None
            elif word.end_ms is None:
                # A pause: the word ends here unless a sounding phoneme of it follows.
                word.end_ms = at_ms
        elif kind in (_EV_END, _EV_SENTENCE, _EV_MSG_TERMINATED) and word.end_ms is None:
            # The clause ends; the word is closed by the next word event, which also tells
            # whether the library said tokens after it as part of it.
            word.end_ms = at_ms

    def _token_at(self, position: int) -> int | None:
        """The token holding character `position`; in whitespace, the token after it."""
        index = bisect.bisect_right(self._token_starts, position) - 1
        if index < 0 or position >= self._token_ends[index]:
            index += 1
        if index >= len(self._tokens) or not self._tokens[index]:
            return None
        return index

    def _close_word(self, at_ms: float, next_token: int) -> None:
        """End the open word at `at_ms` (or its pause); tokens before `next_token` that had no
        word event of their own were said with it and share its time by their length."""
        word = self._open
        if word is None:
            return
        self._open = None
        end_ms = max(word.start_ms, word.end_ms if word.end_ms is not None else at_ms)
        tokens = [self._tokens[i] for i in range(word.first, next_token) if self._tokens[i]]
        letters = sum(len(t) for t in tokens)
        start_ms = word.start_ms
        for token in tokens:
            stop_ms = start_ms + (end_ms - word.start_ms) * len(token) / letters
            self._done.append(WordTiming(token, start_ms, stop_ms))
            start_ms = stop_ms

    def _flush(self, *, final: bool) -> None:
        limit = self._total
        if not final and self._open is not None:
            limit = min(limit, round(self._open.start_ms * SAMPLE_RATE / 1000.0))
        if limit <= self._sent and not (final and self._done):
            return
        take = max(0, limit - self._sent)
        pcm = bytes(self._pending[: take * 2])
        del self._pending[: take * 2]
        self._sent += take
        end_ms = self._sent * 1000.0 / SAMPLE_RATE
        words = [w for w in self._done if final or w.start_ms < end_ms]
        self._done = self._done[len(words) :]
        self.emit(TtsChunk(pcm, tuple(words)))


class _Library:
    """The process's libespeak-ng, initialised once, with the one synth callback it allows."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = (_Callback,)
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = (ctypes.c_char_p,)
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = (
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        )
        lib.espeak_Synth.restype = ctypes.c_int
        # DONT_EXIT: without it the library calls exit() on a fatal error, killing the server.
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS,
            _BUFFER_MS,
            espeakng_loader.get_data_path().encode(),
            _INITIALIZE_PHONEME_EVENTS | _INITIALIZE_DONT_EXIT,
        )
        if rate != SAMPLE_RATE:
            raise TtsError(f"libespeak-ng failed to initialise (returned {rate})")
        self._lib = lib
        # C keeps only the function pointer: this reference keeps the trampoline alive.
        self._callback = _Callback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        self._job: _Job | None = None
        self._voice: str | None = None
        self._wpm: int | None = None

    def _on_audio(self, wav: Any, count: int, events: Any) -> int:
        job = self._job
        if job is None:
            return 1
        try:
            return job.on_audio(wav, count, events)
        except BaseException as exc:  # an exception cannot cross the C frames: stop and report
            job.error = exc
            return 1

    def select(self, voice: str, wpm: int) -> None:
        """Make `voice` and `wpm` current (caller holds `_LOCK`)."""
        if voice != self._voice:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
                raise ConfigError(f"eSpeak NG has no voice {voice!r}", key="tts.voice")
            self._voice = voice
            self._wpm = None
        if wpm != self._wpm:
            self._lib.espeak_SetParameter(_PARAM_RATE, wpm, 0)
            self._wpm = wpm

    def synthesize(self, job: _Job, voice: str, wpm: int) -> None:
        """Run `job` to completion or cancellation (caller holds `_LOCK`)."""
        self.select(voice, wpm)
        data = job.text.encode()
        self._job = job
        try:
            status = self._lib.espeak_Synth(
                data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None
            )
        finally:
            self._job = None
        if job.error is not None:
            raise job.error
        if status != _EE_OK and not job.cancelled.is_set():
            raise TtsError(f"espeak_Synth failed with status {status}")


def _get_library() -> _Library:
    """The process's library (caller holds `_LOCK`)."""
    global _library
    if _library is None:
        _library = _Library()
    return _library


def words_per_minute(speed: float) -> int:
    """eSpeak's rate for a speed factor: 1.0 is its default 175 wpm, clamped to what it can do."""
    if not speed > 0:
        raise ConfigError(f"speed must be positive, got {speed}", key="tts.speed")
    return max(MIN_WPM, min(MAX_WPM, round(DEFAULT_WPM * speed)))


class EspeakTts:
    """eSpeak NG: robotic but tiny and fast (1 to 2 ms of CPU per second of speech), with word
    timings. Synthesis runs on `executor`, else on a one-thread executor shared by the process."""

    sample_rate: int = SAMPLE_RATE
    gives_word_timings: bool = True

    def __init__(
        self, config: TtsConfig, *, executor: concurrent.futures.Executor | None = None
    ) -> None:
        self.voice = config.voice or DEFAULT_VOICE
        self.wpm = words_per_minute(config.speed)
        self._executor = executor or shared_executor("espeak")
        # Fail at construction, not mid-call, on a voice the library does not have.
        with _LOCK:
            _get_library().select(self.voice, self.wpm)

    async def synthesize(self, text: str) -> AsyncIterator[TtsChunk]:
        if not text.strip():
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()

        def emit(item: object) -> None:
            # The loop may be gone when a cancelled job finishes: nobody is listening then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, item)

        job = _Job(text, emit)
        worker = loop.run_in_executor(self._executor, self._run, job)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, TtsChunk)
                yield item
        finally:
            job.cancelled.set()
            # The callback sees the flag within one buffer; waiting keeps a closed stream from
            # overlapping the caller's next one.
            with contextlib.suppress(Exception):
                await worker

    def _run(self, job: _Job) -> None:
        try:
            with _LOCK:
                if job.cancelled.is_set():
                    return
                _get_library().synthesize(job, self.voice, self.wpm)
            if not job.cancelled.is_set():
                job.finish()
        except BaseException as exc:
            job.emit(exc)
        finally:
            job.emit(_DONE)

    async def aclose(self) -> None:
        """Nothing to release: the library and the shared executor live as long as the process."""


_DONE = object()
