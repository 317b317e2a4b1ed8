"""The WebSocket media streams' adapters: /twilio, /telnyx, /plivo, /vonage, /exotel, /jambonz,
and this server's own /ws.

Each carrier's protocol lives in its sans-I/O codec (voice_agent.transports.<carrier>, with the
documents and versions it follows). Here each codec's events are read as the few things a call
needs (carrier_adapter.CallEvent: the start, caller audio, a mark played, a key pressed, the
hang-up, a note for the log and the audit), and what the pipeline sends goes out through the
codec's builders. So every stream runs on one driver (carrier_call.py) and differs only in its
small adapter here (a `Carrier`).

What the adapters decide, per carrier (docs/telephony.md has the table):

* The agent and its args come from what the carrier lets the call's set-up pass through
  (Twilio's, Telnyx's and Exotel's custom parameters, Plivo extraHeaders, Vonage's NCCO headers,
  jambonz's listen metadata, /ws's start message), then, but for /twilio and /ws, from the
  URL's query string (`?agent=booking&party=2`), which every other carrier's stream URL can
  carry; `token` is never an arg. The carrier's call id names the call when it is usable as a
  file name (`usable_call_id`).
* Only the caller's track is heard: Telnyx and Plivo may stream both tracks.
* Marks: Telnyx `mark`, Plivo `checkpoint`/`playedStream`, Vonage `notify`, Exotel `mark`,
  jambonz `mark`. What a carrier does with the marks a clear dropped differs: jambonz reports
  them `cleared` (not passed on), Telnyx returns them at once (as Twilio does), Plivo, Vonage
  and Exotel send nothing. Either way the call core has cut its playback at the clear and
  ignores marks of audio it dropped, so the interruption tracker commits only what was heard.
  jambonz can also lose the report of a mark sent after a `killAudio` (see
  voice_agent.transports.jambonz); there a mark still unreported carrier_call.MARK_GRACE_S after the
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
  Vonage's NCCO transfer, Twilio's call update), keys through Telnyx's and Vonage's REST or on
  Plivo's stream (`sendDTMF`). Exotel's and jambonz's streams offer neither (docs/telephony.md
  says what to do instead).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, cast

from voice_agent.audio.codec import CarrierFormat
from voice_agent.callcontrol.apis import CallControlApis
from voice_agent.gateways.carrier_adapter import (
    CallEvent,
    CallStart,
    Carrier,
    Framer,
    Heard,
    HungUp,
    Key,
    Note,
    Played,
    agent_and_args,
    carrier_format,
    needs_api,
    split,
    warning_note,
)
from voice_agent.gateways.media_socket import Message
from voice_agent.gateways.socket_call import usable_call_id
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.transports import exotel, jambonz, native, plivo, telnyx, twilio, vonage
from voice_agent.transports.errors import ProtocolWarning

MESSAGE_MS = 500  # the longest media message sent to Telnyx or Plivo: 25 times fewer than 20 ms
FRAME_MS = 20
_SILENCE = {"mulaw": b"\xff", "alaw": b"\xd5", "pcm16": b"\x00"}
# Twilio plays whatever length a media message holds and buffers ahead; one message per half
# second instead of per 20 ms frame sends 25 times fewer messages for the same audio.
TWILIO_OUTBOUND_BYTES = 4000  # 500 ms of 8 kHz mu-law


class TwilioCarrier(Carrier):
    """Twilio Media Streams; transfers through Twilio's REST API (callcontrol/twilio_rest.py)."""

    transport = "twilio"

    def __init__(self, request_path: str) -> None:
        self.stream = twilio.TwilioStream()

    def fast_audio(self, message: Message) -> bytes | None:
        return self.stream.media_payload(message) if message.__class__ is str else None

    def receive(self, message: Message) -> list[CallEvent]:
        out: list[CallEvent] = []
        for event in self.stream.receive_message(message):
            if isinstance(event, twilio.Media):
                out.append(Heard(event.payload))
            elif isinstance(event, twilio.Mark):
                out.append(Played(event.name))
            elif isinstance(event, twilio.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, twilio.Start):
                carrier = CarrierFormat("mulaw", twilio.SAMPLE_RATE)
                # The TwiML's <Parameter>s name the agent: Twilio's stream URL takes no query.
                call_id = usable_call_id(event.call_id)
                out.append(CallStart(event.agent, event.agent_args, call_id, carrier))
            elif isinstance(event, twilio.Stop):
                out.append(HungUp("caller hung up"))
            elif isinstance(event, ProtocolWarning):
                out.append(warning_note(event))
        return out

    def audio_messages(self, data: bytes) -> list[Message]:
        media = self.stream.media_message
        return [media(piece) for piece in split(data, TWILIO_OUTBOUND_BYTES)]

    def mark_messages(self, name: str) -> list[Message]:
        return [self.stream.mark_message(name)]

    def clear_messages(self) -> list[Message]:
        return [self.stream.clear_message()]

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        if apis.twilio is None:
            return (
                "transfers on /twilio need Twilio's REST API: set server.twilio_api_key and"
                " server.twilio_api_secret (or server.twilio_auth_token)"
            )
        start = self.stream.start
        assert start is not None  # no call before the start
        return await apis.twilio.transfer(start.account_sid, start.call_sid, transfer)


class NativeCarrier(Carrier):
    """This server's own protocol (/ws, voice_agent.transports.native): the only stream that
    takes the server's events and is told what went wrong."""

    transport = "ws"
    controls_calls = False  # the client does what it likes with its call

    def __init__(self, request_path: str) -> None:
        self.stream = native.NativeStream()
        self.frame_bytes = 0  # set by the start

    def receive(self, message: Message) -> list[CallEvent]:
        if isinstance(message, bytes):
            events = self.stream.receive_bytes(message)
        else:
            events = self.stream.receive_text(message)
        out: list[CallEvent] = []
        for event in events:
            if isinstance(event, native.Audio):
                out.append(Heard(event.data))
            elif isinstance(event, native.Mark):
                out.append(Played(event.name))
            elif isinstance(event, native.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, native.Start):
                audio = event.audio
                self.frame_bytes = audio.bytes_for_ms(native.MAX_AUDIO_FRAME_MS)
                carrier = carrier_format(audio.encoding, audio.sample_rate)
                out.append(CallStart(event.agent, event.args, None, carrier))
            elif isinstance(event, native.Stop):
                out.append(HungUp("caller hung up"))
            elif isinstance(event, ProtocolWarning):
                out.append(warning_note(event))
        return out

    def audio_messages(self, data: bytes) -> list[Message]:
        return list(split(data, self.frame_bytes))

    def mark_messages(self, name: str) -> list[Message]:
        return [native.mark_event(name)]

    def clear_messages(self) -> list[Message]:
        return [native.clear_event()]

    def event_messages(self, payload: dict[str, Any]) -> list[Message]:
        return [native.server_event(payload)]

    def started_messages(self, call_id: str, agent: str | None) -> list[Message]:
        return [native.started_event(call_id, agent=agent)]

    def tell_peer(self, kind: str, text: str) -> list[Message]:
        return [native.error_event(kind, text)]


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
        codec = self.codec
        out: list[CallEvent] = []
        for event in self.stream.receive_message(message):
            if isinstance(event, codec.Media):
                if event.track == codec.INBOUND_TRACK:
                    out.append(Heard(event.payload))
            elif isinstance(event, codec.Mark):
                out.append(Played(event.name))
            elif isinstance(event, codec.Dtmf):
                out.append(Key(event.digit))
            elif isinstance(event, codec.Start):
                fmt = event.media_format
                carrier = carrier_format(fmt.carrier_encoding, fmt.sample_rate)
                frame = int(carrier.bytes_per_ms * FRAME_MS)
                longest = int(carrier.bytes_per_ms * MESSAGE_MS)
                self.framer = Framer(frame, longest, _SILENCE[carrier.encoding])
                agent, args = agent_and_args(self.request_path, event.agent, event.agent_args)
                out.append(CallStart(agent, args, usable_call_id(event.call_id), carrier))
            elif isinstance(event, codec.Stop):
                out.append(HungUp("caller hung up"))
            elif isinstance(event, ProtocolWarning):
                out.append(warning_note(event))
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
            return needs_api("transfers", "Telnyx")
        return await apis.telnyx.transfer(self._call_control_id(), transfer)

    async def send_digits(self, apis: CallControlApis, digits: str) -> str | None:
        if apis.telnyx is None:
            return needs_api("keys", "Telnyx")
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
            return needs_api("transfers", "Plivo")
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
                out.append(warning_note(event))
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
            return needs_api("transfers", "Vonage")
        call_uuid = self._call_uuid()
        if call_uuid is None:
            return self._no_uuid("transfers")
        return await apis.vonage.transfer(call_uuid, transfer)

    async def send_digits(self, apis: CallControlApis, digits: str) -> str | None:
        if apis.vonage is None:
            return needs_api("keys", "Vonage")
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
        out: list[CallEvent] = []
        for event in self.stream.receive_message(message):
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
                out.append(warning_note(event))
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
    marks_by_clock = True  # see the module docstring

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
                out.append(warning_note(event))
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


# The carriers whose stream URL carries the API token (server/auth.py); /twilio is signed instead.
CARRIERS: dict[str, Callable[[str], Carrier]] = {
    "/telnyx": TelnyxCarrier,
    "/plivo": PlivoCarrier,
    "/vonage": VonageCarrier,
    "/exotel": ExotelCarrier,
    "/jambonz": JambonzCarrier,
}
# Every stream's adapter by its path; any other path speaks /ws's protocol.
STREAMS: dict[str, Callable[[str], Carrier]] = {"/twilio": TwilioCarrier, **CARRIERS}
WEBSOCKET_MAX_SIZE = max(
    twilio.WEBSOCKET_MAX_SIZE,
    native.WEBSOCKET_MAX_SIZE,
    telnyx.WEBSOCKET_MAX_SIZE,
    plivo.WEBSOCKET_MAX_SIZE,
    vonage.WEBSOCKET_MAX_SIZE,
    exotel.WEBSOCKET_MAX_SIZE,
    jambonz.WEBSOCKET_MAX_SIZE,
)


def adapter(path: str, request_path: str) -> Carrier:
    """The adapter for a call that came in on `path` (its URL `request_path`)."""
    return STREAMS.get(path, NativeCarrier)(request_path)


def select_subprotocol(path: str, offered: list[str]) -> str | None:
    """The subprotocol to answer on `path`: jambonz's, the one it asked for; none elsewhere."""
    if path == "/jambonz":
        return next((p for p in offered if p in jambonz.SUBPROTOCOLS), None)
    return None
