"""One SIP call on the listener: its RTP and RTCP sockets (the protocols that hand their
datagrams to the call's media), what the listener knows of it while it lasts (`LiveCall`: the
INVITE or the placed call, the negotiated media, the pipeline, a transfer under way, its phase
of the media clock), and the pipeline's Outbound for it (`SipOutbound`: audio to the RTP
playout, a BYE to close, REFER to transfer, RFC 4733 keys).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from voice_agent.pipeline.driver import CallPipeline
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.sip import uas as sip
from voice_agent.sip.media import RtpSession
from voice_agent.sip.sdp import Negotiated
from voice_agent.sip.transaction import Addr

if TYPE_CHECKING:
    from voice_agent.gateways.sip import SipGateway

log = logging.getLogger("voice_agent.server")

# The agent's goodbye, heard (sent and DEFAULT_HEARD_DELAY_MS later), still plays from the
# phone's jitter buffer (baresip's holds up to 200 ms, more when its machine is busy): the BYE
# goes this much later. At 400 ms baresip's recording lost the last word when the suite ran
# on both cores, and at 700 ms once more (2026-12-02, the whole suite on two workers); a phone
# that is hung up on clips what it still holds, and a second of quiet before the line drops
# is what a caller expects after a goodbye anyway.
BYE_AFTER_LAST_AUDIO_MS = 1000.0


class RtpProtocol(asyncio.DatagramProtocol):
    def __init__(self, call: LiveCall, *, rtcp: bool = False) -> None:
        self.call = call
        self.rtcp = rtcp  # the RTCP port (RTP's + 1)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.rtcp:
            self.call.rtcp_in(data, (addr[0], addr[1]))
        else:
            self.call.rtp_in(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable after the caller left: the next BYE or timer ends the call.
        log.debug("rtp socket error: %s", exc)


@dataclass(eq=False)
class LiveCall:
    gateway: SipGateway
    call_id: str
    incoming: sip.IncomingCall | None  # None: a call the server placed
    peer_host: str  # the caller's signalling host, or the trunk's: RTP is taken from it too
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    negotiated: Negotiated | None = None
    media: RtpSession | None = None
    pipeline: CallPipeline | None = None
    transport: asyncio.DatagramTransport | None = None
    rtcp_transport: asyncio.DatagramTransport | None = None
    port: int | None = None
    # A transfer under way: resolved with None once the caller has gone to the target, else
    # why not; `transfer_accepted` once the far end took the REFER.
    transfer: asyncio.Future[str | None] | None = None
    transfer_to: str = ""
    transfer_accepted: bool = False
    phase: int = 0  # which of the media clock's MEDIA_PHASES sends this call's packets

    @property
    def outbound(self) -> bool:
        return self.incoming is None

    def end(self, reason: str) -> None:
        if self.transfer is not None and not self.transfer.done():
            if self.transfer_accepted:
                # The far end hung up on us after taking the REFER: the caller went over.
                reason = f"transferred to {self.transfer_to}"
                self.transfer.set_result(None)
            else:
                self.transfer.set_result(f"the call ended first ({reason})")
        if not self.ended.done():
            self.ended.set_result(reason)

    def transfer_done(self, error: str | None) -> None:
        if self.transfer is not None and not self.transfer.done():
            self.transfer.set_result(error)

    def rtp_in(self, data: bytes, source: Addr) -> None:
        media = self.media
        if media is None:
            return
        try:
            digit = media.receive(data, source, self.gateway.now_ms())
        except Exception:  # as for SIP datagrams: lose the packet, keep the call
            log.exception("sip call %s: an RTP packet could not be handled", self.call_id)
            return
        if digit is not None and self.pipeline is not None:
            self.pipeline.dtmf(digit)

    def rtcp_in(self, data: bytes, source: Addr) -> None:
        media = self.media
        if media is None:
            return
        try:
            media.receive_rtcp(data, source, self.gateway.now_ms())
        except Exception:  # as for RTP: lose the packet, keep the call
            log.exception("sip call %s: an RTCP packet could not be handled", self.call_id)

    def send_rtcp(self, data: bytes) -> None:
        """Our RTCP to the caller: on the RTP socket under rtcp-mux, else on the RTCP one."""
        media = self.media
        destination = media.rtcp_destination if media is not None else None
        transport = (
            self.transport
            if media is not None and media.negotiated.rtcp_mux
            else self.rtcp_transport
        )
        if destination is not None and transport is not None:
            transport.sendto(data, destination)


class SipOutbound:
    """The pipeline's Outbound for a SIP call: audio and marks to the RTP playout; `clear`
    drops what is not yet sent (nothing queued elsewhere: barge-in is immediate); `close` is a
    BYE. SIP has no event channel: events stay in the audit."""

    def __init__(self, gateway: SipGateway, call: LiveCall, media: RtpSession) -> None:
        self._gateway = gateway
        self._call = call
        self._media = media

    def audio(self, data: bytes) -> None:
        self._media.playout.audio(data)

    def mark(self, name: str) -> None:
        self._media.playout.mark(name)

    def clear(self) -> None:
        self._media.playout.clear()

    def event(self, payload: dict[str, Any]) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        # The last words are still in the phone's jitter buffer when their mark counts as
        # heard, and a BYE makes most phones stop playing at once: it waits a little.
        self._gateway.hang_up(self._call.call_id, reason, after_ms=BYE_AFTER_LAST_AUDIO_MS)

    def send_digits(self, digits: str) -> str | None:
        self._media.send_digits(digits)
        return None

    async def transfer(self, transfer: CallTransfer) -> str | None:
        return await self._gateway.transfer(self._call, transfer)
