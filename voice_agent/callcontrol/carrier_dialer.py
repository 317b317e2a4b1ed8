"""Placing calls through a carrier's REST API (`POST /calls` with `via: twilio`, ...).

The carrier dials; when the callee answers it connects the call's stream back to this server,
where the agent starts (after the callee's hello: core/callee_hello.py); its status callbacks
come to the control API (`/callbacks/<call_id>?key=...`) and end the record of a call nobody
answered (busy, no answer, failed), or bring the carrier's answering-machine verdict. The table
of placed calls (placed_calls.py) ties stream and callbacks to the request.

Each carrier is a `Placer` beside its REST client (twilio_rest.py, ...): how it places a call,
the stream path it connects to, and how its callbacks read. What is common is here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import quote

from voice_agent.callcontrol.placed_calls import (
    PLACED_ARG,
    Answered,
    CallStatus,
    PlacedCall,
    PlacedCalls,
    Unanswered,
    Verdict,
    Via,
)
from voice_agent.core.voicemail import BeepHeard, Human, Machine

log = logging.getLogger("voice_agent.server")

CALLBACK_PREFIX = "/callbacks/"
# A placed call whose carrier reports nothing this long after its ring timeout is dropped.
EXPIRE_AFTER_RING_S = 120.0


@dataclass(frozen=True)
class Callback:
    """A carrier's HTTP request to a placed call's callback URL."""

    method: str
    url: str  # as the carrier was given it (signatures cover it): the dialer sets it
    headers: Mapping[str, str]
    body: bytes
    form: Mapping[str, str]  # the form-encoded body's fields, or the query's for a GET


@dataclass(frozen=True)
class Reply:
    """The control API's answer to a callback; `status` what it said of the call."""

    code: int = 200
    body: str = ""
    content_type: str = "text/plain"
    status: CallStatus | None = None


class CallbackRefused(Exception):
    """A callback that is not the carrier's (a bad signature): 403, and nothing changes."""


class Placer(Protocol):
    via: Via

    def unavailable(self) -> str | None:
        """Why this carrier cannot place calls as configured (None: it can)."""

    def stream_path(self, token: str) -> str:
        """The path (and query) of the main port the answered call's stream connects to."""

    async def place(
        self, call: PlacedCall, stream_url: str, callback_url: str, *, amd: bool
    ) -> str | None:
        """Ask the carrier to dial `call.to`; None once it took the request, else why not."""

    def read_callback(self, call: PlacedCall, callback: Callback, stream_url: str) -> Reply:
        """What a callback says (CallbackRefused if it is not the carrier's)."""


RecordUnanswered = Callable[[PlacedCall, str], None]
PipelineOf = Callable[[str], Any]  # the live call's CallPipeline, or None


class CarrierDialer:
    def __init__(
        self,
        placers: Mapping[str, Placer],
        *,
        public_url: str | None,
        control_public_url: str | None,
        ring_timeout_s: float,
        record_unanswered: RecordUnanswered,
        pipeline_of: PipelineOf,
    ) -> None:
        self.placers = dict(placers)
        self.public_url = public_url.rstrip("/") if public_url else None
        self.control_public_url = control_public_url.rstrip("/") if control_public_url else None
        self.ring_timeout_s = ring_timeout_s
        self.calls = PlacedCalls(ring_timeout_s + EXPIRE_AFTER_RING_S)
        self._record_unanswered = record_unanswered
        self._pipeline_of = pipeline_of
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def vias(self) -> list[str]:
        return sorted(self.placers)

    def unavailable(self, via: str) -> str | None:
        """Why calls cannot go out through `via` (None: they can)."""
        placer = self.placers.get(via)
        if placer is None:
            return f"placing calls through {via} needs carriers.{via} in the config"
        if self.public_url is None:
            return f"placing calls through {via} needs server.public_url: its stream connects there"
        if self.control_public_url is None:
            return (
                f"placing calls through {via} needs server.control_public_url: its status "
                "callbacks come there"
            )
        return placer.unavailable()

    # ---- placing -------------------------------------------------------------------------

    def place(
        self, call_id: str, agent: str, to: str, args: dict[str, Any], via: Via, *, amd: bool
    ) -> PlacedCall:
        """Start dialling (unavailable(via) must be None); the request goes out in a task."""
        call = self.calls.add(call_id, agent, args, to, via)
        task = asyncio.ensure_future(self._place(call, amd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        asyncio.get_running_loop().call_later(self.calls.expire_s, self._expire)
        return call

    def stream_url(self, call: PlacedCall) -> str:
        assert self.public_url is not None
        scheme, _, rest = self.public_url.partition("://")
        ws = "wss" if scheme == "https" else "ws"
        return f"{ws}://{rest}{self.placers[call.via].stream_path(call.token)}"

    def callback_url(self, call: PlacedCall) -> str:
        assert self.control_public_url is not None
        return f"{self.control_public_url}{CALLBACK_PREFIX}{call.call_id}?key={quote(call.key)}"

    async def _place(self, call: PlacedCall, amd: bool) -> None:
        placer = self.placers[call.via]
        try:
            error = await placer.place(
                call, self.stream_url(call), self.callback_url(call), amd=amd
            )
        except Exception as exc:  # a bug in a placer must still end the record
            log.exception("call %s: placing it through %s failed", call.call_id, call.via)
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            self._unanswered(call, f"call failed: {error}")

    def _unanswered(self, call: PlacedCall, reason: str) -> None:
        if self.calls.pop(call.call_id) is not None:
            self._record_unanswered(call, reason)

    def _expire(self) -> None:
        for call in self.calls.expired():
            said = "answered, but its stream never connected" if call.answered else "no report"
            self._record_unanswered(call, f"call failed: {call.via} gave {said}")

    # ---- the stream and the callbacks -----------------------------------------------------

    def claim(self, args: dict[str, Any]) -> PlacedCall | None:
        """The placed call a starting stream names by its `placed_call` arg (taken out of
        `args`); None when it names none. LookupError for a token that names no call
        waiting for its stream."""
        token = args.pop(PLACED_ARG, None)
        if token is None:
            return None
        call = self.calls.claim(str(token))
        if call is None:
            raise LookupError("the stream names a placed call that is unknown or already on")
        return call

    def ended(self, call_id: str) -> None:
        """The placed call's stream ended: nothing more to tie to it."""
        self.calls.pop(call_id)

    def callback(self, call_id: str, key: str, callback: Callback) -> Reply:
        call = self.calls.get(call_id, key)
        if call is None:
            # A call already over (a late `completed`), or no such call: nothing to change,
            # and nothing that says which.
            return Reply(404, "no such placed call")
        placer = self.placers[call.via]
        # Signatures cover the URL the carrier was given, not the one a proxy passed on.
        callback = replace(callback, url=self.callback_url(call))
        try:
            reply = placer.read_callback(call, callback, self.stream_url(call))
        except CallbackRefused as exc:
            log.warning("call %s: a callback refused: %s", call_id, exc)
            return Reply(403, str(exc))
        status = reply.status
        if isinstance(status, Unanswered) and not call.streaming:
            self._unanswered(call, status.reason)
        elif isinstance(status, Answered):
            call.answered = True
        elif isinstance(status, Verdict):
            pipeline = self._pipeline_of(call_id) if call.streaming else None
            if pipeline is not None:
                pipeline.machine_answer(decision(status))
            else:
                call.verdicts.append(status)
        return reply


def decision(verdict: Verdict) -> Human | Machine | BeepHeard:
    """A carrier's verdict as the server's own detector would have said it."""
    if verdict.answer == "person":
        return Human(after_ms=0.0)
    if verdict.answer == "machine":
        return Machine(after_ms=0.0, reason="carrier")
    return BeepHeard(at_ms=0.0, assumed=not verdict.beep)
