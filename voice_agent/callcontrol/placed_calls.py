"""Calls the server places through a carrier's REST API, between `POST /calls` and their stream.

A carrier dials the callee, and on answer connects the call's media stream back to this
server (`/twilio`, `/telnyx`, `/plivo`), while its status callbacks (`/callbacks/<call_id>` on
the control API) say what became of the dialling: ringing, answered, busy, no answer, failed,
and its answering-machine verdict when asked for one. This table ties the three together:

* The stream names its placed call by the `placed_call` agent arg (a TwiML `<Parameter>`, a
  query parameter of the stream URL), `<call_id>.<key>`; the key is random per call and used
  once, so no stream can take over another placed call or invent one, and the agent and args
  are the ones `POST /calls` gave, whatever else the stream says.
* A callback's URL holds the same key; an unanswered call's callback ends its record.
* An entry lives until its stream ends or its dialling does; one whose carrier never reports
  back is dropped after `expire_s` (bounded state whatever a carrier does).

Plain code with an injected clock: the server's adapters do the I/O.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

PLACED_ARG = "placed_call"  # the agent arg a placed call's stream carries: "<call_id>.<key>"
Via = Literal["sip", "twilio", "telnyx", "plivo"]
CARRIER_VIAS: tuple[Via, ...] = ("twilio", "telnyx", "plivo")


@dataclass(frozen=True)
class Unanswered:
    """The dialling ended without a stream: `reason` is an end reason ("busy: ...",
    "no answer: ...", "call failed: ...": voice_agent/store/outcomes.py)."""

    reason: str


@dataclass(frozen=True)
class Answered:
    """The callee picked up: the stream is on its way."""


@dataclass(frozen=True)
class Verdict:
    """The carrier's answering-machine detection: "person", "machine" (its greeting goes on)
    or "message" (a machine's greeting has ended, with or without a beep: speak now)."""

    answer: Literal["person", "machine", "message"]
    beep: bool = False
    said: str = ""  # the carrier's own words for it, for the audit


CallStatus = Unanswered | Answered | Verdict


@dataclass
class PlacedCall:
    call_id: str
    agent: str
    args: dict[str, Any]
    to: str
    via: Via
    key: str
    created: float
    answered: bool = False  # the carrier said the callee picked up
    streaming: bool = False  # its stream has connected (the pipeline owns the record)
    carrier_id: str | None = None  # the carrier's id for the call, once it said
    verdicts: list[Verdict] = field(default_factory=list)  # ones that came before the stream

    @property
    def token(self) -> str:
        return f"{self.call_id}.{self.key}"


class PlacedCalls:
    def __init__(self, expire_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.expire_s = expire_s
        self._clock = clock
        self._calls: dict[str, PlacedCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call_id: str, agent: str, args: dict[str, Any], to: str, via: Via) -> PlacedCall:
        call = PlacedCall(
            call_id, agent, dict(args), to, via, secrets.token_urlsafe(18), self._clock()
        )
        self._calls[call_id] = call
        return call

    def get(self, call_id: str, key: str) -> PlacedCall | None:
        """The placed call a callback's URL names, if its key is right."""
        call = self._calls.get(call_id)
        if call is None or not hmac.compare_digest(call.key.encode(), key.encode()):
            return None
        return call

    def valid_token(self, token: str) -> bool:
        """Whether `token` names a placed call whose stream has not yet come (the access
        policy's check for a stream's handshake)."""
        call_id, _, key = token.partition(".")
        call = self.get(call_id, key)
        return call is not None and not call.streaming

    def claim(self, token: str) -> PlacedCall | None:
        """The placed call a stream names, once: a second stream with the same token gets
        None."""
        call_id, _, key = token.partition(".")
        call = self.get(call_id, key)
        if call is None or call.streaming:
            return None
        call.streaming = True
        return call

    def pop(self, call_id: str) -> PlacedCall | None:
        return self._calls.pop(call_id, None)

    def expired(self) -> list[PlacedCall]:
        """Calls still dialling after `expire_s` (their carrier never reported back): removed
        and returned, for their records to end."""
        now = self._clock()
        old = [
            c for c in self._calls.values() if not c.streaming and now - c.created >= self.expire_s
        ]
        for call in old:
            del self._calls[call.call_id]
        return old
