"""SIP over TCP and TLS (`sip.listen: [udp:..., tcp:..., tls:...]`) from real peers: sipp calling
over TCP, baresip over TLS hearing the agent (and with SRTP, nothing of either side's speech on
the wire), a TLS client showing (or not) a certificate, a certificate renewed under a running
server, and what a scanner or a broken peer can send to the connection ports while a call goes
on beside it."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.support.baresip import Baresip, write_line
from tests.support.configs import QUICK_VOICE, default_config_with, serving
from tests.support.live_calls import CallAudit, new_pipeline, recorded, words_in
from tests.support.sipp import run_sipp, scenario
from tests.support.tls import CertificateAuthority, Issued
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.gateways import sip_streams
from voice_agent.gateways.sip import SipGateway
from voice_agent.server.app import VoiceServer
from voice_agent.sip.media import RtpSession
from voice_agent.sip.message import SipMessage, parse_message

pytestmark = pytest.mark.asyncio(loop_scope="module")
AUDIO = Path(__file__).resolve().parent / "fixtures" / "audio"
LISTEN = ["127.0.0.1:0", "tcp:127.0.0.1:0", "tls:127.0.0.1:0"]


class Tls:
    def __init__(self, folder: Path) -> None:
        self.ca = CertificateAuthority(folder / "ca")
        self.server: Issued = self.ca.issue("server")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return Tls(tmp_path_factory.mktemp("tls"))


def tls_section(tls: Tls, **extra: Any) -> dict[str, Any]:
    return {"certificate": str(tls.server.certificate), "key": str(tls.server.key), **extra}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory, tls: Tls) -> AsyncIterator[VoiceServer]:
    folder = tmp_path_factory.mktemp("sip-streams")
    # Piper's voice: what baresip records is transcribed, and Whisper reads eSpeak's poorly.
    voice = {"stt": {"provider": "pocketsphinx"}, "tts": {"provider": "piper"}}
    config = default_config_with(folder, voice=voice, sip={"tls": tls_section(tls)})
    async for voice_server in serving(config, sip=LISTEN):
        yield voice_server


def gateway_of(server: VoiceServer) -> SipGateway:
    assert server.sip is not None
    return server.sip


def port(server: VoiceServer, transport: str) -> int:
    return gateway_of(server).stream_ports[transport]


def options(transport: str, sent_by: str, call_id: str = "probe-1") -> bytes:
    lines = [
        "OPTIONS sip:probe@127.0.0.1 SIP/2.0",
        f"Via: SIP/2.0/{transport} {sent_by};branch=z9hG4bK-{call_id}",
        "Max-Forwards: 70",
        "From: <sip:probe@127.0.0.1>;tag=p1",
        "To: <sip:probe@127.0.0.1>",
        f"Call-ID: {call_id}",
        "CSeq: 1 OPTIONS",
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_message(reader: asyncio.StreamReader) -> SipMessage:
    """One response off a connection (these carry no body)."""
    async with asyncio.timeout(10):
        data = await reader.readuntil(b"\r\n\r\n")
    return parse_message(data)


def client_context(tls: Tls, certificate: Issued | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls.ca.certificate))
    if certificate is not None:
        context.load_cert_chain(str(certificate.certificate), str(certificate.key))
    return context


async def closed_by_server(reader: asyncio.StreamReader, timeout_s: float = 15) -> bytes:
    """What the server sent before closing the connection (it must close it)."""
    async with asyncio.timeout(timeout_s):
        try:
            return await reader.read()
        except ConnectionError:
            return b""  # closed with a reset: closed all the same


async def last_call(server: VoiceServer) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        listing = (await http.get(f"http://127.0.0.1:{server.port}/calls")).json()
        latest = listing["calls"][0]["call_id"]
        call: dict[str, Any] = (
            await http.get(f"http://127.0.0.1:{server.port}/calls/{latest}")
        ).json()
        return call


# ---- calls -----------------------------------------------------------------------------------


async def test_sipps_stock_caller_over_tcp_is_answered_and_hangs_up(
    server: VoiceServer, tmp_path: Path
) -> None:
    """sipp's `uac` with `-t t1`: one TCP connection carries the INVITE, the ACK and the BYE;
    the server's answers come back on it and its Contact names TCP."""
    target = f"127.0.0.1:{port(server, 'TCP')}"
    result = await run_sipp(target, tmp_path, stock="uac", extra=["-t", "t1", "-d", "3000"])
    assert result.ok, result.stderr + result.messages
    assert "TCP message received" in result.messages and "UDP message" not in result.messages
    assert ";transport=tcp>" in result.messages  # the 200's Contact
    call = await last_call(server)
    assert call["end_reason"] == "caller hung up"
    assert call["transport"] == "sip"


async def test_session_timers_over_tcp_a_422_then_a_refresh_on_the_connection(
    server: VoiceServer, tmp_path: Path
) -> None:
    """tests/test_sip_calls.py's session-timer caller over `-t t1`: the 422, the second
    INVITE, the UPDATE refresh and the BYE all on one connection, each 200 carrying the interval
    with the caller as refresher (sipp's checks)."""
    target = f"127.0.0.1:{port(server, 'TCP')}"
    xml = scenario("session_timer", tmp_path, interval="600", pause_ms="500")
    result = await run_sipp(target, tmp_path, scenario_file=xml, extra=["-t", "t1"])
    assert result.ok, result.stderr + result.messages
    assert "UDP message" not in result.messages
    assert "SIP/2.0 422" in result.messages
    call = await last_call(server)
    assert call["end_reason"] == "caller hung up"


async def test_baresip_calls_over_tls_and_hears_the_agent(
    server: VoiceServer, tls: Tls, tmp_path: Path
) -> None:
    """baresip, trusting the tests' CA, dials `;transport=tls`: the greeting it recorded is
    the agent's, transcribed."""
    phone = Baresip(tmp_path, trust=tls.ca.certificate)
    await phone.start()
    try:
        known = set(server.pipelines)
        await phone.dial(f"sip:booking@127.0.0.1:{port(server, 'TLS')};transport=tls")
        pipeline = await new_pipeline(server, known)
        await CallAudit(pipeline).until("agent_utterance")  # the greeting, played out
        connections = gateway_of(server).connections
        assert connections is not None and len(connections) >= 1
        await phone.hang_up()
        await asyncio.wait_for(pipeline.finished.wait(), 15)
    finally:
        await phone.close()
    assert (await last_call(server))["end_reason"] == "caller hung up"
    (said,) = await words_in(recorded(phone.heard()))
    assert "thanks for calling bella vista" in said, said


async def test_baresip_over_tls_with_srtp_required_talks_and_nothing_is_in_the_clear(
    server: VoiceServer, tls: Tls, tmp_path: Path
) -> None:
    """baresip with `mediaenc=srtp-mand` (RTP/SAVP, AES_CM_128_HMAC_SHA1_80) says its line and
    hears the greeting. Every packet both ways is tapped where it meets the socket: decoded as
    G.711, what the wire carried holds neither the agent's words nor the caller's, while the
    recording and the server's speech recognition, behind SRTP, hold them."""
    phone = Baresip(tmp_path, trust=tls.ca.certificate, media_encryption="srtp-mand")
    line = write_line(tmp_path / "book.wav", ulaw_decode((AUDIO / "joe_book1.ulaw").read_bytes()))
    wire_out: list[bytes] = []
    wire_in: list[bytes] = []
    await phone.start()
    try:
        known = set(server.pipelines)
        await phone.dial(f"sip:booking@127.0.0.1:{port(server, 'TLS')};transport=tls")
        pipeline = await new_pipeline(server, known)
        (live,) = [c for c in gateway_of(server).calls.values() if c.pipeline is pipeline]
        assert live.media is not None
        tap(live.media, wire_out, wire_in)
        events = CallAudit(pipeline)
        await events.until("agent_utterance")  # the greeting, played out
        await phone.say(line)
        heard = await events.until("user_utterance")
        await phone.hang_up()
        await asyncio.wait_for(pipeline.finished.wait(), 15)
    finally:
        await phone.close()
    call = await last_call(server)
    (report,) = [e for e in call["audit"] if e["type"] == "rtp"]
    assert report["srtp"] == "AES_CM_128_HMAC_SHA1_80", report
    assert report["srtp_unauthentic"] == 0 and report["received"] > 100, report
    assert "table" in heard.data["text"], heard.data
    assert len(wire_out) > 100 and len(wire_in) > 100
    said, agent_on_wire, caller_on_wire = await words_in(
        recorded(phone.heard()), as_audio(wire_out), as_audio(wire_in)
    )
    assert "bella vista" in said, said
    assert "bella vista" not in agent_on_wire and "calling" not in agent_on_wire, agent_on_wire
    assert "table" not in caller_on_wire and "tomorrow" not in caller_on_wire, caller_on_wire


def tap(media: RtpSession, sent: list[bytes], received: list[bytes]) -> None:
    """Record each packet as it leaves for the socket and as it comes from it."""
    next_packet, receive = media.next_packet, media.receive

    def sending(now_ms: float) -> tuple[bytes | None, list[str]]:
        packet, heard = next_packet(now_ms)
        if packet is not None:
            sent.append(packet)
        return packet, heard

    def receiving(data: bytes, source: tuple[str, int], now_ms: float) -> str | None:
        received.append(data)
        return receive(data, source, now_ms)

    media.next_packet = sending  # type: ignore[method-assign]
    media.receive = receiving  # type: ignore[method-assign]


def as_audio(packets: list[bytes]) -> bytes:
    """The packets' payloads (past the 12-byte RTP header) read as mu-law: 8 kHz PCM."""
    return ulaw_decode(b"".join(packet[12:172] for packet in packets))


# ---- TLS: what a client is shown and must show -------------------------------------------------


async def test_an_options_probe_over_tls_is_answered_on_its_connection(
    server: VoiceServer, tls: Tls
) -> None:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port(server, "TLS"), ssl=client_context(tls), server_hostname="127.0.0.1"
    )
    try:
        writer.write(options("TLS", "127.0.0.1:1"))  # a Via port nobody listens on
        response = await read_message(reader)
        assert response.status == 200 and response.vias[0].transport == "TLS"
        writer.write(b"\r\n\r\n")  # RFC 5626's keep-alive ping
        async with asyncio.timeout(10):
            assert await reader.readexactly(2) == b"\r\n"
    finally:
        writer.close()


async def test_with_verify_client_only_a_certificate_the_ca_signed_gets_in(
    tls: Tls, tmp_path: Path
) -> None:
    config = default_config_with(
        tmp_path,
        voice=QUICK_VOICE,
        sip={"tls": tls_section(tls, ca=str(tls.ca.certificate), verify_client=True)},
    )
    stranger_ca = CertificateAuthority(tmp_path / "other-ca")
    async for strict in serving(config, sip=["tls:127.0.0.1:0"]):
        where = ("127.0.0.1", port(strict, "TLS"))
        for shown in (None, stranger_ca.issue("stranger", server=False)):
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                reader, writer = await asyncio.open_connection(
                    *where, ssl=client_context(tls, shown), server_hostname="127.0.0.1"
                )
                try:
                    # TLS 1.3 reports a refused certificate at the first read, not the handshake.
                    writer.write(options("TLS", "127.0.0.1:1"))
                    await read_message(reader)
                finally:
                    writer.close()
        pbx = tls.ca.issue("pbx", server=False, folder=tmp_path)
        reader, writer = await asyncio.open_connection(
            *where, ssl=client_context(tls, pbx), server_hostname="127.0.0.1"
        )
        writer.write(options("TLS", "127.0.0.1:1"))
        assert (await read_message(reader)).status == 200
        writer.close()


async def test_a_renewed_certificate_is_served_without_a_restart(
    server: VoiceServer, tls: Tls, tmp_path: Path
) -> None:
    """certbot's way: new files written over the old ones; the next handshakes show it."""

    async def served_name() -> str:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port(server, "TLS"), ssl=client_context(tls), server_hostname="127.0.0.1"
        )
        try:
            peer = writer.get_extra_info("peercert")
            return str(dict(item[0] for item in peer["subject"])["commonName"])
        finally:
            writer.close()

    assert await served_name() == "server"
    renewed = tls.ca.issue("renewed", folder=tmp_path)
    tls.server.certificate.write_bytes(renewed.certificate.read_bytes())
    tls.server.key.write_bytes(renewed.key.read_bytes())
    async with asyncio.timeout(15):
        while await served_name() != "renewed":  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # a condition wait: until the watcher has loaded it


# ---- what a scanner or a broken peer sends --------------------------------------------------


async def test_junk_on_the_connection_ports_closes_only_its_connection(
    server: VoiceServer, tls: Tls, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Each of these gets its connection closed, no log line above INFO, and a call over UDP
    goes on beside them to its end."""
    monkeypatch.setattr(sip_streams, "READ_TIMEOUT_S", 1.0)  # the slow ones: closed sooner
    caplog.set_level(logging.INFO)
    gateway = gateway_of(server)
    assert gateway.connections is not None
    before = dict(gateway.connections.closed_for_cause)
    call = asyncio.ensure_future(
        run_sipp(f"127.0.0.1:{gateway.port}", tmp_path, stock="uac", extra=["-d", "6000"])
    )
    tcp = ("127.0.0.1", port(server, "TCP"))
    junk = [
        b"INVITE " + os.urandom(20_000),  # no end of the header section
        options("TCP", "127.0.0.1:1").replace(b"Content-Length: 0\r\n", b""),
        options("TCP", "127.0.0.1:1").replace(b"Content-Length: 0", b"Content-Length: 99999999"),
        options("TCP", "127.0.0.1:1")[:40],  # half a message, then nothing
        b"",  # connected, then nothing at all
    ]
    for data in junk:
        reader, writer = await asyncio.open_connection(*tcp)
        writer.write(data)
        assert await closed_by_server(reader) == b""
        writer.close()
    # A good message first, then a lie: the good one is answered before the close.
    reader, writer = await asyncio.open_connection(*tcp)
    lie = options("TCP", "x", "probe-2")[:-4] + b"\r\nl: 9\r\n\r\n"  # two lengths
    writer.write(options("TCP", "127.0.0.1:1") + lie)
    rest = await closed_by_server(reader)
    assert parse_message(rest[: rest.index(b"\r\n\r\n") + 4]).status == 200
    writer.close()
    # The TLS port: plain text instead of a handshake, and a handshake never finished.
    tls_port = port(server, "TLS")
    for data in (options("TLS", "127.0.0.1:1"), b"\x16\x03\x01\x00\x05hello"):
        reader, writer = await asyncio.open_connection("127.0.0.1", tls_port)
        writer.write(data)
        await closed_by_server(reader, timeout_s=20)
        writer.close()
    result = await call
    assert result.ok, result.stderr + result.messages
    closed = {
        kind: count - before.get(kind, 0)
        for kind, count in gateway.connections.closed_for_cause.items()
    }
    # The TLS port's junk never makes a connection: the handshake fails, or times out.
    assert closed == {"framing": 4, "slow": 2}, closed
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{server.port}/metrics")).text
    assert 'voice_agent_sip_connections_closed_total{reason="framing"}' in metrics
    assert "voice_agent_sip_connections " in metrics
    loud = [r for r in caplog.records if r.levelno > logging.INFO]
    assert loud == [], [r.getMessage() for r in loud]


async def test_a_thousand_idle_connections_leave_a_call_its_room(
    server: VoiceServer, tmp_path: Path
) -> None:
    """1,000 connections, each having sent its OPTIONS and holding on: all are answered, a
    call over TCP beside them completes, and each connection costs the server a bounded few
    kilobytes (its framer holds nothing between messages)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    gateway = gateway_of(server)
    assert gateway.connections is not None
    tcp = ("127.0.0.1", port(server, "TCP"))
    open_before = len(gateway.connections)
    peers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for index in range(1000):
            peers.append(await asyncio.open_connection(*tcp))
            peers[-1][1].write(options("TCP", "127.0.0.1:1", f"idle-{index}"))
        answers = await asyncio.gather(*(read_message(reader) for reader, _ in peers))
        assert {answer.status for answer in answers} == {200}
        assert len(gateway.connections) == open_before + 1000
        assert gateway.connections.pending_bytes == 0
        result = await run_sipp(
            f"127.0.0.1:{tcp[1]}", tmp_path, stock="uac", extra=["-t", "t1", "-d", "2000"]
        )
        assert result.ok, result.stderr + result.messages
    finally:
        for _, writer in peers:
            writer.close()
    async with asyncio.timeout(10):
        while len(gateway.connections) > open_before:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # a condition wait: until the server has seen them go
