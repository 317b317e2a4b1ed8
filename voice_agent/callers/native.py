"""A caller speaking this server's own `/ws` protocol (tests, load, `voice-agent call`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection

from voice_agent.callers.base import ALAW_SILENCE, DEFAULT_TIMEOUT_S, MULAW_SILENCE, Caller, Clock
from voice_agent.transports.native import AudioFormat


class NativeClient(Caller):
    """The same caller over the native `/ws` protocol (docs/protocol.md).

    `connect()` sends `start` and, unless `wait_started=False`, returns once `started` arrives
    (`call_id` is then set). JSON events land in `events`; binary audio is played as in
    TwilioClient, marks are echoed when played and a `clear` returns every pending mark.
    """

    def __init__(
        self,
        url: str,
        *,
        agent: str | None = None,
        args: Mapping[str, Any] | None = None,
        audio: AudioFormat | None = None,
        pace: bool = True,
        continuous: bool | None = None,
        clock: Clock | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        wait_started: bool = True,
    ) -> None:
        self.audio = audio or AudioFormat()
        silence = {"pcm16": b"\x00\x00", "mulaw": bytes([MULAW_SILENCE])}
        super().__init__(
            url,
            bytes_per_second=self.audio.bytes_per_second,
            silence=silence.get(self.audio.encoding, bytes([ALAW_SILENCE])),
            pace=pace,
            continuous=continuous,
            clock=clock,
            timeout=timeout,
        )
        self.agent = agent
        self.args = dict(args or {})
        self.wait_started = wait_started
        self.call_id: str | None = None
        self.events: list[dict[str, Any]] = []  # every JSON event, in order

    async def _open(self, ws: ClientConnection) -> None:
        start: dict[str, Any] = {"type": "start", "args": self.args, "audio": self.audio.as_json()}
        if self.agent is not None:
            start["agent"] = self.agent
        await ws.send(json.dumps(start))
        if self.wait_started:
            async with asyncio.timeout(self.timeout):
                reply = await ws.recv()
            event = json.loads(reply) if isinstance(reply, str) else {}
            if event.get("type") != "started":
                raise ConnectionError(f"expected a started event, got {str(reply)[:200]}")
            self.events.append(event)
            self.call_id = event.get("call_id")

    def _media(self, chunk: bytes) -> bytes:
        return chunk

    def _mark_echo(self, name: str) -> str:
        return json.dumps({"type": "mark", "name": name})

    def _stop_message(self) -> str:
        return '{"type":"stop"}'

    async def send_dtmf(self, digit: str) -> None:
        await self._send(json.dumps({"type": "dtmf", "digit": digit}))

    async def send_json(self, message: Mapping[str, Any]) -> None:
        """Any message, for tests of the server's validation."""
        await self._send(json.dumps(message))

    async def _on_message(self, message: str | bytes, now: float) -> None:
        if isinstance(message, bytes):
            if len(message) % self.audio.sample_width:
                self.errors.append(f"audio frame of {len(message)} bytes splits a sample")
            self._play(message, now)
            return
        try:
            event = json.loads(message)
            kind = event["type"]
        except (ValueError, TypeError, KeyError):
            self.errors.append(f"not a native event: {message[:80]!r}")
            return
        self.events.append(event)
        if kind == "started" and self.call_id is None:
            self.call_id = event.get("call_id")
        elif kind == "mark":
            self._add_mark(str(event.get("name")), now)
        elif kind == "clear":
            await self._clear(now)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event.get("type") == kind]

    async def wait_event(
        self,
        kind: str,
        match: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Wait for the first event of type `kind` (that `match` accepts) and return it."""

        def found() -> dict[str, Any] | None:
            return next((e for e in self.events_of(kind) if match is None or match(e)), None)

        return await self.wait_until(found, f"a {kind} event")
