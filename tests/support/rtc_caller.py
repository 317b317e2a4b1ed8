"""A WebRTC caller on aiortc, as a browser would call `/rtc`: an offer over the signalling
WebSocket, a microphone track playing PCM in real time, the agent's audio recorded, and the
data channel's events collected."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from websockets.asyncio.client import ClientConnection, connect

from voice_agent.gateways.webrtc import CARRIER, AgentAudioTrack
from voice_agent.transports.webrtc import RtpPlayout

RATE = CARRIER.sample_rate  # what the server sends; the browser side takes any rate
FRAME = RATE // 50


class MicTrack(AgentAudioTrack):
    """Plays queued PCM16 (16 kHz mono) in real time, silence in between: the server's own
    paced track, with a mark after each piece so `play` knows when it has all been sent."""

    def __init__(self) -> None:
        self._playout = RtpPlayout(RATE)
        self._playout.report_delay(0)  # sent is done, for a microphone
        self._sent: dict[str, asyncio.Future[None]] = {}
        super().__init__(self._playout, self._on_sent)

    def play(self, pcm: bytes) -> asyncio.Future[None]:
        name = str(len(self._sent))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sent[name] = done
        self._playout.audio(pcm)
        self._playout.mark(name)
        return done

    def _on_sent(self, name: str) -> None:
        future = self._sent.get(name)
        if future is not None and not future.done():
            future.set_result(None)


class RtcCaller:
    def __init__(self, url: str, *, agent: str | None = None, timeout: float = 60) -> None:
        self.url = url  # ws://HOST:PORT/rtc
        self.agent = agent
        self.timeout = timeout
        self.pc = RTCPeerConnection()
        self.mic = MicTrack()
        self.received = bytearray()  # the agent's audio, 16 kHz mono PCM16
        self.events: list[dict[str, Any]] = []
        self.signals: list[dict[str, Any]] = []
        self.call_id: str | None = None
        self.ws: ClientConnection | None = None
        self.close_code: int | None = None
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.channel = self.pc.createDataChannel("events")
        self.channel.on("message", self._on_event)
        self.pc.on("track", self._on_track)

    def _notify(self) -> None:
        self._changed.set()

    def _on_event(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self._notify()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.ensure_future(self._record(track)))

    async def _record(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):
                continue  # an audio track yields audio frames; this keeps the types honest
            for pcm in resampler.resample(frame):
                self.received += pcm.to_ndarray().tobytes()
            self._notify()

    async def _read_signals(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                self.signals.append(json.loads(message))
                self._notify()
        except Exception:
            pass
        finally:
            self.close_code = self.ws.close_code
            self._notify()

    async def offer_sdp(self) -> str:
        self.pc.addTrack(self.mic)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def connect(self, *, apply_answer: bool = True) -> None:
        sdp = await self.offer_sdp()
        self.ws = await connect(self.url)
        await self.ws.send(json.dumps({"type": "offer", "sdp": sdp, "agent": self.agent}))
        self._tasks.append(asyncio.ensure_future(self._read_signals()))
        answer = await self.wait_signal(lambda s: s["type"] in ("answer", "error"))
        if answer["type"] == "error":
            raise ConnectionError(answer["message"])
        self.call_id = answer["call_id"]
        if apply_answer:
            await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))

    async def wait_until(self, check: Callable[[], Any], what: str) -> Any:
        async def poll() -> Any:
            while True:
                result = check()
                if result:
                    return result
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(poll(), self.timeout)
        except TimeoutError:
            raise AssertionError(
                f"timed out waiting for {what}; events {self.events[-8:]}, signals {self.signals}"
            ) from None

    async def wait_signal(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        found: dict[str, Any] = await self.wait_until(
            lambda: next((s for s in self.signals if match(s)), None), "a signalling message"
        )
        return found

    async def wait_event(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        found: dict[str, Any] = await self.wait_until(
            lambda: next((e for e in self.events if match(e)), None), "a data channel event"
        )
        return found

    def loud_ms(self, threshold: float = 500.0) -> float:
        """Milliseconds of received audio louder than `threshold` RMS (20 ms windows)."""
        samples = np.frombuffer(bytes(self.received), dtype="<i2").astype(np.float64)
        windows = samples[: len(samples) // FRAME * FRAME].reshape(-1, FRAME)
        if not len(windows):
            return 0.0
        rms = np.sqrt((windows**2).mean(axis=1))
        return float((rms > threshold).sum() * 20)

    async def wait_loud(self, ms: float) -> None:
        await self.wait_until(lambda: self.loud_ms() >= ms, f"{ms} ms of agent audio")

    async def say(self, pcm: bytes) -> None:
        await asyncio.wait_for(self.mic.play(pcm), self.timeout)

    async def hang_up(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.send(json.dumps({"type": "hangup"}))
            await self.wait_until(lambda: self.close_code is not None, "the socket to close")
        await self.close()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
