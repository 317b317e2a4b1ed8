"""One SIP call's RTP, sans-I/O: datagrams in (audio to a jitter buffer, telephone events to
digits), one 20 ms packet out per tick from the agent's playout (comfort silence when it is
quiet), and where to send them. RFC 3550/3551 for G.711, RFC 4733 for DTMF.

Where packets go (symmetric RTP, RFC 4961): to the address the caller's packets come from once
they come, else to the SDP's. Packets are taken only from the caller's signalling host or the
SDP's connection host; RTP from anywhere else is dropped and counted, so a stranger who guesses
the port cannot talk into the call ("RTP bleed"). The hosts, not the ports: a NAT may map the
caller's media to another port than it wrote.

Hold (RFC 3264 section 8.4): while the caller has us on hold (sendonly, inactive, c=0.0.0.0)
nothing is sent and the agent's audio waits in the playout, to go on when the call resumes.

A re-INVITE that moves the call to the other G.711 law (PCMU to PCMA or back) is taken: the
pipeline keeps the law the call started in (its carrier format is set at the start), and the
wire gets the new one, code by code through a 256-byte table both ways, under the new payload
type on the same RTP stream.

SRTP (RFC 3711), when the offer and answer set keys (voice_agent.sip.sdes): every packet out is
protected and every packet in unprotected before it is read; one that fails its check (forged,
replayed, or plain RTP on an SRTP call) is dropped and counted, and the call goes on.

RTCP (RFC 3550 section 6; voice_agent.sip.rtcp_session): the caller's reports read, from the
RTCP port (RTP's + 1) or the RTP port itself (RFC 5761's rtcp-mux, or a peer that sends them
there anyway: told apart by packet type), through SRTCP on an SRTP call; ours sent every 5 s
or so to where the caller's come from, else to its SDP's RTCP port. `silent_for_ms` is how
long neither RTP nor RTCP has come, for the gateway's `sip.media_timeout_s`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.g711 import alaw_to_ulaw, ulaw_to_alaw
from voice_agent.audio.playout import RtpPlayout
from voice_agent.sip.dtmf import DtmfReceiver, tone_pcm
from voice_agent.sip.jitter import JitterBuffer
from voice_agent.sip.rtcp import is_rtcp
from voice_agent.sip.rtcp_session import RtcpSession
from voice_agent.sip.rtp import RtpError, RtpSender, parse_rtp
from voice_agent.sip.sdes import SrtpDropped, SrtpTransform
from voice_agent.sip.sdp import Negotiated
from voice_agent.sip.transaction import Addr

SAMPLE_RATE = 8000
FRAME_MS = 20
# G.711's code for a zero sample (ITU-T G.711 tables): mu-law 0xFF, A-law 0xD5.
SILENCE = {"PCMU": 0xFF, "PCMA": 0xD5}
ENCODINGS: dict[str, Literal["mulaw", "alaw"]] = {"PCMU": "mulaw", "PCMA": "alaw"}
# Audio sent is heard this much later: the network plus the caller's jitter buffer.
DEFAULT_HEARD_DELAY_MS = 60.0
# Keys sent: each 100 ms long, then 100 ms of silence (an IVR needs a gap to tell two presses
# of one key apart; Q.24 asks for 40 ms or more of each).
KEY_MS = 100
KEY_GAP_FRAMES = 5
RTP_HEADER_BYTES = 12  # ours carry no CSRC list and no extension


@dataclass(slots=True)
class MediaStats:
    received: int = 0
    sent: int = 0
    unreadable: int = 0  # neither RTP nor RTCP
    foreign: int = 0  # from a host that is not the caller's
    other_payload: int = 0  # a payload type the answer did not name
    digits: int = 0
    srtp_replayed: int = 0  # SRTP packets dropped as replays
    srtp_unauthentic: int = 0  # SRTP packets dropped as forged, corrupted or not SRTP


class RtpSession:
    def __init__(
        self,
        negotiated: Negotiated,
        *,
        signalling_host: str,
        heard_delay_ms: float = DEFAULT_HEARD_DELAY_MS,
        wall_offset_s: float = 0.0,  # wall-clock time at now_ms 0, for RTCP's NTP times
    ) -> None:
        self.negotiated = negotiated
        name = negotiated.codec.name
        self.encoding = ENCODINGS[name]
        self.playout = RtpPlayout(
            SAMPLE_RATE, FRAME_MS, 1, silence=SILENCE[name], delay_ms=heard_delay_ms
        )
        self.sender = RtpSender(negotiated.codec.payload_type)
        self.jitter = JitterBuffer()
        self.dtmf = DtmfReceiver()
        self.stats = MediaStats()
        self._signalling_host = signalling_host
        self._latched: Addr | None = None
        self._frame_bytes = SAMPLE_RATE * FRAME_MS // 1000
        self._silence = bytes([SILENCE[name]]) * self._frame_bytes
        self._owed = 0  # bytes of the caller's audio due to the pipeline and not yet given
        self._heard_any = False
        self._carrier = CarrierFormat(self.encoding, SAMPLE_RATE)
        self._keys: deque[str] = deque()  # keys to send, after the one under way
        self._key_packets: deque[bytes | None] = deque()  # this key's packets; None: silence
        self.srtp = SrtpTransform(negotiated.srtp) if negotiated.srtp is not None else None
        ssrc = self.sender.ssrc
        self.rtcp = RtcpSession(ssrc, f"{ssrc:08x}@voice-agent", wall_offset_s=wall_offset_s)
        self._rtcp_latched: Addr | None = None  # where the caller's RTCP comes from
        self._octets = 0  # payload bytes sent, for our sender reports
        self._heard_ms: float | None = None  # the caller's last RTP or RTCP
        self._quiet_since_ms: float | None = None
        # While the wire's law is not the pipeline's: the pipeline's codes to the wire's, and
        # back (None: the same law).
        self._to_wire: Callable[[bytes], bytes] | None = None
        self._from_wire: Callable[[bytes], bytes] | None = None

    @property
    def on_hold(self) -> bool:
        return self.negotiated.on_hold

    @property
    def destination(self) -> Addr | None:
        """Where our packets go; None while nothing is to be sent (hold, or port 0)."""
        if self.on_hold:
            return None
        if self._latched is not None:
            return self._latched
        if self.negotiated.remote_port == 0:
            return None
        return (self.negotiated.remote_address, self.negotiated.remote_port)

    def update(self, negotiated: Negotiated) -> None:
        """A re-INVITE settled new media: hold, resume, another address, the other G.711 law
        (sent and read in it from the next packet; the pipeline keeps its own)."""
        if negotiated.codec != self.negotiated.codec:
            self.sender.use_payload_type(negotiated.codec.payload_type)
            wire = ENCODINGS[negotiated.codec.name]
            if wire == self.encoding:
                self._to_wire = self._from_wire = None
            elif wire == "alaw":
                self._to_wire, self._from_wire = ulaw_to_alaw, alaw_to_ulaw
            else:
                self._to_wire, self._from_wire = alaw_to_ulaw, ulaw_to_alaw
        if negotiated.remote_address != self.negotiated.remote_address:
            self._latched = None
            self._rtcp_latched = None
        if negotiated.srtp != self.negotiated.srtp:
            # New keys in the new offer and answer (RFC 4568 section 7.1.4): both ends switch.
            self.srtp = SrtpTransform(negotiated.srtp) if negotiated.srtp is not None else None
        self.negotiated = negotiated

    def receive(self, data: bytes, source: Addr, now_ms: float) -> str | None:
        """A datagram on the call's port; returns a key the caller pressed, if it is one."""
        if not self._trusted(source):
            return None
        if is_rtcp(data):
            self._rtcp_in(data, now_ms)
            return None
        if self.srtp is not None:
            try:
                data = self.srtp.unprotect(data)
            except SrtpDropped as dropped:
                # Counted here, not in the transform: a re-key replaces it, the count goes on.
                if dropped.replay:
                    self.stats.srtp_replayed += 1
                else:
                    self.stats.srtp_unauthentic += 1
                return None
        try:
            packet = parse_rtp(data)
        except RtpError:
            self.stats.unreadable += 1
            return None
        payload_type = packet.payload_type
        event = self.negotiated.telephone_event
        if payload_type == self.negotiated.codec.payload_type:
            self._from(source, packet.ssrc, packet.sequence, now_ms)
            if self._from_wire is not None:
                packet.payload = self._from_wire(packet.payload)
            self.jitter.push(packet, now_ms)
            return None
        if event is not None and payload_type == event.payload_type:
            self._from(source, packet.ssrc, packet.sequence, now_ms)
            digit = self.dtmf.feed(packet)
            if digit is not None:
                self.stats.digits += 1
            return digit
        self.stats.other_payload += 1
        return None

    def _from(self, source: Addr, ssrc: int, sequence: int, now_ms: float) -> None:
        # Only a packet of the answer's payload types moves where ours go: stray bytes that
        # happen to read as RTP do not.
        self.stats.received += 1
        self._latched = source
        self._heard_ms = now_ms
        self.rtcp.rtp(ssrc, sequence)

    def _trusted(self, source: Addr) -> bool:
        host = source[0]
        if host != self._signalling_host and host != self.negotiated.remote_address:
            self.stats.foreign += 1
            return False
        return True

    def receive_rtcp(self, data: bytes, source: Addr, now_ms: float) -> None:
        """A datagram on the call's RTCP port (RTP's + 1)."""
        if self._trusted(source) and self._rtcp_in(data, now_ms):
            self._rtcp_latched = source

    def _rtcp_in(self, data: bytes, now_ms: float) -> bool:
        if self.srtp is not None:
            try:
                data = self.srtp.unprotect_rtcp(data)
            except SrtpDropped:
                self.rtcp.stats.unreadable += 1
                return False
        if not self.rtcp.receive(data, now_ms):
            return False
        self._heard_ms = now_ms
        return True

    @property
    def rtcp_destination(self) -> Addr | None:
        """Where our RTCP goes: where the caller's comes from, else its SDP's RTCP port (the
        RTP destination under rtcp-mux); None without an address (port 0, c=0.0.0.0). Sent on
        hold too: RTCP is what says the call is alive meanwhile."""
        negotiated = self.negotiated
        if negotiated.remote_port == 0 or negotiated.remote_address == "0.0.0.0":
            return None
        if negotiated.rtcp_mux:
            return self._latched or (negotiated.remote_address, negotiated.remote_port)
        return self._rtcp_latched or (negotiated.remote_address, negotiated.rtcp_port)

    def next_rtcp(self, now_ms: float) -> bytes | None:
        """Our report, when one is due (send it to `rtcp_destination`)."""
        if not self.rtcp.due(now_ms) or self.rtcp_destination is None:
            return None
        sent = self.stats.sent
        sender = (self.sender.timestamp, sent, self._octets) if sent else None
        report = self.rtcp.report(now_ms, sender=sender, jitter_ms=self.jitter.stats.jitter_ms)
        return self.srtp.protect_rtcp(report) if self.srtp is not None else report

    def rtcp_goodbye(self, now_ms: float) -> bytes | None:
        """Our last report with a BYE, as the call ends (None if there is nowhere to send)."""
        if self.rtcp_destination is None:
            return None
        report = self.rtcp.goodbye(now_ms, jitter_ms=self.jitter.stats.jitter_ms)
        return self.srtp.protect_rtcp(report) if self.srtp is not None else report

    def silent_for_ms(self, now_ms: float) -> float:
        """How long neither RTP nor RTCP has come from the caller (since the first ask)."""
        if self._quiet_since_ms is None:
            self._quiet_since_ms = now_ms
        heard = self._heard_ms if self._heard_ms is not None else self._quiet_since_ms
        return now_ms - max(heard, self._quiet_since_ms)

    def heard_audio(self, now_ms: float) -> bytes | None:
        """The caller's next 20 ms for the pipeline, once per tick; None until the first packet.

        The pipeline keeps time by the audio it gets, so every tick after the first packet
        gives 20 ms: packets from the jitter buffer (one of 30 ms covers a tick and a half, so
        any packet time works), and silence for a lost packet or while nothing comes (a phone
        that suppresses silence sends nothing while the caller is quiet, and a turn ends on
        silence).
        """
        self._owed += self._frame_bytes
        if self._owed <= 0:
            return None  # the last long packet covered this tick too
        out = b""
        while self._owed > 0:
            payload = self.jitter.pop(now_ms)
            if payload is None:
                break
            out += payload
            self._owed -= len(payload)
        if out:
            self._heard_any = True
            return out
        if not self._heard_any:
            self._owed = 0
            return None
        filler, self._owed = self._silence[: self._owed], 0
        return filler

    def send_digits(self, digits: str) -> None:
        """Queue keypad presses for the far end: RFC 4733 events when the call negotiated
        telephone-event, else the tones in the audio. They go out in place of the agent's
        audio, which waits meanwhile."""
        self._keys.extend(digits)

    @property
    def sending_digits(self) -> bool:
        return bool(self._keys or self._key_packets)

    def _key_packet(self) -> bytes | None:
        if not self._key_packets and self._keys:
            digit = self._keys.popleft()
            event = self.negotiated.telephone_event
            packets: list[bytes | None]
            if event is not None:
                packets = list(
                    self.sender.event_packets(digit, event.payload_type, duration_ms=KEY_MS)
                )
            else:
                tone = self._carrier.encode(tone_pcm(digit, KEY_MS))
                frames = range(0, len(tone), self._frame_bytes)
                packets = [self._audio(tone[i : i + self._frame_bytes]) for i in frames]
            self._key_packets.extend([*packets, *[None] * KEY_GAP_FRAMES])
        packet = self._key_packets.popleft()
        return packet if packet is not None else self._audio(self._silence)

    def _audio(self, frame: bytes, *, marker: bool = False) -> bytes:
        """An audio packet of the pipeline's codes, in the wire's law."""
        if self._to_wire is not None:
            frame = self._to_wire(frame)
        return self.sender.packet(frame, marker=marker)

    def next_packet(self, now_ms: float) -> tuple[bytes | None, list[str]]:
        """The packet to send this tick (None on hold) and the marks now heard."""
        if self.on_hold:
            return None, []
        if self.sending_digits:
            self.stats.sent += 1
            return self._sealed(self._key_packet()), []
        frame, heard = self.playout.next_frame(now_ms)
        self.stats.sent += 1
        return self._sealed(self._audio(frame, marker=self.stats.sent == 1)), heard

    def report(self) -> dict[str, Any]:
        """The call's media as it ends, for its `rtp` audit entry: what came and went, and what
        was dropped and why. The SRTP suite, never its keys."""
        jitter = self.jitter.stats
        stats = self.stats
        return {
            "codec": self.negotiated.codec.name,
            "received": stats.received,
            "sent": stats.sent,
            "lost": jitter.lost,
            "late": jitter.late,
            "underruns": jitter.underruns,
            "foreign": stats.foreign,
            "unreadable": stats.unreadable,
            "other_payload": stats.other_payload,
            "digits": stats.digits,
            "jitter_ms": round(jitter.jitter_ms, 1),
            "srtp": self.negotiated.srtp.suite if self.negotiated.srtp else None,
            "srtp_replayed": stats.srtp_replayed,
            "srtp_unauthentic": stats.srtp_unauthentic,
            **self.rtcp.summary(),
        }

    def _sealed(self, packet: bytes | None) -> bytes | None:
        if packet:
            self._octets += len(packet) - RTP_HEADER_BYTES  # the payload, for our SR
        return self.srtp.protect(packet) if self.srtp is not None and packet else packet
