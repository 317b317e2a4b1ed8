"""What a call's media counts of the caller's RTP stream, and what the caller reports of ours,
for RTCP (RFC 3550), sans-I/O: the extended highest sequence number, packets lost and the
fraction lost since the last report (Appendix A.1 and A.3), and the round-trip time from the
caller's reports of our sender reports (section 6.4.1). Fed with each RTP packet's SSRC and
sequence number (audio and telephone events: they share the sequence).

Apart from the jitter buffer's counters (voice_agent.sip.jitter) on purpose: its `lost` is
what playout skipped, and a packet that came too late to play is lost there but received
here, as RTCP counts it. The interarrival jitter (A.8) is the buffer's, passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice_agent.sip.rtcp import ReportBlock, RtcpReport, middle_32, ntp_time

MAX_DROPOUT = 3000  # A.1: a jump forward of more than this is a restart
MAX_MISORDER = 100  # ... and one back of less than this a late packet
SEQ_MOD = 1 << 16


@dataclass
class Reception:
    """The caller's stream as received: Appendix A.1's state, without the probation (a call's
    stream is known to start with its first packet: the signalling named it)."""

    clock_rate: int = 8000
    ssrc: int | None = None
    base_seq: int = 0
    max_seq: int = 0
    cycles: int = 0
    bad_seq: int = SEQ_MOD + 1
    received: int = 0
    expected_prior: int = 0
    received_prior: int = 0
    last_sr: int = 0  # middle 32 bits of the caller's last SR's NTP time
    last_sr_at_ms: float | None = None
    # From the caller's reports about our stream:
    remote_fraction_lost: int | None = None
    remote_cumulative_lost: int | None = None
    remote_jitter: int | None = None
    round_trip_ms: float | None = None
    reports: int = 0  # RTCP compound packets read from the caller

    def packet(self, ssrc: int, sequence: int) -> None:
        if self.ssrc != ssrc:
            self._restart(ssrc, sequence)
        else:
            delta = (sequence - self.max_seq) % SEQ_MOD
            if delta < MAX_DROPOUT:
                if sequence < self.max_seq:
                    self.cycles += SEQ_MOD  # wrapped
                self.max_seq = sequence
            elif delta <= SEQ_MOD - MAX_MISORDER:
                if sequence == self.bad_seq:
                    self._restart(ssrc, sequence)  # two in a row: the sender restarted
                else:
                    self.bad_seq = (sequence + 1) % SEQ_MOD
                    return  # a stray jump: not counted
            # else: late or duplicated: counted as received, nothing moves
        self.received += 1

    def _restart(self, ssrc: int, sequence: int) -> None:
        self.ssrc = ssrc
        self.base_seq = sequence
        self.max_seq = sequence
        self.cycles = 0
        self.bad_seq = SEQ_MOD + 1
        self.received = 0
        self.expected_prior = 0
        self.received_prior = 0

    @property
    def extended_max(self) -> int:
        return self.cycles + self.max_seq

    @property
    def expected(self) -> int:
        return self.extended_max - self.base_seq + 1 if self.ssrc is not None else 0

    @property
    def lost(self) -> int:
        return self.expected - self.received

    def block(self, now_ms: float, jitter_ms: float) -> ReportBlock | None:
        """A report block about the caller's stream (None before its first packet), with the
        interarrival jitter measured; starts the next interval of the fraction lost (A.3)."""
        if self.ssrc is None:
            return None
        expected_interval = self.expected - self.expected_prior
        received_interval = self.received - self.received_prior
        self.expected_prior, self.received_prior = self.expected, self.received
        lost_interval = expected_interval - received_interval
        fraction = (
            (lost_interval << 8) // expected_interval
            if expected_interval > 0 and lost_interval > 0
            else 0
        )
        delay = 0
        if self.last_sr_at_ms is not None:
            delay = int((now_ms - self.last_sr_at_ms) / 1000 * 65536)
        return ReportBlock(
            self.ssrc,
            min(fraction, 255),
            self.lost,
            self.extended_max,
            int(jitter_ms * self.clock_rate / 1000),
            self.last_sr,
            delay,
        )

    def report(self, report: RtcpReport, our_ssrc: int, now_ms: float, wall_s: float) -> None:
        """The caller's RTCP: its SR's time for our next LSR, its block about our stream."""
        self.reports += 1
        if report.sender_ntp is not None:
            self.last_sr = middle_32(report.sender_ntp)
            self.last_sr_at_ms = now_ms
        for block in report.blocks:
            if block.ssrc != our_ssrc:
                continue
            self.remote_fraction_lost = block.fraction_lost
            self.remote_cumulative_lost = block.cumulative_lost
            self.remote_jitter = block.jitter
            if block.last_sr:
                # Section 6.4.1: now - LSR - DLSR, in 1/65536 s (a 32-bit clock: wraps).
                rtt = middle_32(ntp_time(wall_s)) - block.last_sr - block.delay_since_last_sr
                rtt &= 0xFFFFFFFF
                if rtt < 1 << 31:
                    self.round_trip_ms = rtt * 1000 / 65536
