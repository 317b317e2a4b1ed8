"""The SIP listener: moves datagrams between its sockets (UDP, and TCP and TLS connections
through gateways/sip_streams.py) and the sans-I/O SIP endpoint (voice_agent.sip.endpoint: the
calls that come in, the calls placed through the trunk, the registrations and the trunk's
probe) and each call's RTP session (voice_agent.sip.media), and runs each confirmed call on
the same call pipeline as /twilio.

One clock paces every call's RTP: each call is on one of four phases of a 20 ms monotonic
deadline grid, 5 ms apart, and a tick of its phase sends it one packet (the agent's audio or
comfort silence) and hands the pipeline one frame of the caller's from the jitter buffer. Four
wake-ups per 20 ms for all calls rather than one per call, each sending a quarter of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.pacing import PhasedPacer
from voice_agent.config import SipSettings, sip_listeners, split_host_port
from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.gateways.rtp_ports import RtpPorts
from voice_agent.gateways.sip_call import LiveCall, RtpProtocol, SipOutbound
from voice_agent.gateways.sip_registrations import (
    RegistrationStates,
    registrations_from,
    trunk_probe,
)
from voice_agent.gateways.sip_routes import failure_reason, refer_target, route_call
from voice_agent.gateways.sip_streams import SipConnections, make_room
from voice_agent.gateways.sip_tls import CHECK_S as TLS_CHECK_S
from voice_agent.gateways.sip_tls import ServerTls
from voice_agent.pipeline.driver import CallPipeline
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.sip import sdes
from voice_agent.sip import uac as outbound
from voice_agent.sip import uas as sip
from voice_agent.sip.auth import Credentials, DigestAuthenticator
from voice_agent.sip.endpoint import Action, CallEvent, SipEndpoint
from voice_agent.sip.guard import parse_networks
from voice_agent.sip.media import FRAME_MS, SAMPLE_RATE, RtpSession
from voice_agent.sip.offer import MediaSecurity
from voice_agent.sip.registration import RegistrationChanged
from voice_agent.sip.session_timer import TimerSettings
from voice_agent.sip.transaction import Addr
from voice_agent.sip.trunk_probe import TrunkReachability

log = logging.getLogger("voice_agent.server")

# The media clock's phases: calls spread over the 20 ms grid in 5 ms steps, so a tick sends a
# quarter of the calls' packets (audio/pacing.py PhasedPacer).
MEDIA_PHASES = 4

StartCall = Callable[..., Awaitable[CallPipeline]]
Admit = Callable[[str], "str | None"]  # where the call comes in -> why it is refused, or None
TRANSPORT = "sip"
SIP_RECEIVE_BUFFER = 4 * 1024 * 1024  # bytes; the kernel caps it at net.core.rmem_max
# How long a transfer may take: the far end calls the target, which may ring a while, before
# the final NOTIFY says how it went.
TRANSFER_WAIT_S = 45.0


class _SignalProtocol(asyncio.DatagramProtocol):
    def __init__(self, gateway: SipGateway) -> None:
        self.gateway = gateway

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.gateway.datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip socket error: %s", exc)


class SipGateway:
    def __init__(
        self,
        settings: SipSettings,
        *,
        listen: str | list[str],
        start_call: StartCall,
        admit: Admit,
        agents: Mapping[str, Any],
        secrets: Mapping[str, str],
        on_refused: Callable[[sip.Refused], None] | None = None,
        on_connection_closed: Callable[[str], None] | None = None,
        on_media_report: Callable[[dict[str, Any]], None] | None = None,
        on_registration: Callable[[RegistrationChanged], None] | None = None,
        on_trunk: Callable[[bool], None] | None = None,
        max_failed_auth_per_minute: int = 10,
    ) -> None:
        self.settings = settings
        try:
            listeners = sip_listeners(listen)
        except ValueError as exc:
            raise ConfigError(str(exc), key="sip.listen") from None
        udp = next((item for item in listeners if item.transport == "udp"), None)
        self._stream_listeners = [item for item in listeners if item.transport != "udp"]
        self._udp = udp is not None
        self.host, self.port = (udp or listeners[0]).host, (udp or listeners[0]).port
        if any(item.transport == "tls" for item in listeners):
            if settings.tls is None:
                raise ConfigError("a tls: address needs sip.tls", key="sip.tls")
            self.tls: ServerTls | None = ServerTls(settings.tls)
        else:
            self.tls = None
        self.stream_ports: dict[str, int] = {}  # "TCP", "TLS": the ports bound, once started
        self.connections: SipConnections | None = None
        self._tls_watch: asyncio.TimerHandle | None = None
        if (settings.trunk is not None or settings.registrations) and udp is None:
            raise ConfigError(
                "placed calls and registrations go over UDP: sip.listen needs a udp address",
                key="sip.listen",
            )
        self._srtp = settings.srtp
        if settings.srtp != "off" and not sdes.available():
            if settings.srtp == "required":
                raise ConfigError(
                    "sip.srtp: required needs pylibsrtp: pip install 'voice_agent[srtp]'",
                    key="sip.srtp",
                )
            log.info("sip: SRTP offers are refused: pylibsrtp is not installed (the srtp extra)")
            self._srtp = "off"
        public = settings.public_address or self.host
        if public in ("0.0.0.0", "::"):
            raise ConfigError(
                f"listening on {self.host} needs sip.public_address: the address callers "
                "reach this server at, for the SDP and Contact",
                key="sip.public_address",
            )
        self.public = public
        self._start_call = start_call
        self._admit = admit
        self._agents = agents
        self._on_refused = on_refused
        self._on_connection_closed = on_connection_closed
        self._on_media_report = on_media_report  # each call's rtp report, as it ends
        self._on_registration = on_registration
        self._on_trunk = on_trunk
        self._secrets = secrets
        self.registrations = RegistrationStates()
        self._max_failures = max_failed_auth_per_minute
        credentials = {}
        for user, secret in settings.credentials.items():
            if secret not in secrets:
                raise ConfigError(
                    f"sip.credentials.{user} names secret {secret!r}, which is not set: "
                    f"voice-agent secrets set {secret}",
                    key=f"sip.credentials.{user}",
                )
            credentials[user] = secrets[secret]
        self._credentials = credentials
        self.trunk = settings.trunk
        self._trunk_credentials: Credentials | None = None
        if self.trunk is not None:
            try:
                self._trunk_addr: Addr = split_host_port(self.trunk.address)
            except ValueError as exc:
                raise ConfigError(str(exc), key="sip.trunk.address") from None
            if self.trunk.username is not None:
                secret = self.trunk.password_secret or ""
                if secret not in secrets:
                    raise ConfigError(
                        f"sip.trunk.password_secret names secret {secret!r}, which is not set:"
                        f" voice-agent secrets set {secret or 'NAME'}",
                        key="sip.trunk.password_secret",
                    )
                self._trunk_credentials = Credentials(self.trunk.username, secrets[secret])
        self._networks = (
            parse_networks(settings.allowed_sources)
            if settings.allowed_sources is not None
            else None
        )
        self.ports = RtpPorts(settings.rtp_port_min, settings.rtp_port_max)
        self.calls: dict[str, LiveCall] = {}
        self.uas: sip.UserAgentServer | None = None
        self.uac: outbound.UserAgentClient | None = None  # calls the server places
        self.endpoint: SipEndpoint | None = None  # both, behind one datagram and one clock
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._pacer: PhasedPacer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.send_lateness_ms: list[float] = []  # the ticks' lateness, for the load report
        self.record_lateness = False

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._udp:
            transport, _ = await self._loop.create_datagram_endpoint(
                lambda: _SignalProtocol(self), local_addr=(self.host, self.port)
            )
            self._transport = transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # Room for a burst (a trunk's OPTIONS and INVITEs at once, a scan): the kernel
                # drops what does not fit while the loop is busy.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SIP_RECEIVE_BUFFER)
            self.port = transport.get_extra_info("sockname")[1]
        if self._stream_listeners:
            make_room(self.settings.max_connections)
            self.connections = SipConnections(
                self.datagram,
                max_connections=self.settings.max_connections,
                in_use=self._carries_a_call,
                on_closed=self._on_connection_closed,
            )
            for listener in self._stream_listeners:
                context = self.tls.context if listener.transport == "tls" and self.tls else None
                bound = await self.connections.listen(listener.host, listener.port, context)
                self.stream_ports[listener.transport.upper()] = bound
            if not self._udp:
                self.port = next(iter(self.stream_ports.values()))
            if self.tls is not None:
                self._tls_watch = self._loop.call_later(TLS_CHECK_S, self._check_tls)
        authenticator = (
            DigestAuthenticator(
                self.settings.realm,
                self._credentials,
                algorithms=tuple(self.settings.digest_algorithms),
            )
            if self._credentials
            else None
        )
        self.uas = sip.UserAgentServer(
            sip.UasSettings(
                host=self.public,
                port=self.port,
                stream_ports=dict(self.stream_ports),
                allowed_sources=self._networks,
                authenticator=authenticator,
                max_auth_failures_per_minute=self._max_failures,
                media_security=MediaSecurity(
                    self._srtp, self.settings.srtp_keys_over_plain_signalling
                ),
                timers=TimerSettings(
                    self.settings.session_expires_s, self.settings.min_session_expires_s
                ),
            )
        )
        if self.trunk is not None:
            self.uac = outbound.UserAgentClient(
                outbound.UacSettings(
                    host=self.public,
                    port=self.port,
                    trunk=self._trunk_addr,
                    ring_timeout_ms=self.trunk.ring_timeout_s * 1000,
                )
            )
        registrations = registrations_from(
            self.settings, self._secrets, host=self.public, port=self.port
        )
        probe = None
        if self.trunk is not None and self.trunk.options_interval_s > 0:
            probe = trunk_probe(self.trunk, self._trunk_addr, host=self.public, port=self.port)
        self.endpoint = SipEndpoint(self.uas, self.uac, registrations, probe)
        self._apply(self.endpoint.register(self.now_ms()))
        where = [f"udp {self.host}:{self.port}"] if self._udp else []
        where += [
            f"{item.transport} {item.host}:{self.stream_ports[item.transport.upper()]}"
            for item in self._stream_listeners
        ]
        log.info("SIP on %s (contact %s)", ", ".join(where), self.public)

    @property
    def open_connections(self) -> int:
        return len(self.connections) if self.connections is not None else 0

    def _check_tls(self) -> None:
        assert self.tls is not None and self._loop is not None
        self.tls.reload_if_changed()
        self._tls_watch = self._loop.call_later(TLS_CHECK_S, self._check_tls)

    def _carries_a_call(self, peer: Addr) -> bool:
        """A live call came over the connection of `peer` (its idle time does not count)."""
        return any(
            call.incoming is not None and call.incoming.source == peer
            for call in self.calls.values()
        )

    def drain(self) -> None:
        """New INVITEs and OPTIONS get 503 from now on, and the registrars are told to send no
        more (Expires: 0); the calls in progress go on."""
        if self.uas is not None:
            self.uas.draining = True
        if self.endpoint is not None:
            self._apply(self.endpoint.unregister(self.now_ms()))

    async def stop(self, reason: str = "server shutting down") -> None:
        if self.endpoint is not None:
            self._apply(self.endpoint.unregister(self.now_ms()))  # unless draining did
        for call_id in list(self.calls):
            self.hang_up(call_id, reason)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._tls_watch is not None:
            self._tls_watch.cancel()
        if self._transport is not None:
            self._transport.close()
        if self.connections is not None:
            self.connections.close()

    def now_ms(self) -> float:
        assert self._loop is not None
        return self._loop.time() * 1000

    # ---- signalling ----------------------------------------------------------------------

    def datagram(self, data: bytes, source: Addr) -> None:
        if self.endpoint is None:
            return
        try:
            actions = self.endpoint.datagram(data, source, self.now_ms())
        except Exception:
            # A bug, not the peer's fault: this datagram is lost, the port and its calls go on.
            log.exception("sip: a datagram from %s:%d could not be handled", *source)
            return
        self._apply(actions)

    def hang_up(self, call_id: str, reason: str, *, after_ms: float = 0) -> None:
        """End the call: BYE (now, or `after_ms` later) and the call's end with `reason`."""
        if self.uas is not None:
            if after_ms > 0 and self._loop is not None:
                self._loop.call_later(after_ms / 1000, self._send_bye, call_id, reason)
            else:
                self._send_bye(call_id, reason)
        call = self.calls.get(call_id)
        if call is not None and call.pipeline is not None:
            # After the BYE (or while its ACK is awaited): the caller hears nothing more.
            call.end(reason)

    def _send_bye(self, call_id: str, reason: str) -> None:
        # A caller's own BYE meanwhile makes this a no-op.
        if self.endpoint is not None:
            self._apply(self.endpoint.hang_up(call_id, self.now_ms(), reason))

    async def transfer(self, call: LiveCall, transfer: CallTransfer) -> str | None:
        """REFER the caller to the destination; None once it has gone there, else why not."""
        assert self.uas is not None
        if call.transfer is not None and not call.transfer.done():
            return "a transfer is already under way"
        target = refer_target(transfer.target, call.peer_host)
        call.transfer = asyncio.get_running_loop().create_future()
        call.transfer_to, call.transfer_accepted = transfer.destination, False
        self._apply(self.uas.transfer(call.call_id, target, self.now_ms()))
        try:
            return await asyncio.wait_for(asyncio.shield(call.transfer), TRANSFER_WAIT_S)
        except TimeoutError:
            if call.transfer_accepted:
                # RFC 5589 section 6.1: the transferor may leave once the REFER is accepted;
                # a far end that sends no final NOTIFY has taken the call over.
                return None
            return f"no answer to the REFER in {TRANSFER_WAIT_S:g} s"

    def _apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, sip.Send):
                connections = self.connections
                if connections is not None and connections.send(action.addr, action.data):
                    pass  # the peer's connection (TCP, TLS)
                elif self._transport is not None:
                    self._transport.sendto(action.data, action.addr)
            elif isinstance(action, sip.Refused):
                self._refused(action)
            elif isinstance(action, sip.IncomingCall):
                self._incoming(action)
            elif isinstance(action, outbound.Ringing):
                log.info("sip call %s: ringing (%d)", action.call_id, action.status)
            elif isinstance(action, outbound.Dialing):
                pass  # _place reads it from dial()'s own actions
            elif isinstance(action, RegistrationChanged):
                self.registrations.changed(action)
                if self._on_registration is not None:
                    self._on_registration(action)
            elif isinstance(action, TrunkReachability):
                self.registrations.trunk(action)
                if self._on_trunk is not None:
                    self._on_trunk(action.reachable)
            else:
                call = self.calls.get(action.call_id)
                if call is not None:
                    self._call_event(call, action)
        self._schedule()

    def _refused(self, action: sip.Refused) -> None:
        log.info(
            "sip %s:%d: %s%s",
            action.addr[0],
            action.addr[1],
            action.reason,
            f" ({action.status})" if action.status else " (dropped)",
        )
        if self._on_refused is not None:
            self._on_refused(action)

    def _incoming(self, action: sip.IncomingCall) -> None:
        new = LiveCall(self, action.call_id, action, action.source[0])
        self.calls[action.call_id] = new
        task = asyncio.ensure_future(self._run(new))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _call_event(self, call: LiveCall, action: CallEvent) -> None:
        """What one of the user agents says of a live call, either way it began."""
        if isinstance(action, sip.CallConfirmed | outbound.Answered):
            call.negotiated = action.negotiated
            call.confirmed.set()
        elif isinstance(action, sip.MediaChanged):
            if call.media is not None:
                call.media.update(action.negotiated)
                log.info(
                    "sip call %s: %s",
                    action.call_id,
                    "on hold" if action.negotiated.on_hold else "media updated",
                )
        elif isinstance(action, sip.DtmfReceived):
            if call.pipeline is not None:
                call.pipeline.dtmf(action.digit)
        elif isinstance(action, sip.CallEnded):
            call.end(action.reason)
        elif isinstance(action, outbound.Failed):
            call.end(failure_reason(action))
        elif isinstance(action, sip.TransferAccepted):
            call.transfer_accepted = True
        elif isinstance(action, sip.TransferProgress):
            if action.final:
                ok = 200 <= action.status < 300
                call.transfer_done(
                    None if ok else f"the target answered {action.status} {action.reason}"
                )
        elif isinstance(action, sip.TransferFailed):
            call.transfer_done(f"the REFER was refused: {action.status} {action.reason}")

    def _schedule(self) -> None:
        assert self.endpoint is not None and self._loop is not None
        deadline = self.endpoint.next_deadline_ms()
        if deadline is None or deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline / 1000, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.endpoint is not None:
            self._apply(self.endpoint.tick(self.now_ms()))

    # ---- calls the server places -----------------------------------------------------------

    def place_call(
        self, *, call_id: str, agent: str, target: str, args: dict[str, Any]
    ) -> asyncio.Task[tuple[str, bool]]:
        """Dial `target` (a SIP URI, or a number the trunk routes) through the trunk; the
        agent starts when the callee answers, as call `call_id`. The task's result is how the
        call ended and whether it was answered (else no pipeline made a record of it)."""
        task = asyncio.ensure_future(self._place(call_id, agent, target, args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _place(
        self, call_id: str, agent: str, target: str, args: dict[str, Any]
    ) -> tuple[str, bool]:
        assert self.uac is not None and self.trunk is not None
        refusal = self._admit(TRANSPORT)
        if refusal is not None:
            return f"call failed: {refusal}", False
        try:
            sock, rtcp_sock = self.ports.bind(self.host)
        except VoiceAgentError as exc:
            return f"call failed: {exc}", False
        port = sock.getsockname()[1]
        host = f"[{self.public}]" if ":" in self.public else self.public
        actions = self.uac.dial(
            call_id,
            refer_target(target, self._trunk_addr[0]),
            f"sip:{self.trunk.caller_id}@{host}",
            self.public,
            port,
            self.now_ms(),
            self._trunk_credentials,
        )
        dialing = next(a for a in actions if isinstance(a, outbound.Dialing))
        call = LiveCall(self, dialing.call_id, None, self._trunk_addr[0], port=port)
        self.calls[call.call_id] = call
        reason = "call failed: not answered"
        try:
            assert self._loop is not None
            call.transport, call.rtcp_transport = await self._rtp_endpoints(call, sock, rtcp_sock)
            self._apply(actions)
            confirmed = asyncio.ensure_future(call.confirmed.wait())
            await _first(confirmed, call.ended)
            confirmed.cancel()
            if call.ended.done():
                reason = call.ended.result()
                return reason, False
            callee = {"callee": target, "caller": self.trunk.caller_id}
            reason = await self._converse(call, agent, {**callee, **args}, call_id)
            return reason, True
        finally:
            await self._finish(call, reason)

    # ---- one call ------------------------------------------------------------------------

    async def _run(self, call: LiveCall) -> None:
        assert self.uas is not None and self._loop is not None
        reason = "caller hung up"
        try:
            refusal = self._admit(TRANSPORT)
            assert call.incoming is not None  # _run takes the calls that came in
            route = route_call(call.incoming.invite, self.settings, self._agents)
            if refusal is not None:
                self._apply(self.uas.reject(call.call_id, 503, self.now_ms(), refusal))
                return
            if route is None:
                self._apply(self.uas.reject(call.call_id, 404, self.now_ms(), "no such agent"))
                return
            try:
                sock, rtcp_sock = self.ports.bind(self.host)
            except VoiceAgentError as exc:
                self._apply(self.uas.reject(call.call_id, 503, self.now_ms(), str(exc)))
                return
            call.port = sock.getsockname()[1]
            call.transport, call.rtcp_transport = await self._rtp_endpoints(call, sock, rtcp_sock)
            if self.settings.answer_after_ms > 0:
                self._apply(self.uas.ringing(call.call_id))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.shield(call.ended), self.settings.answer_after_ms / 1000
                    )
                if call.ended.done():
                    reason = call.ended.result()
                    return
            self._apply(self.uas.accept(call.call_id, self.public, call.port, self.now_ms()))
            confirmed = asyncio.ensure_future(call.confirmed.wait())
            await _first(confirmed, call.ended)
            confirmed.cancel()
            if call.ended.done():
                reason = call.ended.result()
                return
            reason = await self._converse(call, route.agent, route.args, None)
        finally:
            await self._finish(call, reason)

    async def _rtp_endpoints(
        self, call: LiveCall, sock: socket.socket, rtcp_sock: socket.socket
    ) -> tuple[asyncio.DatagramTransport, asyncio.DatagramTransport]:
        assert self._loop is not None
        rtp, _ = await self._loop.create_datagram_endpoint(lambda: RtpProtocol(call), sock=sock)
        rtcp, _ = await self._loop.create_datagram_endpoint(
            lambda: RtpProtocol(call, rtcp=True), sock=rtcp_sock
        )
        return rtp, rtcp

    async def _converse(
        self, call: LiveCall, agent: str | None, args: dict[str, Any], call_id: str | None
    ) -> str:
        """The call, once its media is agreed: RTP and the agent until either side ends it;
        why it ended."""
        assert call.negotiated is not None  # CallConfirmed or Answered carries it
        call.media = RtpSession(
            call.negotiated,
            signalling_host=call.peer_host,
            heard_delay_ms=self.settings.heard_delay_ms,
            wall_offset_s=time.time() - self.now_ms() / 1000,
        )
        carrier = CarrierFormat(call.media.encoding, SAMPLE_RATE)
        outbound = SipOutbound(self, call, call.media)
        try:
            call.pipeline = await self._start_call(
                transport=TRANSPORT,
                agent=agent,
                args=args,
                call_id=call_id,
                carrier=carrier,
                out=outbound,
                placed=call.outbound,
                control=outbound,
            )
        except VoiceAgentError as exc:
            reason = f"call could not start: {exc}"
            self.hang_up(call.call_id, reason)
            return reason
        party = args.get("callee" if call.outbound else "caller", "?")
        log.info(
            "sip call %s %s %s is call %s",
            call.call_id,
            "to" if call.outbound else "from",
            party,
            call.pipeline.session.call_id,
        )
        # The record names the SIP dialog too, so a trace or a carrier's CDR finds its call.
        call.pipeline.session.audit.add(
            "sip",
            call_id=call.call_id,
            direction="outbound" if call.outbound else "inbound",
            party=party,
            peer=call.peer_host,
            codec=call.negotiated.codec.name,
        )
        call.phase = self._quietest_phase()
        self._start_ticker()
        await call.pipeline.start()
        finished = asyncio.ensure_future(call.pipeline.finished.wait())
        await _first(finished, call.ended)
        finished.cancel()
        if call.ended.done():
            return call.ended.result()
        self.hang_up(call.call_id, "call ended")
        return "call ended"

    async def _finish(self, call: LiveCall, reason: str) -> None:
        if call.pipeline is not None:
            if call.media is not None:
                goodbye = call.media.rtcp_goodbye(self.now_ms())
                if goodbye is not None:
                    call.send_rtcp(goodbye)
                # What the line carried, in the call's audit: packets, losses, strays.
                report = call.media.report()
                call.pipeline.session.audit.add("rtp", **report)
                if self._on_media_report is not None:
                    self._on_media_report(report)
            await call.pipeline.hang_up(reason)
        if call.transport is not None:
            call.transport.close()
        if call.rtcp_transport is not None:
            call.rtcp_transport.close()
        if call.port is not None:
            self.ports.release(call.port)
        self.calls.pop(call.call_id, None)

    # ---- the media clock -----------------------------------------------------------------

    def _quietest_phase(self) -> int:
        """The media phase with the fewest calls on it (calls spread over the 20 ms grid)."""
        counts = [0] * MEDIA_PHASES
        for other in self.calls.values():
            if other.media is not None:
                counts[other.phase] += 1
        return counts.index(min(counts))

    def _start_ticker(self) -> None:
        if self._ticker is None:
            self._pacer = PhasedPacer(self.now_ms(), FRAME_MS, MEDIA_PHASES)
            self._tick_media()

    def _tick_media(self) -> None:
        assert self._loop is not None and self._pacer is not None
        now = self.now_ms()
        if self.record_lateness:
            self.send_lateness_ms.append(self._pacer.lateness_ms(now))
        for phase, frames in self._pacer.due(now):
            active = [c for c in self.calls.values() if c.phase == phase and c.media and c.pipeline]
            for _ in range(frames):
                for call in active:
                    self._media_frame(call, now)
        if not self.calls:
            self._ticker = None
            return
        self._ticker = self._loop.call_at(self._pacer.next_deadline_ms / 1000, self._tick_media)

    def _media_frame(self, call: LiveCall, now_ms: float) -> None:
        media, pipeline = call.media, call.pipeline
        assert media is not None and pipeline is not None
        if pipeline.ended:
            return
        try:
            inbound = media.heard_audio(now_ms)
            if inbound is not None:
                pipeline.audio(inbound)
            packet, heard = media.next_packet(now_ms)
            destination = media.destination
            if packet is not None and destination is not None and call.transport is not None:
                call.transport.sendto(packet, destination)
            for name in heard:
                pipeline.mark(name)
            report = media.next_rtcp(now_ms)
            if report is not None:
                call.send_rtcp(report)
            timeout_s = self.settings.media_timeout_s
            if timeout_s and not media.on_hold and media.silent_for_ms(now_ms) >= timeout_s * 1000:
                # The caller's phone or network is gone without a BYE: nothing would end it.
                self.hang_up(call.call_id, f"media timeout: no RTP or RTCP for {timeout_s:g} s")
        except Exception as exc:  # one call's failure must not stop every call's clock
            log.exception("sip call %s: media tick failed", call.call_id)
            self.hang_up(call.call_id, f"media failed: {type(exc).__name__}")


async def _first(*futures: asyncio.Future[Any]) -> None:
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
