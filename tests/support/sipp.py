"""sipp (Debian's sip-tester) as the tests' SIP peer: running a scenario against the server,
and writing the RTP captures its `play_pcap_audio` plays, from the project's audio fixtures.

sipp replays a capture's RTP payloads at the capture's own timing, rewriting the addresses to
the call's; so a capture of 20 ms packets of a caller's line is that caller talking.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

SIPP = shutil.which("sipp")
PCAPS = Path("/usr/share/sip-tester")  # sip-tester's captures: g711a.pcap, dtmf_2833_*.pcap
FRAME_BYTES = 160  # 20 ms of G.711 at 8 kHz
SCENARIOS = Path(__file__).resolve().parent.parent / "fixtures" / "sipp"


@dataclass(frozen=True)
class SippResult:
    returncode: int
    stdout: str
    stderr: str
    messages: str  # sipp's -trace_msg log: every SIP message sent and received

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def free_udp_port(address: str = "127.0.0.1") -> int:
    """A port free for UDP and for TCP too: sipp's `-t t1` binds its main socket's number over
    TCP, and a test holding many TCP connections has ephemeral ports a UDP-only check misses."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
            port: int = sock.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as stream:
            try:
                stream.bind((address, port))
            except OSError:
                continue  # taken over TCP: another
        return port


def scenario(name: str, folder: Path, **values: str) -> Path:
    """tests/fixtures/sipp/NAME.xml with {placeholders} filled, written to `folder`."""
    text = (SCENARIOS / f"{name}.xml").read_text()
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    path = folder / f"{name}.xml"
    path.write_text(text)
    return path


async def run_sipp(
    target: str,
    folder: Path,
    *,
    stock: str | None = None,
    scenario_file: Path | None = None,
    extra: list[str] | None = None,
    timeout_s: float = 60.0,
    calls: int = 1,
    address: str = "127.0.0.1",
) -> SippResult:
    """`calls` calls (one by default) from sipp on `address` to `target` (HOST:PORT), from
    `folder` (where its logs go)."""
    assert SIPP is not None, "sipp is missing: scripts/test installs sip-tester"
    which = ["-sn", stock] if stock else ["-sf", str(scenario_file)]
    command = [
        SIPP, target, *which, "-m", str(calls), "-i", address, "-p", str(free_udp_port(address)),
        "-mp", str(free_udp_port(address) & ~1), "-timeout", f"{int(timeout_s)}s", "-timeout_error",
        "-trace_msg", "-message_file", str(folder / "messages.log"), "-nostdin",
        *(extra or []),
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout_s + 10)
    log = folder / "messages.log"
    return SippResult(
        process.returncode if process.returncode is not None else -1,
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        log.read_text(errors="replace") if log.exists() else "",
    )


def write_rtp_pcap(
    path: Path, audio: bytes, *, payload_type: int, lead_in_ms: int = 0, ssrc: int = 0x5EED
) -> None:
    """A capture (Ethernet, IPv4, UDP) of `audio` (G.711 bytes) as 20 ms RTP packets, after
    `lead_in_ms` of silence, for sipp's play_pcap_audio."""
    silence = b"\xff" if payload_type == 0 else b"\xd5"
    audio = silence * (lead_in_ms * 8) + audio
    records = []
    for index in range(0, len(audio) // FRAME_BYTES):
        payload = audio[index * FRAME_BYTES : (index + 1) * FRAME_BYTES]
        rtp = struct.pack(
            ">BBHII", 0x80, payload_type | (0x80 if index == 0 else 0), index & 0xFFFF,
            index * FRAME_BYTES, ssrc,
        ) + payload  # fmt: skip
        udp = struct.pack(">HHHH", 40000, 40002, 8 + len(rtp), 0) + rtp
        ip = struct.pack(
            ">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), index & 0xFFFF, 0, 64, 17, 0,
            bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]),
        ) + udp  # fmt: skip
        frame = b"\x00\x00\x00\x00\x00\x02" + b"\x00\x00\x00\x00\x00\x01" + b"\x08\x00" + ip
        micros = index * 20_000
        records.append(
            struct.pack("<IIII", micros // 1_000_000, micros % 1_000_000, len(frame), len(frame))
            + frame
        )
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    path.write_bytes(header + b"".join(records))


class SippCallee:
    """sipp as the far end of a call the server places: it listens on a free port (the
    server's trunk address), answers one call as `scenario_file` says, then exits."""

    def __init__(
        self, folder: Path, scenario_file: Path, *, port: int, timeout_s: float = 60.0
    ) -> None:
        assert SIPP is not None, "sipp is missing: scripts/test installs sip-tester"
        self.folder = folder
        self.scenario_file = scenario_file
        self.timeout_s = timeout_s
        self.port = port
        self._process: asyncio.subprocess.Process | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        assert SIPP is not None
        command = [
            SIPP, "-sf", str(self.scenario_file), "-m", "1", "-i", "127.0.0.1",
            "-p", str(self.port), "-mp", str(free_udp_port() & ~1),
            "-timeout", f"{int(self.timeout_s)}s", "-timeout_error", "-trace_msg",
            "-message_file", str(self.folder / "messages.log"), "-nostdin",
        ]  # fmt: skip
        self._process = await asyncio.create_subprocess_exec(
            *command,
            cwd=self.folder,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def result(self) -> SippResult:
        assert self._process is not None
        out, err = await asyncio.wait_for(self._process.communicate(), self.timeout_s + 10)
        log = self.folder / "messages.log"
        return SippResult(
            self._process.returncode if self._process.returncode is not None else -1,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            log.read_text(errors="replace") if log.exists() else "",
        )

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
