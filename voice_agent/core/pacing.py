"""When the streamed audio of a sentence goes out: at once while the caller has little left to
play, in larger pieces once it is well ahead.

A hosted engine streams a sentence in pieces of about 100 ms, usually several times faster than
real time. Sending each piece as it comes puts the first audio on the wire soonest, but once the
caller has a comfortable lead, every extra message costs the worker CPU (encoding, framing, a
write) for nothing the caller can hear. Pieces are therefore sent at once while less than
`low_water_ms` of the sentence is left to play, and otherwise gathered up to `batch_ms`; should
the engine stall meanwhile, what is held goes out when the lead falls to `low_water_ms`
(`due_ms`, for the driver's timer). An engine that streams at real time or slower never builds
a lead, so all its pieces go out at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOW_WATER_MS = 300.0
BATCH_MS = 400.0


@dataclass
class SentencePacer:
    bytes_per_ms: float
    low_water_ms: float = LOW_WATER_MS
    batch_ms: float = BATCH_MS
    _pending: bytearray = field(default_factory=bytearray)
    _sent_ms: float = 0.0
    _first_sent_ms: float | None = None

    def push(self, audio: bytes, now_ms: float) -> bytes:
        """Audio the engine gave; returns what to send now (empty: hold it for now)."""
        self._pending += audio
        pending_ms = len(self._pending) / self.bytes_per_ms
        if self._first_sent_ms is None:
            self._first_sent_ms = now_ms
        elif self.lead_ms(now_ms) >= self.low_water_ms and pending_ms < self.batch_ms:
            return b""
        return self.take()

    def lead_ms(self, now_ms: float) -> float:
        """How much of what was sent the caller has yet to hear, at the latest."""
        if self._first_sent_ms is None:
            return 0.0
        return self._sent_ms - (now_ms - self._first_sent_ms)

    def due_ms(self) -> float | None:
        """When audio held back must go out, should the engine send nothing more by then: the
        moment the caller's lead falls to the low-water mark. None when nothing is held."""
        if not self._pending or self._first_sent_ms is None:
            return None
        return self._first_sent_ms + self._sent_ms - self.low_water_ms

    def take(self) -> bytes:
        """Everything held, to send now."""
        self._sent_ms += len(self._pending) / self.bytes_per_ms
        out = bytes(self._pending)
        self._pending.clear()
        return out

    def finish(self) -> bytes:
        """The sentence is complete: whatever is held goes out with its end."""
        return self.take()
