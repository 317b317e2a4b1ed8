"""The agent's sentences on their way through TTS to the call: requested a few at a time,
streamed to the call core one at a time, in order, and let go as soon as nobody will hear them.

The call core decides what is still wanted (`reply_wanted`, `stream_wanted`); this module only
schedules the engine's requests and paces what they give (audio.pacing.SentencePacer).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.pacing import SentencePacer
from voice_agent.audio.resample import StreamResampler
from voice_agent.core.playback import Word
from voice_agent.engines.tts import Tts, TtsChunk

# Sentences whose synthesis runs at once: the one streaming to the caller and the next, so
# the next one's first audio is there when the current one ends (an engine's first-byte
# delay would otherwise fall between the two, in the caller's ears).
SYNTH_IN_FLIGHT = 2


@dataclass(eq=False)
class _Synthesis:
    """One sentence's synthesis under way: its engine pieces, buffered until it is its turn
    to stream (None ends them; an exception is the engine's failure)."""

    reply_id: int
    text: str
    pieces: asyncio.Queue[TtsChunk | BaseException | None] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    dropped: bool = False


def _call_ended(*_: object) -> Any:
    raise RuntimeError("the call has ended")


def _ignore(*_: object) -> None:
    pass


# (reply_id, text, audio in the carrier's format, last, the engine's word timings)
AudioSink = Callable[[int, str, bytes, bool, tuple[Word, ...] | None], None]


class SpeechQueue:
    """One call's sentences to speak. `add` a sentence; its audio reaches `on_audio` as the
    engine streams it (the last part with `last=True` and the words, if the engine times
    them); `prune` after the core has stopped or committed a reply; `busy` while any sentence
    is still being synthesised. A failed synthesis goes to `on_failure` and the queue goes on;
    `on_done` after each sentence."""

    def __init__(
        self,
        tts: Tts,
        carrier: CarrierFormat,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        now_ms: Callable[[], float],
        at_ms: Callable[[float, Callable[[], None]], asyncio.TimerHandle],
        reply_wanted: Callable[[int], bool],
        stream_wanted: Callable[[int], bool],
        on_audio: AudioSink,
        on_failure: Callable[[int, str, Exception], None],
        on_done: Callable[[], None],
    ) -> None:
        self._tts = tts
        self._carrier = carrier
        self._spawn = spawn
        self._now_ms = now_ms
        self._at_ms = at_ms
        self._reply_wanted = reply_wanted
        self._stream_wanted = stream_wanted
        self._on_audio = on_audio
        self._on_failure = on_failure
        self._on_done = on_done
        # Sentences to synthesise, in order: not started yet, then started (at most
        # SYNTH_IN_FLIGHT, the first of them streaming to the caller).
        self._waiting: deque[tuple[int, str]] = deque()
        self._started: asyncio.Queue[_Synthesis] = asyncio.Queue()
        self._in_flight: list[_Synthesis] = []
        self._streaming: _Synthesis | None = None
        self.task: asyncio.Task[None] | None = spawn(self._synthesize_forever())

    @property
    def busy(self) -> bool:
        return bool(self._in_flight)

    def add(self, reply_id: int, text: str) -> None:
        self._waiting.append((reply_id, text))
        self._start()

    def prune(self) -> None:
        """Stop synthesising what the caller will not hear: sentences of replies a barge-in
        stopped or that are committed, and the rest of one cut while it streamed once it can
        no longer resume. Waiting for them would hold up the next reply's audio."""
        wanted = self._reply_wanted
        if any(not wanted(reply_id) for reply_id, _ in self._waiting):
            self._waiting = deque(s for s in self._waiting if wanted(s[0]))
        kept: list[_Synthesis] = []
        for synthesis in self._in_flight:
            streaming = synthesis is self._streaming
            if streaming:
                keep = self._stream_wanted(synthesis.reply_id)
            else:
                keep = wanted(synthesis.reply_id)
            if not keep and not synthesis.dropped:
                self._drop(synthesis)
            if keep or streaming:
                kept.append(synthesis)  # a dropped one that streams is let go by the synth task
        self._in_flight = kept
        self._start()

    def close(self) -> None:
        """The call has ended (its tasks cancelled): let go of every reference to it. The
        callbacks are the call's own (a cycle), and a cancelled task keeps its exception, whose
        traceback holds the call: either way its objects would wait for a full garbage
        collection, which pauses every call on the worker."""
        self._spawn = self._now_ms = self._at_ms = _call_ended
        self._on_audio = self._on_failure = _ignore
        self._on_done = _ignore
        self.task = None
        self._waiting.clear()
        self._in_flight.clear()
        self._streaming = None
        while not self._started.empty():
            self._started.get_nowait()

    @staticmethod
    def _drop(synthesis: _Synthesis) -> None:
        """Cancel its engine request; the synth task skips it, or ends it if it streams."""
        synthesis.dropped = True
        if synthesis.task is not None:
            synthesis.task.cancel()
        pieces = synthesis.pieces
        while not pieces.empty():
            pieces.get_nowait()
        pieces.put_nowait(None)

    def _start(self) -> None:
        while self._waiting and len(self._in_flight) < SYNTH_IN_FLIGHT:
            reply_id, text = self._waiting.popleft()
            synthesis = _Synthesis(reply_id, text)
            synthesis.task = self._spawn(self._request_speech(synthesis))
            self._in_flight.append(synthesis)
            self._started.put_nowait(synthesis)

    async def _request_speech(self, synthesis: _Synthesis) -> None:
        pieces = synthesis.pieces
        try:
            async for chunk in self._tts.synthesize(synthesis.text):
                pieces.put_nowait(chunk)
        except asyncio.CancelledError:
            # The cancelled task keeps its error, whose traceback holds this frame and so the
            # synthesis: were the synthesis to hold the task, only the collector could free
            # them (and the call this frame holds).
            synthesis.task = None
            raise
        except Exception as exc:
            pieces.put_nowait(exc)
            return
        pieces.put_nowait(None)

    async def _synthesize_forever(self) -> None:
        while True:
            synthesis = await self._started.get()
            if synthesis.dropped:
                continue
            self._streaming = synthesis
            try:
                await self._synthesize(synthesis)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_failure(synthesis.reply_id, synthesis.text, exc)
            self._streaming = None
            self._in_flight.remove(synthesis)
            self._start()
            self._on_done()

    async def _synthesize(self, synthesis: _Synthesis) -> None:
        """One sentence: its audio goes out as the engine streams it (paced, see audio.pacing);
        the core places its words (and sends its mark) when the last of it has come."""
        reply_id, text = synthesis.reply_id, synthesis.text
        tts, carrier, on_audio = self._tts, self._carrier, self._on_audio
        to_carrier = (
            StreamResampler(tts.sample_rate, carrier.sample_rate)
            if tts.sample_rate != carrier.sample_rate
            else None
        )
        # Paced on the engine's audio, so that what is held back is not resampled yet either.
        pacer = SentencePacer(tts.sample_rate * 2 / 1000)

        def to_send(pcm: bytes, last: bool = False) -> bytes:
            if to_carrier is not None:
                pcm = to_carrier.process(pcm) + (to_carrier.flush() if last else b"")
            return carrier.encode(pcm) if pcm else b""

        held: asyncio.TimerHandle | None = None

        def send_held() -> None:
            # The engine went quiet while audio was held back: send it before the caller
            # runs short.
            nonlocal held
            held = None
            if audio := to_send(pacer.take()):
                on_audio(reply_id, text, audio, False, None)

        words: list[Word] = []
        try:
            while (chunk := await synthesis.pieces.get()) is not None:
                if isinstance(chunk, BaseException):
                    raise chunk
                if held is not None:
                    held.cancel()
                    held = None
                words.extend(Word(w.word, w.start_ms, w.end_ms) for w in chunk.words)
                pcm = pacer.push(chunk.pcm, self._now_ms())
                if pcm and (audio := to_send(pcm)):
                    on_audio(reply_id, text, audio, False, None)
                due_ms = pacer.due_ms()
                if due_ms is not None:
                    held = self._at_ms(due_ms, send_held)
        finally:
            if held is not None:
                held.cancel()
        timed = tuple(words) if tts.gives_word_timings and words else None
        on_audio(reply_id, text, to_send(pacer.finish(), last=True), True, timed)
