"""SIP messages (RFC 3261 section 7): one datagram in, a parsed request or response out, and
responses built from the request they answer (section 8.2.6). Sans-I/O: bytes only.

What is covered: the start line (7.1, 7.2), headers with their compact forms (7.3.3), header
values folded over several lines (7.3.1), comma-separated values of one header in one line
(7.3.1; Via is the one the server reads that way), Content-Length deciding the body (18.3, with
a datagram's extra bytes ignored and a short body an error), and the parameters of Via and of
From/To name-addr values (tag, branch, received, rport). Not covered, as a user agent server for
G.711 calls needs none of it: multipart bodies, S/MIME, header comments, TCP framing.

Every problem raises SipParseError saying what is wrong with which part of the datagram; the
caller answers 400 when the start line and the headers a response needs could be read, and
drops the datagram otherwise (section 8.2.1 and 16.3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from voice_agent.errors import VoiceAgentError

# A datagram larger than this is not a SIP message we take (RFC 3261 18.1.1 keeps UDP
# messages under the path MTU; 64 KiB is UDP's own limit).
MAX_MESSAGE_BYTES = 65_535
MAX_HEADERS = 128
SIP_VERSION = "SIP/2.0"

# Compact forms (section 7.3.3 and RFC 3515 / 3265 / 3841 for the later ones).
_COMPACT = {
    "i": "call-id",
    "m": "contact",
    "e": "content-encoding",
    "l": "content-length",
    "c": "content-type",
    "f": "from",
    "s": "subject",
    "k": "supported",
    "t": "to",
    "v": "via",
    "r": "refer-to",
    "o": "event",
    "u": "allow-events",
}
# Headers whose value may hold several comma-separated entries on one line (section 7.3.1):
# only those the server splits; the rest are kept as written.
_LISTS = {"via"}
_TOKEN = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")
_REQUEST_LINE = re.compile(r"^([A-Za-z0-9.!%*_+`'~-]+) (\S+) (SIP/\d+\.\d+)$")
_STATUS_LINE = re.compile(r"^(SIP/\d+\.\d+) (\d{3}) ?(.*)$")
_VIA = re.compile(r"^SIP\s*/\s*2\.0\s*/\s*([A-Za-z]+)\s+([^;\s]+)\s*(.*)$", re.IGNORECASE)
REASONS = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "Version Not Supported",
    603: "Decline",
}


class SipParseError(VoiceAgentError):
    """A datagram that is not a SIP message we can read; the message says what is wrong."""


@dataclass(frozen=True)
class Via:
    """One Via header value (section 20.42): transport, sent-by host[:port], parameters."""

    transport: str
    sent_by: str
    params: dict[str, str | None]

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")

    @property
    def over_stream(self) -> bool:
        """Sent over a connection (TCP, TLS...), whose responses go back on it (18.2.2)."""
        return self.transport != "UDP"


@dataclass
class SipMessage:
    """A request (method and uri set) or a response (status set). Header names are kept in
    lower case, long forms; values in the order they came."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    method: str | None = None
    uri: str | None = None
    status: int | None = None
    reason: str = ""

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def get(self, name: str) -> str | None:
        """The first value of header `name` (any case, long or compact form)."""
        key = _header_key(name)
        return next((value for header, value in self.headers if header == key), None)

    def get_all(self, name: str) -> list[str]:
        key = _header_key(name)
        return [value for header, value in self.headers if header == key]

    @property
    def call_id(self) -> str:
        return self._required("call-id")

    @property
    def cseq(self) -> tuple[int, str]:
        value = self._required("cseq")
        parts = value.split()
        if len(parts) != 2 or not parts[0].isdigit() or not _TOKEN.match(parts[1]):
            raise SipParseError(f"CSeq {value!r} is not a number and a method")
        return int(parts[0]), parts[1].upper()

    @property
    def vias(self) -> list[Via]:
        return [parse_via(value) for value in self.get_all("via")]

    @property
    def from_tag(self) -> str | None:
        return header_params(self._required("from")).get("tag")

    @property
    def to_tag(self) -> str | None:
        return header_params(self._required("to")).get("tag")

    def _required(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise SipParseError(f"no {name} header")
        return value


def _header_key(name: str) -> str:
    key = name.strip().lower()
    return _COMPACT.get(key, key)


def parse_message(data: bytes) -> SipMessage:
    """One SIP message from a datagram (section 7). Raises SipParseError."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError(f"message of {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    # Section 7.5: line breaks before the start line are ignored (RFC 5626 keep-alives).
    data = data.lstrip(b"\r\n")
    if not data:
        raise SipParseError("no start line")
    head, separator, rest = data.partition(b"\r\n\r\n")
    if not separator:
        # Section 7.5: the empty line is required even without a body.
        raise SipParseError("no empty line after the headers")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SipParseError(f"headers are not UTF-8 (byte {e.start})") from None
    lines = text.split("\r\n")
    message = _start_line(lines[0])
    message.headers = _headers(lines[1:])
    message.body = _body(message, rest)
    return message


def _start_line(line: str) -> SipMessage:
    if line.startswith("SIP/"):
        match = _STATUS_LINE.match(line)
        if match is None:
            raise SipParseError(f"status line {line[:80]!r} is not 'SIP/2.0 CODE REASON'")
        if match[1] != SIP_VERSION:
            raise SipParseError(f"version {match[1]!r} is not {SIP_VERSION}")
        return SipMessage(status=int(match[2]), reason=match[3])
    match = _REQUEST_LINE.match(line)
    if match is None:
        raise SipParseError(f"request line {line[:80]!r} is not 'METHOD URI SIP/2.0'")
    if match[3] != SIP_VERSION:
        raise SipParseError(f"version {match[3]!r} is not {SIP_VERSION}")
    return SipMessage(method=match[1].upper(), uri=match[2])


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            # A folded line continues the header before it (section 7.3.1).
            if not headers:
                raise SipParseError("a continuation line before any header")
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name.strip()):
            raise SipParseError(f"header line {line[:80]!r} has no 'Name: value'")
        key = _header_key(name)
        value = value.strip()
        if key in _LISTS:
            headers.extend((key, part.strip()) for part in split_commas(value) if part.strip())
        else:
            headers.append((key, value))
        if len(headers) > MAX_HEADERS:
            raise SipParseError(f"more than {MAX_HEADERS} headers")
    return headers


def split_commas(value: str) -> list[str]:
    """Split at commas outside quotes and angle brackets (empty parts kept)."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(value):
        if char == '"':
            quoted = not quoted
        elif not quoted and char == "<":
            depth += 1
        elif not quoted and char == ">":
            depth = max(0, depth - 1)
        elif char == "," and not quoted and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    parts.append(value[start:])
    return parts


def _body(message: SipMessage, rest: bytes) -> bytes:
    length = message.get("content-length")
    if length is None:
        return rest  # section 18.3: over UDP the body runs to the end of the datagram
    if not length.strip().isdigit():
        raise SipParseError(f"Content-Length {length!r} is not a number")
    size = int(length)
    if size > len(rest):
        raise SipParseError(f"Content-Length {size} but only {len(rest)} bytes of body")
    return rest[:size]  # extra bytes after the body are dropped (section 18.3)


def header_params(value: str) -> dict[str, str | None]:
    """The header parameters of a From/To/Contact value: those after the name-addr's '>' (or
    after the bare URI, whose own parameters they are otherwise taken for: section 20.10)."""
    at = value.rfind(">")
    tail = value[at + 1 :] if at >= 0 else value[value.find(";") :] if ";" in value else ""
    return _params(tail)


def _params(tail: str) -> dict[str, str | None]:
    params: dict[str, str | None] = {}
    for part in tail.split(";"):
        part = part.strip()
        if not part:
            continue
        name, equals, value = part.partition("=")
        params[name.strip().lower()] = value.strip().strip('"') if equals else None
    return params


def parse_via(value: str) -> Via:
    match = _VIA.match(value.strip())
    if match is None:
        raise SipParseError(f"Via {value[:80]!r} is not 'SIP/2.0/TRANSPORT host[:port]'")
    return Via(match[1].upper(), match[2], _params(match[3]))


def name_addr_uri(value: str) -> str:
    """The URI of a From/To/Contact value: inside <...>, or the bare URI before parameters."""
    start = value.find("<")
    if start >= 0:
        end = value.find(">", start)
        if end < 0:
            raise SipParseError(f"{value[:80]!r} opens '<' and never closes it")
        return value[start + 1 : end]
    return value.split(";", 1)[0].strip()


def uri_user(uri: str) -> str | None:
    """The user part of a sip: or sips: URI ("sip:booking@host" -> "booking")."""
    scheme, colon, rest = uri.partition(":")
    if not colon or scheme.lower() not in ("sip", "sips", "tel"):
        return None
    if scheme.lower() == "tel":
        return rest.split(";", 1)[0] or None
    user, at, _ = rest.partition("@")
    if not at:
        return None
    return user.split(";", 1)[0] or None


def build_response(
    request: SipMessage,
    status: int,
    *,
    reason: str | None = None,
    to_tag: str | None = None,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
) -> bytes:
    """A response to `request` (section 8.2.6): its Via values, From, Call-ID and CSeq copied,
    its To with `to_tag` added unless it has one, then `headers`, Content-Length and body."""
    if not request.is_request:
        raise ValueError("responses answer requests")
    lines = [f"{SIP_VERSION} {status} {reason or REASONS.get(status, 'Unknown')}"]
    lines.extend(f"Via: {via}" for via in request.get_all("via"))
    for name, title in (("from", "From"), ("to", "To"), ("call-id", "Call-ID"), ("cseq", "CSeq")):
        value = request.get(name)
        if value is None:
            continue
        if name == "to" and to_tag and "tag" not in header_params(value):
            value = f"{value};tag={to_tag}"
        lines.append(f"{title}: {value}")
    lines.extend(f"{name}: {value}" for name, value in headers or [])
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def required_extensions(request: SipMessage) -> set[str]:
    """The option tags of a request's Require headers (section 8.2.2.3), lower case."""
    return {
        tag.strip().lower()
        for value in request.get_all("require")
        for tag in value.split(",")
        if tag.strip()
    }


def host_in_uri(host: str) -> str:
    """A host as a URI or Via writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def quoted(text: str) -> str:
    """`text` for a quoted-string (a Reason's text), escaped and cut to 200 characters."""
    return text.replace("\\", "\\\\").replace('"', '\\"')[:200]


_SIPFRAG_STATUS = re.compile(r"SIP/2\.0\s+([1-6][0-9][0-9])\s*([^\r\n]*)")


def sipfrag_status(body: bytes) -> tuple[int | None, str]:
    """The status line of a message/sipfrag body (RFC 3420): what the REFER's target answered."""
    first = body.lstrip().split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    match = _SIPFRAG_STATUS.match(first)
    if match is None:
        return None, ""
    return int(match.group(1)), match.group(2).strip()[:100]
