#!/usr/bin/env python3
"""An OpenAI-compatible stand-in for the hosted engines, so a load test measures the server only.

    .venv/bin/python scripts/standin_engines.py --port 8799 --stt-delay-ms 150 --tts-delay-ms 150

`scripts/loadtest.py --mode hosted` starts it by itself; run it alone to point a server of your
own at it (`stt`/`tts` `provider: openai`, `base_url: http://127.0.0.1:8799/v1`, any api_key).
Once listening it prints one line, `standin listening on http://HOST:PORT/v1`.

- POST /v1/audio/transcriptions: the transcript of the audio fixture (tests/fixtures/audio) that
  the uploaded WAV sounds like, after --stt-delay-ms. "Sounds like" is the best match of 20 ms
  energy envelopes over every alignment: the server uploads a VAD-trimmed, mu-law-degraded
  copy with some pre-roll and tail, so the length alone cannot tell "yes please" (0.88 s) from
  "no thank you" (0.91 s). No fixture close enough (a cough, noise) gives "".
- POST /v1/audio/speech: 24 kHz PCM16 (response_format pcm, or wav) of fixture speech, about
  65 ms per character of the input, first byte after --tts-delay-ms, then 100 ms chunks at
  --tts-speed times real time (0: as fast as the socket takes them).
- POST /v1/chat/completions: --llm-reply, streamed (or whole) after --llm-delay-ms, for LLM
  agents; the default flow agent needs none.
- GET /v1/models; GET /stats: requests and service times so far, per endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import socket
import sys
import time
import wave
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from voice_agent.audio.resample import resample  # noqa: E402
from voice_agent.audio.wav import read_wav  # noqa: E402

AUDIO = ROOT / "tests" / "fixtures" / "audio"
TTS_RATE = 24000  # what OpenAI's speech endpoint sends for response_format "pcm"
MS_PER_CHAR = 65  # about 15 characters a second: a normal speaking rate
CHUNK_MS = 100
ENVELOPE_FRAME = 320  # 20 ms at 16 kHz
FLOOR_DB = -55.0  # envelopes count energy above this; fixtures peak at -3 dBFS
ACTIVE_DB = 10.0  # a frame this far above the floor is part of the utterance
MIN_SCORE = 0.8  # below this the upload sounds like none of the fixtures
DEFAULT_LLM_REPLY = "Sure, I can help with that. What day and time would you like?"


def envelope(pcm: bytes, sample_rate: int = 16000) -> npt.NDArray[np.float64]:
    """Energy in dB above FLOOR_DB per 20 ms frame, at 16 kHz."""
    if sample_rate != 16000:
        pcm = resample(pcm, sample_rate, 16000)
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768.0
    frames = len(samples) // ENVELOPE_FRAME
    if frames == 0:
        return np.zeros(0)
    power = (samples[: frames * ENVELOPE_FRAME].reshape(frames, ENVELOPE_FRAME) ** 2).mean(axis=1)
    return np.clip(10.0 * np.log10(power + 1e-12) - FLOOR_DB, 0.0, None)


def _active_frames(env: npt.NDArray[np.float64]) -> int:
    loud = np.nonzero(env > ACTIVE_DB)[0]
    return int(loud[-1] - loud[0] + 1) if len(loud) else 0


@dataclass(frozen=True)
class Fixture:
    name: str
    transcript: str
    env: npt.NDArray[np.float64]
    active: int
    norm: float


class Transcriber:
    """Finds the fixture an uploaded utterance was cut from (see the module's docstring)."""

    def __init__(self, audio_dir: Path = AUDIO) -> None:
        manifest = json.loads((audio_dir / "manifest.json").read_text())
        self.fixtures: list[Fixture] = []
        for item in manifest["files"]:
            # Noise stays in as a candidate with no words, so a cough is not taken for "yeah".
            if not item.get("transcript") and item.get("kind") != "noise":
                continue
            pcm, rate = read_wav(audio_dir / item["wav"])
            env = envelope(pcm, rate)
            self.fixtures.append(
                Fixture(
                    item["name"],
                    item.get("transcript") or "",
                    env,
                    _active_frames(env),
                    float(np.linalg.norm(env)),
                )
            )

    def transcribe(self, pcm: bytes, sample_rate: int) -> tuple[str, str | None, float]:
        """(transcript, fixture name or None, score) for one utterance."""
        upload = envelope(pcm, sample_rate)
        norm = float(np.linalg.norm(upload))
        active = _active_frames(upload)
        if norm == 0.0 or active == 0:
            return "", None, 0.0
        best: tuple[float, Fixture] | None = None
        for fixture in self.fixtures:
            # Only fixtures of about the utterance's length can be it: saves most of the work.
            if abs(fixture.active - active) > max(8, 0.4 * fixture.active):
                continue
            padding = np.zeros(len(fixture.env))
            padded = np.concatenate([padding, upload, padding])
            score = float(np.correlate(padded, fixture.env, "valid").max())
            score /= norm * fixture.norm + 1e-9
            if best is None or score > best[0]:
                best = (score, fixture)
        if best is None or best[0] < MIN_SCORE:
            return "", None, best[0] if best else 0.0
        return best[1].transcript, best[1].name, best[0]


def voice_bank(audio_dir: Path = AUDIO) -> bytes:
    """The joe caller lines end to end at 24 kHz: speech-like audio for the TTS to slice."""
    manifest = json.loads((audio_dir / "manifest.json").read_text())
    parts = []
    for item in manifest["files"]:
        if item.get("voice") == "joe" and item.get("kind") == "caller":
            pcm, rate = read_wav(audio_dir / item["wav"])
            parts.append(resample(pcm, rate, TTS_RATE))
    return b"".join(parts)


def speech_for(text: str, bank: bytes) -> bytes:
    """About MS_PER_CHAR of audio per character, the same audio for the same text."""
    seconds = max(0.3, len(text) * MS_PER_CHAR / 1000)
    size = int(seconds * TTS_RATE) * 2
    start = (zlib.crc32(text.encode()) % (len(bank) // 2)) * 2
    looped = bank[start:] + bank * (size // len(bank) + 1)
    return looped[:size]


def wav_header(pcm_bytes: int, sample_rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(b"")
    header = bytearray(out.getvalue())
    # The stream's length is known up front: fill it in as `wave` would have at close.
    header[4:8] = (36 + pcm_bytes).to_bytes(4, "little")
    header[40:44] = pcm_bytes.to_bytes(4, "little")
    return bytes(header)


@dataclass
class EndpointStats:
    requests: int = 0
    errors: int = 0
    cancelled: int = 0  # TTS: the client stopped reading mid-stream
    service_ms: list[float] = field(default_factory=list)
    upload_ms: list[float] = field(default_factory=list)  # STT: until the body was in

    def as_json(self) -> dict[str, Any]:
        def pick(values: list[float], p: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))], 1)

        body: dict[str, Any] = {
            "requests": self.requests,
            "errors": self.errors,
            "cancelled": self.cancelled,
            "service_ms_p50": pick(self.service_ms, 50),
            "service_ms_p95": pick(self.service_ms, 95),
            "service_ms_max": pick(self.service_ms, 100),
        }
        if self.upload_ms:
            body["upload_ms_p50"] = pick(self.upload_ms, 50)
            body["upload_ms_p95"] = pick(self.upload_ms, 95)
        return body


class StandIn:
    def __init__(self, args: argparse.Namespace) -> None:
        self.stt_delay = args.stt_delay_ms / 1000
        self.tts_delay = args.tts_delay_ms / 1000
        self.llm_delay = args.llm_delay_ms / 1000
        self.tts_speed = args.tts_speed
        self.llm_reply = args.llm_reply
        self.transcriber = Transcriber()
        self.bank = voice_bank()
        self.stats = {name: EndpointStats() for name in ("stt", "tts", "llm")}
        self.unmatched: list[float] = []  # scores of uploads that matched no fixture

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/audio/transcriptions", self.transcriptions)
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/stats", self.get_stats)
        return app

    async def transcriptions(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        stats = self.stats["stt"]
        stats.requests += 1
        form = await request.post()
        # Reading the upload takes as long as the server takes to send it: a busy server
        # shows up here, not in the processing below.
        stats.upload_ms.append((time.perf_counter() - started) * 1000)
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            stats.errors += 1
            return _error(400, "a 'file' field with the audio is required")
        try:
            with wave.open(io.BytesIO(upload.file.read()), "rb") as wav:
                if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
                    raise wave.Error("expected mono PCM16")
                rate = wav.getframerate()
                pcm = wav.readframes(wav.getnframes())
        except (wave.Error, EOFError) as exc:
            stats.errors += 1
            return _error(400, f"not a PCM WAV file: {exc}")
        text, _, score = self.transcriber.transcribe(pcm, rate)
        if not text:
            self.unmatched.append(round(score, 3))
        # The delay counts from the request's arrival, as a hosted service's latency does.
        await asyncio.sleep(max(0.0, self.stt_delay - (time.perf_counter() - started)))
        stats.service_ms.append((time.perf_counter() - started) * 1000)
        if form.get("response_format") == "text":
            return web.Response(text=text)
        return web.json_response({"text": text})

    async def speech(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        stats = self.stats["tts"]
        stats.requests += 1
        try:
            body = await request.json()
            text = str(body["input"])
        except (ValueError, KeyError, TypeError):
            stats.errors += 1
            return _error(400, "a JSON body with 'input' is required")
        response_format = body.get("response_format", "mp3")
        if response_format not in ("pcm", "wav"):
            stats.errors += 1
            return _error(400, f"the stand-in speaks pcm and wav, not {response_format!r}")
        audio = speech_for(text, self.bank)
        await asyncio.sleep(self.tts_delay)
        content_type = "audio/pcm" if response_format == "pcm" else "audio/wav"
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if response_format == "wav":
            await response.write(wav_header(len(audio), TTS_RATE))
        chunk = TTS_RATE * 2 * CHUNK_MS // 1000
        first = time.perf_counter()
        try:
            for index, offset in enumerate(range(0, len(audio), chunk)):
                if self.tts_speed > 0:
                    due = first + index * CHUNK_MS / 1000 / self.tts_speed
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await response.write(audio[offset : offset + chunk])
            await response.write_eof()
        except ConnectionResetError:
            # The server stopped reading (a caller barged in): as a hosted service would, stop.
            stats.cancelled += 1
            return response
        stats.service_ms.append((time.perf_counter() - started) * 1000)
        return response

    async def chat(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        stats = self.stats["llm"]
        stats.requests += 1
        try:
            body = await request.json()
        except ValueError:
            stats.errors += 1
            return _error(400, "the body is not JSON")
        model = str(body.get("model", "stand-in"))
        created = int(time.time())
        ident = f"chatcmpl-standin-{stats.requests}"
        await asyncio.sleep(self.llm_delay)
        if not body.get("stream"):
            message = {"role": "assistant", "content": self.llm_reply, "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            stats.service_ms.append((time.perf_counter() - started) * 1000)
            return web.json_response(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            return f"data: {json.dumps(data)}\n\n".encode()

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": ""}))
        words = self.llm_reply.split(" ")
        for index, word in enumerate(words):
            # About the pace of a hosted model's tokens: a word every 20 ms.
            await asyncio.sleep(0.02)
            await response.write(chunk({"content": word if index == 0 else " " + word}))
        await response.write(chunk({}, "stop"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        stats.service_ms.append((time.perf_counter() - started) * 1000)
        return response

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "stand-in"}
            for name in ("stand-in-stt", "stand-in-tts", "stand-in-llm")
        ]
        return web.json_response({"object": "list", "data": data})

    async def get_stats(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {name: s.as_json() for name, s in self.stats.items()}
        body["stt"]["unmatched"] = len(self.unmatched)
        return web.json_response(body)


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return web.json_response(body, status=status)


async def serve(args: argparse.Namespace) -> None:
    standin = StandIn(args)
    # No access log: at a hundred calls it would be a real share of this process's CPU.
    runner = web.AppRunner(standin.app(), access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    await web.SockSite(runner, sock).start()
    port = sock.getsockname()[1]
    # What is loaded now stays: out of the collector's way, as the server does.
    gc.freeze()
    print(f"standin listening on http://{args.host}:{port}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8799, help="0: any free port")
    parser.add_argument("--stt-delay-ms", type=float, default=150.0)
    parser.add_argument("--tts-delay-ms", type=float, default=150.0, help="to the first byte")
    parser.add_argument("--tts-speed", type=float, default=4.0, help="times real time; 0: unpaced")
    parser.add_argument("--llm-delay-ms", type=float, default=300.0, help="to the first token")
    parser.add_argument("--llm-reply", default=DEFAULT_LLM_REPLY)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
