"""The audio of an agent whose engine hears the caller and speaks itself (a speech-to-speech
model, brains/realtime.py): the caller's audio of each turn, and the engine's audio in the
carrier's format.

Each turn's audio is the same utterances the server's STT heard, sorted by what the call core
made of them.

The core takes an utterance's transcript to be a turn, the rest of a turn it held back, or
nothing (a backchannel, noise): only the audio of utterances that became the caller's turn is
handed over, so the model hears what the committed history says the caller said and no
"uh-huh" the agent talked through.
"""

from __future__ import annotations

from collections import deque

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.resample import StreamResampler
from voice_agent.core import call as core
from voice_agent.runtime.turn_events import AgentAudio, CallerAudio


class CallerTurns:
    def __init__(self, sample_rate: int, carrier: tuple[str, int]) -> None:
        self.sample_rate = sample_rate
        self.carrier = carrier
        self._current = bytearray()
        self._finished: deque[bytes] = deque()  # in the order their transcripts will come
        self._held = bytearray()  # utterances of a turn the core has not started yet

    def start(self) -> None:
        """A new utterance (one begun before it, never finished, was given up)."""
        self._current = bytearray()

    def feed(self, pcm: bytes) -> None:
        self._current += pcm

    def finish(self) -> None:
        self._finished.append(bytes(self._current))
        self._current = bytearray()

    def decided(self, actions: list[core.Action]) -> CallerAudio | None:
        """What the core did with the oldest finished utterance's transcript: the turn's audio
        if it started one (with any it held back for it), else None."""
        audio = self._finished.popleft() if self._finished else b""
        dropped = any(
            isinstance(a, core.Audit) and a.type == "user_utterance_dropped" for a in actions
        )
        if not dropped:
            self._held += audio
        if not any(isinstance(a, core.StartUserTurn) for a in actions):
            return None
        pcm, self._held = bytes(self._held), bytearray()
        return CallerAudio(pcm, self.sample_rate, self.carrier)


class EngineVoice:
    """An engine's audio in the carrier's format: as it comes when the engine speaks that
    format (G.711 to a G.711 carrier), else decoded, resampled and encoded, one resampler a
    reply so its state carries over the joins between deltas."""

    def __init__(self, carrier: CarrierFormat) -> None:
        self.carrier = carrier
        self._reply: int | None = None
        self._resampler: StreamResampler | None = None

    def to_carrier(self, event: AgentAudio) -> bytes:
        carrier = self.carrier
        if (event.encoding, event.sample_rate) == (carrier.encoding, carrier.sample_rate):
            return event.audio
        if self._reply != event.reply_id:
            self._reply = event.reply_id
            rate = event.sample_rate
            same = rate == carrier.sample_rate
            self._resampler = None if same else StreamResampler(rate, carrier.sample_rate)
        source = CarrierFormat(event.encoding, event.sample_rate)  # type: ignore[arg-type]
        pcm = source.decode(event.audio)
        if self._resampler is not None:
            pcm = self._resampler.process(pcm)
        return carrier.encode(pcm)
