"""The carriers' media-stream WebSocket endpoints: /telnyx, /plivo, /vonage, /exotel, /jambonz.

Each carrier's protocol lives in its sans-I/O codec (voice_agent.transports.<carrier>, with the
documents and versions it follows). Here each codec's events are read as the few things a call
needs (`CallStart`, caller audio, a mark played, a key pressed, the hang-up, a note for the log
and the audit), and what the pipeline sends goes out through the codec's builders. So the five
endpoints share one driver (`_CarrierCall`, on `SocketCall` like /twilio's) and differ only in
a small adapter per carrier (`Carrier`).

What the adapters decide, per carrier (docs/telephony.md has the table):

* The agent and its args come from what the carrier lets the call's set-up pass through
  (Telnyx and Exotel custom parameters, Plivo extraHeaders, Vonage's NCCO headers, jambonz's
  listen metadata), then from the URL's query string (`?agent=booking&party=2`), which every
  carrier's stream URL can carry; `token` is never an arg. The carrier's call id names the call
  when it is usable as a file name (`usable_call_id`).
* Only the caller's track is heard: Telnyx and Plivo may stream both tracks.
* Marks: Telnyx `mark`, Plivo `checkpoint`/`playedStream`, Vonage `notify`, Exotel `mark`,
  jambonz `mark`. What a carrier does with the marks a clear dropped differs: jambonz reports
  them `cleared` (not passed on), Telnyx returns them at once (as Twilio does), Plivo, Vonage
  and Exotel send nothing. Either way the call core has cut its playback at the clear and
  ignores marks of audio it dropped, so the interruption tracker commits only what was heard.
  jambonz can also lose the report of a mark sent after a `killAudio` (see
  voice_agent.transports.jambonz); there a mark still unreported MARK_GRACE_S after the
  server's estimate of its playout counts as played, so a reply is never left uncommitted.
* Hang-up: a stop message where the carrier has one (Telnyx, Exotel, jambonz's empty frame),
  else the socket's clean close (Plivo, Vonage). The agent ending the call closes the socket;
  jambonz first gets `disconnect`, which ends its listen verb.
* Audio out: Telnyx takes RTP payloads of 20 ms to 30 s, so the pipeline's audio goes out in
  whole 20 ms frames, MESSAGE_MS at most per message (a mark pads the last partial frame with
  the codec's silence); Plivo's playAudio likewise. Vonage, Exotel and jambonz frame audio in
  their codecs.
* Call control (the pipeline's `CallControl`): transfers through the carrier's REST API on the
  call the stream names (Telnyx `transfer`, Plivo's transfer to this server's `<Dial>` XML,
  Vonage's NCCO transfer), keys through Telnyx's and Vonage's REST or on Plivo's stream
  (`sendDTMF`). The APIs are built once per server (`call_control_apis`) and handed to every
  call; without one, the agent gets a reason naming the config to set. Exotel's and jambonz's
  streams offer neither (docs/telephony.md says what to do instead). Keys through a REST API
  go in order, before any transfer asked for after them; a refusal goes to the audit.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar, cast
from urllib.parse import parse_qsl, urlsplit

from voice_agent.agents.registry import AgentRegistry
from voice_agent.audio.codec import CarrierFormat, Encoding
from voice_agent.callcontrol.plivo_rest import PlivoRest
from voice_agent.callcontrol.telnyx_rest import TelnyxRest
from voice_agent.callcontrol.vonage_rest import VonageRest
from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.gateways.endpoints import (
    SocketCall,
    SocketOutbound,
    StartCall,
    refusal_text,
    usable_call_id,
)
from voice_agent.gateways.media_socket import MediaConnection, Message
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.transports import exotel, jambonz, plivo, telnyx, vonage
from voice_agent.transports.errors import POLICY_VIOLATION, ProtocolWarning, close_reason

log = logging.getLogger("voice_agent.server")

QUERY_AGENT = "agent"
QUERY_TOKEN = "token"  # the API token, never an arg
MESSAGE_MS = 500  # the longest media message sent to Telnyx or Plivo: 25 times fewer than 20 ms
FRAME_MS = 20
MAX_NOTES = 20  # carrier notes kept in a call's audit
MARK_GRACE_S = 1.0  # jambonz: a mark this late past its estimated playout counts as played
_SILENCE = {"mulaw": b"\xff", "alaw": b"\xd5", "pcm16": b"\x00"}


# ---- what a carrier's events mean to a call ------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallStart:
    agent: str | None
    args: dict[str, str]
    call_id: str | None
    carrier: CarrierFormat


@dataclass(frozen=True, slots=True)
class Heard:
    audio: bytes  # the caller's audio in the call's CarrierFormat


@dataclass(frozen=True, slots=True)
class Played:
    name: str


@dataclass(frozen=True, slots=True)
class Key:
    digit: str


@dataclass(frozen=True, slots=True)
class HungUp:
    reason: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something the carrier said that changes nothing (a warning, an error report, a clear
    confirmed): logged and kept in the call's audit."""

    kind: str
    text: str


CallEvent = CallStart | Heard | Played | Key | HungUp | Note


def agent_and_args(
    request_path: str, agent: str | None, args: dict[str, str]
) -> tuple[str | None, dict[str, str]]:
    """The carrier's own agent and args first, then the stream URL's query string."""
    params = dict(parse_qsl(urlsplit(request_path).query, keep_blank_values=True))
    params.pop(QUERY_TOKEN, None)
    query_agent = params.pop(QUERY_AGENT, None) or None
    return agent or query_agent, {**params, **args}


class Framer:
    """Audio in whole frames, `max_bytes` at most per piece; the rest waits for more or a
    flush, which pads it with silence to a whole frame."""

    def __init__(self, frame_bytes: int, max_bytes: int, silence: bytes) -> None:
        self.frame_bytes = frame_bytes
        self.max_bytes = max_bytes - max_bytes % frame_bytes
        self._silence = silence
        self._pending = bytearray()

    def push(self, data: bytes) -> list[bytes]:
        pending = self._pending
        pending += data
        whole = len(pending) - len(pending) % self.frame_bytes
        step = self.max_bytes
        out = [bytes(pending[i : min(i + step, whole)]) for i in range(0, whole, step)]
        del pending[:whole]
        return out

    def flush(self) -> list[bytes]:
        if not self._pending:
            return []
        short = self.frame_bytes - len(self._pending)
        data = bytes(self._pending) + self._silence * short
        self._pending.clear()
        return [data]

    def drop(self) -> None:
        self._pending.clear()


# ---- the carriers' APIs --------------------------------------------------------------------


@dataclass(frozen=True)
class CallControlApis:
    """The carriers' REST clients, built once per server; None where not configured."""

    telnyx: TelnyxRest | None = None
    plivo: PlivoRest | None = None
    vonage: VonageRest | None = None
    public_url: str | None = None  # server.public_url: where Plivo fetches a transfer's XML


NO_APIS = CallControlApis()


def _secret(registry: AgentRegistry, key: str, name: str) -> str:
    """The secret `name` that config key `key` names, or a ConfigError saying how to set it."""
    if name not in registry.secrets:
        raise ConfigError(
            f"{key} names secret {name!r}, which is not set: voice-agent secrets set {name}",
            file=str(registry.loaded.path),
            key=key,
        )
    return registry.secrets[name]


def call_control_apis(registry: AgentRegistry) -> CallControlApis:
    """The clients for the APIs `carriers:` configures (a ConfigError for a missing secret or
    a Vonage key that is not an RSA key in PEM)."""
    config = registry.loaded.config
    apis = config.carriers
    telnyx = plivo = vonage = None
    if apis.telnyx is not None:
        key = _secret(registry, "carriers.telnyx.api_key_secret", apis.telnyx.api_key_secret)
        telnyx = TelnyxRest(key, apis.telnyx.api_url)
    if apis.plivo is not None:
        name = apis.plivo.auth_token_secret
        token = _secret(registry, "carriers.plivo.auth_token_secret", name)
        plivo = PlivoRest(apis.plivo.auth_id, token, apis.plivo.api_url)
    if apis.vonage is not None:
        where = "carriers.vonage.private_key_secret"
        pem = _secret(registry, where, apis.vonage.private_key_secret)
        try:
            vonage = VonageRest(apis.vonage.application_id, pem, apis.vonage.api_url)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: secret {apis.vonage.private_key_secret!r} is {exc}",
                file=str(registry.loaded.path),
                key=where,
            ) from None
    return CallControlApis(telnyx, plivo, vonage, config.server.public_url)


def _needs_api(what: str, carrier: str) -> str:
    """Why `what` (transfers, keys) cannot go through `carrier`'s API: it is not configured."""
    name = carrier.lower()  # the stream's path and the config key alike
    return f"{what} on /{name} need {carrier}'s API: set carriers.{name}"


# ---- the carriers ------------------------------------------------------------------------


class Carrier:
    """One call's codec, read as CallEvents; after the start, the messages the carrier takes,
    and what it can do to the call (a transfer, keys)."""

    transport: ClassVar[str]
    sends_keys: ClassVar[bool] = False  # keys_on_stream or send_digits can work

    def receive(self, message: Message) -> list[CallEvent]:
        raise NotImplementedError

    def fast_audio(self, message: Message) -> bytes | None:
        """The caller's audio in `message` if it is a plain in-order media message (the path 50
        messages a second take), else None and `receive` handles it."""
        return None

    def audio_messages(self, data: bytes) -> list[Message]:
        raise NotImplementedError

    def mark_messages(self, name: str) -> list[Message]:
        raise NotImplementedError

    def clear_messages(self) -> list[Message]:
        raise NotImplementedError

    def goodbye_messages(self) -> list[Message]:
        return []

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        """Hand the call over; None once the carrier took it, else why not."""
        return f"the {self.transport} stream cannot transfer calls"

    def keys_on_stream(self, digits: str) -> list[Message] | None:
        """The messages that press `digits` on the stream itself; None: not this way."""
        return None

    async def send_digits(self, apis: CallControlApis, digits: str) -> str | None:
        """Press `digits` through the carrier's API; None once it took them, else why not."""
        return f"the {self.transport} stream cannot send keys"


def _note(warning: ProtocolWarning) -> Note:
    return Note(warning.kind, warning.message)


def _carrier_format(encoding: str, sample_rate: int) -> CarrierFormat:
    return CarrierFormat(cast(Encoding, encoding), sample_rate)


class _FramedJson(Carrier):
    """Telnyx and Plivo: the same event shapes (their codecs are both written like Twilio's),
    base64 JSON media sent in whole frames (see the module docstring)."""

    codec: ClassVar[ModuleType]  # voice_agent.transports.telnyx or .plivo

    def __init__(self, request_path: str, stream: Any) -> None:
        self.stream = stream
        self.request_path = request_path
        self.framer: Framer | None = None

    def fast_audio(self, message: Message) -> bytes | None:
        audio: bytes | None = (
            self.stream.media_payload(message) if message.__class__ is str else None
        )
        return audio

    def receive(self, message: Message) -> list[CallEvent]:
        if isinstance(message, bytes):
            self.stream.receive_bytes(message)  # raises: these carriers send text only
        codec = self.codec
        out: list[CallEvent] = []
        for event in self.stream.receive(cast(str, message)):
            if isinstance(event, codec.Media):
                if event.track == codec.INBOUND_TRACK:
                    out.append(Heard(event.payload))
            elif isinstance(event, codec.Mark):
                out.append(Played(event.name))
            elif isinstance(event, codec.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, codec.Start):
                fmt = event.media_format
                carrier = _carrier_format(fmt.carrier_encoding, fmt.sample_rate)
                frame = int(carrier.bytes_per_ms * FRAME_MS)
                longest = int(carrier.bytes_per_ms * MESSAGE_MS)
                self.framer = Framer(frame, longest, _SILENCE[carrier.encoding])
                agent, args = agent_and_args(self.request_path, event.agent, event.agent_args)
                out.append(CallStart(agent, args, usable_call_id(event.call_id), carrier))
            elif isinstance(event, codec.Stop):
                out.append(HungUp("caller hung up"))
            elif isinstance(event, ProtocolWarning):
                out.append(_note(event))
            else:
                note = self.note(event)
                if note is not None:
                    out.append(note)
        return out

    def note(self, event: object) -> Note | None:
        """A carrier's own event that changes nothing for the call."""
        return None

    def audio_messages(self, data: bytes) -> list[Message]:
        assert self.framer is not None
        return [self.stream.media_message(piece) for piece in self.framer.push(data)]

    def mark_messages(self, name: str) -> list[Message]:
        assert self.framer is not None
        media = [self.stream.media_message(piece) for piece in self.framer.flush()]
        return [*media, self.stream.mark_message(name)]

    def clear_messages(self) -> list[Message]:
        assert self.framer is not None
        self.framer.drop()
        return [self.stream.clear_message()]


class TelnyxCarrier(_FramedJson):
    transport = "telnyx"
    sends_keys = True
    codec: ClassVar[ModuleType] = telnyx

    def __init__(self, request_path: str) -> None:
        super().__init__(request_path, telnyx.TelnyxStream())

    def note(self, event: object) -> Note | None:
        if isinstance(event, telnyx.StreamError):
            return Note("carrier_error", f"{event.code} {event.title}: {event.detail}")
        return None

    def _call_control_id(self) -> str:
        assert self.stream.start is not None  # no call before the start
        return cast(str, self.stream.start.call_control_id)

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        if apis.telnyx is None:
            return _needs_api("transfers", "Telnyx")
        return await apis.telnyx.transfer(self._call_control_id(), transfer)

    async def send_digits(self, apis: CallControlApis, digits: str) -> str | None:
        if apis.telnyx is None:
            return _needs_api("keys", "Telnyx")
        return await apis.telnyx.send_digits(self._call_control_id(), digits)


class PlivoCarrier(_FramedJson):
    transport = "plivo"
    sends_keys = True
    codec: ClassVar[ModuleType] = plivo

    def __init__(self, request_path: str) -> None:
        super().__init__(request_path, plivo.PlivoStream())

    def note(self, event: object) -> Note | None:
        if isinstance(event, plivo.Cleared):
            return Note("cleared", "Plivo dropped its queued audio")
        return None

    def keys_on_stream(self, digits: str) -> list[Message] | None:
        return [plivo.send_dtmf_message(digits)]

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        if apis.plivo is None:
            return _needs_api("transfers", "Plivo")
        if apis.public_url is None:
            return (
                "transfers on /plivo need server.public_url: Plivo fetches the transfer's"
                " <Dial> XML from this server"
            )
        assert self.stream.start is not None  # no call before the start
        call_uuid = cast(str, self.stream.start.call_id)
        return await apis.plivo.transfer(call_uuid, transfer, apis.public_url)


class VonageCarrier(Carrier):
    transport = "vonage"
    sends_keys = True

    def __init__(self, request_path: str) -> None:
        self.stream = vonage.VonageStream()
        self.request_path = request_path

    def fast_audio(self, message: Message) -> bytes | None:
        return self.stream.audio_payload(message) if message.__class__ is bytes else None

    def receive(self, message: Message) -> list[CallEvent]:
        out: list[CallEvent] = []
        for event in self.stream.receive(message):
            if isinstance(event, vonage.Audio):
                out.append(Heard(event.payload))
            elif isinstance(event, vonage.Notify):
                if event.name is not None:
                    out.append(Played(event.name))
            elif isinstance(event, vonage.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, vonage.Connected):
                agent, args = agent_and_args(self.request_path, event.agent, event.agent_args)
                call_id = usable_call_id(event.call_id) if event.call_id else None
                out.append(CallStart(agent, args, call_id, event.carrier))
            elif isinstance(event, vonage.Cleared):
                out.append(Note("cleared", "Vonage dropped its buffered audio"))
            elif isinstance(event, ProtocolWarning):
                out.append(_note(event))
        return out

    def audio_messages(self, data: bytes) -> list[Message]:
        return list(self.stream.audio_messages(data))

    def mark_messages(self, name: str) -> list[Message]:
        return self.stream.mark_messages(name)

    def clear_messages(self) -> list[Message]:
        return self.stream.clear_messages()

    def _call_uuid(self) -> str | None:
        connected = self.stream.connected
        return connected.call_id if connected is not None else None

    def _no_uuid(self, what: str) -> str:
        return (
            f"{what} on /vonage need the call's uuid: pass the answer webhook's uuid as the"
            f" NCCO websocket endpoint's {vonage.CALL_ID_HEADER!r} header"
        )

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        if apis.vonage is None:
            return _needs_api("transfers", "Vonage")
        call_uuid = self._call_uuid()
        if call_uuid is None:
            return self._no_uuid("transfers")
        return await apis.vonage.transfer(call_uuid, transfer)

    async def send_digits(self, apis: CallControlApis, digits: str) -> str | None:
        if apis.vonage is None:
            return _needs_api("keys", "Vonage")
        call_uuid = self._call_uuid()
        if call_uuid is None:
            return self._no_uuid("keys")
        return await apis.vonage.send_digits(call_uuid, digits)


class ExotelCarrier(Carrier):
    transport = "exotel"

    def __init__(self, request_path: str) -> None:
        self.stream = exotel.ExotelStream()
        self.request_path = request_path

    def receive(self, message: Message) -> list[CallEvent]:
        if isinstance(message, bytes):
            self.stream.receive_bytes(message)  # raises: Exotel sends text only
        out: list[CallEvent] = []
        for event in self.stream.receive(cast(str, message)):
            if isinstance(event, exotel.Media):
                out.append(Heard(event.payload))
            elif isinstance(event, exotel.Mark):
                out.append(Played(event.name))
            elif isinstance(event, exotel.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, exotel.Start):
                agent, args = agent_and_args(self.request_path, event.agent, event.agent_args)
                args.pop(exotel.SAMPLE_RATE_PARAMETER, None)  # the applet URL's, never an arg
                out.append(CallStart(agent, args, usable_call_id(event.call_id), event.carrier))
            elif isinstance(event, exotel.Stop):
                reason = "caller hung up" if event.caller_hung_up else f"stream {event.reason}"
                out.append(HungUp(reason))
            elif isinstance(event, ProtocolWarning):
                out.append(_note(event))
        return out

    def audio_messages(self, data: bytes) -> list[Message]:
        return list(self.stream.media_messages(data))

    def mark_messages(self, name: str) -> list[Message]:
        return list(self.stream.mark_messages(name))

    def clear_messages(self) -> list[Message]:
        return list(self.stream.clear_messages())

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        # The Voicebot applet's flow goes on to its next applet when the stream ends: a Connect
        # applet there is Exotel's transfer, chosen by the flow, not by the agent.
        return (
            "Exotel's Voicebot stream cannot hand a call over: end the call (end_call) with a"
            " Connect applet after the Voicebot applet in the flow"
        )


class JambonzCarrier(Carrier):
    transport = "jambonz"

    def __init__(self, request_path: str) -> None:
        self.stream = jambonz.JambonzStream()
        self.request_path = request_path

    def fast_audio(self, message: Message) -> bytes | None:
        return self.stream.audio_payload(message) if message.__class__ is bytes else None

    def receive(self, message: Message) -> list[CallEvent]:
        out: list[CallEvent] = []
        for event in self.stream.receive(message):
            if isinstance(event, jambonz.Audio):
                out.append(Heard(event.payload))
            elif isinstance(event, jambonz.Mark):
                # A cleared mark's audio was dropped unplayed: it was not heard.
                if not event.cleared:
                    out.append(Played(event.name))
            elif isinstance(event, jambonz.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, jambonz.Start):
                agent, args = agent_and_args(self.request_path, event.agent, event.agent_args)
                out.append(CallStart(agent, args, usable_call_id(event.call_id), event.carrier))
            elif isinstance(event, jambonz.Stop):
                out.append(HungUp("caller hung up"))
            elif isinstance(event, jambonz.PlayDone):
                out.append(Note("play_done", f"playAudio {event.id} done"))
            elif isinstance(event, ProtocolWarning):
                out.append(_note(event))
        return out

    def audio_messages(self, data: bytes) -> list[Message]:
        return list(self.stream.audio_messages(data))

    def mark_messages(self, name: str) -> list[Message]:
        return self.stream.mark_messages(name)

    def clear_messages(self) -> list[Message]:
        return self.stream.clear_messages()

    def goodbye_messages(self) -> list[Message]:
        return [self.stream.disconnect_message()]

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        # listen's socket takes audio and a few commands, none of which moves the call; jambonz's
        # REST "update call" (a new call_hook) would, with credentials this server lacks.
        return (
            "jambonz's listen stream cannot hand a call over: end the call (end_call) and let"
            " the application's next verb (a dial) take it"
        )


CARRIERS: dict[str, Callable[[str], Carrier]] = {
    "/telnyx": TelnyxCarrier,
    "/plivo": PlivoCarrier,
    "/vonage": VonageCarrier,
    "/exotel": ExotelCarrier,
    "/jambonz": JambonzCarrier,
}
WEBSOCKET_MAX_SIZE = max(
    telnyx.WEBSOCKET_MAX_SIZE,
    plivo.WEBSOCKET_MAX_SIZE,
    vonage.WEBSOCKET_MAX_SIZE,
    exotel.WEBSOCKET_MAX_SIZE,
    jambonz.WEBSOCKET_MAX_SIZE,
)


def select_subprotocol(path: str, offered: list[str]) -> str | None:
    """The subprotocol to answer on `path`: jambonz's, the one it asked for; none elsewhere."""
    if path == "/jambonz":
        return next((p for p in offered if p in jambonz.SUBPROTOCOLS), None)
    return None


# ---- the driver ------------------------------------------------------------------------------


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
    when the server ends the call. Transfers go to the carrier (a reason where it has none)."""

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
            mark=lambda name: "",  # unused: mark and clear below send lists
            clear=lambda: "",
            event=lambda payload: None,  # carriers take media and their commands only
        )
        self.carrier = carrier
        self.clock = clock
        self.apis = apis
        self._keys_failed = keys_failed
        self._keys: asyncio.Task[None] | None = None  # the last keys asked for, not yet out

    async def transfer(self, transfer: CallTransfer) -> str | None:
        if self._keys is not None:
            # Keys asked for before the hand-over (a menu's choice, then the transfer) go first.
            await asyncio.gather(self._keys, return_exceptions=True)
        return await self.carrier.transfer(self.apis, transfer)

    async def _press(self, before: asyncio.Task[None] | None, digits: str) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)  # in the order asked
        try:
            error = await self.carrier.send_digits(self.apis, digits)
        except Exception as exc:  # a carrier's failure is this call's, never the server's
            log.exception("keys %s on a %s call failed", digits, self.carrier.transport)
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            self._keys_failed(error)

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
        for message in self.carrier.mark_messages(name):
            self._write(message)
        if self.clock is not None:
            self.clock.sent_mark(name)

    def clear(self) -> None:
        for message in self.carrier.clear_messages():
            self._write(message)
        if self.clock is not None:
            self.clock.cleared()

    def close(self, code: int, reason: str) -> None:
        if self._closing is None:
            for message in self.carrier.goodbye_messages():
                self._write(message)
            if self.clock is not None:
                self.clock.stop()
        super().close(code, reason)


class KeypadOutbound(CarrierOutbound):
    """A carrier's Outbound that can send keys too (`Carrier.sends_keys`): on the stream, or
    through the carrier's API in the background, one request after another."""

    def send_digits(self, digits: str) -> None:
        messages = self.carrier.keys_on_stream(digits)
        if messages is not None:
            for message in messages:
                self._write(message)
            return
        self._keys = asyncio.ensure_future(self._press(self._keys, digits))


class _CarrierCall(SocketCall):
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
        if isinstance(self.carrier, JambonzCarrier):
            carrier = event.carrier
            self.clock = _MarkClock(
                asyncio.get_running_loop(),
                carrier.sample_rate * carrier.sample_bytes,
                self._mark_played,
            )
        outbound = KeypadOutbound if self.carrier.sends_keys else CarrierOutbound
        self.outbound = outbound(self.ws, self.carrier, self.clock, self.apis, self._keys_failed)
        try:
            self.pipeline = await self.start_call(
                transport=self.transport,
                agent=event.agent,
                args=event.args,
                call_id=event.call_id,
                carrier=event.carrier,
                out=self.outbound,
            )
        except VoiceAgentError as exc:
            self.end(f"refused: {exc}")
            log.warning("%s call refused: %s", self.transport, refusal_text(exc))
            self.outbound.close(POLICY_VIOLATION, close_reason(refusal_text(exc)))
            return
        await self.pipeline.start()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            if self.clock is not None:
                self.clock.stop()


async def carrier_endpoint(
    ws: MediaConnection, start_call: StartCall, path: str, apis: CallControlApis = NO_APIS
) -> None:
    """Run one carrier call on `ws`, which came in on `path` (one of CARRIERS), with the
    carriers' APIs for its transfers and keys."""
    request_path = ws.request.path if ws.request is not None else path
    await _CarrierCall(ws, start_call, CARRIERS[path](request_path), apis).run()
