"""The /asterisk WebSocket endpoint: one call from Asterisk's chan_websocket, moved between its
socket and a call pipeline.

Asterisk dials `WebSocket/<connection>` and connects here as the WebSocket client of the `uri`
in websocket_client.conf; the first message is MEDIA_START, then the channel's media comes as
BINARY messages and control events as TEXT (voice_agent.transports.asterisk_ws holds the
protocol, the versions it follows and what differs between them). Here:

* MEDIA_START starts the call: the agent and its args come from the URL's query string
  (`agent=booking&party=2`, from the `uri` or the dial string's `v(...)` option, which Asterisk
  appends, so it wins over the `uri`'s), then from VOICE_AGENT and VOICE_AGENT_ARG_<name>
  channel variables (JSON control messages only); `token` is left out of the args. The call id
  is Asterisk's channel_id when it has one. The server sends ANSWER and starts the pipeline.
* The agent's audio goes out as it comes, like Twilio's: Asterisk queues it and plays it at the
  channel's pace. MARK_MEDIA follows each chunk the pipeline marks and MEDIA_MARK_PROCESSED
  tells when the caller has heard up to it. An Asterisk without MARK_MEDIA (before 20.18.0 /
  22.8.0 / 23.2.0, every 21.x) never answers one; the server then confirms marks itself when
  its estimate of Asterisk's playout (frames play back to back at 1x from when they were sent)
  reaches them, CLOCK_MARGIN_S late rather than early. Plain-text MEDIA_START does not tell
  those releases apart, so there the server sends one probe mark before any media and waits
  PROBE_TIMEOUT_S for its answer.
* Barge-in (Outbound.clear) sends FLUSH_MEDIA. Asterisk drops the marks still queued with the
  media; a MEDIA_MARK_PROCESSED that still comes for one (sent before the flush reached
  Asterisk) names a mark the server no longer waits for and is ignored.
* MEDIA_XOFF holds media and marks here, in order and bounded, until MEDIA_XON.
* DTMF_END goes to the pipeline's dtmf. Asterisk closing the socket is the caller hanging up;
  the agent ending the call sends HANGUP, then closes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

from websockets.asyncio.server import ServerConnection

from voice_agent.errors import VoiceAgentError
from voice_agent.gateways.media_socket import MediaConnection, Message
from voice_agent.gateways.socket_call import SocketCall, SocketOutbound, StartCall, usable_call_id
from voice_agent.transports.asterisk_ws import (
    AsteriskStream,
    BufferingCompleted,
    DtmfEnd,
    Error,
    MarkProcessed,
    MediaStart,
    MediaXoff,
    MediaXon,
    QueueDrained,
    Status,
)
from voice_agent.transports.errors import (
    POLICY_VIOLATION,
    TRY_AGAIN_LATER,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
    close_reason,
)

log = logging.getLogger("voice_agent.server")

PATH = "/asterisk"
TRANSPORT = "asterisk"
# Asterisk re-frames what it gets and plays it at the channel's pace: one message per half
# second sends 25 times fewer messages than one per frame (and stays far below its 65500 bytes).
MEDIA_MESSAGE_MS = 500
# What MEDIA_XOFF may hold back: an Asterisk that never says MEDIA_XON again ends the call
# rather than have the server buffer without end.
MAX_HELD_MS = 60_000
# An Asterisk with MARK_MEDIA answers a mark at the head of its queue on its next 20 ms tick.
PROBE_ID = "voice-agent-probe"
PROBE_TIMEOUT_S = 1.5
# Without marks, a mark counts as played this long after the estimate says: Asterisk plays on
# 20 ms ticks of its own, and a hang-up must not cut the end of a goodbye.
CLOCK_MARGIN_S = 0.1
QUERY_AGENT = "agent"
QUERY_TOKEN = "token"  # the API token, never an arg

Admit = Callable[[str], "str | None"]  # where the call comes in -> why it is refused, or None


class MarkMode(enum.Enum):
    ASTERISK = "asterisk"  # MEDIA_MARK_PROCESSED reports each mark
    PROBING = "probing"  # a plain-text Asterisk that may or may not have MARK_MEDIA
    CLOCK = "clock"  # no MARK_MEDIA: marks play when the server's playout estimate says


def _no_event(payload: dict[str, Any]) -> list[Message]:
    return []  # Asterisk takes media and commands only


class AsteriskOutbound(SocketOutbound):
    """What the pipeline sends, as chan_websocket takes it.

    Media goes out in whole frames of optimal_frame_size (Asterisk drops a message's partial
    frame), MEDIA_MESSAGE_MS at most per message; a mark first fills the chunk's last partial
    frame with silence, so that it follows all of the chunk. `on_mark(name)` is called when a
    mark has played, by Asterisk's word or the playout estimate (`mode`).
    """

    def __init__(
        self, ws: MediaConnection, stream: AsteriskStream, on_mark: Callable[[str], None]
    ) -> None:
        start = stream.start
        if start is None:
            raise RuntimeError("no MEDIA_START yet")
        super().__init__(
            ws,
            audio=self._messages,
            mark=lambda name: [stream.mark_message(name)],  # mark() below writes its own
            clear=lambda: [stream.flush_message()],
            event=_no_event,
        )
        self.start = start
        self._stream = stream
        self._on_mark = on_mark
        self._loop = asyncio.get_running_loop()
        carrier = start.carrier
        self._frame = start.optimal_frame_size
        self._silence = carrier.encode(bytes(2 * self._frame // carrier.sample_bytes))
        self._bytes_per_s = carrier.sample_rate * carrier.sample_bytes
        self._message_bytes = max(1, MEDIA_MESSAGE_MS // start.ptime) * self._frame
        self._max_held = int(MAX_HELD_MS * carrier.bytes_per_ms)
        self._partial = bytearray()  # less than a frame, waiting for the rest of its chunk
        self._held: deque[bytes | str] = deque()  # media and mark names, during MEDIA_XOFF
        self._held_bytes = 0
        self.xoff = False
        # Marks sent and not played yet, with when Asterisk will have played up to them.
        self._pending: deque[tuple[str, float]] = deque()
        self._play_end = 0.0  # when Asterisk will have played all media sent, by estimate
        supported = start.marks_supported
        self.mode = (
            MarkMode.ASTERISK
            if supported
            else MarkMode.CLOCK
            if supported is False
            else MarkMode.PROBING
        )
        self._mark_timer: asyncio.TimerHandle | None = None
        self._probe_timer: asyncio.TimerHandle | None = None
        self._hanging_up = False
        self.media_bytes_sent = 0  # media written to the socket

    @property
    def held_bytes(self) -> int:
        """Media held back since MEDIA_XOFF."""
        return self._held_bytes

    # ---- the Outbound protocol -----------------------------------------------------------

    def answer(self) -> None:
        """Answer the channel (a no-op unless the dial string has `n`), and probe for marks."""
        self._write(self._stream.answer_message())
        if self.mode is MarkMode.PROBING:
            self._probe()

    def audio(self, data: bytes) -> None:
        if self._closing is not None:
            return
        partial = self._partial
        partial += data
        whole = len(partial) - len(partial) % self._frame
        if whole:
            media = bytes(partial[:whole])
            del partial[:whole]
            self._media(media)

    def mark(self, name: str) -> None:
        if self._closing is not None:
            return
        if self._partial:
            self._partial += self._silence[: self._frame - len(self._partial)]
            media = bytes(self._partial)
            self._partial.clear()
            self._media(media)
        if self.xoff:
            self._held.append(name)
        else:
            self._send_mark(name)

    def clear(self) -> None:
        if self._closing is not None:
            return
        self._partial.clear()
        self._held.clear()
        self._held_bytes = 0
        self._write(self._stream.flush_message())
        # FLUSH_MEDIA drops the queued marks with the media: Asterisk never reports them.
        self._pending.clear()
        self._play_end = self._loop.time()
        self._cancel(mark=True)
        if self.mode is MarkMode.PROBING:
            self._probe()  # the flush may have dropped the probe too

    def close(self, code: int, reason: str) -> None:
        if self._closing is None and not self._hanging_up:
            # HANGUP first: Asterisk then hangs the channel up with a normal cause.
            self._hanging_up = True
            self._cancel(mark=True, probe=True)
            self._write(self._stream.hangup_message())
        super().close(code, reason)

    async def aclose(self) -> None:
        self._cancel(mark=True, probe=True)
        await super().aclose()

    # ---- from Asterisk -------------------------------------------------------------------

    def media_xoff(self) -> None:
        self.xoff = True

    def media_xon(self) -> None:
        self.xoff = False
        while self._held and not self.xoff and self._closing is None:
            item = self._held.popleft()
            if isinstance(item, bytes):
                self._held_bytes -= len(item)
                self._send_media(item)
            else:
                self._send_mark(item)

    def mark_processed(self, correlation_id: str) -> None:
        if self.mode is MarkMode.PROBING:
            # Any answer proves MARK_MEDIA, the probe's first of all (nothing precedes it).
            self.mode = MarkMode.ASTERISK
            self._cancel(probe=True)
            log.debug("asterisk %s: MARK_MEDIA answered", self._ws.remote_address)
        if correlation_id == PROBE_ID or self.mode is not MarkMode.ASTERISK:
            return  # a late probe answer: this call's marks already play by the estimate
        if all(name != correlation_id for name, _ in self._pending):
            return  # queued before a FLUSH_MEDIA (or never sent): nobody waits for it
        while self._pending:
            name, _ = self._pending.popleft()
            if name == correlation_id:
                break
        self._on_mark(correlation_id)

    # ---- sending -------------------------------------------------------------------------

    def _messages(self, media: bytes) -> list[Message]:
        size = self._message_bytes
        return [media[i : i + size] for i in range(0, len(media), size)]

    def _media(self, media: bytes) -> None:
        if not self.xoff:
            self._send_media(media)
            return
        self._held.append(media)
        self._held_bytes += len(media)
        if self._held_bytes > self._max_held:
            self.overflowed = (
                f"Asterisk sent MEDIA_XOFF and no MEDIA_XON for {MAX_HELD_MS // 1000} s "
                "of the agent's audio"
            )
            self.close(POLICY_VIOLATION, self.overflowed)

    def _send_media(self, media: bytes) -> None:
        for message in self._messages(media):
            self._write(message)
        self.media_bytes_sent += len(media)
        self._play_end = max(self._loop.time(), self._play_end) + len(media) / self._bytes_per_s

    def _send_mark(self, name: str) -> None:
        if self.mode is not MarkMode.CLOCK:
            self._write(self._stream.mark_message(name))
        self._pending.append((name, max(self._play_end, self._loop.time())))
        if self.mode is MarkMode.CLOCK and self._mark_timer is None:
            self._arm()

    # ---- marks without MARK_MEDIA ----------------------------------------------------------

    def _probe(self) -> None:
        self._cancel(probe=True)
        self._write(self._stream.mark_message(PROBE_ID))
        self._probe_timer = self._loop.call_later(PROBE_TIMEOUT_S, self._probe_expired)

    def _probe_expired(self) -> None:
        self._probe_timer = None
        if self.mode is not MarkMode.PROBING or self._closing is not None:
            return
        self.mode = MarkMode.CLOCK
        log.info(
            "asterisk %s: no answer to MARK_MEDIA in %.1f s (an Asterisk before 20.18.0 / "
            "22.8.0 / 23.2.0): marks play by the server's playout estimate",
            self._ws.remote_address,
            PROBE_TIMEOUT_S,
        )
        self._arm()

    def _arm(self) -> None:
        self._cancel(mark=True)
        if self._pending and self._closing is None:
            due = self._pending[0][1] + CLOCK_MARGIN_S
            self._mark_timer = self._loop.call_at(due, self._marks_due)

    def _marks_due(self) -> None:
        self._mark_timer = None
        now = self._loop.time()
        while (
            self._pending and self._pending[0][1] + CLOCK_MARGIN_S <= now and self._closing is None
        ):
            name, _ = self._pending.popleft()
            self._on_mark(name)  # may clear or close: the loop looks again each time
        if self._mark_timer is None and self.mode is MarkMode.CLOCK:
            self._arm()

    def _cancel(self, *, mark: bool = False, probe: bool = False) -> None:
        if mark and self._mark_timer is not None:
            self._mark_timer.cancel()
            self._mark_timer = None
        if probe and self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None


def agent_and_args(request_path: str, start: MediaStart) -> tuple[str | None, dict[str, str]]:
    """The agent and args a call asks for: the URL's query string, then channel variables."""
    # The last of repeated names wins: `v(...)` parameters come after the configured uri's.
    params = dict(parse_qsl(urlsplit(request_path).query, keep_blank_values=True))
    params.pop(QUERY_TOKEN, None)
    agent = params.pop(QUERY_AGENT, None) or None
    return start.agent or agent, {**params, **start.agent_args}


def call_id_of(start: MediaStart) -> str | None:
    """Asterisk's channel id, which its logs and CDRs show, when it can name the call."""
    return usable_call_id(start.channel_id)


class _AsteriskCall(SocketCall):
    transport = TRANSPORT

    def __init__(self, ws: MediaConnection, start_call: StartCall, admit: Admit | None) -> None:
        super().__init__(ws, start_call)
        self.stream = AsteriskStream()
        self.admit = admit
        self.asterisk: AsteriskOutbound | None = None
        self._sample_bytes = 1

    def on_message(self, message: Message) -> None:
        # The caller's media, 50 messages a second, goes straight to the pipeline; control
        # messages and media the fast path declines take the general path.
        pipeline = self.pipeline
        if (
            message.__class__ is bytes
            and pipeline is not None
            and self._backlog is None
            and not self._ended.done()
        ):
            size = len(message)
            if 0 < size <= self.stream.max_media_bytes and not size % self._sample_bytes:
                pipeline.audio(cast(bytes, message))
                return
        super().on_message(message)

    def receive(self, message: Message) -> list[Any]:
        if isinstance(message, bytes):
            return list(self.stream.receive_bytes(message))
        return list(self.stream.receive_text(message))

    def protocol_error(self, error: ProtocolError) -> None:
        if self.stream.start is not None:
            self.ws.write(self.stream.hangup_message())
        super().protocol_error(error)

    def dispatch(self, event: Any) -> None:
        pipeline = self.pipeline
        out = self.asterisk
        if isinstance(event, bytes):
            if pipeline is not None:
                pipeline.audio(event)
        elif isinstance(event, MarkProcessed):
            if out is not None:
                out.mark_processed(event.id)
        elif isinstance(event, MediaXoff):
            if out is not None:
                out.media_xoff()
        elif isinstance(event, MediaXon):
            if out is not None:
                out.media_xon()
        elif isinstance(event, DtmfEnd):
            if pipeline is not None:
                pipeline.dtmf(event.digit)
        elif isinstance(event, MediaStart):
            self._sample_bytes = event.media.sample_bytes
            log.info(
                "asterisk %s: MEDIA_START %s %s, %s control messages",
                self.ws.remote_address,
                event.channel or event.connection_id,
                event.format,
                event.form,
            )
            self.begin_start(event)
        elif isinstance(event, Error):
            log.warning("asterisk %s: ERROR %s", self.ws.remote_address, event.text)
            if "passthrough" in event.text and out is not None:
                # Passthrough (the `p` dial option) takes neither marks nor flushes, and plays
                # each message as one frame: this server cannot speak over it.
                reason = "Asterisk's passthrough mode is not supported: drop p from the Dial"
                self.end(f"protocol error: {reason}")
                out.close(UNSUPPORTED_DATA, reason)
        elif isinstance(event, ProtocolWarning):
            log.info("asterisk %s: %s", self.ws.remote_address, event)
        elif isinstance(event, Status | QueueDrained | BufferingCompleted):
            log.debug("asterisk %s: %s", self.ws.remote_address, event)

    def _mark(self, name: str) -> None:
        pipeline = self.pipeline
        if pipeline is not None and not pipeline.ended:
            pipeline.mark(name)

    async def set_up(self, event: MediaStart) -> None:
        if self.admit is not None:
            refusal = self.admit(PATH)
            if refusal is not None:
                self.end(f"refused: {refusal}")
                self.ws.write(self.stream.hangup_message())
                await self.ws.close(TRY_AGAIN_LATER, close_reason(refusal))
                return
        request = self.ws.request
        agent, args = agent_and_args(request.path if request else "", event)
        out = AsteriskOutbound(self.ws, self.stream, self._mark)
        self.outbound = self.asterisk = out
        try:
            self.pipeline = await self.start_call(
                transport=TRANSPORT,
                agent=agent,
                args=args,
                call_id=call_id_of(event),
                carrier=event.carrier,
                out=out,
            )
        except VoiceAgentError as exc:
            self.end(f"refused: {exc}")
            out.close(POLICY_VIOLATION, close_reason(str(exc)))
            return
        out.answer()
        await self.pipeline.start()


async def asterisk_endpoint(
    ws: ServerConnection, start_call: StartCall, admit: Admit | None = None
) -> None:
    """One chan_websocket connection, until the call ends.

    `ws` must be a MediaConnection (`serve(..., create_connection=MediaConnection)`) whose
    `process_request` called `hold_messages(max_message_bytes)`: Asterisk sends MEDIA_START at
    once. `admit`, when given, is asked at MEDIA_START (with PATH) whether to take the call; a
    refusal sends HANGUP and closes with 1013 (try again later).
    """
    if not isinstance(ws, MediaConnection):
        raise TypeError(
            "asterisk_endpoint needs a MediaConnection: serve(..., create_connection="
            "MediaConnection)"
        )
    await _AsteriskCall(ws, start_call, admit).run()
