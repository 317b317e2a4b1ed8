"""The WebRTC endpoint: aiortc peer connections feeding the same call pipeline as /twilio and /ws.

Signalling is one WebSocket per call at `/rtc` (the offer in, the answer out, `end` and errors);
it also is the call's lifeline: when it closes, the call ends. Opus is decoded and resampled by
aiortc and PyAV into 16 kHz PCM for the pipeline; the agent's audio goes out through a track
that paces 20 ms frames from `RtpPlayout`, which also decides when a mark has been heard.
The protocol logic is in voice_agent.transports.webrtc; this module only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from voice_agent.audio.codec import CarrierFormat
from voice_agent.config import WebRtcSettings
from voice_agent.errors import VoiceAgentError
from voice_agent.pipeline.driver import CallPipeline
from voice_agent.transports import webrtc
from voice_agent.transports.errors import (
    POLICY_VIOLATION,
    PROTOCOL_ERROR,
    ProtocolError,
    ProtocolWarning,
    close_reason,
)

try:
    import av
    from aiortc import (
        MediaStreamTrack,
        RTCConfiguration,
        RTCDataChannel,
        RTCIceServer,
        RTCPeerConnection,
        RTCSessionDescription,
    )
    from aiortc.mediastreams import MediaStreamError

    from voice_agent.gateways.webrtc_opus import OpusVoice

    AVAILABLE = True
except ImportError:  # the `webrtc` extra is not installed
    AVAILABLE = False

log = logging.getLogger("voice_agent.server")

# The pipeline's carrier for WebRTC calls: wideband, a rate webrtcvad takes as it is.
CARRIER = CarrierFormat("pcm16", 16000)
FRAME_SAMPLES = CARRIER.sample_rate // 50
OFFER_TIMEOUT_S = 10.0
MAX_QUEUED_EVENTS = 500  # events waiting for the data channel to open

StartCall = Callable[..., Awaitable[CallPipeline]]


class RtcOutbound:
    """The pipeline's Outbound for one WebRTC call: audio and marks to the playout, events to
    the data channel (held until it opens), close to the signalling socket."""

    def __init__(self, ws: ServerConnection, playout: webrtc.RtpPlayout) -> None:
        self._ws = ws
        self.playout = playout
        self._channel: RTCDataChannel | None = None
        self._held: list[str] = []
        self.close_with: tuple[int, str] | None = None
        self.closing = asyncio.Event()

    def attach(self, channel: RTCDataChannel) -> None:
        self._channel = channel

        @channel.on("open")
        def _flush() -> None:
            held, self._held = self._held, []
            for message in held:
                channel.send(message)

        if channel.readyState == "open":
            _flush()

    def audio(self, data: bytes) -> None:
        self.playout.audio(data)

    def mark(self, name: str) -> None:
        self.playout.mark(name)

    def clear(self) -> None:
        self.playout.clear()

    def event(self, payload: dict[str, Any]) -> None:
        message = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(message)
        elif len(self._held) < MAX_QUEUED_EVENTS:
            self._held.append(message)

    def close(self, code: int, reason: str) -> None:
        if self.close_with is None:
            self.close_with = (code, reason)
            self.closing.set()


if AVAILABLE:

    class AgentAudioTrack(MediaStreamTrack):
        """The agent's voice: one 20 ms Opus packet per tick, silence when it has nothing to say."""

        kind = "audio"

        def __init__(self, playout: webrtc.RtpPlayout, on_heard: Callable[[str], None]) -> None:
            super().__init__()
            self._playout = playout
            self._on_heard = on_heard
            self._start: float | None = None
            self._pts = 0
            self.voice = OpusVoice(CARRIER.sample_rate)

        async def recv(self) -> av.Packet:
            if self.readyState != "live":
                raise MediaStreamError
            loop = asyncio.get_running_loop()
            if self._start is None:
                self._start = loop.time()
            else:
                self._pts += FRAME_SAMPLES
                delay = self._start + self._pts / CARRIER.sample_rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            speech = self._playout.pending_ms > 0
            data, heard = self._playout.next_frame(loop.time() * 1000)
            for name in heard:
                self._on_heard(name)
            # Encoded here, not by aiortc: voice_agent.gateways.webrtc_opus says why.
            return self.voice.packet(data, self._pts, speech=speech)


class RtcGateway:
    """Runs the WebRTC calls; `peers` holds every live peer connection (none leak)."""

    def __init__(self, start_call: StartCall, settings: WebRtcSettings) -> None:
        self._start_call = start_call
        self.settings = settings
        self.peers: set[Any] = set()

    def ice_servers(self) -> list[dict[str, Any]]:
        return [server.model_dump(exclude_none=True) for server in self.settings.ice_servers]

    async def endpoint(self, ws: ServerConnection) -> None:
        try:
            if not AVAILABLE:
                raise ProtocolError(
                    POLICY_VIOLATION,
                    "this server was installed without WebRTC: pip install 'voice_agent[webrtc]'",
                    kind="webrtc_unavailable",
                )
            try:
                first = await asyncio.wait_for(ws.recv(), OFFER_TIMEOUT_S)
            except TimeoutError:
                raise ProtocolError(
                    POLICY_VIOLATION, f"no offer within {OFFER_TIMEOUT_S:.0f} s", kind="no_offer"
                ) from None
            signal = webrtc.parse_signal(first)
            if not isinstance(signal, webrtc.Offer):
                raise ProtocolError(
                    PROTOCOL_ERROR, "the first message must be an offer", kind="out_of_order"
                )
            await self._call(ws, signal)
        except ProtocolError as error:
            log.info("rtc %s: %s", ws.remote_address, error.reason)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(webrtc.error_event(error.kind, error.reason))
                await ws.close(error.code, error.close_reason)
        except ConnectionClosed:
            pass

    async def _call(self, ws: ServerConnection, offer: webrtc.Offer) -> None:
        config = RTCConfiguration(
            iceServers=[RTCIceServer(**server) for server in self.ice_servers()]
        )
        pc = RTCPeerConnection(configuration=config)
        self.peers.add(pc)
        playout = webrtc.RtpPlayout(CARRIER.sample_rate)
        out = RtcOutbound(ws, playout)
        pipeline: CallPipeline | None = None
        started = False
        connected = asyncio.Event()
        failed = asyncio.Event()
        tasks: set[asyncio.Task[Any]] = set()
        reason = "caller hung up"

        def heard(name: str) -> None:
            if pipeline is not None and not pipeline.ended:
                pipeline.mark(name)

        track = AgentAudioTrack(playout, heard)

        async def receive_audio(remote: MediaStreamTrack) -> None:
            resampler = av.AudioResampler(format="s16", layout="mono", rate=CARRIER.sample_rate)
            while True:
                try:
                    frame = await remote.recv()
                except MediaStreamError:
                    return
                if pipeline is None or not started or not isinstance(frame, av.AudioFrame):
                    continue
                for pcm in resampler.resample(frame):
                    pipeline.audio(pcm.to_ndarray().tobytes())

        def on_channel_message(message: str | bytes) -> None:
            event = webrtc.parse_channel(message)
            if isinstance(event, webrtc.Playout):
                playout.report_delay(event.delay_ms)
            elif isinstance(event, webrtc.Dtmf):
                if pipeline is not None:
                    pipeline.dtmf(event.digit)
            elif isinstance(event, webrtc.Hangup):
                out.close(1000, "caller hung up")
            else:
                out.event({"type": "error", "code": event.kind, "message": event.message})

        @pc.on("track")
        def on_track(remote: MediaStreamTrack) -> None:
            if remote.kind == "audio":
                task = asyncio.ensure_future(receive_audio(remote))
                tasks.add(task)

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            out.attach(channel)
            channel.on("message", on_channel_message)

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState == "connected":
                connected.set()
            elif pc.connectionState in ("failed", "closed"):
                failed.set()

        try:
            try:
                await pc.setRemoteDescription(RTCSessionDescription(offer.sdp, "offer"))
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                raise ProtocolError(
                    PROTOCOL_ERROR, f"offer: sdp was not accepted: {exc}", kind="bad_sdp"
                ) from None
            pc.addTrack(track)
            try:
                pipeline = await self._start_call(
                    transport="webrtc",
                    agent=offer.agent,
                    args=offer.args,
                    call_id=None,
                    carrier=CARRIER,
                    out=out,
                )
            except VoiceAgentError as exc:
                raise ProtocolError(POLICY_VIOLATION, str(exc), kind="bad_start") from None
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
            await ws.send(webrtc.answer_event(pc.localDescription.sdp, pipeline.session.call_id))
            failure = await self._wait_connected(ws, connected, failed)
            if failure is not None:
                reason = failure
            else:
                started = True
                await pipeline.start()
                reason = await self._run(ws, out, pipeline, failed)
        except ProtocolError as error:
            reason = f"protocol error: {error.reason}"
            log.info("rtc %s: %s", ws.remote_address, error.reason)
            out.close(error.code, error.close_reason)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(webrtc.error_event(error.kind, error.reason))
        finally:
            if pipeline is not None:
                await pipeline.hang_up(reason)
            for task in tasks:
                task.cancel()
            track.stop()
            await pc.close()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.peers.discard(pc)
            await self._close(ws, out, reason)

    async def _wait_connected(
        self, ws: ServerConnection, connected: asyncio.Event, failed: asyncio.Event
    ) -> str | None:
        """None once ICE and DTLS are up; otherwise why the call cannot go on."""
        waiters = {
            asyncio.ensure_future(connected.wait()),
            asyncio.ensure_future(failed.wait()),
            asyncio.ensure_future(ws.wait_closed()),
        }
        _, pending = await asyncio.wait(
            waiters, timeout=self.settings.ice_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for waiter in pending:
            waiter.cancel()
        if connected.is_set():
            return None
        if failed.is_set():
            message = "the browser's connection failed before the call started (ICE or DTLS)"
        elif ws.state is not State.OPEN:
            return "caller hung up before the call connected"
        else:
            message = (
                f"the browser did not connect within {self.settings.ice_timeout_s:g} s "
                "(ICE): check the network, STUN and TURN settings"
            )
        with contextlib.suppress(ConnectionClosed):
            await ws.send(webrtc.error_event("ice_failed", message))
        return f"ice failed: {message}"

    async def _run(
        self,
        ws: ServerConnection,
        out: RtcOutbound,
        pipeline: CallPipeline,
        failed: asyncio.Event,
    ) -> str:
        """Until the caller hangs up, the peer goes away, or the call ends on its own."""

        async def signalling() -> str:
            try:
                async for message in ws:
                    try:
                        signal = webrtc.parse_signal(message)
                    except ProtocolError as error:
                        await ws.send(webrtc.error_event(error.kind, f"{error.reason} (ignored)"))
                        continue
                    if isinstance(signal, webrtc.Hangup):
                        return "caller hung up"
                    if isinstance(signal, ProtocolWarning):
                        await ws.send(webrtc.error_event(signal.kind, signal.message))
                    else:
                        await ws.send(
                            webrtc.error_event("out_of_order", "one offer per call (ignored)")
                        )
            except ConnectionClosed:
                pass
            return "caller hung up"

        async def closing() -> str:
            await out.closing.wait()
            return out.close_with[1] if out.close_with else "call ended"

        async def peer_failed() -> str:
            await failed.wait()
            return "connection lost"

        async def finished() -> str:
            await pipeline.finished.wait()
            return "call ended"

        waiters = [asyncio.ensure_future(c) for c in (signalling(), closing(), peer_failed())]
        waiters.append(asyncio.ensure_future(finished()))
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in pending:
            waiter.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return next(iter(done)).result()

    async def _close(self, ws: ServerConnection, out: RtcOutbound, reason: str) -> None:
        code, why = out.close_with or (1000, reason)
        with contextlib.suppress(ConnectionClosed):
            if ws.state is State.OPEN:
                await ws.send(json.dumps({"type": "end", "reason": reason}))
                await ws.close(code, close_reason(why))
