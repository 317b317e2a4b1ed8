"""The append-only audit log of a call: everything that happened, heard or not, with timestamps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

AuditListener = Callable[["AuditEvent"], None]


@dataclass(frozen=True)
class AuditEvent:
    type: str
    t: float  # seconds on the call's monotonic clock since the call started
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "t": round(self.t, 6), **self.data}


class AuditLog:
    """Events are redacted before they are stored, so nothing downstream can leak a secret."""

    def __init__(
        self,
        clock: Callable[[], float],
        redact: Callable[[Any], Any] = lambda value: value,
    ) -> None:
        self._clock = clock
        self._start = clock()
        self._redact = redact
        self._events: list[AuditEvent] = []
        self._listeners: list[AuditListener] = []

    def subscribe(self, listener: AuditListener) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        """The call is over: stop telling listeners (events are still kept). Listeners hold
        the call's objects and the call holds its audit, a cycle only a full collection of
        the garbage collector would free; dropping them lets the call go when it ends."""
        self._listeners.clear()

    def elapsed(self) -> float:
        """Seconds since the call started, on the audit's clock."""
        return self._clock() - self._start

    def add(self, type: str, **data: Any) -> AuditEvent:
        event = AuditEvent(type, self._clock() - self._start, self._redact(data))
        self._events.append(event)
        for listener in self._listeners:
            listener(event)
        return event

    def state_change(
        self, before: Mapping[str, Any], after: Mapping[str, Any], source: str
    ) -> None:
        """A `state_change` event with the keys whose values differ (a key added or removed
        differs too), if any do; `source` names what changed them."""
        missing = object()
        diff = {
            key: {"old": before.get(key), "new": after.get(key)}
            for key in set(before) | set(after)
            if before.get(key, missing) != after.get(key, missing)
        }
        if diff:
            self.add("state_change", source=source, diff=diff)

    @property
    def events(self) -> tuple[AuditEvent, ...]:
        return tuple(self._events)

    def of_type(self, type: str) -> list[AuditEvent]:
        return [event for event in self._events if event.type == type]

    def as_list(self) -> list[dict[str, Any]]:
        return [event.as_dict() for event in self._events]
