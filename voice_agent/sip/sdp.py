"""SDP (RFC 8866) read from an INVITE's body, and the offer/answer model (RFC 3264) for one G.711
audio stream. Sans-I/O: bytes in, dataclasses out, answer and offer bytes built.

What is covered: the line grammar of RFC 8866 section 5 (`<type>=<value>`, v= first and 0, o=
5.2, c= 5.7 with the multicast /ttl and /count suffixes dropped, m= 5.14 with its /count of
ports dropped); the attributes a user agent server for G.711 reads (rtpmap 6.6, fmtp 6.15,
ptime 6.4, sendrecv/sendonly/recvonly/inactive 6.7); static payload types from RFC 3551 tables
4 and 5; choosing the audio stream and codec of an offer (RFC 3264 section 6), the answer to it
(6, 6.1: one m= line per offered one, the rest rejected with port 0), hold both ways (8.4:
sendonly/inactive, and the RFC 2543 c=0.0.0.0); and the delayed offer, our offer answered in
the ACK (section 5 and 7). Not covered, as such a server needs none of it: s=/i=/u=/e=/p=/b=/
t=/r=/z=/k= lines and type letters RFC 8866 does not define (read past, not checked; section 5
would reject a description with an unknown letter, we are more lenient), session-level
rtpmap/fmtp (media-level only, 6.6), several c= lines of layered multicast (5.7), ICE,
RTCP attributes, bundling, and codecs other than PCMU/PCMA plus telephone-event (RFC 4733).
SRTP streams (RTP/SAVP) are read when the caller allows them (`negotiate(protocols=...)`):
their `a=crypto` lines are kept for voice_agent.sip.sdes, which chooses the keys.

Every problem with the SDP raises SdpError saying what is wrong and, where a line is at fault,
which (its number and text); the caller answers 400. An offer that reads but has no audio we
take raises NoCommonCodec, for a 488 (RFC 3261 section 21.4.26).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from typing import Literal

from voice_agent.errors import VoiceAgentError
from voice_agent.sip.sdes import SrtpKeys

# An SDP for one audio call is well under 1 KiB; a body past this is not one we read (and the
# m= line limit keeps a hostile offer from making us build a huge answer).
MAX_SDP_BYTES = 16 * 1024
MAX_MEDIA = 64
MAX_CRYPTO = 16  # a=crypto lines kept per stream: offers list two or three suites
SUPPORTED = ("PCMU", "PCMA")
DEFAULT_PTIME_MS = 20
TELEPHONE_EVENT = "TELEPHONE-EVENT"

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
_DIRECTIONS: dict[str, Direction] = {
    "sendrecv": "sendrecv",
    "sendonly": "sendonly",
    "recvonly": "recvonly",
    "inactive": "inactive",
}
# RFC 3264 section 6.1: the answer's direction is the offer's seen from the other end.
_ANSWER_DIRECTION: dict[Direction, Direction] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
# RFC 3551 tables 4 and 5: the payload types that need no a=rtpmap (section 6).
_STATIC: dict[int, tuple[str, int, int]] = {
    0: ("PCMU", 8000, 1),
    3: ("GSM", 8000, 1),
    4: ("G723", 8000, 1),
    5: ("DVI4", 8000, 1),
    6: ("DVI4", 16000, 1),
    7: ("LPC", 8000, 1),
    8: ("PCMA", 8000, 1),
    9: ("G722", 8000, 1),
    10: ("L16", 44100, 2),
    11: ("L16", 44100, 1),
    12: ("QCELP", 8000, 1),
    13: ("CN", 8000, 1),
    14: ("MPA", 90000, 1),
    15: ("G728", 8000, 1),
    16: ("DVI4", 11025, 1),
    17: ("DVI4", 22050, 1),
    18: ("G729", 8000, 1),
    25: ("CELB", 90000, 1),
    26: ("JPEG", 90000, 1),
    28: ("NV", 90000, 1),
    31: ("H261", 90000, 1),
    32: ("MPV", 90000, 1),
    33: ("MP2T", 90000, 1),
    34: ("H263", 90000, 1),
}
# The transports we take audio over: plain RTP, and AVPF, which an AVP receiver can talk to
# (RFC 4585 section 5) since it only adds RTCP feedback we may ignore; and their SRTP forms.
PLAIN_RTP = ("RTP/AVP", "RTP/AVPF")
SECURE_RTP = ("RTP/SAVP", "RTP/SAVPF")
# Encoding names are case-insensitive (RFC 4855 section 3); written the usual way in what we
# build, as some peers compare them as written.
_SPELLING = {TELEPHONE_EVENT: "telephone-event"}
# G.711 is 8 kHz mono (RFC 3551 section 4.5.14); a "PCMU/16000" or "PCMU/8000/2" is not it.
_G711 = ("PCMU", "PCMA")

# RFC 8866 section 9: token characters; [0-9] rather than \d, which also takes other scripts'
# digits that int() reads and the grammar does not allow.
_TOKEN = r"[A-Za-z0-9!#$%&'*+.^_`{|}~-]+"
_LINE = re.compile(r"([a-z])=(.*)")
_PORT = re.compile(r"([0-9]{1,5})(?:/[0-9]{1,5})?")
_PAYLOAD_TYPE = re.compile(r"[0-9]{1,3}")
_PROTOCOL = re.compile(r"[A-Za-z0-9][A-Za-z0-9/._-]*")
_MEDIA_TOKEN = re.compile(_TOKEN)
_RTPMAP = re.compile(rf"([0-9]{{1,3}})[ \t]+({_TOKEN})/([0-9]{{1,9}})(?:/([0-9]{{1,3}}))?")
_FMTP = re.compile(rf"({_TOKEN})[ \t]+(\S.*)")
# RFC 8866 section 6.4 allows a non-integral packet time; we keep whole milliseconds.
_PTIME = re.compile(r"([0-9]{1,6})(?:\.([0-9]{1,6}))?")
_HOSTNAME = re.compile(r"(?=[A-Za-z0-9.-]*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\.?")
_FIELDS = re.compile(r"[ \t]+")


class SdpError(VoiceAgentError):
    """An SDP body we cannot read; the message names the line and what is wrong with it."""


class NoCommonCodec(SdpError):
    """The SDP reads, but has no audio stream we can take; the caller answers 488."""


@dataclass(frozen=True)
class Codec:
    """One RTP payload format of a stream: a=rtpmap, or a static payload type (RFC 3551)."""

    payload_type: int
    name: str  # upper case: encoding names are case-insensitive (RFC 4855 section 3)
    clock_rate: int
    fmtp: str | None = None
    channels: int = 1  # rtpmap's encoding parameters for audio (RFC 8866 section 6.6)

    @property
    def label(self) -> str:
        return f"{self.name}/{self.clock_rate}"


@dataclass(frozen=True)
class MediaStream:
    """One m= line with what its media-level lines (or the session's, as defaults) say."""

    media: str  # lower case: "audio", "video", ...
    port: int
    protocol: str
    formats: tuple[str, ...]
    codecs: tuple[Codec, ...]  # the m= line's order; dynamic types without a=rtpmap left out
    connection: str | None  # the media-level c= address, else the session-level one
    direction: Direction
    ptime_ms: int | None
    crypto: tuple[str, ...] = ()  # its a=crypto values, in order (RFC 4568)
    rtcp_mux: bool = False  # a=rtcp-mux: RTCP on the RTP port (RFC 5761)
    rtcp_port: int | None = None  # a=rtcp:PORT (RFC 3605); None: the RTP port + 1


@dataclass(frozen=True)
class SessionDescription:
    origin_session_id: str
    origin_version: str
    connection: str | None  # the session-level c= address
    streams: tuple[MediaStream, ...]


@dataclass(frozen=True)
class Negotiated:
    """The audio stream offer/answer settled on, from our end: where to send, in what."""

    remote_address: str
    remote_port: int
    codec: Codec
    telephone_event: Codec | None
    direction: Direction  # the remote end's, as it wrote it
    on_hold: bool
    ptime_ms: int
    stream_index: int
    srtp: SrtpKeys | None = None  # the call's SRTP keys, once voice_agent.sip.offer chose them
    rtcp_mux: bool = False  # RTCP shares the RTP port both ways (offered and answered)
    remote_rtcp_port: int | None = None  # where the far end takes RTCP, when not muxed

    @property
    def rtcp_port(self) -> int:
        """The far end's RTCP port: the RTP port when muxed, its a=rtcp, else RTP's + 1."""
        if self.rtcp_mux:
            return self.remote_port
        return self.remote_rtcp_port or self.remote_port + 1


@dataclass
class _Draft:
    """The lines of one level (the session, or one m= line) while they are read."""

    media: str = ""
    port: int = 0
    protocol: str = ""
    formats: tuple[str, ...] = ()
    connection: str | None = None
    direction: Direction | None = None
    ptime_ms: int | None = None
    rtpmap: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    fmtp: dict[str, str] = field(default_factory=dict)
    crypto: list[str] = field(default_factory=list)
    rtcp_mux: bool = False
    rtcp_port: int | None = None

    @property
    def is_rtp(self) -> bool:
        return "RTP/" in self.protocol.upper()


def _error(number: int, line: str, problem: str) -> SdpError:
    return SdpError(f"SDP line {number} {line[:80]!r}: {problem}")


def parse_sdp(body: bytes) -> SessionDescription:
    """The session description in an SDP body (RFC 8866 section 5). Raises SdpError."""
    if len(body) > MAX_SDP_BYTES:
        raise SdpError(f"SDP of {len(body)} bytes, over the limit of {MAX_SDP_BYTES}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        number = body.count(b"\n", 0, e.start) + 1
        raise SdpError(f"SDP line {number} is not UTF-8 (byte {e.start})") from None
    session = _Draft()
    streams: list[_Draft] = []
    origin: tuple[str, str] | None = None
    seen_version = False
    # Section 5 says CRLF, and that a parser should take LF alone too; trailing blanks and
    # blank lines (some stacks end the body with one) are read past.
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip(" \t\r")
        if not line:
            continue
        if "\r" in line or "\x00" in line:
            raise _error(number, line, "holds a CR or NUL inside the line")
        match = _LINE.fullmatch(line)
        if match is None:
            raise _error(number, line, "is not '<type>=<value>' with a lower-case letter type")
        kind, value = match[1], match[2]
        if not seen_version:
            if kind != "v":
                raise _error(number, line, "an SDP starts with v=0 (RFC 8866 section 5)")
            if value != "0":
                raise _error(number, line, "the version is not 0")
            seen_version = True
            continue
        current = streams[-1] if streams else session
        if kind == "v":
            raise _error(number, line, "a second v= line")
        if kind == "o":
            if streams:
                raise _error(number, line, "o= after an m= line: it belongs to the session")
            if origin is not None:
                raise _error(number, line, "a second o= line")
            origin = _origin(number, line, value)
        elif kind == "c":
            if current.connection is not None:
                raise _error(number, line, "a second c= line at one level")
            current.connection = _connection(number, line, value)
        elif kind == "m":
            if len(streams) == MAX_MEDIA:
                raise _error(number, line, f"more than {MAX_MEDIA} m= lines")
            streams.append(_media(number, line, value))
        elif kind == "a":
            _attribute(number, line, value, current, is_session=not streams)
        # Other types are read past: s, i, u, e, p, b, t, r, z and k we have no use for, and
        # a letter we do not know too. Section 5 would have the whole description ignored or
        # rejected then; a newer stack's extension line should not cost the call its audio.
    if not seen_version:
        raise SdpError("SDP is empty: no v= line")
    if origin is None:
        raise SdpError("SDP has no o= line (RFC 8866 section 5.2)")
    return SessionDescription(
        origin_session_id=origin[0],
        origin_version=origin[1],
        connection=session.connection,
        streams=tuple(_stream(draft, session) for draft in streams),
    )


def _origin(number: int, line: str, value: str) -> tuple[str, str]:
    # o=<username> <sess-id> <sess-version> <nettype> <addrtype> <unicast-address>. The id
    # and version are kept as written: RFC 3264 section 8 compares them, nothing adds them.
    fields = _FIELDS.split(value)
    if len(fields) != 6 or not all(fields):
        raise _error(number, line, "o= needs 6 fields: username id version IN IP4|IP6 address")
    return fields[1], fields[2]


def _connection(number: int, line: str, value: str) -> str:
    fields = _FIELDS.split(value)
    if len(fields) != 3 or fields[0] != "IN" or fields[1].upper() not in ("IP4", "IP6"):
        raise _error(number, line, "c= is not 'IN IP4|IP6 <address>'")
    # Section 5.7: a multicast IPv4 address carries /ttl[/count], IPv6 /count; we send to
    # the address itself.
    address = fields[2].split("/", 1)[0]
    family = ipaddress.IPv4Address if fields[1].upper() == "IP4" else ipaddress.IPv6Address
    try:
        family(address)
    except ValueError:
        # RFC 8866 allows a domain name in place of the address (section 5.7).
        if not _HOSTNAME.fullmatch(address):
            raise _error(number, line, f"{address!r} is not an {fields[1]} address") from None
    return address


def _media(number: int, line: str, value: str) -> _Draft:
    # m=<media> <port>[/<number of ports>] <proto> <fmt> ... (section 5.14)
    fields = _FIELDS.split(value)
    if len(fields) < 4 or not _MEDIA_TOKEN.fullmatch(fields[0]):
        raise _error(number, line, "m= is not '<media> <port> <protocol> <format> ...'")
    port = _PORT.fullmatch(fields[1])
    if port is None or int(port[1]) > 65535:
        raise _error(number, line, f"port {fields[1][:20]!r} is not 0..65535")
    if not _PROTOCOL.fullmatch(fields[2]):
        raise _error(number, line, f"protocol {fields[2][:20]!r} is not a protocol name")
    draft = _Draft(media=fields[0].lower(), port=int(port[1]), protocol=fields[2])
    for fmt in fields[3:]:
        if draft.is_rtp:
            # RTP formats are payload type numbers (RFC 3550 section 5.1: 7 bits).
            if not _PAYLOAD_TYPE.fullmatch(fmt) or int(fmt) > 127:
                raise _error(number, line, f"payload type {fmt[:20]!r} is not 0..127")
        elif not _MEDIA_TOKEN.fullmatch(fmt):
            raise _error(number, line, f"format {fmt[:20]!r} is not a token")
    draft.formats = tuple(fields[3:])
    return draft


def _attribute(number: int, line: str, value: str, draft: _Draft, *, is_session: bool) -> None:
    name, _, argument = value.partition(":")
    name = name.lower()
    if not name:
        raise _error(number, line, "a= with no attribute name")
    if name in _DIRECTIONS:
        direction = _DIRECTIONS[name]
        if draft.direction not in (None, direction):
            raise _error(number, line, f"{name} after {draft.direction} at one level")
        draft.direction = direction
    elif name == "rtpmap":
        # a=rtpmap:<payload type> <encoding name>/<clock rate>[/<encoding parameters>] (6.6)
        match = _RTPMAP.fullmatch(argument)
        zero_channels = match is not None and match[4] is not None and int(match[4]) == 0
        if match is None or int(match[1]) > 127 or int(match[3]) == 0 or zero_channels:
            raise _error(number, line, "rtpmap is not '<0..127> <name>/<rate>[/<channels>]'")
        payload_type = int(match[1])
        if is_session or not draft.is_rtp:
            return  # rtpmap is a media-level attribute of RTP streams (section 6.6)
        if payload_type in draft.rtpmap:
            # Section 6.6: up to one rtpmap for each format; two leave the codec unknown.
            raise _error(number, line, f"a second rtpmap for payload type {payload_type}")
        channels = int(match[4]) if match[4] else 1
        draft.rtpmap[payload_type] = (match[2].upper(), int(match[3]), channels)
    elif name == "fmtp":
        match = _FMTP.fullmatch(argument)
        if match is None:
            raise _error(number, line, "fmtp is not '<format> <parameters>'")
        fmt = match[1]
        if draft.is_rtp:
            if not _PAYLOAD_TYPE.fullmatch(fmt) or int(fmt) > 127:
                raise _error(number, line, f"fmtp payload type {fmt[:20]!r} is not 0..127")
            fmt = str(int(fmt))
        if is_session:
            return  # media-level only (section 6.15)
        if fmt in draft.fmtp:
            raise _error(number, line, f"a second fmtp for format {fmt}")
        draft.fmtp[fmt] = match[2]
    elif name == "ptime":
        match = _PTIME.fullmatch(argument)
        if match is None or not (int(match[1]) or (match[2] or "").strip("0")):
            raise _error(number, line, "ptime is not a positive number of milliseconds")
        if draft.ptime_ms is not None:
            raise _error(number, line, "a second ptime at one level")
        # Whole milliseconds, half up, and never 0 for a sub-millisecond ptime.
        round_up = bool(match[2]) and match[2][0] >= "5"
        draft.ptime_ms = max(1, int(match[1]) + round_up)
    elif name == "crypto":
        if not is_session and len(draft.crypto) < MAX_CRYPTO:  # media-level (RFC 4568 9.1)
            draft.crypto.append(argument)
    elif name == "rtcp-mux":
        draft.rtcp_mux = draft.rtcp_mux or not is_session  # media-level (RFC 5761 5.1.1)
    elif name == "rtcp":
        # a=rtcp:<port> [<nettype> <addrtype> <address>] (RFC 3605); the address is not
        # taken: RTCP goes where RTP does, as the callers in use send both from one host.
        port = argument.split(" ", 1)[0]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise _error(number, line, "rtcp is not '<port 1..65535> [address]'")
        if not is_session:
            draft.rtcp_port = int(port)
    # Any other attribute is read past (section 5.13: unknown attributes are ignored).


def _stream(draft: _Draft, session: _Draft) -> MediaStream:
    codecs: list[Codec] = []
    seen: set[int] = set()
    if draft.is_rtp:
        for fmt in draft.formats:
            payload_type = int(fmt)
            if payload_type in seen:
                continue
            seen.add(payload_type)
            # An explicit rtpmap wins over the static table: it is what the sender wrote, and
            # for a static type it says the same thing when it is right.
            known = draft.rtpmap.get(payload_type) or _STATIC.get(payload_type)
            if known is None:
                continue  # a dynamic type with no rtpmap: nothing says what it is
            name, rate, channels = known
            fmtp = draft.fmtp.get(str(payload_type))
            codecs.append(Codec(payload_type, name, rate, fmtp, channels))
    return MediaStream(
        media=draft.media,
        port=draft.port,
        protocol=draft.protocol,
        formats=draft.formats,
        codecs=tuple(codecs),
        connection=draft.connection or session.connection,
        # Section 6.7: a media-level direction overrides the session's; sendrecv by default.
        direction=draft.direction or session.direction or "sendrecv",
        # ptime is media-level (6.4); a session-level one is taken as the streams' default,
        # as some stacks write it there and it can mean nothing else.
        ptime_ms=draft.ptime_ms if draft.ptime_ms is not None else session.ptime_ms,
        crypto=tuple(draft.crypto),
        rtcp_mux=draft.rtcp_mux,
        rtcp_port=draft.rtcp_port,
    )


def codec_in_use(negotiated: Negotiated | None) -> str | None:
    """The codec a call is in (None before it has one), for a re-offer to `keep`."""
    return negotiated.codec.name if negotiated is not None else None


def negotiate(
    offer: SessionDescription,
    supported: tuple[str, ...] = SUPPORTED,
    *,
    protocols: tuple[str, ...] = PLAIN_RTP,
    keep: str | None = None,
) -> Negotiated:
    """The audio stream and codec to answer `offer` with (RFC 3264 section 6): the first
    m=audio over one of `protocols` (RTP/AVP(F) by default), port not 0, with a codec in
    `supported`; of its codecs the first we support, as the offerer lists them in its order of
    preference (section 5.1), but `keep` (the codec a call is in) if a re-offer lists it: a
    re-INVITE for hold or a new address need not switch the law of a running call.

    Raises SdpError when the offer has no audio stream, NoCommonCodec when none we can take."""
    wanted = tuple(name.upper() for name in supported)
    audio = [(index, s) for index, s in enumerate(offer.streams) if s.media == "audio"]
    if not audio:
        raise SdpError("the offer has no audio stream (no m=audio line)")
    for index, stream in audio:
        if stream.port == 0 or stream.protocol.upper() not in protocols:
            continue
        usable = [c for c in stream.codecs if _takes(c, wanted)]
        kept = [c for c in usable if keep is not None and c.name == keep.upper()]
        codec = next(iter(kept or usable), None)
        if codec is not None:
            return _negotiated(index, stream, codec, "offer")
    offered = " and ".join(_describe(stream) for _, stream in audio)
    raise NoCommonCodec(f"offer has audio in {offered}; this server takes {', '.join(wanted)}")


def _takes(codec: Codec, wanted: tuple[str, ...]) -> bool:
    if codec.name not in wanted or codec.channels != 1:
        return False
    return codec.name not in _G711 or codec.clock_rate == 8000


def _describe(stream: MediaStream) -> str:
    if stream.codecs:
        text = ", ".join(codec.label for codec in stream.codecs)
    else:
        text = f"formats {' '.join(stream.formats)} with no a=rtpmap"
    if stream.port == 0:
        return f"{text} (disabled, port 0)"
    if stream.protocol.upper() not in PLAIN_RTP:
        return f"{text} over {stream.protocol}"
    return text


def _negotiated(index: int, stream: MediaStream, codec: Codec, side: str) -> Negotiated:
    if stream.connection is None:
        # Section 5.7 of RFC 8866: a c= at session level or in every m= section.
        raise SdpError(
            f"the {side}'s m={stream.media} {stream.port} {stream.protocol} stream has no c= "
            "line, at session level or its own"
        )
    events = (
        c for c in stream.codecs if c.name == TELEPHONE_EVENT and c.clock_rate == codec.clock_rate
    )
    return Negotiated(
        remote_address=stream.connection,
        remote_port=stream.port,
        codec=codec,
        telephone_event=next(events, None),
        direction=stream.direction,
        # RFC 3264 section 8.4: sendonly or inactive is hold; c=0.0.0.0 is RFC 2543's way,
        # which section 8.4 no longer recommends and older stacks still send.
        on_hold=stream.direction in ("sendonly", "inactive") or stream.connection == "0.0.0.0",
        ptime_ms=stream.ptime_ms or DEFAULT_PTIME_MS,
        stream_index=index,
        # An offer's a=rtcp-mux is taken (the answer says so); an answer's only counts if we
        # offered it, which our offers do not (negotiate_answer).
        rtcp_mux=stream.rtcp_mux and side == "offer",
        remote_rtcp_port=stream.rtcp_port,
    )


def negotiate_answer(our_offer: SessionDescription, answer: SessionDescription) -> Negotiated:
    """The caller's answer to our offer (build_offer; a delayed offer answered in the ACK,
    RFC 3264 section 7): its first audio stream, and of its codecs the first we offered.
    The payload types are the answer's: a stream lists those its writer receives (5.1, 6.1).

    Raises SdpError when the answer has no audio stream, NoCommonCodec when the answer
    rejected it (port 0), changed its transport, or holds no codec we offered."""
    ours = next((s for s in our_offer.streams if s.media == "audio"), None)
    if ours is None:
        raise ValueError("our offer has no audio stream")
    offered = [c for c in ours.codecs if _takes(c, SUPPORTED)]
    offered_text = ", ".join(c.label for c in offered)
    found = next(((i, s) for i, s in enumerate(answer.streams) if s.media == "audio"), None)
    if found is None:
        raise SdpError("the answer has no audio stream (no m=audio line)")
    index, stream = found
    if stream.port == 0:
        raise NoCommonCodec(
            f"the answer rejected the audio stream (port 0); we offered {offered_text}"
        )
    if stream.protocol.upper() != ours.protocol.upper():
        raise NoCommonCodec(f"the answer's audio is {stream.protocol}; we offered {ours.protocol}")
    keys = {(c.name, c.clock_rate, c.channels) for c in offered}
    codec = next((c for c in stream.codecs if (c.name, c.clock_rate, c.channels) in keys), None)
    if codec is None:
        raise NoCommonCodec(f"answer has audio in {_describe(stream)}; we offered {offered_text}")
    negotiated = _negotiated(index, stream, codec, "answer")
    if not any(c.name == TELEPHONE_EVENT for c in ours.codecs):
        # An answer may list formats the offer did not (section 6.1); only those both list
        # are ours to send.
        negotiated = replace(negotiated, telephone_event=None)
    if stream.ptime_ms is None and ours.ptime_ms is not None:
        # The answer left the packet time to us: the one we offered.
        negotiated = replace(negotiated, ptime_ms=ours.ptime_ms)
    return negotiated


def build_answer(
    offer: SessionDescription,
    negotiated: Negotiated,
    *,
    address: str,
    port: int,
    session_id: str,
    version: int,
) -> bytes:
    """The answer to `offer` (RFC 3264 section 6): one m= line for each offered one, in order;
    the negotiated audio stream at `address`:`port` with its codec and telephone-event, the
    rest rejected with port 0 and their formats copied (section 6)."""
    if not 0 <= negotiated.stream_index < len(offer.streams):
        raise ValueError(f"stream {negotiated.stream_index} is not one of the offer's")
    lines = _session_lines(address, port, session_id, version)
    for index, stream in enumerate(offer.streams):
        if index != negotiated.stream_index:
            lines.append(f"m={stream.media} 0 {stream.protocol} {' '.join(stream.formats)}")
            continue
        codecs = [negotiated.codec]
        if negotiated.telephone_event is not None:
            codecs.append(negotiated.telephone_event)
        lines.extend(_audio_lines(port, stream.protocol, codecs))
        if negotiated.srtp is not None:
            lines.append(negotiated.srtp.answer_line())
        if negotiated.rtcp_mux:
            lines.append("a=rtcp-mux")  # RFC 5761 section 5.1.1: taken
        if stream.ptime_ms is not None:
            # The packet time we send with, which we would like to receive as well (RFC 3264
            # section 6.1). An offer without one gets none back: ptime is optional there, and
            # the codec's default (20 ms for G.711, RFC 3551 table 1) applies both ways.
            lines.append(f"a=ptime:{negotiated.ptime_ms}")
        lines.append(f"a={_ANSWER_DIRECTION[negotiated.direction]}")
    return _encode(lines)


def build_offer(
    *, address: str, port: int, session_id: str, version: int, direction: Direction = "sendrecv"
) -> bytes:
    """Our offer (RFC 3264 section 5): G.711 mu-law then A-law, telephone-event 0-16, 20 ms."""
    codecs = [
        Codec(0, "PCMU", 8000),
        Codec(8, "PCMA", 8000),
        Codec(101, TELEPHONE_EVENT, 8000, "0-16"),
    ]
    lines = _session_lines(address, port, session_id, version)
    lines.extend(_audio_lines(port, "RTP/AVP", codecs))
    lines.extend([f"a=ptime:{DEFAULT_PTIME_MS}", f"a={direction}"])
    return _encode(lines)


def _session_lines(address: str, port: int, session_id: str, version: int) -> list[str]:
    # What goes into the SDP is checked, as a space or line break in it would make another
    # field or line of it.
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not 1..65535")
    if not re.fullmatch(r"[0-9]{1,20}", session_id) or version < 0:
        raise ValueError(f"o= session id {session_id!r} and version {version} are not numbers")
    network = f"IN {_address_type(address)} {address}"
    origin = f"o=voice-agent {session_id} {version} {network}"
    return ["v=0", origin, "s=voice-agent", f"c={network}", "t=0 0"]


def _address_type(address: str) -> str:
    try:
        return "IP6" if ipaddress.ip_address(address).version == 6 else "IP4"
    except ValueError:
        if _HOSTNAME.fullmatch(address):
            return "IP4"
        raise ValueError(f"{address!r} is not an IP address or host name") from None


def _audio_lines(port: int, protocol: str, codecs: list[Codec]) -> list[str]:
    formats = " ".join(str(codec.payload_type) for codec in codecs)
    lines = [f"m=audio {port} {protocol} {formats}"]
    for codec in codecs:
        name = _SPELLING.get(codec.name, codec.name)
        channels = f"/{codec.channels}" if codec.channels != 1 else ""
        lines.append(f"a=rtpmap:{codec.payload_type} {name}/{codec.clock_rate}{channels}")
        if codec.fmtp:
            lines.append(f"a=fmtp:{codec.payload_type} {codec.fmtp}")
    return lines


def _encode(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")
