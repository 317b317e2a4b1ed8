"""The agent's voice as the WebRTC track encodes it: what a browser decodes is the same speech,
its silence costs no encoding, and the packets keep RTP time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.speech_eval import transcribe
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.engines.stt import SttConfig, make_stt
from voice_agent.engines.stt.scoring import spoken_words

pytest.importorskip("aiortc")

import av
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame

from voice_agent.gateways.webrtc_opus import SETTLE_FRAMES, OpusVoice

AUDIO = Path(__file__).resolve().parent / "fixtures" / "audio"
RATE = 16000
FRAME = RATE * 2 // 50  # 20 ms of PCM16


def fixture(name: str) -> bytes:
    pcm, rate = read_wav(AUDIO / f"{name}.wav")
    assert rate == RATE
    return pcm


def frames(pcm: bytes) -> list[bytes]:
    pcm += bytes(-len(pcm) % FRAME)
    return [pcm[i : i + FRAME] for i in range(0, len(pcm), FRAME)]


def browser_decode(packets: list[av.Packet]) -> bytes:
    """What a browser plays: aiortc's Opus decoder (48 kHz stereo, as negotiated), to 16 kHz
    mono."""
    decoder = OpusDecoder()
    out = bytearray()
    for packet in packets:
        assert packet.pts is not None
        timestamp = packet.pts * 48000 // RATE
        for frame in decoder.decode(JitterFrame(data=bytes(packet), timestamp=timestamp)):
            assert isinstance(frame, av.AudioFrame)
            stereo = frame.to_ndarray().reshape(-1, 2)
            out += stereo[:, 0].astype("<i2").tobytes()
    return resample(bytes(out), 48000, RATE)


def encode(voice: OpusVoice, pcm: bytes, start: int, *, speech: bool) -> list[av.Packet]:
    return [
        voice.packet(frame, start + i * (FRAME // 2), speech=speech)
        for i, frame in enumerate(frames(pcm))
    ]


@pytest.mark.asyncio
async def test_the_browser_hears_the_words_the_agent_said() -> None:
    line = fixture("joe_book1")
    voice = OpusVoice(RATE)
    heard = browser_decode(encode(voice, line, 0, speech=True))
    stt = make_stt(SttConfig(provider="whisper", model="tiny.en", processes=1))
    try:
        sent_words = await transcribe(stt, line)
        heard_words = await transcribe(stt, heard)
    finally:
        await stt.aclose()
    assert (
        " ".join(spoken_words(sent_words))
        == "i would like to book a table for two tomorrow at seven pm"
    )
    assert spoken_words(heard_words) == spoken_words(sent_words)


def test_silence_after_speech_fades_out_then_costs_no_encoding() -> None:
    voice = OpusVoice(RATE)
    line = fixture("joe_book1")
    spoken = encode(voice, line, 0, speech=True)
    encoded = voice.encoded
    quiet = encode(voice, bytes(FRAME * 100), len(spoken) * FRAME // 2, speech=False)
    # The encoder's own fade-out for a few frames, then its silence packet repeated.
    assert voice.encoded == encoded + SETTLE_FRAMES
    assert len({bytes(p) for p in quiet[SETTLE_FRAMES:]}) == 1
    played = np.frombuffer(browser_decode(spoken + quiet), dtype="<i2")
    tail = played[len(line) // 2 + RATE // 5 :]  # from 200 ms after the line's end
    assert np.abs(tail).max() <= 8, "the silence packets decode to something audible"


def test_a_call_that_starts_in_silence_encodes_only_its_first_frames() -> None:
    voice = OpusVoice(RATE)
    quiet = encode(voice, bytes(FRAME * 100), 0, speech=False)
    assert voice.encoded == SETTLE_FRAMES
    assert np.abs(np.frombuffer(browser_decode(quiet), dtype="<i2")).max() <= 8


def test_packets_carry_the_tracks_rtp_time() -> None:
    voice = OpusVoice(RATE)
    packets = encode(voice, fixture("joe_book1")[: FRAME * 10], 320 * 7, speech=True)
    packets += encode(voice, bytes(FRAME * 10), 320 * 17, speech=False)
    assert [p.pts for p in packets] == [320 * (7 + i) for i in range(20)]
    assert {p.time_base for p in packets} == {voice.time_base}
    # 20 ms each, as the RTP time says: a browser plays every packet for 960 samples at 48 kHz.
    decoder = OpusDecoder()
    for packet in packets:
        (frame,) = decoder.decode(JitterFrame(data=bytes(packet), timestamp=0))
        assert isinstance(frame, av.AudioFrame) and frame.samples == 960
