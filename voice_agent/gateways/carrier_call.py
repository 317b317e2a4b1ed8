"""The one driver of every WebSocket media stream (/twilio, the carriers', /ws): a call's
messages through its carrier's adapter (carriers.py) to the pipeline, and the pipeline's audio,
marks, clears, events, transfers and keys back through it.

Call control (the pipeline's `CallControl`): transfers through the carrier's REST API on the
call the stream names, keys on the stream or through the API (`Carrier.sends_keys`). The APIs
are built once per server (callcontrol/apis.py) and handed to every call; without one, the
agent gets a reason naming the config to set. Keys through a REST API go in order, before any
transfer asked for after them; a refusal goes to the audit.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from voice_agent.callcontrol.apis import NO_APIS, CallControlApis
from voice_agent.errors import VoiceAgentError
from voice_agent.gateways.carrier_adapter import (
    CallStart,
    Carrier,
    Heard,
    HungUp,
    Key,
    Note,
    Played,
)
from voice_agent.gateways.carriers import adapter
from voice_agent.gateways.media_socket import MediaConnection, Message
from voice_agent.gateways.socket_call import SocketCall, SocketOutbound, StartCall, refusal_text
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.transports.errors import POLICY_VIOLATION, ProtocolError, close_reason

log = logging.getLogger("voice_agent.server")

MAX_NOTES = 20  # carrier notes kept in a call's audit
MARK_GRACE_S = 1.0  # jambonz: a mark this late past its estimated playout counts as played


def _nothing(_: str) -> None:
    pass


@dataclass
class _MarkClock:
    """jambonz's fallback for unreported marks: when each mark's audio should have played."""

    loop: asyncio.AbstractEventLoop
    bytes_per_s: float
    on_played: Callable[[str], None]
    play_end: float = 0.0
    pending: deque[tuple[str, float]] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None

    def sent_audio(self, size: int) -> None:
        now = self.loop.time()
        self.play_end = max(self.play_end, now) + size / self.bytes_per_s

    def sent_mark(self, name: str) -> None:
        self.pending.append((name, max(self.play_end, self.loop.time()) + MARK_GRACE_S))
        self._arm()

    def reported(self, name: str) -> None:
        self.pending = deque(item for item in self.pending if item[0] != name)
        self._arm()

    def cleared(self) -> None:
        self.pending.clear()
        self.play_end = self.loop.time()
        self._arm()

    def stop(self) -> None:
        self.pending.clear()
        self._arm()

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending:
            self.timer = self.loop.call_at(self.pending[0][1], self._due)

    def _due(self) -> None:
        self.timer = None
        now = self.loop.time()
        while self.pending and self.pending[0][1] <= now:
            name, _ = self.pending.popleft()
            log.info("jambonz never reported mark %s: taken as played by the clock", name)
            self.on_played(name)
        self._arm()


class CarrierOutbound(SocketOutbound):
    """What the pipeline sends, through the carrier's builders; the carrier's goodbye first
    when the server ends the call. Its call control (the pipeline's `CallControl`, handed to
    it at the start): transfers and keys go to the carrier, a reason where it has none."""

    def __init__(
        self,
        ws: MediaConnection,
        carrier: Carrier,
        clock: _MarkClock | None,
        apis: CallControlApis = NO_APIS,
        keys_failed: Callable[[str], None] = lambda error: None,
    ) -> None:
        super().__init__(
            ws,
            audio=carrier.audio_messages,
            mark=carrier.mark_messages,
            clear=carrier.clear_messages,
            event=carrier.event_messages,
        )
        self.carrier = carrier
        self.clock = clock
        self.apis = apis
        self.keys_failed = keys_failed
        self._keys: asyncio.Task[None] | None = None  # the last keys asked for, not yet out

    async def transfer(self, transfer: CallTransfer) -> str | None:
        if self._keys is not None:
            # Keys asked for before the hand-over (a menu's choice, then the transfer) go first.
            await asyncio.gather(self._keys, return_exceptions=True)
        return await self.carrier.transfer(self.apis, transfer)

    def send_digits(self, digits: str) -> str | None:
        """Keys where the carrier takes them (`Carrier.sends_keys`): on the stream, or through
        its API in the background, one request after another."""
        if not self.carrier.sends_keys:
            return f"the {self.carrier.transport} transport cannot send digits"
        messages = self.carrier.keys_on_stream(digits)
        if messages is not None:
            self.write_all(messages)
            return None
        self._keys = asyncio.ensure_future(self._press(self._keys, digits))
        return None

    async def _press(self, before: asyncio.Task[None] | None, digits: str) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)  # in the order asked
        try:
            error = await self.carrier.send_digits(self.apis, digits)
        except Exception as exc:  # a carrier's failure is this call's, never the server's
            log.exception("keys %s on a %s call failed", digits, self.carrier.transport)
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            self.keys_failed(error)

    async def aclose(self) -> None:
        if self._keys is not None and not self._keys.done():
            self._keys.cancel()  # the call is over: its keys have nowhere to go
            await asyncio.gather(self._keys, return_exceptions=True)
        await super().aclose()

    def audio(self, data: bytes) -> None:
        super().audio(data)
        if self.clock is not None:
            self.clock.sent_audio(len(data))

    def mark(self, name: str) -> None:
        super().mark(name)
        if self.clock is not None:
            self.clock.sent_mark(name)

    def clear(self) -> None:
        super().clear()
        if self.clock is not None:
            self.clock.cleared()

    def tell_peer(self, kind: str, text: str) -> None:
        self.write_all(self.carrier.tell_peer(kind, text))

    def close(self, code: int, reason: str) -> None:
        if self._closing is None:
            self.write_all(self.carrier.goodbye_messages())
            if self.clock is not None:
                self.clock.stop()
        super().close(code, reason)


class CarrierCall(SocketCall):
    def __init__(
        self,
        ws: MediaConnection,
        start_call: StartCall,
        carrier: Carrier,
        apis: CallControlApis = NO_APIS,
    ) -> None:
        super().__init__(ws, start_call)
        self.carrier = carrier
        self.apis = apis
        self.transport = carrier.transport
        self.clock: _MarkClock | None = None
        self.notes = 0

    def on_message(self, message: Message) -> None:
        pipeline = self.pipeline
        if pipeline is not None and self._backlog is None and not self._ended.done():
            audio = self.carrier.fast_audio(message)
            if audio is not None:
                pipeline.audio(audio)
                return
        super().on_message(message)

    def receive(self, message: Message) -> list[Any]:
        return self.carrier.receive(message)

    def protocol_error(self, error: ProtocolError) -> None:
        for message in self.carrier.tell_peer(error.kind, error.reason):
            self.ws.write(message)  # written before the close, whatever the outbound's state
        super().protocol_error(error)

    def dispatch(self, event: Any) -> None:
        pipeline = self.pipeline
        if isinstance(event, Heard):
            if pipeline is not None:
                pipeline.audio(event.audio)
        elif isinstance(event, Played):
            if self.clock is not None:
                self.clock.reported(event.name)
            if pipeline is not None:
                pipeline.mark(event.name)
        elif isinstance(event, CallStart):
            self.begin_start(event)
        elif isinstance(event, Key):
            if pipeline is not None:
                pipeline.dtmf(event.digit)
        elif isinstance(event, HungUp):
            self.end(event.reason)
        elif isinstance(event, Note):
            self._note(event)

    def _note(self, note: Note) -> None:
        # A carrier gone wrong may say the same thing 50 times a second: the audit keeps the
        # first MAX_NOTES, the log one line per MAX_NOTES after them.
        self.notes += 1
        for message in self.carrier.tell_peer(note.kind, note.text):
            self.ws.write(message)  # /ws's client is told every time: it sent the message
        if self.notes <= MAX_NOTES:
            peer = self.ws.remote_address
            log.info("%s %s: %s: %s", self.transport, peer, note.kind, note.text)
            if self.pipeline is not None:
                self.pipeline.session.audit.add("carrier_note", kind=note.kind, text=note.text)
        elif self.notes % MAX_NOTES == 0:
            log.info("%s %s: %d notes", self.transport, self.ws.remote_address, self.notes)

    def _mark_played(self, name: str) -> None:
        if self.pipeline is not None and not self._ended.done():
            self.pipeline.mark(name)

    def _keys_failed(self, error: str) -> None:
        log.warning("%s %s: keys not sent: %s", self.transport, self.ws.remote_address, error)
        if self.pipeline is not None:
            self.pipeline.session.audit.add("error", where="send_dtmf", message=error)

    async def set_up(self, event: CallStart) -> None:
        if self.carrier.marks_by_clock:
            carrier = event.carrier
            self.clock = _MarkClock(
                asyncio.get_running_loop(),
                carrier.sample_rate * carrier.sample_bytes,
                self._mark_played,
            )
        outbound = CarrierOutbound(self.ws, self.carrier, self.clock, self.apis, self._keys_failed)
        self.outbound = outbound
        try:
            self.pipeline = await self.start_call(
                transport=self.transport,
                agent=event.agent,
                args=event.args,
                call_id=event.call_id,
                carrier=event.carrier,
                out=outbound,
                control=outbound if self.carrier.controls_calls else None,
            )
        except VoiceAgentError as exc:
            self.end(f"refused: {exc}")
            log.warning("%s call refused: %s", self.transport, refusal_text(exc))
            outbound.tell_peer("bad_start", refusal_text(exc))
            outbound.close(POLICY_VIOLATION, close_reason(refusal_text(exc)))
            return
        call_id = self.pipeline.session.call_id
        outbound.write_all(self.carrier.started_messages(call_id, event.agent))
        await self.pipeline.start()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            # The clock and the outbound call back into this call: once it is over they must
            # not, so that its objects go with it rather than wait for the garbage collector.
            if self.clock is not None:
                self.clock.stop()
                self.clock.on_played = _nothing
            if isinstance(self.outbound, CarrierOutbound):
                self.outbound.keys_failed = _nothing


async def stream_endpoint(
    ws: MediaConnection, start_call: StartCall, path: str, apis: CallControlApis = NO_APIS
) -> None:
    """Run one call on `ws`, which came in on `path` (/twilio, one of the CARRIERS, else /ws's
    protocol), with the carriers' APIs for its transfers and keys."""
    request_path = ws.request.path if ws.request is not None else path
    await CarrierCall(ws, start_call, adapter(path, request_path), apis).run()
