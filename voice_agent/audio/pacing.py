"""When the agent's audio goes out.

`Pacer` and `PhasedPacer`: the send clock of server-paced media (SIP's RTP, AudioSocket's TCP),
one frame every 20 ms on a grid computed from the start, never drifting.

`SentencePacer`: when the streamed audio of a sentence goes out to a carrier that buffers it
(the WebSocket carriers): at once while the caller has little left to play, in larger pieces
once it is well ahead.

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

FRAME_MS = 20.0
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


class Pacer:
    """The send clock of one stream: frame n is due at start + n * frame_ms.

    Deadlines are computed from the start, never accumulated from sleep results, so the late
    wake-ups of a busy event loop never add up to drift. After a stall (a GC pause, a blocked
    loop) at most max_catch_up frames are due at once; the older ones are dropped, counted in
    `dropped`, and the grid goes on where the wall clock is, so the far end never gets seconds
    of audio in a burst. The caller advances its RtpSender by the dropped frames (skip()) to
    keep the media clock with the wall clock.

    A frame within `early_ms` of its deadline is due: uvloop's timers have whole-millisecond
    resolution, and the ms -> s -> ms round trip of a deadline can wake the tick a hair before
    it; without the allowance the tick found nothing due, re-armed for the same deadline and
    spun until the next millisecond (seen in the SIP load run: 20,016 wake-ups for 5,100
    ticks)."""

    __slots__ = ("_early", "_frame", "_max_catch_up", "_sent", "_start", "dropped")

    def __init__(
        self,
        start_ms: float,
        frame_ms: float = FRAME_MS,
        *,
        max_catch_up: int = 5,
        early_ms: float = 1.0,
    ) -> None:
        if frame_ms <= 0:
            raise ValueError(f"frame_ms {frame_ms} is not positive")
        if max_catch_up < 1:
            raise ValueError(f"max_catch_up {max_catch_up} is below 1")
        self._start = start_ms
        self._frame = frame_ms
        self._max_catch_up = max_catch_up
        self._early = early_ms
        self._sent = 0  # frames handed out or dropped: the index of the next frame
        self.dropped = 0

    @property
    def next_deadline_ms(self) -> float:
        """When the next frame is due, on the caller's clock."""
        return self._start + self._sent * self._frame

    def due(self, now_ms: float) -> int:
        """How many frames to send now: those whose deadline has come, at most max_catch_up."""
        now_ms += self._early
        if now_ms < self._start + self._sent * self._frame:
            return 0
        count = int((now_ms - self._start) // self._frame) + 1 - self._sent
        # Every frame whose deadline has passed is consumed; only the newest are sent.
        self._sent += count
        if count > self._max_catch_up:
            self.dropped += count - self._max_catch_up
            return self._max_catch_up
        return count

    def lateness_ms(self, now_ms: float) -> float:
        """How late a send at now_ms is against the next frame's deadline: call it before due();
        positive when late, negative when the wake-up came early. The send-jitter measure."""
        return now_ms - (self._start + self._sent * self._frame)


class PhasedPacer:
    """`phases` Pacers on one frame grid, each `frame_ms / phases` after the one before.

    One clock for every call, but the calls spread over the phases: a tick sends the packets
    of one phase's calls, a quarter of them with four phases, so the last packet of a tick
    leaves that much sooner after its deadline (one tick for all 200 calls of the load run
    took 5.5 ms, and its last packet was 13-16 ms late at p99). Each call stays on its phase,
    so its own packets are still `frame_ms` apart."""

    __slots__ = ("pacers",)

    def __init__(self, start_ms: float, frame_ms: float = FRAME_MS, phases: int = 4) -> None:
        if phases < 1:
            raise ValueError(f"phases {phases} is below 1")
        step = frame_ms / phases
        self.pacers = [Pacer(start_ms + i * step, frame_ms) for i in range(phases)]

    @property
    def next_deadline_ms(self) -> float:
        return min(pacer.next_deadline_ms for pacer in self.pacers)

    @property
    def dropped(self) -> int:
        return sum(pacer.dropped for pacer in self.pacers)

    def lateness_ms(self, now_ms: float) -> float:
        """How late a send at now_ms is against the earliest deadline (see Pacer)."""
        return now_ms - self.next_deadline_ms

    def due(self, now_ms: float) -> list[tuple[int, int]]:
        """(phase, frames) for each phase with frames due now, in phase order."""
        out = []
        for phase, pacer in enumerate(self.pacers):
            frames = pacer.due(now_ms)
            if frames:
                out.append((phase, frames))
        return out
