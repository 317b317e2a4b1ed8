"""This worker's live calls (the durable store in voice_agent.store keeps every call's record)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from voice_agent.runtime.session import CallSession


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class CallRecord:
    """One call as the API shows it; the session holds state, context and audit."""

    session: CallSession
    transport: str
    started_at: str = field(default_factory=now_iso)
    ended_at: str | None = None
    end_reason: str | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def call_id(self) -> str:
        return self.session.call_id

    def summary(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "agent": self.session.agent.name,
            "transport": self.transport,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "state": self.session.public_state(),
            "context": self.session.context_view(),
            "audit": self.session.audit.as_list(),
            "turns": list(self.turns),
        }


class MemoryCallStore:
    """Keeps every live call and the last `keep_ended` ended ones (oldest dropped first)."""

    def __init__(self, keep_ended: int = 200) -> None:
        self.keep_ended = keep_ended
        self._live: dict[str, CallRecord] = {}
        self._ended: OrderedDict[str, CallRecord] = OrderedDict()

    def add(self, record: CallRecord) -> None:
        self._live[record.call_id] = record

    def ended(self, call_id: str, reason: str) -> None:
        record = self._live.pop(call_id, None)
        if record is None:
            return
        record.ended_at = now_iso()
        record.end_reason = reason
        self._ended[call_id] = record
        while len(self._ended) > self.keep_ended:
            self._ended.popitem(last=False)

    def get(self, call_id: str) -> CallRecord | None:
        return self._live.get(call_id) or self._ended.get(call_id)

    def recent(self, limit: int = 50) -> list[CallRecord]:
        records = list(self._live.values()) + list(reversed(self._ended.values()))
        return records[:limit]

    def live_count(self) -> int:
        return len(self._live)
