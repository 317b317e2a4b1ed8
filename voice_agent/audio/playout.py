"""The agent's outgoing audio when the server paces it itself (WebRTC, SIP's RTP): one frame
per tick, and when each mark's audio has been heard. Sans-I/O: the clock is the caller's."""

from __future__ import annotations

from collections import deque

# Before a browser's first report: a typical WebRTC jitter buffer on a quiet network.
DEFAULT_PLAYOUT_DELAY_MS = 60.0
MAX_PLAYOUT_DELAY_MS = 2000.0


class RtpPlayout:
    """The agent's outgoing audio, paced in frames, and when each mark's audio has been heard.

    Audio and marks are queued as the pipeline sends them; `next_frame` hands the RTP sender one
    frame per tick. A mark is heard once its last byte has been sent and the browser's playout
    delay has passed. `clear` drops what has not been sent; what is already in flight still plays
    in the browser, but the call core has cut its playback by then and ignores those marks.
    """

    def __init__(
        self,
        sample_rate: int,
        frame_ms: int = 20,
        sample_bytes: int = 2,
        *,
        silence: int = 0,
        delay_ms: float = DEFAULT_PLAYOUT_DELAY_MS,
    ) -> None:
        self.frame_bytes = sample_rate * sample_bytes * frame_ms // 1000
        self.frame_ms = frame_ms
        self.delay_ms = delay_ms
        # PCM16's silence is zeros; G.711's is not (0xFF in mu-law, 0xD5 in A-law).
        self._silence = bytes([silence]) * self.frame_bytes
        self._buffer = bytearray()
        self._queued = 0  # bytes ever queued, minus what clear dropped
        self._sent = 0  # bytes ever sent
        self._marks: deque[tuple[int, str]] = deque()  # (byte position it follows, name)
        self._in_flight: deque[tuple[float, str]] = deque()  # (heard at ms, name)

    @property
    def pending_ms(self) -> float:
        """Audio queued but not yet sent."""
        return len(self._buffer) / self.frame_bytes * self.frame_ms

    def audio(self, data: bytes) -> None:
        self._buffer += data
        self._queued += len(data)

    def mark(self, name: str) -> None:
        self._marks.append((self._queued, name))

    def report_delay(self, delay_ms: float) -> None:
        self.delay_ms = min(max(0.0, delay_ms), MAX_PLAYOUT_DELAY_MS)

    def clear(self) -> None:
        self._queued -= len(self._buffer)
        self._buffer.clear()
        self._marks.clear()
        self._in_flight.clear()

    def next_frame(self, now_ms: float) -> tuple[bytes, list[str]]:
        """The frame to send now (silence when there is nothing to say), and the marks heard."""
        if self._buffer:
            frame = bytes(self._buffer[: self.frame_bytes])
            del self._buffer[: self.frame_bytes]
            if len(frame) < self.frame_bytes:
                frame += self._silence[len(frame) :]
            self._sent += self.frame_bytes
            self._queued = max(self._queued, self._sent)
            # A mark is heard when its last byte, sent in this frame, has played out.
            heard_at = now_ms + self.frame_ms + self.delay_ms
        else:
            frame = self._silence
            self._sent = self._queued
            heard_at = now_ms + self.delay_ms
        while self._marks and self._marks[0][0] <= self._sent:
            self._in_flight.append((heard_at, self._marks.popleft()[1]))
        heard: list[str] = []
        while self._in_flight and self._in_flight[0][0] <= now_ms:
            heard.append(self._in_flight.popleft()[1])
        return frame, heard
