"""Calls over SIP from a real peer: sipp (Debian's sip-tester) against `serve --sip` on
127.0.0.1, with its stock scenarios and ones written for these tests (tests/fixtures/sipp/).

The agent is the default one hearing with pocketsphinx's domain model, as in
tests/test_voice_e2e.py, so a caller's scripted line comes back word for word. sipp plays the
caller's audio from captures: its own (A-law speech, RFC 4733 digits) and ones written here
from the project's fixtures. baresip is the caller where the test reacts to the call as it
goes (a booking talked through, a backchannel over the greeting heard by Whisper as the
default agent ships it) and its recording of the agent is transcribed.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.support.baresip import Baresip, write_line
from tests.support.configs import GREETING, QUICK_VOICE, default_config_with, ended_call, serving
from tests.support.live_calls import CallAudit, new_pipeline, recorded, words_in
from tests.support.sipp import (
    PCAPS,
    SippResult,
    run_sipp,
    scenario,
    write_rtp_pcap,
)
from voice_agent.audio import read_wav
from voice_agent.audio.g711 import alaw_encode, ulaw_decode, ulaw_encode
from voice_agent.audio.resample import resample
from voice_agent.engines.tts.piper import default_voice_paths, load_voice
from voice_agent.server.app import VoiceServer
from voice_agent.sip.message import parse_message
from voice_agent.sip.sdp import parse_sdp

ROOT = Path(__file__).resolve().parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
GREETING_MS = 5000  # the greeting, spoken at QUICK_VOICE's pace, with room to spare
pytestmark = pytest.mark.asyncio(loop_scope="module")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="sipp plays captures through raw sockets: root only"
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    config = default_config_with(tmp_path_factory.mktemp("sip"), voice=QUICK_VOICE)
    async for voice_server in serving(config, sip=True):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def guarded(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """Digest credentials required; calls recorded."""
    folder = tmp_path_factory.mktemp("sip-auth")
    config = default_config_with(
        folder,
        voice=QUICK_VOICE,
        sip={"credentials": {"trunk": "sip_trunk_password"}},
        server={"recording": True, "data_dir": str(folder / "data")},
    )
    async for voice_server in serving(
        config, sip=True, secrets={"sip_trunk_password": "s3cret-pass"}
    ):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ringing(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """1.5 s of ringing (180) before the answer."""
    config = default_config_with(
        tmp_path_factory.mktemp("sip-ring"),
        voice=QUICK_VOICE,
        sip={"answer_after_ms": 1500},
    )
    async for voice_server in serving(config, sip=True):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def impatient(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """A call is ended after 2 s without RTP or RTCP from the caller."""
    config = default_config_with(
        tmp_path_factory.mktemp("sip-media-timeout"),
        voice=QUICK_VOICE,
        sip={"media_timeout_s": 2},
    )
    async for voice_server in serving(config, sip=True):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def piper_voiced(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The agent speaking with Piper's joe voice: what the caller records is transcribed, and
    Whisper tiny.en reads eSpeak's voice poorly (docs/performance.md)."""
    config = default_config_with(
        tmp_path_factory.mktemp("sip-piper"),
        voice={"stt": {"provider": "pocketsphinx"}, "tts": {"provider": "piper"}},
    )
    async for voice_server in serving(config, sip=True):
        yield voice_server


def target(server: VoiceServer) -> str:
    assert server.sip is not None
    return f"127.0.0.1:{server.sip.port}"


async def last_call(server: VoiceServer) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        page = (await http.get(f"http://127.0.0.1:{server.port}/calls?limit=1")).json()
    return await ended_call(server, page["calls"][0]["call_id"])


def messages(call: dict[str, Any], role: str) -> list[str | None]:
    return [m.get("content") for m in call["context"]["messages"] if m["role"] == role]


def audit(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in call["audit"] if e["type"] == kind]


def received(result: SippResult) -> list[Any]:
    """The SIP messages sipp received, parsed."""
    parsed = []
    for block in result.messages.split("UDP message received")[1:]:
        text = block.split(":\n", 1)[1].split("\n-------------")[0].strip("\n")
        data = text.replace("\r\n", "\n").replace("\n", "\r\n").encode()
        head, _, body = data.partition(b"\r\n\r\n")
        # The log drops the body's last line break: let the body run to the end instead.
        lines = [
            line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-length")
        ]
        parsed.append(parse_message(b"\r\n".join(lines) + b"\r\n\r\n" + body))
    return parsed


def speech_pcap(folder: Path, name: str, *, payload_type: int = 0) -> Path:
    """A fixture line as the caller's RTP, after half a second of the line's quiet (a phone
    sends audio all along; the line is not cut out of silence)."""
    path = folder / f"{name}.pcap"
    audio = (AUDIO / f"{name}.ulaw").read_bytes()
    write_rtp_pcap(path, audio, payload_type=payload_type, lead_in_ms=500)
    return path


async def test_sipps_stock_caller_is_answered_and_hangs_up(
    server: VoiceServer, tmp_path: Path
) -> None:
    """sipp's stock `uac`: PCMU offered, no RTP, BYE 3 s in, mid-greeting: the greeting is
    committed as far as it had been sent, no further, and the record names the dialog."""
    result = await run_sipp(target(server), tmp_path, stock="uac", extra=["-d", "3000"])
    assert result.ok, result.stderr + result.messages
    ok = next(m for m in received(result) if m.status == 200 and m.cseq[1] == "INVITE")
    answer = parse_sdp(ok.body)
    assert [c.name for c in answer.streams[0].codecs] == ["PCMU"]
    call = await last_call(server)
    assert call["transport"] == "sip"
    assert call["end_reason"] == "caller hung up"
    # The record names the SIP dialog it was, as sipp sent it.
    (dialog,) = audit(call, "sip")
    assert dialog["call_id"] == ok.call_id
    assert (dialog["direction"], dialog["peer"], dialog["codec"]) == (
        "inbound",
        "127.0.0.1",
        "PCMU",
    )
    greeting = audit(call, "agent_utterance")[0]
    assert greeting["generated"] == GREETING
    assert greeting["committed"] != GREETING and GREETING.startswith(greeting["committed"])
    assert len(greeting["committed"]) > 10


@needs_root
async def test_sipps_stock_pcap_caller_talks_in_a_law_and_presses_a_key(
    server: VoiceServer, tmp_path: Path
) -> None:
    """sipp's stock `uac_pcap`: PCMA and telephone-event 101 only; plays an A-law capture,
    then RFC 4733 digit 1, then hangs up. The key reaches the agent's dtmf trigger."""
    (tmp_path / "pcap").symlink_to(PCAPS)
    result = await run_sipp(target(server), tmp_path, stock="uac_pcap")
    assert result.ok, result.stderr + result.messages
    ok = next(m for m in received(result) if m.status == 200 and m.cseq[1] == "INVITE")
    codecs = [c.name for c in parse_sdp(ok.body).streams[0].codecs]
    assert codecs == ["PCMA", "TELEPHONE-EVENT"]
    call = await last_call(server)
    triggers = audit(call, "trigger")
    assert [t["function"] for t in triggers] == ["on_keypad"]


@needs_root
async def test_a_pcmu_caller_books_a_table_and_presses_a_key(
    server: VoiceServer, tmp_path: Path
) -> None:
    """The caller waits for the greeting, says its line, presses 0 and hangs up: the line is
    transcribed as said, the agent answers it, and the key reaches the trigger."""
    xml = scenario(
        "talk", tmp_path,
        before_ms=str(GREETING_MS - 500), speech=str(speech_pcap(tmp_path, "joe_book1")),
        talk_ms="7000", dtmf=str(PCAPS / "dtmf_2833_0.pcap"), after_ms="2000",
    )  # fmt: skip
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    call = await last_call(server)
    (rtp,) = audit(call, "rtp")
    assert rtp["received"] > 150 and rtp["lost"] == 0, rtp
    assert messages(call, "user")[0] == "i would like to book a table for two tomorrow at seven pm"
    assistant = messages(call, "assistant")
    assert assistant[0] == GREETING
    assert assistant[1] == "What name should I put the booking under?"
    assert [t["function"] for t in audit(call, "trigger")] == ["on_keypad"]
    assert call["end_reason"] == "caller hung up"


@needs_root
async def test_a_caller_that_moves_the_call_to_a_law_is_heard_and_answered_in_it(
    server: VoiceServer, tmp_path: Path
) -> None:
    """The call starts in PCMU; a second into the greeting the caller's re-INVITE offers PCMA
    only and is answered in it, and the caller then says its line in A-law: it is transcribed
    as said and answered, the agent's audio went on in A-law (no packet of another type)."""
    speech = tmp_path / "joe_book1_alaw.pcap"
    pcm, rate = read_wav(AUDIO / "joe_book1.wav")  # A-law from the recording, as a phone has it
    write_rtp_pcap(speech, alaw_encode(resample(pcm, rate, 8000)), payload_type=8, lead_in_ms=500)
    xml = scenario(
        "codec_change", tmp_path,
        before_ms="1000", talk_after_ms=str(GREETING_MS - 1500), speech=str(speech),
        talk_ms="7000",
    )  # fmt: skip
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    answers = [
        parse_sdp(m.body).streams[0].codecs[0].name
        for m in received(result)
        if m.status == 200 and m.cseq[1] == "INVITE"
    ]
    assert answers == ["PCMU", "PCMA"]
    call = await last_call(server)
    (rtp,) = audit(call, "rtp")
    assert rtp["codec"] == "PCMA" and rtp["other_payload"] == 0 and rtp["received"] > 150, rtp
    # A-law's quantisation is not mu-law's: pocketsphinx hears the end of this line differently
    # in it ("tomorrow thirty pm", so the agent asks for the time); the request itself comes
    # through, and the booking starts with its party size.
    heard = messages(call, "user")[0] or ""
    assert heard.startswith("i would like to book a table for two tomorrow"), heard
    assert call["state"]["party_size"] == 2, call["state"]


@needs_root
async def test_talking_over_the_greeting_commits_only_what_was_heard(
    server: VoiceServer, tmp_path: Path
) -> None:
    """Barge-in on SIP: the server owns the playout, so the committed greeting is what had
    been sent (less the jitter allowance) when the caller cut in: a prefix of it."""
    xml = scenario(
        "talk", tmp_path,
        before_ms="1500", speech=str(speech_pcap(tmp_path, "joe_book1")),
        talk_ms="8000", dtmf=str(PCAPS / "dtmf_2833_0.pcap"), after_ms="500",
    )  # fmt: skip
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    call = await last_call(server)
    greeting = audit(call, "agent_utterance")[0]
    assert greeting["generated"] == GREETING
    committed = messages(call, "assistant")[0] or ""
    assert committed and committed != GREETING and GREETING.startswith(committed)


def spoken_ulaw(text: str) -> bytes:
    """`text` in the Piper joe voice the fixtures use, as 8 kHz mu-law. Piper's noise is off:
    with it each run draws a different rendering, and one in four or so of the word "goodbye"
    was heard as something else, so the test's line would change from run to run."""
    from piper import SynthesisConfig

    voice = load_voice(*default_voice_paths())
    quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text, syn_config=quiet))
    return ulaw_encode(resample(pcm, voice.config.sample_rate, 8000))


@needs_root
async def test_the_agent_hangs_up_with_a_bye_after_the_caller_says_goodbye(
    server: VoiceServer, tmp_path: Path
) -> None:
    """The goodbye route's end_call: the agent says its line, then the server sends BYE."""
    pcap = tmp_path / "goodbye.pcap"
    line = await asyncio.to_thread(spoken_ulaw, "Goodbye.")  # off the loop the server runs on
    write_rtp_pcap(pcap, line, payload_type=0, lead_in_ms=500)
    xml = scenario(
        "server_bye", tmp_path,
        before_ms=str(GREETING_MS - 500), speech=str(pcap), bye_timeout_ms="20000",
    )  # fmt: skip
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    bye = next(m for m in received(result) if m.method == "BYE")
    assert bye.uri == "sip:sipp@127.0.0.1:" + bye.uri.rsplit(":", 1)[1]  # the caller's Contact
    call = await last_call(server)
    assert messages(call, "user") == ["goodbye"]
    assert messages(call, "assistant")[-1] == "Thanks for calling Bella Vista. Goodbye!"
    assert call["end_reason"] != "caller hung up"


async def test_a_call_without_an_offer_gets_ours_and_answers_in_the_ack(
    server: VoiceServer, tmp_path: Path
) -> None:
    xml = scenario("delayed_offer", tmp_path, talk_ms="2000")
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    ok = next(m for m in received(result) if m.status == 200 and m.cseq[1] == "INVITE")
    offer = parse_sdp(ok.body)
    assert [c.name for c in offer.streams[0].codecs] == ["PCMU", "PCMA", "TELEPHONE-EVENT"]
    call = await last_call(server)
    assert call["transport"] == "sip" and call["end_reason"] == "caller hung up"


async def test_hold_and_resume_are_answered_in_the_dialog(
    server: VoiceServer, tmp_path: Path
) -> None:
    xml = scenario("hold", tmp_path, before_ms="1000", hold_ms="1500", after_ms="1000")
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    answers = [
        parse_sdp(m.body).streams[0].direction
        for m in received(result)
        if m.status == 200 and m.cseq[1] == "INVITE"
    ]
    assert answers == ["sendrecv", "recvonly", "sendrecv"]


async def test_a_caller_asking_for_session_timers_is_told_the_minimum_then_refreshes(
    server: VoiceServer, tmp_path: Path
) -> None:
    """RFC 4028 as a trunk's SBC does it: 30 s is refused with 422 and Min-SE 90, the INVITE
    asked again with 600 s is answered with it (refresher=uac, Require: timer: sipp checks),
    the caller's UPDATE refresh gets 200 with the interval, and the call ends as the caller
    hangs up, not as the timer would end it."""
    xml = scenario("session_timer", tmp_path, interval="600", pause_ms="1000")
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    statuses = [(m.status, m.cseq[1]) for m in received(result) if m.status != 100]
    assert statuses == [(422, "INVITE"), (200, "INVITE"), (200, "UPDATE"), (200, "BYE")]
    call = await last_call(server)
    assert call["end_reason"] == "caller hung up"


async def test_a_caller_gone_quiet_is_hung_up_after_the_media_timeout(
    impatient: VoiceServer, tmp_path: Path
) -> None:
    """No RTP and no RTCP after the ACK (a phone that lost its network sends no BYE either):
    the server hangs up at `sip.media_timeout_s` and files the call as a media timeout."""
    xml = scenario("silent_caller", tmp_path, bye_timeout_ms="15000")
    result = await run_sipp(target(impatient), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    call = await last_call(impatient)
    assert call["end_reason"] == "media timeout: no RTP or RTCP for 2 s"
    assert call["outcome"] == "error"
    started = next(e["t"] for e in call["audit"] if e["type"] == "sip")
    ended = next(e["t"] for e in call["audit"] if e["type"] == "rtp")
    assert 1.9 <= ended - started < 10  # not at once: after the 2 s of quiet


async def test_a_trunks_options_probe_is_answered(server: VoiceServer, tmp_path: Path) -> None:
    result = await run_sipp(target(server), tmp_path, scenario_file=scenario("options", tmp_path))
    assert result.ok, result.stderr + result.messages
    (ok,) = received(result)
    assert ok.status == 200 and "INVITE" in (ok.get("allow") or "")


async def test_the_caller_hangs_up_while_it_rings(ringing: VoiceServer, tmp_path: Path) -> None:
    """CANCEL before the answer: 200 for the CANCEL, 487 for the INVITE, no call started."""
    async with httpx.AsyncClient() as http:
        before = (await http.get(f"http://127.0.0.1:{ringing.port}/calls")).json()["total"]
    xml = scenario("cancel", tmp_path)
    result = await run_sipp(target(ringing), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    statuses = [m.status for m in received(result)]
    assert 487 in statuses
    async with httpx.AsyncClient() as http:
        after = (await http.get(f"http://127.0.0.1:{ringing.port}/calls")).json()["total"]
    assert after == before


async def test_a_trunk_with_the_right_password_gets_in(
    guarded: VoiceServer, tmp_path: Path
) -> None:
    xml = scenario("auth", tmp_path, talk_ms="1000")
    result = await run_sipp(
        target(guarded), tmp_path, scenario_file=xml, extra=["-au", "trunk", "-ap", "s3cret-pass"]
    )
    assert result.ok, result.stderr + result.messages
    call = await last_call(guarded)
    assert call["transport"] == "sip"
    (recording,) = audit(call, "recording")  # recorded like any other call
    assert recording.get("path") and not recording.get("error"), recording


async def test_a_wrong_password_is_challenged_again_and_starts_no_call(
    guarded: VoiceServer, tmp_path: Path
) -> None:
    async with httpx.AsyncClient() as http:
        before = (await http.get(f"http://127.0.0.1:{guarded.port}/calls")).json()["total"]
    xml = scenario("auth_refused", tmp_path)
    result = await run_sipp(
        target(guarded), tmp_path, scenario_file=xml, extra=["-au", "trunk", "-ap", "guess"]
    )
    assert result.ok, result.stderr + result.messages
    async with httpx.AsyncClient() as http:
        after = (await http.get(f"http://127.0.0.1:{guarded.port}/calls")).json()["total"]
    assert after == before


class _Probe:
    """A UDP socket of the test's, sending to the server and reading what it answers."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    async def exchange(
        self, data: bytes, to: tuple[str, int], wait_s: float = 1.0, tries: int = 3
    ) -> bytes | None:
        """Send `data`, again as a SIP client would if nothing comes back (UDP may drop it);
        the first datagram back, or None."""
        loop = asyncio.get_running_loop()
        for _ in range(tries):
            await loop.sock_sendto(self.sock, data, to)
            try:
                return await asyncio.wait_for(loop.sock_recv(self.sock, 70_000), wait_s / tries)
            except TimeoutError:
                continue
        return None

    def close(self) -> None:
        self.sock.close()


def _request(method: str, port: int, *, call_id: str, to_tag: str = "", body: bytes = b"",
             content_type: str = "application/sdp") -> bytes:  # fmt: skip
    tag = f";tag={to_tag}" if to_tag else ""
    head = (
        f"{method} sip:booking@127.0.0.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK{random.getrandbits(40):x};rport\r\n"
        f"From: <sip:fuzz@127.0.0.1:{port}>;tag=f{random.getrandbits(24):x}\r\n"
        f"To: <sip:booking@127.0.0.1>{tag}\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 7 {method}\r\nMax-Forwards: 70\r\n"
        f"Contact: <sip:fuzz@127.0.0.1:{port}>\r\n"
        + (f"Content-Type: {content_type}\r\n" if body else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def test_a_call_goes_on_while_its_ports_are_fuzzed(
    server: VoiceServer, tmp_path: Path
) -> None:
    """Garbage, truncated and oversized datagrams, bad SDP, unknown methods, wrong Call-IDs and
    tags, stray responses, RTP from a stranger: each gets the answer RFC 3261 asks for or is
    dropped, the call in progress completes, and the server keeps no state for any of it."""
    gateway = server.sip
    assert gateway is not None and gateway.uas is not None
    sip_addr = ("127.0.0.1", gateway.port)
    call = asyncio.ensure_future(
        run_sipp(target(server), tmp_path, stock="uac", extra=["-d", "8000"])
    )
    async with asyncio.timeout(10):
        while not any(c.media is not None for c in gateway.calls.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # a condition wait: until the call's media is set up
    (live,) = gateway.calls.values()
    assert live.port is not None
    cached_before = len(gateway.uas.responder.responses)
    probe, noise, stranger = _Probe(), _Probe(), _Probe("127.0.0.2")
    rng = random.Random(17)
    try:
        invite = _request("INVITE", probe.port, call_id="fuzz-1", body=b"v=0\r\nm=audio")
        stray = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 1.2.3.4;branch=z9hG4bKnope\r\n\r\n"

        async def status(data: bytes) -> int | None:
            reply = await probe.exchange(data, sip_addr)
            return parse_message(reply).status if reply else None

        loop = asyncio.get_running_loop()
        # The call's RTP port: a stranger's packets and garbage are not heard.
        rtp = struct.pack(">BBHII", 0x80, 0, 1, 160, 0xBAD) + b"\x00" * 160
        for _ in range(50):
            await loop.sock_sendto(stranger.sock, rtp, ("127.0.0.1", live.port))
            await loop.sock_sendto(noise.sock, rng.randbytes(40), ("127.0.0.1", live.port))
        # Unreadable: dropped, no answer to a sender that may not exist.
        for _ in range(300):
            await loop.sock_sendto(probe.sock, rng.randbytes(rng.randrange(1, 1500)), sip_addr)
        await loop.sock_sendto(probe.sock, invite[: len(invite) // 3], sip_addr)  # truncated
        await loop.sock_sendto(probe.sock, b"INVITE " + b"x" * 65_000, sip_addr)  # oversized
        await loop.sock_sendto(probe.sock, stray, sip_addr)  # a response to nothing
        assert await status(_request("OPTIONS", probe.port, call_id="fuzz-0")) == 200  # first
        # Readable, refused as the RFC says.
        assert await status(invite) == 400  # SDP that does not read
        assert await status(_request("FROB", probe.port, call_id="fuzz-2")) == 501
        assert await status(_request("BYE", probe.port, call_id="no-such-call")) == 481
        assert await status(_request("BYE", probe.port, call_id=live.call_id, to_tag="x")) == 481
        assert await status(_request("INFO", probe.port, call_id=live.call_id, to_tag="y")) == 481
        not_sdp = _request(
            "INVITE", probe.port, call_id="fuzz-3", body=b"hi", content_type="text/plain"
        )
        assert await status(not_sdp) == 415
        assert not live.ended.done()
    finally:
        for sock in (probe, noise, stranger):
            sock.close()
    result = await call
    assert result.ok, result.stderr + result.messages
    record = await last_call(server)
    assert record["end_reason"] == "caller hung up"
    (report,) = audit(record, "rtp")
    assert report["foreign"] == 50 and report["received"] == 0, report
    # Nothing kept for the refusals: only sipp's calls, ended, lingering for retransmissions.
    assert all(c.state == "ended" for c in gateway.uas.calls.values())
    assert not [i for i in gateway.uas.calls if i.startswith("fuzz") or i == "no-such-call"]
    # The cached responses: one a readable non-INVITE request (OPTIONS, BYE, INFO) and sipp's BYE.
    assert len(gateway.uas.responder.responses) <= cached_before + 5


async def test_a_booking_conversation_from_baresip_heard_as_the_caller_hears_it(
    piper_voiced: VoiceServer, tmp_path: Path
) -> None:
    """baresip calls, presses 0 (the opening hours), books a table, cuts the read-back short
    with its "yes", says "no thanks" and is hung up on; what it recorded of the agent is
    transcribed and holds the agent's lines, and the context holds only the heard part of the
    read-back."""
    server = piper_voiced
    phone = Baresip(tmp_path)
    lines = {
        name: write_line(
            tmp_path / f"{name}.wav", ulaw_decode((AUDIO / f"{name}.ulaw").read_bytes())
        )
        for name in ("joe_book1", "joe_book2", "joe_book3", "joe_book4", "joe_book5")
    }
    await phone.start()
    try:
        known = set(server.pipelines)
        await phone.dial(f"sip:booking@{target(server)}")
        pipeline = await new_pipeline(server, known)
        audit_events = CallAudit(pipeline)
        await audit_events.until("agent_utterance")  # the greeting, played out
        await phone.press("0")
        await audit_events.until("agent_utterance")  # the opening hours
        for name in ("joe_book1", "joe_book2"):
            await phone.say(lines[name])
            await audit_events.until("agent_utterance")
        await phone.say(lines["joe_book3"])  # the phone number: the agent reads the booking back
        await audit_events.until("turn_metrics")  # its first audio is out
        await asyncio.sleep(2.0)  # the caller listens to two seconds of it, then says yes
        await phone.say(lines["joe_book4"])
        read_back = await audit_events.until("agent_utterance")
        await audit_events.until("agent_utterance")  # the booking is made
        await phone.say(lines["joe_book5"])
        try:
            await asyncio.wait_for(pipeline.finished.wait(), 30)
        except TimeoutError:
            heard = [e.data for e in pipeline.session.audit.events if e.type == "user_utterance"]
            raise AssertionError(f"the agent did not end the call; it heard {heard}") from None
        # The pipeline is done once the goodbye's mark is heard; the phone still plays it out
        # until the BYE a second later: its recording is whole once the call closed there.
        await phone.wait_event("CALL_CLOSED")
    finally:
        await phone.close()
    call = await last_call(server)
    assert call["end_reason"] == "agent ended the call"
    assert [t["function"] for t in audit(call, "trigger")] == ["on_keypad"]
    assert call["state"]["phone"] == "88005553535" and call["state"]["party_size"] == 2
    (said,) = await words_in(recorded(phone.heard()))
    assert read_back.data["interrupted"], read_back.data
    committed = read_back.data["committed"]
    assert committed and read_back.data["generated"].startswith(committed)
    assert committed in [m for m in messages(call, "assistant") if m]
    for expected in ("thanks for calling bella vista", "open every day", "what name", "goodbye"):
        assert expected in said, said
    # RTCP both ways with a real stack (baresip's libre): its reports reached us and named our
    # stream, and its echo of our sender report's time gave the round trip.
    (rtp,) = audit(call, "rtp")
    assert rtp["rtcp_received"] > 0 and rtp["rtcp_sent"] > 0 and rtp["rtcp_unreadable"] == 0
    assert rtp["caller_reported_lost"] is not None
    assert rtp["round_trip_ms"] is not None and 0 <= rtp["round_trip_ms"] < 1000


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def as_shipped(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent hearing with Whisper tiny.en, as shipped, and speaking with Piper's joe
    voice so that what baresip recorded of it can be transcribed."""
    config = default_config_with(
        tmp_path_factory.mktemp("sip-whisper"),
        voice={"stt": {"provider": "whisper", "model": "tiny.en"}, "tts": {"provider": "piper"}},
    )
    async for voice_server in serving(config, sip=True):
        yield voice_server


@pytest.mark.parametrize("word", ["uh-huh", "yeah"])
async def test_a_backchannel_over_the_greeting_leaves_it_heard_whole_once(
    as_shipped: VoiceServer, tmp_path: Path, word: str
) -> None:
    """Over SIP, where the server holds the agent's audio: a drawn-out "uh-huh" (0.6 to 1.3 s)
    while the agent greets pauses it and it goes on from where it stopped; baresip's recording
    has the greeting once, nothing of it said twice, and only the greeting is committed."""
    server = as_shipped
    phone = Baresip(tmp_path)
    backchannel = ulaw_decode((AUDIO / f"joe_bclong-{word}.ulaw").read_bytes())
    line = write_line(tmp_path / "backchannel.wav", backchannel)
    await phone.start()
    try:
        known = set(server.pipelines)
        await phone.dial(f"sip:booking@{target(server)}")
        pipeline = await new_pipeline(server, known)
        audit_events = CallAudit(pipeline)
        # The greeting (about six seconds) starts as the call does: the caller listens to a
        # little of it, then says "uh-huh".
        await asyncio.sleep(2.0)
        await phone.say(line)
        greeting = await audit_events.until("agent_utterance")
        await phone.hang_up()
        await asyncio.wait_for(pipeline.finished.wait(), 15)
    finally:
        await phone.close()
    call = await last_call(server)
    assert greeting.data["committed"] == greeting.data["generated"], greeting.data
    assert messages(call, "assistant") == [greeting.data["generated"]]
    assert messages(call, "user") == []
    dropped = [e["reason"] for e in audit(call, "user_utterance_dropped")]
    assert dropped == ["backchannel"] or dropped == ["noise"], dropped
    assert len(audit(call, "false_interruption")) == 1
    (said,) = await words_in(recorded(phone.heard()))
    assert said.count("bella vista") == 1 and said.count("what would you like") == 1, said
