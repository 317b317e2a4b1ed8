"""A speech-to-speech agent (`llm.provider: openai_realtime`) over the transports that
tests/test_realtime_calls.py does not take (it has /twilio and SIP): AudioSocket, chan_websocket,
WebRTC and /ws, each called by the test client its own module uses, against the project's
Realtime stand-in (tests/support/realtime_server.py) through the real `openai` SDK.

One call per transport: the caller hears the first message (the agent's TTS), says a recorded
line and hears the model's scripted answer. The assertions read the format the session asked
the model for (G.711 straight through on a G.711 call, else 24 kHz PCM), the caller's turn as
the model got it, how much of the model's audio reached the caller, and the call record.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

import numpy as np
import pytest
import pytest_asyncio
import yaml

from tests.support.configs import ended_call as record
from tests.support.configs import serving
from tests.support.live_calls import CallAudit, new_pipeline
from tests.support.realtime_server import ModelReply, RealtimeStandIn
from tests.support.rtc_caller import RtcCaller
from tests.test_asterisk_ws import FakeAsterisk, caller_audio
from tests.test_audiosocket import AsteriskLikeCaller, slin
from tests.test_realtime_calls import realtime_config
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.callers import NativeClient
from voice_agent.engines.realtime.formats import PCM24, PCMA, PCMU, AudioFormat
from voice_agent.server.app import VoiceServer
from voice_agent.transports.native import AudioFormat as WsAudio

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
GREETING = "Hello, thanks for calling Bella Vista! How can I help?"
LINE = "joe_change1"  # "hi i need to change my booking"
REPLY = "Of course, which evening?"
MODEL_FORMATS = {f.name: f for f in (PCM24, PCMU, PCMA)}

pytestmark = pytest.mark.asyncio(loop_scope="module")


# ---- measuring speech ------------------------------------------------------------------------


def speech_span_ms(pcm: bytes, rate: int, threshold: float = 500.0) -> float:
    """From the first 20 ms window louder than `threshold` RMS to the end of the last one."""
    frame = rate // 50
    samples = np.frombuffer(pcm[: len(pcm) // (2 * frame) * 2 * frame], dtype="<i2")
    windows = samples.astype(np.float64).reshape(-1, frame)
    loud = np.flatnonzero(np.sqrt((windows**2).mean(axis=1)) > threshold)
    return float((loud[-1] - loud[0] + 1) * 20) if len(loud) else 0.0


def model_audio(fmt: AudioFormat, data: bytes) -> tuple[float, float]:
    """Audio in the model's format: its length and its speech span, in ms."""
    return len(data) / fmt.carrier.bytes_per_ms, speech_span_ms(
        fmt.carrier.decode(data), fmt.sample_rate
    )


def line_span_ms() -> float:
    """The speech span of the caller's recorded line, as the fixture holds it."""
    pcm, rate = read_wav(AUDIO / f"{LINE}.wav")
    return speech_span_ms(pcm, rate)


# ---- one caller per transport, driven the same way -------------------------------------------


class Line(Protocol):
    """A caller on one transport: `heard_ms` is the agent's audio it has received since
    `mark()`, or where the line carries silence between the agent's words (RTP), the span of
    that audio's speech."""

    continuous: bool

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def say(self, name: str) -> None: ...

    def mark(self) -> None: ...

    def heard_ms(self) -> float: ...

    async def played_out(self) -> None:
        """Until the agent's audio has played out on the caller's side."""


class AudioSocketLine:
    """Asterisk's AudioSocket at 8 kHz slin (tests/test_audiosocket.py's caller)."""

    continuous = False

    def __init__(self, server: VoiceServer) -> None:
        assert server.audiosocket is not None and server.audiosocket.port
        self.caller = AsteriskLikeCaller(server.audiosocket.port, rate=8000)
        self._from = 0

    async def __aenter__(self) -> Self:
        await self.caller.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.caller.hang_up()

    async def say(self, name: str) -> None:
        await self.caller.send_audio(slin(name, 8000))

    def mark(self) -> None:
        self._from = len(self.caller.audio)

    def heard_ms(self) -> float:
        return sum(len(m.payload) for m in self.caller.audio[self._from :]) / 16

    async def played_out(self) -> None:
        await self.caller.wait_silence(300)


class ChanWebSocketLine:
    """Asterisk's chan_websocket on /asterisk (tests/test_asterisk_ws.py's caller)."""

    continuous = False

    def __init__(self, server: VoiceServer, fmt: str) -> None:
        self.fmt = fmt
        self.caller = FakeAsterisk(f"ws://127.0.0.1:{server.port}/asterisk", fmt=fmt)
        self._from = 0

    async def __aenter__(self) -> Self:
        await self.caller.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.caller.hang_up()

    async def say(self, name: str) -> None:
        await self.caller.say(caller_audio(name, self.fmt))

    def mark(self) -> None:
        self._from = self.caller.received_bytes

    def heard_ms(self) -> float:
        return (self.caller.received_bytes - self._from) / self.caller.media.bytes_per_ms

    async def played_out(self) -> None:
        await self.caller.wait_quiet(300)


class NativeLine:
    """This server's own /ws protocol (voice_agent.callers.NativeClient)."""

    continuous = False

    def __init__(self, server: VoiceServer, audio: WsAudio) -> None:
        self.audio = audio
        self.caller = NativeClient(f"ws://127.0.0.1:{server.port}/ws", audio=audio, timeout=60)
        self._from = 0.0

    async def __aenter__(self) -> Self:
        await self.caller.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.caller.stop()

    async def say(self, name: str) -> None:
        if self.audio.encoding == "mulaw":
            await self.caller.send_audio((AUDIO / f"{name}.ulaw").read_bytes())
        else:
            await self.caller.send_audio(slin(name, self.audio.sample_rate))

    def mark(self) -> None:
        self._from = self.caller.received_ms

    def heard_ms(self) -> float:
        return self.caller.received_ms - self._from

    async def played_out(self) -> None:
        await self.caller.wait_silence_after_audio(300)


class WebRtcLine:
    """A browser on /rtc (tests/support/rtc_caller.py, aiortc)."""

    continuous = True

    def __init__(self, server: VoiceServer) -> None:
        self.caller = RtcCaller(f"ws://127.0.0.1:{server.port}/rtc")
        self._from = 0

    async def __aenter__(self) -> Self:
        await self.caller.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.caller.hang_up()

    async def say(self, name: str) -> None:
        pcm, rate = read_wav(AUDIO / f"{name}.wav")
        await self.caller.say(pcm if rate == 16000 else resample(pcm, rate, 16000))

    def mark(self) -> None:
        self._from = len(self.caller.received)

    def heard_ms(self) -> float:
        return speech_span_ms(bytes(self.caller.received[self._from :]), 16000)

    async def played_out(self) -> None:
        # The data channel's `committed` for the answer: the server's playout says it is heard.
        await self.caller.wait_event(lambda e: e["type"] == "committed" and e["reply_id"] != 1)


@dataclass(frozen=True)
class Transport:
    name: str
    dial: Callable[[VoiceServer], Line]
    model_format: AudioFormat  # what formats.py asks of the model for this call's carrier
    call_transport: str  # the call record's `transport`


TRANSPORTS = [
    Transport("audiosocket-slin8", AudioSocketLine, PCM24, "audiosocket"),
    Transport(
        "chan_websocket-ulaw", lambda server: ChanWebSocketLine(server, "ulaw"), PCMU, "asterisk"
    ),
    Transport(
        "chan_websocket-alaw", lambda server: ChanWebSocketLine(server, "alaw"), PCMA, "asterisk"
    ),
    Transport("webrtc", WebRtcLine, PCM24, "webrtc"),
    Transport("ws-pcm16", lambda server: NativeLine(server, WsAudio()), PCM24, "ws"),
    Transport("ws-mulaw", lambda server: NativeLine(server, WsAudio("mulaw", 8000)), PCMU, "ws"),
]


# ---- the server ------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def model() -> AsyncIterator[RealtimeStandIn]:
    async with RealtimeStandIn() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, model: RealtimeStandIn
) -> AsyncIterator[VoiceServer]:
    """The realtime concierge, its first message at 1.6 times the TTS's pace, with the
    AudioSocket listener on and WebRTC's ICE wait short (every call connects on localhost)."""
    path = realtime_config(tmp_path_factory.mktemp("transports"), model, tts={"speed": 1.6})
    data = yaml.safe_load(path.read_text())
    data["audiosocket"] = {"listen": "127.0.0.1:0"}
    data["webrtc"] = {"ice_timeout_s": 5}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    async for voice_server in serving(path):
        yield voice_server


@pytest.fixture(autouse=True)
def fresh(model: RealtimeStandIn) -> None:
    model.replies.clear()


def messages(call: dict[str, Any], role: str) -> list[str | None]:
    return [m.get("content") for m in call["context"]["messages"] if m["role"] == role]


# ---- the call --------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS, ids=[t.name for t in TRANSPORTS])
async def test_a_speech_to_speech_call_over_the_transport(
    server: VoiceServer, model: RealtimeStandIn, transport: Transport
) -> None:
    model.script(ModelReply(text=REPLY))
    known = set(server.pipelines)
    async with transport.dial(server) as line:
        pipeline = await new_pipeline(server, known)
        events = CallAudit(pipeline)
        greeting = await events.until("agent_utterance")  # the first message, played out
        line.mark()
        await line.say(LINE)
        answer = await events.until("agent_utterance")
        await line.played_out()
        heard_ms = line.heard_ms()
    call = await record(server, pipeline.session.call_id)
    assert call["transport"] == transport.call_transport
    assert greeting.data["committed"] == GREETING

    # The session asked the model for the call's own format: G.711 as it is, else 24 kHz PCM.
    session = model.sessions[-1]
    wire = transport.model_format.wire()
    assert session["audio"]["input"]["format"] == wire
    assert session["audio"]["output"]["format"] == wire

    # The caller's turn reached the model as its audio, in that format, at its real length.
    (said,) = [i for i in model.items if i["type"] == "message" and i["role"] == "user"]
    (part,) = said["content"]
    assert part["type"] == "input_audio"
    _, span_ms = model_audio(transport.model_format, base64.b64decode(part["audio"]))
    line_ms = line_span_ms()
    assert abs(span_ms - line_ms) <= 0.15 * line_ms, (span_ms, line_ms)

    # The model's answer reached the caller whole, once, at the right rate.
    (reply,) = [i for i in model.assistant_items() if i["id"] in model.audio]
    spoken = model.audio[reply["id"]]
    assert MODEL_FORMATS[spoken.format] == transport.model_format
    reply_ms, reply_span_ms = model_audio(transport.model_format, spoken.data)
    expected_ms = reply_span_ms if line.continuous else reply_ms
    assert abs(heard_ms - expected_ms) <= 0.1 * expected_ms + 60, (heard_ms, expected_ms)

    # And the call record keeps it as what the agent said.
    assert answer.data["committed"] == REPLY
    assert messages(call, "assistant") == [GREETING, REPLY]
    assert model.errors == []
