"""Session timers (RFC 4028) as the user agent server keeps them, sans-I/O: what interval and
which refresher to answer an INVITE, re-INVITE or UPDATE with (section 9), when the refresh is
due if it is ours (half the interval, section 10) and when the call is to be ended with a BYE
if the caller's never comes (the interval less the smaller of 32 s and a third of it).

Choices where the RFC leaves them to the server:
- The caller refreshes whenever it can (it named no refresher and supports timers): its SIP
  stack has done this for every call it made, and a refresh we never send cannot fail.
- A caller that supports timers but asked for none gets `session_expires_s` (1800 s, the
  RFC's recommendation) with itself as the refresher: a dialog whose caller vanished without
  a BYE then ends within the interval instead of lasting forever on both sides.
- An interval below our `min_se_s` is refused with 422 when the caller supports timers; when it
  does not (a proxy added the header), it is raised to `min_se_s` instead (errata 1687), as a
  refusal it cannot understand would fail the call.
- The interval asked for is taken as it is (the RFC lets a server shorten it, never lengthen it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from voice_agent.sip.message import SipMessage, SipParseError, header_params

MIN_SE_FLOOR_S = 90  # RFC 4028 section 4: no Min-SE below 90 s
DEFAULT_SESSION_EXPIRES_S = 1800  # section 4's recommendation
_MAX_INTERVAL_S = 2**31 - 1  # delta-seconds (RFC 3261 section 25.1)

Refresher = Literal["uac", "uas"]


@dataclass(frozen=True)
class TimerSettings:
    # What a caller that supports timers but names no interval gets; 0: no timer unless asked.
    session_expires_s: int = DEFAULT_SESSION_EXPIRES_S
    min_se_s: int = MIN_SE_FLOOR_S  # the shortest interval taken (422 below it)


@dataclass(frozen=True)
class TooSmall:
    """The request's interval is below what we take: 422 with `Min-SE: min_se_s`."""

    min_se_s: int


@dataclass
class SessionTimer:
    """A running session timer. `we_refresh`: the refreshes are ours to send (the server was
    named refresher), else the caller's to send and ours to watch."""

    interval_s: int
    we_refresh: bool
    started_ms: float = 0.0
    refreshing: bool = False  # our refresh is sent and not yet answered with a 2xx

    def restart(self, now_ms: float) -> None:
        """A 2xx to an INVITE or UPDATE was sent or received (section 10): a new interval."""
        self.started_ms = now_ms
        self.refreshing = False

    @property
    def refresh_ms(self) -> float:
        """When our refresh is sent (section 10's recommended half of the interval)."""
        return self.started_ms + self.interval_s * 500

    @property
    def expiry_ms(self) -> float:
        """When the call is ended with a BYE if no refresh succeeded (section 10)."""
        return self.started_ms + (self.interval_s - min(32, self.interval_s / 3)) * 1000

    @property
    def deadline_ms(self) -> float:
        return self.refresh_ms if self.we_refresh and not self.refreshing else self.expiry_ms

    def response_headers(self) -> list[tuple[str, str]]:
        """The headers of our 2xx to the caller's INVITE, re-INVITE or UPDATE: in the caller's
        terms its side is the uac; a uac refresher must be told it is required (section 9)."""
        refresher: Refresher = "uas" if self.we_refresh else "uac"
        headers = [("Session-Expires", f"{self.interval_s};refresher={refresher}")]
        if refresher == "uac":
            headers.append(("Require", "timer"))
        return headers

    def request_headers(self) -> list[tuple[str, str]]:
        """The headers of a refresh we send: we are its uac, and the refresher."""
        return [
            ("Session-Expires", f"{self.interval_s};refresher=uac"),
            ("Supported", "timer"),
        ]


def supports_timer(message: SipMessage) -> bool:
    """Whether a request says it supports timers (Supported or Require: timer)."""
    tags = {
        tag.strip().lower()
        for name in ("supported", "require")
        for value in message.get_all(name)
        for tag in value.split(",")
    }
    return "timer" in tags


def read_session_expires(message: SipMessage) -> tuple[int, Refresher | None] | None:
    """The Session-Expires of a request or response: its interval and refresher, if any."""
    value = message.get("session-expires")
    if value is None:
        return None
    delta, _, tail = value.partition(";")
    delta = delta.strip()
    if not delta.isdigit() or not 0 < int(delta) <= _MAX_INTERVAL_S:
        raise SipParseError(f"Session-Expires {value[:40]!r}: not a number of seconds")
    refresher = header_params(";" + tail).get("refresher")
    if refresher is not None and refresher.lower() not in ("uac", "uas"):
        raise SipParseError(f"Session-Expires refresher {refresher[:20]!r}: not uac or uas")
    return int(delta), (refresher.lower() if refresher else None)  # type: ignore[return-value]


def read_min_se(message: SipMessage) -> int | None:
    value = message.get("min-se")
    if value is None:
        return None
    delta = value.partition(";")[0].strip()
    if not delta.isdigit() or int(delta) > _MAX_INTERVAL_S:
        raise SipParseError(f"Min-SE {value[:40]!r}: not a number of seconds")
    return int(delta)


def negotiate(
    request: SipMessage, settings: TimerSettings, *, current: SessionTimer | None = None
) -> SessionTimer | TooSmall | None:
    """The timer our 2xx to `request` (the caller's INVITE, re-INVITE or UPDATE) sets up, or
    TooSmall (422), or None for no timer. `current` is the dialog's timer, whose interval a
    refresh that names none keeps. Raises SipParseError for a header that does not read."""
    supported = supports_timer(request)
    asked = read_session_expires(request)
    floor = max(settings.min_se_s, read_min_se(request) or 0)
    if asked is None:
        if not supported:
            return None  # a caller without timers, and no proxy asked for one
        interval = current.interval_s if current is not None else settings.session_expires_s
        if interval <= 0:
            return None
        return SessionTimer(max(interval, floor), we_refresh=False)
    interval, refresher = asked
    if interval < settings.min_se_s:
        if supported:
            return TooSmall(floor)
        interval = floor
    if refresher is None:
        refresher = "uac" if supported else "uas"
    elif refresher == "uac" and not supported:
        refresher = "uas"  # section 9: a caller that cannot refresh is not made to
    return SessionTimer(interval, we_refresh=refresher == "uas")


def answered(response: SipMessage, current: SessionTimer) -> SessionTimer | None:
    """The timer after the 2xx to a refresh we sent: as the response sets it (the refresher
    it names in our terms: we sent the request, so uac is us), or None if it names none
    (section 7.2: no timer any more)."""
    got = read_session_expires(response)
    if got is None:
        return None
    interval, refresher = got
    return SessionTimer(interval, we_refresh=refresher != "uas", started_ms=current.started_ms)
