"""SIP transactions (RFC 3261 section 17), the parts a user agent server needs: the
timers, the key that matches a retransmitted request to its transaction (17.2.3), the
non-INVITE server transaction's "completed" state as a bounded cache of responses (17.2.2), and
one retransmission schedule shared by the 2xx to an INVITE (13.3.1.4) and the requests the
server sends itself (17.1.2, timers E and F). Sans-I/O: times are the caller's `now_ms`.

The INVITE server transaction of a call lives with the call (voice_agent.sip.uas), since its
2xx is the dialog's business (RFC 6026's "accepted" state). Requests refused before a call
exists are answered statelessly (section 8.2.7): a lost refusal is repaired by the client's own
retransmission, and a flood of refused requests leaves no state behind.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from voice_agent.sip.message import SipMessage, SipParseError, parse_via

T1_MS = 500.0  # round-trip estimate (section 17.1.1.1)
T2_MS = 4000.0  # the longest retransmit interval for non-INVITE requests and INVITE responses
T4_MS = 5000.0  # how long a message can stay in the network
TIMEOUT_MS = 64 * T1_MS  # timers B, F, H, J, L: 32 s
MAGIC_COOKIE = "z9hG4bK"  # section 8.1.1.7: a branch made by an RFC 3261 client
MAX_CACHED_RESPONSES = 4096

Addr = tuple[str, int]
TransactionKey = tuple[str, ...]


def transaction_key(request: SipMessage) -> TransactionKey:
    """What matches a request to its server transaction (section 17.2.3).

    ACK matches the INVITE it acknowledges (for a non-2xx final response); CANCEL has a
    transaction of its own. Clients older than RFC 3261 (no magic cookie) are matched on the
    Call-ID, From tag, CSeq number and top Via, the fallback the section describes in short.
    """
    method = request.method or ""
    top = request.vias[0] if request.get("via") else None
    if top is None:
        raise SipParseError("no Via header")
    matched_method = "INVITE" if method == "ACK" else method
    branch = top.branch or ""
    if branch.startswith(MAGIC_COOKIE):
        return (branch, top.sent_by.lower(), matched_method)
    number, _ = request.cseq
    return (
        "rfc2543",
        request.call_id,
        request.from_tag or "",
        str(number),
        top.sent_by.lower(),
        matched_method,
    )


@dataclass
class Retransmission:
    """Sends one message again at T1, 2*T1, ... capped at T2, until stopped or TIMEOUT_MS."""

    data: bytes
    addr: Addr
    started_ms: float
    interval_ms: float = T1_MS
    cap_ms: float = T2_MS

    def __post_init__(self) -> None:
        self.next_ms = self.started_ms + self.interval_ms

    @classmethod
    def of_request(
        cls, data: bytes, addr: Addr, started_ms: float, *, over_stream: bool
    ) -> Retransmission:
        """A request's, or a non-2xx final response's: over UDP sent again at T1, 2*T1, ...;
        over a connection, which delivers it or fails (17.1.2.2, 17.2.1: timers E and G are
        not set), never sent again, and still given up at TIMEOUT_MS. (A 2xx to an INVITE is
        sent again over every transport, 13.3.1.4.)"""
        return cls(data, addr, started_ms, interval_ms=TIMEOUT_MS if over_stream else T1_MS)

    @property
    def gives_up_ms(self) -> float:
        return self.started_ms + TIMEOUT_MS

    @property
    def deadline_ms(self) -> float:
        return min(self.next_ms, self.gives_up_ms)

    def due(self, now_ms: float) -> bool:
        """True when the message is to be sent again now (and the next time is set)."""
        if now_ms < self.next_ms or now_ms >= self.gives_up_ms:
            return False
        self.interval_ms = min(self.interval_ms * 2, self.cap_ms)
        self.next_ms = now_ms + self.interval_ms
        return True

    def timed_out(self, now_ms: float) -> bool:
        return now_ms >= self.gives_up_ms


class ResponseCache:
    """The final responses of recent non-INVITE server transactions (section 17.2.2): a
    retransmitted BYE, OPTIONS or INFO gets the same response again, for timer J (32 s) over UDP.
    Bounded: past `max_entries` the oldest go first, so a flood costs no memory."""

    def __init__(self, max_entries: int = MAX_CACHED_RESPONSES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[TransactionKey, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: TransactionKey, now_ms: float) -> bytes | None:
        self.prune(now_ms)
        entry = self._entries.get(key)
        return entry[1] if entry is not None else None

    def put(self, key: TransactionKey, response: bytes, now_ms: float) -> None:
        self._entries[key] = (now_ms + TIMEOUT_MS, response)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def prune(self, now_ms: float) -> None:
        # Every entry lives as long, so insertion order is expiry order.
        while self._entries:
            key, (expires_ms, _) = next(iter(self._entries.items()))
            if expires_ms > now_ms:
                return
            del self._entries[key]


_RPORT = re.compile(r";\s*rport(?=\s*(;|$))", re.IGNORECASE)


def response_addr(request: SipMessage, source: Addr) -> Addr:
    """Where a response goes (section 18.2.2 with RFC 3581): back on the connection a request
    came over (TCP, TLS: the I/O layer knows it by its peer's address); over UDP to the source
    port if the client asked (rport), else to the port in its Via, at the address the request
    came from."""
    via = request.vias[0]
    if via.over_stream or "rport" in via.params:
        return source
    port = via.sent_by.rpartition(":")[2] if not via.sent_by.endswith("]") else ""
    return (source[0], int(port) if port.isdigit() else 5060)


def with_received(request: SipMessage, source: Addr) -> SipMessage:
    """The request with `received` and `rport` filled in its top Via (section 18.2.1, RFC
    3581), so every response built from it carries them back."""
    for index, (name, value) in enumerate(request.headers):
        if name != "via":
            continue
        via = parse_via(value)
        host = via.sent_by.rsplit(":", 1)[0] if not via.sent_by.endswith("]") else via.sent_by
        new = value
        asked_rport = "rport" in via.params and via.params["rport"] is None
        if asked_rport:
            new = _RPORT.sub(f";rport={source[1]}", new, count=1)
        # RFC 3581 section 4: with rport, received is added even when it repeats the host.
        if (asked_rport or host.strip("[]") != source[0]) and "received" not in via.params:
            new = f"{new};received={source[0]}"
        if new == value:
            return request
        headers = list(request.headers)
        headers[index] = (name, new)
        return SipMessage(
            headers=headers, body=request.body, method=request.method, uri=request.uri
        )
    return request
