"""One call's RTCP (RFC 3550 section 6), sans-I/O: when our next report is due, what it says,
and what the caller's reports said. voice_agent.sip.media feeds it the caller's RTP packets
and RTCP datagrams and asks it for a report each tick; the gateway sends what it returns to
the caller's RTCP port (or the RTP port under rtcp-mux, RFC 5761).

The interval: section 6.2's minimum of 5 s, each one drawn from 0.5 to 1.5 times it (6.3.1,
so that calls started together do not report together), the first after half of it (6.2's
initial interval). With two participants and G.711's 64 kbit/s, section 6.2's 5% bandwidth
rule gives far less than 5 s, so the minimum is what applies.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from voice_agent.sip.rtcp import (
    RtcpError,
    SenderInfo,
    build_bye,
    build_report,
    is_rtcp,
    ntp_time,
    parse_rtcp,
)
from voice_agent.sip.rtp_reception import Reception

MIN_INTERVAL_MS = 5000.0


@dataclass(slots=True)
class RtcpStats:
    received: int = 0
    sent: int = 0
    unreadable: int = 0  # not RTCP, or failing SRTCP's check


class RtcpSession:
    def __init__(
        self,
        ssrc: int,
        cname: str,
        *,
        wall_offset_s: float = 0.0,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.ssrc = ssrc
        self.cname = cname
        self.reception = Reception()
        self.stats = RtcpStats()
        self._wall_offset_s = wall_offset_s  # wall time = now_ms / 1000 + this
        self._draw = draw  # 0..1, for the interval's spread
        self._due_ms: float | None = None

    def wall_s(self, now_ms: float) -> float:
        return now_ms / 1000 + self._wall_offset_s

    def rtp(self, ssrc: int, sequence: int) -> None:
        """One of the caller's RTP packets (audio or telephone event), as it came."""
        self.reception.packet(ssrc, sequence)

    def receive(self, data: bytes, now_ms: float) -> bool:
        """The caller's RTCP, already through SRTCP if the call has keys; False (counted) for
        one that does not read."""
        try:
            if not is_rtcp(data):
                raise RtcpError("not an RTCP packet type")
            report = parse_rtcp(data)
        except RtcpError:
            self.stats.unreadable += 1
            return False
        self.stats.received += 1
        self.reception.report(report, self.ssrc, now_ms, self.wall_s(now_ms))
        return True

    def due(self, now_ms: float) -> bool:
        """Whether our next report is to go now (the first call starts the schedule)."""
        if self._due_ms is None:
            self._due_ms = now_ms + MIN_INTERVAL_MS / 2
        return now_ms >= self._due_ms

    def report(
        self, now_ms: float, *, sender: tuple[int, int, int] | None, jitter_ms: float
    ) -> bytes:
        """Our compound report now: an SR when we have sent (`sender`: the RTP timestamp of
        now, packets and payload octets sent), else an RR; schedules the next."""
        self._due_ms = now_ms + MIN_INTERVAL_MS * (0.5 + self._draw())
        self.stats.sent += 1
        info = None
        if sender is not None:
            timestamp, packets, octets = sender
            info = SenderInfo(ntp_time(self.wall_s(now_ms)), timestamp, packets, octets)
        block = self.reception.block(now_ms, jitter_ms)
        return build_report(
            self.ssrc, self.cname, sender=info, blocks=[block] if block is not None else []
        )

    def goodbye(self, now_ms: float, *, jitter_ms: float) -> bytes:
        """Our last report and a BYE (section 6.6), as the call ends."""
        self.stats.sent += 1
        block = self.reception.block(now_ms, jitter_ms)
        blocks = [block] if block is not None else []
        return build_report(self.ssrc, self.cname, sender=None, blocks=blocks) + build_bye(
            self.ssrc
        )

    def summary(self) -> dict[str, Any]:
        """For the call's `rtp` audit entry: the reports both ways and what the caller's said
        of our stream (its loss and jitter as it received us, and the round trip)."""
        reception = self.reception
        return {
            # The caller's stream as RTCP counts it (a packet too late to play is received).
            "stream_expected": reception.expected,
            "stream_lost": reception.lost,
            "rtcp_received": self.stats.received,
            "rtcp_sent": self.stats.sent,
            "rtcp_unreadable": self.stats.unreadable,
            "caller_reported_lost": reception.remote_cumulative_lost,
            "caller_reported_fraction_lost": (
                round(reception.remote_fraction_lost / 256, 4)
                if reception.remote_fraction_lost is not None
                else None
            ),
            "caller_reported_jitter_ms": (
                round(reception.remote_jitter / 8, 1)  # 8 kHz timestamp units
                if reception.remote_jitter is not None
                else None
            ),
            "round_trip_ms": (
                round(reception.round_trip_ms, 1) if reception.round_trip_ms is not None else None
            ),
        }
