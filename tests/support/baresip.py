"""baresip (Debian's baresip-core) as a caller: a softphone that dials the server, says lines
from WAV files (its `aufile` source, switched mid-call), presses keys, and records what it
hears (its `sndfile` filter writes the decoded audio of the call to a WAV).

It is driven over its `ctrl_tcp` module: netstring-framed JSON commands, the same as its menu's
(`dial`, `ausrc`, `sndcode`, `hangup`). baresip 1.0 hangs up when its audio source reaches the
end of a file, so every line is written with a long tail of silence, and the call starts on a
long silent file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import wave
from pathlib import Path

BARESIP = shutil.which("baresip")
MODULES = Path("/usr/lib/baresip/modules")
RATE = 8000
TAIL_S = 120  # silence after each line: longer than any call here


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_ports(first: int | None = None) -> int:
    """A port free for UDP and TCP, with the next one free too (baresip listens for SIP over
    UDP and TCP on its port and over TLS on the next). Below the kernel's ephemeral range
    (32768 and up), where the suite's many client connections take their ports: a number
    taken from bind(0) could be a connection's by the time baresip binds it."""
    port = first if first is not None else random.randrange(10_000, 30_000, 2)
    while not (_bindable(port) and _bindable(port + 1)):
        port += 2
    return port


def _ahead_of_the_suite() -> None:
    """A phone plays out on hardware of its own; here it shares two cores with the suite's
    servers, recognisers and the other worker's tests, and a starved baresip lets its jitter
    buffer overflow and loses the last words when the BYE comes. So it runs ahead of them
    (as root, which CI is; elsewhere at the usual priority)."""
    with contextlib.suppress(OSError):
        os.nice(-10)


def write_line(path: Path, pcm: bytes) -> Path:
    """8 kHz PCM16 mono (what aufile takes) with TAIL_S of silence after it."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm + bytes(2 * RATE * TAIL_S))
    return path


class Baresip:
    def __init__(
        self, folder: Path, *, trust: Path | None = None, media_encryption: str | None = None
    ) -> None:
        """`trust`: a CA certificate (PEM) baresip checks a TLS server's certificate with;
        `media_encryption`: its account's `mediaenc` ("srtp-mand": SRTP offered as RTP/SAVP,
        nothing else taken)."""
        assert BARESIP is not None, "baresip is missing: scripts/test installs baresip-core"
        self.folder = folder
        self.trust = trust
        self.media_encryption = media_encryption
        self.recordings = folder / "heard"
        self.recordings.mkdir(parents=True, exist_ok=True)
        self.sip_port = free_ports()  # UDP and TCP on it, TLS on the next
        self.control_port = free_ports(first=self.sip_port + 2)
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.log = folder / "baresip.log"
        self.events: list[dict[str, object]] = []
        self._answers: dict[str, asyncio.Future[dict[str, object]]] = {}
        self._changed = asyncio.Event()
        self._listening: asyncio.Task[None] | None = None

    async def start(self) -> None:
        silence = write_line(self.folder / "silence.wav", b"")
        config = f"""
poll_method epoll
sip_listen 127.0.0.1:{self.sip_port}
audio_player aubridge,heard
audio_alert aubridge,heard
audio_source aufile,{silence}
ausrc_srate {RATE}
auplay_srate {RATE}
ausrc_channels 1
auplay_channels 1
jitter_buffer_delay 5-10
audio_buffer 20-160
module_path {MODULES}
module g711.so
module aufile.so
module aubridge.so
module sndfile.so
module account.so
module_app menu.so
module_app ctrl_tcp.so
ctrl_tcp_listen 127.0.0.1:{self.control_port}
snd_path {self.recordings}
rtp_ports 40000-40999
"""
        if self.trust is not None:
            config += f"sip_cafile {self.trust}\n"
        if self.media_encryption is not None:
            # Before account.so, which reads the account's mediaenc as it loads.
            config = config.replace("module account.so", "module srtp.so\nmodule account.so")
        (self.folder / "config").write_text(config)
        account = f"<sip:caller@127.0.0.1:{self.sip_port}>;regint=0;audio_codecs=PCMU"
        if self.media_encryption is not None:
            account += f";mediaenc={self.media_encryption}"
        (self.folder / "accounts").write_text(account + "\n")
        self._process = await asyncio.create_subprocess_exec(
            BARESIP, "-f", str(self.folder),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self.log.open("wb"),
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_ahead_of_the_suite,
        )  # fmt: skip
        async with asyncio.timeout(10):
            while True:
                try:
                    self._reader, self._writer = await asyncio.open_connection(
                        "127.0.0.1", self.control_port
                    )
                    return
                except OSError:
                    await asyncio.sleep(0.1)  # until baresip listens

    async def command(self, name: str, params: str = "") -> dict[str, object]:
        """One command; baresip's response to it (events meanwhile go to `events`)."""
        assert self._writer is not None
        if self._listening is None:
            self._listening = asyncio.ensure_future(self._listen())
        answer: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
        self._answers[name] = answer
        data = json.dumps({"command": name, "params": params, "token": name}).encode()
        self._writer.write(str(len(data)).encode() + b":" + data + b",")
        await self._writer.drain()
        async with asyncio.timeout(10):
            return await answer

    async def _listen(self) -> None:
        """Every netstring from baresip: responses to their commands, events to `events`."""
        assert self._reader is not None
        while True:
            try:
                length = int((await self._reader.readuntil(b":"))[:-1])
                message = json.loads(await self._reader.readexactly(length))
                await self._reader.readexactly(1)  # the netstring's ","
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if message.get("response"):
                answer = self._answers.pop(str(message.get("token")), None)
                if answer is not None and not answer.done():
                    answer.set_result(dict(message))
            elif message.get("event"):
                self.events.append(dict(message))
                self._changed.set()

    async def wait_event(
        self, kind: str, count: int = 1, timeout_s: float = 20
    ) -> list[dict[str, object]]:
        """The first `count` events of `kind` (CALL_DTMF_START, CALL_CLOSED, ...) once come."""
        async with asyncio.timeout(timeout_s):
            while True:
                found = [e for e in self.events if e.get("type") == kind]
                if len(found) >= count:
                    return found[:count]
                self._changed.clear()
                await self._changed.wait()

    async def dial(self, uri: str) -> None:
        await self.command("dial", uri)

    async def say(self, wav: Path) -> None:
        await self.command("ausrc", f"aufile,{wav}")

    async def press(self, digit: str) -> None:
        await self.command("sndcode", digit)

    async def hang_up(self) -> None:
        await self.command("hangup")

    def heard(self) -> Path:
        """The WAV of what baresip received (the agent), once the call is over."""
        (path,) = self.recordings.glob("*-dec.wav")
        return path

    async def close(self) -> None:
        if self._listening is not None:
            self._listening.cancel()
        if self._writer is not None:
            self._writer.close()
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()
