"""A caller speaking Twilio's side of a Media Stream (tests, load, `voice-agent call`)."""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection

from voice_agent.callers.base import DEFAULT_TIMEOUT_S, FRAME_MS, MULAW_SILENCE, Caller, Clock


class TwilioClient(Caller):
    """Twilio's side of a bidirectional Media Stream (`<Connect><Stream>`), for tests and load.

    Sends `connected` and `start` (callSid, customParameters: `agent` and the agent's args), then
    the caller's 8 kHz mu-law in 20 ms `media` messages: paced in real time by default (and
    silence between `send_audio` calls, as a phone line does), or as fast as possible with
    `pace=False`. The server's `media` is played at 8000 bytes/s after the audio before it; a
    `mark` is echoed once everything sent before it has played; a `clear` drops what has not
    played and returns every pending mark at once.
    """

    def __init__(
        self,
        url: str,
        *,
        call_sid: str = "CA00000000000000000000000000000001",
        stream_sid: str = "MZ00000000000000000000000000000001",
        account_sid: str = "AC00000000000000000000000000000001",
        custom_parameters: Mapping[str, str] | None = None,
        pace: bool = True,
        continuous: bool | None = None,
        clock: Clock | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        send_connected: bool = True,
    ) -> None:
        super().__init__(
            url,
            bytes_per_second=8000,
            silence=bytes([MULAW_SILENCE]),
            pace=pace,
            continuous=continuous,
            clock=clock,
            timeout=timeout,
        )
        self.call_sid = call_sid
        self.stream_sid = stream_sid
        self.account_sid = account_sid
        self.custom_parameters = dict(custom_parameters or {})
        self.send_connected = send_connected
        self._sid_json = json.dumps(stream_sid)
        self.messages: list[dict[str, Any]] = []  # every JSON message but media, as received
        self._sequence = itertools.count(1)
        self._chunk = itertools.count(1)

    def _envelope(self, event: str, **body: Any) -> str:
        # Built while holding the send lock, so sequence numbers go out in order.
        message = {"event": event, "sequenceNumber": str(next(self._sequence)), **body}
        message["streamSid"] = self.stream_sid
        return json.dumps(message, separators=(",", ":"))

    async def _open(self, ws: ClientConnection) -> None:
        if self.send_connected:
            await ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
        start = {
            "accountSid": self.account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": self.custom_parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        await ws.send(self._envelope("start", start=start))

    def _media(self, chunk: bytes) -> str:
        # What _envelope would build, by hand: 50 of these a second per caller.
        number = next(self._chunk)
        return (
            f'{{"event":"media","sequenceNumber":"{next(self._sequence)}","media":'
            f'{{"track":"inbound","chunk":"{number}","timestamp":"{(number - 1) * FRAME_MS}",'
            f'"payload":"{base64.b64encode(chunk).decode()}"}},"streamSid":{self._sid_json}}}'
        )

    def _mark_echo(self, name: str) -> str:
        return self._envelope("mark", mark={"name": name})

    def _stop_message(self) -> str:
        return self._envelope(
            "stop", stop={"accountSid": self.account_sid, "callSid": self.call_sid}
        )

    async def send_dtmf(self, digit: str) -> None:
        await self._send(self._envelope("dtmf", dtmf={"track": "inbound_track", "digit": digit}))

    async def _on_message(self, message: str | bytes, now: float) -> None:
        if isinstance(message, bytes):
            self.errors.append(f"binary frame of {len(message)} bytes (Twilio takes JSON text)")
            return
        try:
            data = json.loads(message)
            event = data["event"]
        except (ValueError, TypeError, KeyError):
            self.errors.append(f"not a Twilio message: {message[:80]!r}")
            return
        if event != "media":
            self.messages.append(data)
        if data.get("streamSid") != self.stream_sid:
            self.errors.append(f"{event} for streamSid {data.get('streamSid')!r}")
            return
        if event == "media":
            try:
                audio = binascii.a2b_base64(data["media"]["payload"], strict_mode=True)
            except (KeyError, TypeError, ValueError, binascii.Error):
                self.errors.append("media without a valid base64 payload")
                return
            self._play(audio, now)
        elif event == "mark":
            name = (data.get("mark") or {}).get("name")
            if not isinstance(name, str):
                self.errors.append("mark without a name")
                return
            self._add_mark(name, now)
        elif event == "clear":
            await self._clear(now)
        else:
            self.errors.append(f"unknown event {event!r}")
