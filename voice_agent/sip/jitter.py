"""A receive-side jitter buffer for one incoming G.711 stream (RFC 3550 sections 5.1 and 6.4.1,
appendices A.1 and A.8), sans-I/O: packets pushed as they arrive, one payload popped per 20 ms
tick, the time of each passed in as `now_ms`.

What is covered: reordering by the 16-bit sequence number across its wrap (extended as in
appendix A.1), duplicates and packets too late to play dropped and counted, a lost packet
reported as None once so the caller conceals it, a new stream (another SSRC, or a sequence
jump of more than MAX_JUMP, as after a re-INVITE) starting the buffer afresh once a second
packet confirms it (appendix A.1's probation, shortened to one packet), the delay kept bounded
after a burst, memory bounded under a flood, and the interarrival jitter estimate of A.8.

Not covered: adaptive depth, time-stretching, packet loss concealment (the caller's), and
playout by timestamp: G.711 packets are all 20 ms, so sequence order is playout order, and a
timestamp gap from silence suppression plays as back-to-back audio.

The caller passes only the audio payload type here; telephone events go to dtmf.py first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from voice_agent.sip.rtp import CLOCK_RATE, FRAME_MS

if TYPE_CHECKING:
    from voice_agent.sip.rtp import RtpPacket

# A sequence number further than this from the newest one is another stream, not reordering:
# appendix A.1's MAX_MISORDER, and at 50 packets a second a 2 s gap.
MAX_JUMP = 100
# A new stream's first packet waits this long for a second one to confirm it.
PROBATION_MS = 1000.0
_SAMPLES_PER_MS = CLOCK_RATE / 1000


@dataclass(slots=True)
class JitterStats:
    """Counters of one buffer's life. lost counts sequence numbers skipped unplayed; a packet
    arriving after its turn was skipped is also counted late. A copy of a packet already played
    counts as late, not duplicate: the buffer keeps no record of what it played. concealed
    counts the pops that answered None for a loss, the frames to conceal; lost can also rise on
    a pop that plays audio, when a gap is skipped on rebuffering or by the delay cut."""

    received: int = 0
    duplicates: int = 0
    late: int = 0
    lost: int = 0
    concealed: int = 0
    reordered: int = 0  # arrived after a higher sequence number, in time to play
    dropped: int = 0  # held but never played: overflow, the delay cut, a new stream
    strays: int = 0  # single packets from another stream that nothing confirmed
    resets: int = 0
    underruns: int = 0  # ticks that found the buffer empty while playing
    jitter_ms: float = 0.0  # interarrival jitter (appendix A.8), in milliseconds


def _signed16(value: int) -> int:
    value &= 0xFFFF
    return value - 0x10000 if value >= 0x8000 else value


class JitterBuffer:
    """Holds `depth` packets (60 ms by default) before playout starts, then hands out one
    payload per pop() in sequence order: None while buffering, None once for a missing packet
    when a later one is there (the gap is skipped rather than waited for), None on an underrun
    (playout then waits for `depth` packets again). When more than `max_delay` packets lie
    between the next to play and the newest, as after a network stall, the oldest are dropped
    down to `depth`, so one burst does not keep its delay for the rest of the call. At most
    `max_packets` are held; beyond that the oldest go."""

    __slots__ = (
        "_candidate",
        "_candidate_ms",
        "_depth",
        "_held",
        "_last_arrival_ms",
        "_last_timestamp",
        "_max",
        "_max_delay",
        "_max_packets",
        "_next",
        "_playing",
        "_ssrc",
        "_started",
        "_wait_since_ms",
        "stats",
    )

    def __init__(
        self, *, depth: int = 3, max_packets: int = 50, max_delay: int | None = None
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth {depth} is below 1")
        if max_packets < depth:
            raise ValueError(f"max_packets {max_packets} is below depth {depth}")
        delay = max(10, 2 * depth) if max_delay is None else max_delay
        if delay <= depth:
            raise ValueError(f"max_delay {delay} is not above depth {depth}")
        self._depth = depth
        self._max_packets = max_packets
        self._max_delay = delay
        self.stats = JitterStats()
        # Extended sequence numbers (appendix A.1: cycles counted past the 16-bit wrap) key
        # the held payloads; _next is the one to play, _max the newest received.
        self._held: dict[int, bytes] = {}
        self._ssrc: int | None = None
        self._next = 0
        self._max = 0
        self._playing = False
        self._started = False  # something was played or skipped: older packets are late
        self._wait_since_ms = 0.0
        self._candidate: RtpPacket | None = None
        self._candidate_ms = 0.0
        self._last_timestamp: int | None = None
        self._last_arrival_ms = 0.0

    def __len__(self) -> int:
        return len(self._held)

    @property
    def buffering(self) -> bool:
        return not self._playing

    def push(self, packet: RtpPacket, now_ms: float) -> None:
        """Take one arrived audio packet."""
        self.stats.received += 1
        if packet.ssrc == self._ssrc:
            delta = _signed16(packet.sequence - self._max)
            if -MAX_JUMP <= delta <= MAX_JUMP:
                self._take(self._max + delta, delta, packet, now_ms)
                return
        elif self._ssrc is None:
            self._restart(packet, now_ms)
            return
        self._foreign(packet, now_ms)

    def pop(self, now_ms: float) -> bytes | None:
        """The payload to play this tick, or None (buffering, a loss, an underrun)."""
        held = self._held
        if not self._playing:
            if not held:
                return None
            if len(held) < self._depth and now_ms - self._wait_since_ms < self._depth * FRAME_MS:
                return None
            # Enough held, or the first has waited as long as a full buffer would have: a
            # stream of fewer packets than depth still plays.
            self._playing = True
            if self._started and self._next not in held:
                # Rebuffering after an underrun already covered the missing packets' ticks.
                following = min(held)
                self.stats.lost += following - self._next
                self._next = following
        if self._max - self._next >= self._max_delay:
            self._skip(self._max - self._next + 1 - self._depth)
        payload = held.pop(self._next, None)
        if payload is not None:
            self._next += 1
            self._started = True
            return payload
        if not held:
            self.stats.underruns += 1
            self._playing = False
            return None
        # A loss: one tick of concealment, then on from the next packet held rather than a
        # tick for each missing number, which would add the gap to the delay for good.
        following = min(held)
        self.stats.lost += following - self._next
        self.stats.concealed += 1
        self._next = following
        self._started = True
        return None

    def drain(self) -> list[bytes]:
        """Every payload held, in sequence order, emptying the buffer (for a hang-up)."""
        held = self._held
        payloads = [held[ext] for ext in sorted(held)]
        held.clear()
        if payloads:
            self._next = self._max + 1
            self._started = True
        self._playing = False
        return payloads

    def _take(self, ext: int, delta: int, packet: RtpPacket, now_ms: float) -> None:
        stats = self.stats
        if ext < self._next:
            if self._started:
                stats.late += 1
                return
            self._next = ext  # still buffering: an earlier packet than the first one seen
        held = self._held
        if ext in held:
            stats.duplicates += 1
            return
        if delta > 0:
            self._max = ext
        elif delta < 0:
            stats.reordered += 1
        if not held and not self._playing:
            self._wait_since_ms = now_ms
        held[ext] = packet.payload
        self._jitter(packet.timestamp, now_ms)
        if len(held) > self._max_packets:
            oldest = min(held)
            del held[oldest]
            stats.dropped += 1
            self._next = oldest + 1

    def _foreign(self, packet: RtpPacket, now_ms: float) -> None:
        """A packet that is not of the current stream: a new stream if the one before it was
        of the same new stream and near it in sequence, else held aside as a candidate."""
        candidate = self._candidate
        if (
            candidate is not None
            and candidate.ssrc == packet.ssrc
            and now_ms - self._candidate_ms <= PROBATION_MS
        ):
            delta = _signed16(packet.sequence - candidate.sequence)
            if delta != 0 and -MAX_JUMP <= delta <= MAX_JUMP:
                self._candidate = None
                self._restart(candidate, self._candidate_ms)
                self._take(self._max + delta, delta, packet, now_ms)
                return
        if candidate is not None:
            self.stats.strays += 1
        self._candidate = packet
        self._candidate_ms = now_ms

    def _restart(self, packet: RtpPacket, now_ms: float) -> None:
        stats = self.stats
        if self._ssrc is not None:
            stats.resets += 1
            stats.dropped += len(self._held)
        self._held.clear()
        self._held[packet.sequence] = packet.payload
        self._ssrc = packet.ssrc
        self._next = self._max = packet.sequence
        self._playing = self._started = False
        self._wait_since_ms = now_ms
        self._candidate = None
        self._last_timestamp = None
        self._jitter(packet.timestamp, now_ms)

    def _skip(self, count: int) -> None:
        """Drop the next `count` sequence numbers, held or not, to cut the delay."""
        held = self._held
        stats = self.stats
        start = self._next
        for ext in range(start, start + count):
            if held.pop(ext, None) is None:
                stats.lost += 1
            else:
                stats.dropped += 1
        self._next = start + count
        self._started = True

    def _jitter(self, timestamp: int, now_ms: float) -> None:
        # Appendix A.8: J += (|D| - J) / 16, D the change in transit time between arrivals.
        last = self._last_timestamp
        if last is not None:
            moved = (timestamp - last) & 0xFFFFFFFF
            if moved >= 0x80000000:
                moved -= 0x100000000
            change = abs(now_ms - self._last_arrival_ms - moved / _SAMPLES_PER_MS)
            self.stats.jitter_ms += (change - self.stats.jitter_ms) / 16
        self._last_timestamp = timestamp
        self._last_arrival_ms = now_ms
