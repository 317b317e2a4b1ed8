"""Random and mutated messages at /twilio, /ws and the carriers' paths (/telnyx, /plivo, /vonage,
/exotel, /jambonz) while a normal call runs alongside.

Every bad peer must get a defined answer (a close code from docs/protocol.md or the carrier
codecs, or an `error` event), must leave no call behind once it is gone, and the normal call
must complete as if nothing happened.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from tests.support.configs import serving
from voice_agent.audio.wav import read_wav
from voice_agent.callers import NativeClient
from voice_agent.gateways import carriers
from voice_agent.server.app import VoiceServer
from voice_agent.transports import asterisk_ws, jambonz, native, twilio, vonage

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
# docs/protocol.md's close codes for /twilio and /ws. The carrier codecs raise only the four of
# voice_agent/transports/errors.py (PROTOCOL_ERROR 1002, UNSUPPORTED_DATA 1003,
# POLICY_VIOLATION 1008, MESSAGE_TOO_BIG 1009), all already here, so the carriers add none.
# 1007 (not UTF-8) cannot happen: every text message here is a str. 1011 (a server bug) and
# 1013 (admission refused: this test must stay under the limits) are deliberately not defined.
DEFINED_CLOSE_CODES = {1000, 1002, 1003, 1008, 1009}
SEED = 20261130
ROUNDS_PER_PATH = 15  # as before this covered the carriers: 30 peers per path, two at a time
PEERS_PER_ROUND = 2
LEFTOVER_WAIT_S = 5.0  # a gone peer's call ends within milliseconds; this is only a ceiling
END_WAIT_S = 10.0
# The server's WebSocket frame limit, the largest of every endpoint's as VoiceServer.start sets
# it: a frame past it gets 1009 from `websockets` itself, before any codec sees it.
SERVER_MAX_SIZE = max(
    twilio.WEBSOCKET_MAX_SIZE,
    native.WEBSOCKET_MAX_SIZE,
    asterisk_ws.WEBSOCKET_MAX_SIZE,
    carriers.WEBSOCKET_MAX_SIZE,
)
VONAGE_RATE = JAMBONZ_RATE = 16000
PCM_FRAME = bytes(VONAGE_RATE * 2 * 20 // 1000)  # 20 ms of 16 kHz L16 silence: 640 bytes
# The largest binary frame each codec takes at 16 kHz: one past it is a policy violation.
VONAGE_MAX_FRAME = VONAGE_RATE * 2 * vonage.MAX_FRAME_MS // 1000
JAMBONZ_MAX_FRAME = JAMBONZ_RATE * 2 * jambonz.MAX_AUDIO_MS // 1000
MULAW_FRAME = b"\xff" * 160  # 20 ms of 8 kHz mu-law silence

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server


def _id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def twilio_messages(rng: random.Random) -> list[str | bytes]:
    sid = "MZ" + "0" * 32
    start = {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": sid,
        "start": {
            "streamSid": sid,
            "accountSid": "AC" + "0" * 32,
            "callSid": f"CAfuzz{rng.randrange(10**9)}",
            "tracks": ["inbound"],
            "customParameters": {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    }
    media = {
        "event": "media",
        "sequenceNumber": "2",
        "streamSid": sid,
        "media": {
            "track": "inbound",
            "chunk": "1",
            "timestamp": "20",
            "payload": base64.b64encode(bytes(160)).decode(),
        },
    }
    valid = [json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})]
    valid.append(json.dumps(start))
    valid.append(json.dumps(media))
    return _mutate(rng, valid)


def native_messages(rng: random.Random) -> list[str | bytes]:
    start = {"type": "start", "audio": {"encoding": "pcm16", "sample_rate": 16000}}
    valid = [json.dumps(start), json.dumps({"type": "dtmf", "digit": "5"})]
    return [*_mutate(rng, valid), bytes(rng.randrange(0, 700))]


def telnyx_messages(rng: random.Random) -> list[str | bytes]:
    # The shapes of Telnyx's AsyncAPI examples (tests/test_carrier_telnyx_plivo.py's T_START).
    stream = _id(rng)
    start = {
        "event": "start",
        "sequence_number": "1",
        "stream_id": stream,
        "start": {
            "user_id": _id(rng),
            "call_control_id": f"v3:fuzz{rng.randrange(10**9)}",
            "call_session_id": _id(rng),
            "from": "+13122010094",
            "to": "+13122123456",
            "custom_parameters": {},
            "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
        },
    }
    media = {
        "event": "media",
        "sequence_number": "2",
        "stream_id": stream,
        "media": {
            "track": "inbound",
            "chunk": "1",
            "timestamp": "20",
            "payload": base64.b64encode(MULAW_FRAME).decode(),
        },
    }
    dtmf = {"event": "dtmf", "sequence_number": "3", "stream_id": stream, "dtmf": {"digit": "1"}}
    mark = {"event": "mark", "sequence_number": "4", "stream_id": stream, "mark": {"name": "m1"}}
    connected = {"event": "connected", "version": "1.0.0"}
    return _carrier_mutate(rng, [connected, start, media, dtmf, mark], opening=2)


def plivo_messages(rng: random.Random) -> list[str | bytes]:
    # Plivo has no `connected`: it sends `start` as soon as the socket is open (plivo.py).
    stream = _id(rng)
    start = {
        "event": "start",
        "sequenceNumber": 1,
        "start": {
            "callId": _id(rng),
            "streamId": stream,
            "accountId": "MAXXXXXXXXXXXXXXXXXX",
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
        },
        "extra_headers": "{}",
    }
    media = {
        "event": "media",
        "sequenceNumber": 2,
        "streamId": stream,
        "media": {
            "track": "inbound",
            "timestamp": "1705312200000",
            "chunk": 1,
            "payload": base64.b64encode(MULAW_FRAME).decode(),
        },
    }
    dtmf = {"event": "dtmf", "sequenceNumber": 3, "streamId": stream, "dtmf": {"digit": "5"}}
    played = {"event": "playedStream", "streamId": stream, "name": "m1"}
    return _carrier_mutate(rng, [start, media, dtmf, played], opening=1)


def exotel_messages(rng: random.Random) -> list[str | bytes]:
    # developer.exotel.com's websocket-protocol page (EXOTEL_START in the codec's tests).
    sid = f"MZfuzz{rng.randrange(10**9)}"
    start = {
        "event": "start",
        "sequence_number": "1",
        "stream_sid": sid,
        "start": {
            "stream_sid": sid,
            "call_sid": f"CAfuzz{rng.randrange(10**9)}",
            "account_sid": "ACxxxxxxxxxxxxxxxxxxxxxxxx",
            "from": "+919876543210",
            "to": "+918047491899",
            "custom_parameters": {},
            "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"},
        },
    }
    # 100 ms of 8 kHz L16, what Exotel sends a message.
    payload = base64.b64encode(bytes(1600)).decode()
    media = {
        "event": "media",
        "sequence_number": "2",
        "stream_sid": sid,
        "media": {"chunk": "1", "timestamp": "100", "payload": payload},
    }
    dtmf = {
        "event": "dtmf",
        "sequence_number": "3",
        "stream_sid": sid,
        "dtmf": {"digit": "5", "duration": "200"},
    }
    mark = {"event": "mark", "sequence_number": "4", "stream_sid": sid, "mark": {"name": "m1"}}
    connected = {"event": "connected"}
    return _carrier_mutate(rng, [connected, start, media, dtmf, mark], opening=2)


def vonage_messages(rng: random.Random) -> list[str | bytes]:
    connected = {
        "event": "websocket:connected",
        "content-type": f"audio/l16;rate={VONAGE_RATE}",
        "uuid": _id(rng),
    }
    dtmf = {"event": "websocket:dtmf", "digit": "5", "duration": 260}
    notify = {"event": "websocket:notify", "payload": {"name": "m1"}}
    valid: list[Mapping[str, object] | bytes] = [connected, PCM_FRAME, PCM_FRAME, dtmf, notify]
    return _carrier_mutate(rng, valid, opening=1, max_frame=VONAGE_MAX_FRAME)


def jambonz_messages(rng: random.Random) -> list[str | bytes]:
    # What listen.js sends first: {sampleRate, mixType} and the call's attributes.
    attributes = {
        "sampleRate": JAMBONZ_RATE,
        "mixType": "mono",
        "callSid": _id(rng),
        "direction": "inbound",
        "from": "+15083084809",
        "to": "+15083728299",
        "callId": _id(rng),
        "callStatus": "in-progress",
        "accountSid": _id(rng),
        "applicationSid": _id(rng),
    }
    dtmf = {"event": "dtmf", "dtmf": "2", "duration": "1600"}
    mark = {"type": "mark", "data": {"name": "m1", "event": "playout"}}
    valid: list[Mapping[str, object] | bytes] = [attributes, PCM_FRAME, PCM_FRAME, dtmf, mark]
    return _carrier_mutate(rng, valid, opening=1, max_frame=JAMBONZ_MAX_FRAME)


def _carrier_mutate(
    rng: random.Random,
    valid: Sequence[Mapping[str, object] | bytes],
    opening: int,
    max_frame: int = 0,
) -> list[str | bytes]:
    """A carrier's messages mutated. Half its peers send the opening (up to and including the
    start) unchanged, the rest mutate from the first message as /twilio's do: mutated alone, a
    start survives three times in ten (with this seed 0 of 30 jambonz peers started a call), so
    the garbage a started call gets, the carrier endpoints' own code, would go almost untried."""
    messages = [m if isinstance(m, bytes) else json.dumps(m) for m in valid]
    intact = opening if rng.random() < 0.5 else 0
    return [*messages[:intact], *_mutate(rng, messages[intact:], max_frame=max_frame)]


def _mutate(
    rng: random.Random, valid: Sequence[str | bytes], *, max_frame: int = 0
) -> list[str | bytes]:
    """A plausible start, then garbage of the kinds real peers produce. Binary audio frames
    (Vonage, jambonz: `max_frame` is the codec's largest) get the binary kinds of garbage."""
    out: list[str | bytes] = []
    for message in valid:
        if isinstance(message, bytes):
            out.append(_mutate_frame(rng, message, max_frame))
            continue
        choice = rng.random()
        if choice < 0.3:
            out.append(message)
        elif choice < 0.5:
            chars = list(message)
            for _ in range(rng.randrange(1, 6)):
                chars[rng.randrange(len(chars))] = chr(rng.randrange(32, 127))
            out.append("".join(chars))
        elif choice < 0.6:
            out.append(message[: rng.randrange(len(message))])
        elif choice < 0.7:
            out.append(rng.randbytes(rng.randrange(1, 400)))
        elif choice < 0.8:
            out.append(json.dumps({"event": rng.choice(["media", "mark", "stop", "nope"])}))
        elif choice < 0.9:
            out.append("x" * rng.choice([10, 70_000, 300_000]))
        else:
            out.append(json.dumps([1, 2, 3]))
    return out


def _mutate_frame(rng: random.Random, frame: bytes, max_frame: int) -> str | bytes:
    """An audio frame kept, or the binary garbage a codec of `max_frame` bytes must refuse."""
    assert max_frame > 0, "binary messages need their codec's largest frame"
    choice = rng.random()
    if choice < 0.3:
        return frame
    if choice < 0.45:  # not whole 16-bit samples
        return rng.randbytes(rng.randrange(1, 2 * len(frame), 2))
    if choice < 0.6:  # past the codec's limit, or past the WebSocket frame limit
        return bytes(rng.choice([max_frame + 2, SERVER_MAX_SIZE + 2]))
    if choice < 0.7:  # jambonz's end of stream; an empty frame to Vonage
        return b""
    if choice < 0.8:  # audio of any whole-sample length the codec takes
        return rng.randbytes(2 * rng.randrange(1, max_frame // 2))
    if choice < 0.9:  # a text message where audio was due
        return json.dumps({"event": rng.choice(["websocket:dtmf", "dtmf", "mark", "nope"])})
    return "x" * rng.choice([10, 70_000])


# Each path's messages, and what its peer sends to end the call: a stop message where the
# protocol has one, else None (Plivo, Vonage: the caller hangs up by closing the socket).
FUZZED: dict[str, tuple[Callable[[random.Random], list[str | bytes]], str | bytes | None]] = {
    "/ws": (native_messages, json.dumps({"type": "stop"})),
    "/twilio": (twilio_messages, json.dumps({"event": "stop"})),
    "/telnyx": (telnyx_messages, json.dumps({"event": "stop"})),
    "/plivo": (plivo_messages, None),
    "/vonage": (vonage_messages, None),
    "/exotel": (exotel_messages, json.dumps({"event": "stop", "stop": {"reason": "callended"}})),
    "/jambonz": (jambonz_messages, b""),
}


@dataclass
class Answer:
    """What one bad peer got: the server's close code (on a path without a stop message, its
    answer to the peer's own close, if still `open_at_end`); `hung` when a stop or a ping was
    not answered within END_WAIT_S."""

    path: str
    round: int
    messages: list[str | bytes]
    code: int | None
    open_at_end: bool = False
    hung: bool = False

    def __str__(self) -> str:
        shown = [m[:80] if isinstance(m, str) else f"<{len(m)} bytes>" for m in self.messages]
        what = "no answer to its end" if self.hung else f"close code {self.code}"
        return f"seed {SEED} {self.path} round {self.round}: {what} after {shown}"


def defined(answer: Answer) -> bool:
    return not answer.hung and answer.code in DEFINED_CLOSE_CODES


async def fuzz_one(
    server: VoiceServer, path: str, round_: int, messages: list[str | bytes]
) -> Answer:
    """Send the messages and the path's end; return how the server answered."""
    end = FUZZED[path][1]
    subprotocols = [Subprotocol(jambonz.SUBPROTOCOL)] if path == "/jambonz" else None
    url = f"ws://127.0.0.1:{server.port}{path}"
    # max_queue=None: a started call's audio is never read here, and with a bounded queue the
    # client stops reading the socket once it is full, so it would not see the server's close
    # frame and its own close would end, 10 s later, in 1006.
    async with connect(url, max_size=2**22, max_queue=None, subprotocols=subprotocols) as ws:
        # jambonz drops a connection that does not answer the subprotocol it asked for.
        assert ws.subprotocol == (subprotocols[0] if subprotocols else None)
        open_at_end = False
        try:
            async with asyncio.timeout(END_WAIT_S):
                for message in messages:
                    await ws.send(message)
                if end is None:
                    # The caller hangs up by closing. A ping first: the server answers it only
                    # after it has handled the messages before it, so the close it meant to
                    # send for one of them is sent before the pong, not lost in our close.
                    await (await ws.ping())
                    open_at_end = True
                    await ws.close()
                else:
                    await ws.send(end)
                    async for _ in ws:
                        pass
        except ConnectionClosed:
            pass
        except TimeoutError:
            return Answer(path, round_, messages, ws.close_code, open_at_end, hung=True)
        return Answer(path, round_, messages, ws.close_code, open_at_end)


def leftovers(server: VoiceServer, normal_id: str | None) -> dict[str, object]:
    """What the server still keeps of calls other than the normal one (read with no await in
    between, so it is one moment's state)."""
    normal = {normal_id}
    kept: dict[str, object] = {}
    if others := sorted(set(server.pipelines) - normal):
        kept["pipelines"] = others
    if others := sorted({record.call_id for record in server.live.recent(10**6)} - normal):
        kept["live"] = others
    if (extra := server.store.live_count() - (normal_id in server.pipelines)) > 0:
        kept["store_live"] = extra
    # Connections still in a call endpoint's handler: at most the normal call's.
    if server._call_connections > (normal_id is not None):
        kept["call_connections"] = server._call_connections
    return kept


async def wait_for_no_leftovers(server: VoiceServer, normal_id: str | None) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEFTOVER_WAIT_S
    # Polled: the server has no event for "a call's objects are all gone".
    while (kept := leftovers(server, normal_id)) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return kept


async def test_fuzzed_peers_get_defined_answers_while_a_real_call_completes(
    server: VoiceServer, caplog: pytest.LogCaptureFixture
) -> None:
    caller = NativeClient(f"ws://127.0.0.1:{server.port}/ws", timeout=60)
    started = asyncio.Event()

    async def normal_call() -> list[str]:
        async with caller:
            started.set()
            await caller.wait_silence_after_audio(300)
            heard = caller.received_ms
            await caller.send_audio(read_wav(AUDIO / "joe_book1.wav")[0])
            await caller.wait_audio(heard + 1)
            await caller.wait_silence_after_audio(500)
            await caller.stop()
        return [e["text"] for e in caller.events_of("transcript") if e.get("final")]

    answers: list[Answer] = []
    left: list[str] = []

    async def fuzzers() -> None:
        # /ws and /twilio share the generator, in the order they always took turns, so their
        # messages are the ones this test sent before it covered the carriers. Each carrier has
        # its own, seeded by its path: seed, path and round rebuild a carrier peer's messages.
        legacy = random.Random(SEED)
        rngs = {path: random.Random(f"{SEED}{path}") for path in FUZZED}
        rngs["/ws"] = rngs["/twilio"] = legacy
        await started.wait()  # the normal call's id tells its call from the peers'
        for round_ in range(ROUNDS_PER_PATH):
            for path, (messages_for, _) in FUZZED.items():
                messages = messages_for(rngs[path])
                batch = [fuzz_one(server, path, round_, messages) for _ in range(PEERS_PER_ROUND)]
                answers.extend(await asyncio.gather(*batch))
                kept = await wait_for_no_leftovers(server, caller.call_id)
                if kept:
                    left.append(f"seed {SEED} {path} round {round_}: the server kept {kept}")

    with caplog.at_level(logging.ERROR):
        finals, _ = await asyncio.gather(normal_call(), fuzzers())
    # The caller was understood and answered (the exact words are the STT tests' business).
    assert finals and "table for two" in finals[0]
    assert caller.events_of("agent_text")[-1]["text"] != caller.events_of("agent_text")[0]["text"]
    assert caller.close_code == 1000
    wrong = [str(a) for a in answers if not defined(a)]
    assert not wrong, "\n".join(wrong)
    assert not left, "\n".join(left)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, "\n".join(caplog.text.splitlines()[:40])
    async with httpx.AsyncClient() as http:
        health = (await http.get(f"http://127.0.0.1:{server.port}/healthz")).json()
    assert health["status"] == "ok"
    for pipeline in list(server.pipelines.values()):
        await pipeline.finished.wait()
    assert server.store.live_count() == 0
    assert await wait_for_no_leftovers(server, None) == {}


async def test_a_live_call_stays_known_when_another_with_its_call_id_ends(
    server: VoiceServer,
) -> None:
    # What the fuzzers' two peers of a round do whenever their start survives: the same start,
    # so the same call id, on two sockets at once (a carrier streaming a call twice, a stream
    # reconnecting before its old socket is seen to be gone).
    start = {
        "event": "start",
        "sequence_number": "1",
        "stream_id": "fuzz-stream",
        "start": {
            "call_control_id": "v3:fuzz-same-call",
            "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
        },
    }
    stop = json.dumps({"event": "stop"})
    url = f"ws://127.0.0.1:{server.port}/telnyx"
    async with connect(url, max_queue=None) as first, connect(url, max_queue=None) as second:
        for ws in (first, second):
            await ws.send(json.dumps(start))
            await ws.recv()  # the greeting's first audio: this call is live
        await first.send(stop)
        async for _ in first:
            pass
        async with asyncio.timeout(LEFTOVER_WAIT_S):
            while server._call_connections > 1:  # noqa: ASYNC110 (no event for a handler's end)
                await asyncio.sleep(0.01)
        assert json.loads(await second.recv())["event"] == "media"  # the second call goes on
        # However the server names the second call, it must still know it is live.
        kept = (len(server.pipelines), server.live.live_count(), server.store.live_count())
        await second.send(stop)
        async for _ in second:
            pass
    assert kept == (1, 1, 1)
