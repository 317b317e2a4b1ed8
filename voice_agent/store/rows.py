"""What a call store writes and reads, for every backend: the rows of a call as the writer gets
them (its start, audit events, turns, context, state, end), a batch of them, a worker's
heartbeat, a listing's filter; and the helpers the backends share (JSON, times, transcripts)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CallStart:
    call_id: str
    agent: str
    transport: str
    started_at: str  # as the server gave it, shown as it is
    started: datetime  # the same instant in UTC, for ordering and time filters
    state: str  # JSON
    worker_id: str


@dataclass(frozen=True)
class EventRow:
    call_id: str
    type: str
    t: float | None
    data: str  # JSON of the whole event, type and t included


@dataclass(frozen=True)
class TurnRow:
    call_id: str
    metrics: str  # JSON


@dataclass(frozen=True)
class ContextRow:
    call_id: str
    messages: str  # JSON list
    search_text: str  # the transcript, case-folded, for `text` searches
    preview: str | None  # the caller's first line


@dataclass(frozen=True)
class StateRow:
    call_id: str
    state: str  # JSON


@dataclass(frozen=True)
class CallEnd:
    call_id: str
    ended_at: str
    outcome: str
    reason: str


Row = CallStart | EventRow | TurnRow | ContextRow | StateRow | CallEnd


@dataclass
class Batch:
    """One write, applied in this order in one transaction; context and state keep the latest."""

    starts: list[CallStart] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    turns: list[TurnRow] = field(default_factory=list)
    contexts: list[ContextRow] = field(default_factory=list)
    states: list[StateRow] = field(default_factory=list)
    ends: list[CallEnd] = field(default_factory=list)

    @classmethod
    def of(cls, rows: list[Row]) -> Batch:
        batch = cls()
        contexts: dict[str, ContextRow] = {}
        states: dict[str, StateRow] = {}
        for row in rows:
            if isinstance(row, CallStart):
                batch.starts.append(row)
            elif isinstance(row, EventRow):
                batch.events.append(row)
            elif isinstance(row, TurnRow):
                batch.turns.append(row)
            elif isinstance(row, ContextRow):
                contexts[row.call_id] = row
            elif isinstance(row, StateRow):
                states[row.call_id] = row
            else:
                batch.ends.append(row)
        batch.contexts = list(contexts.values())
        batch.states = list(states.values())
        return batch


@dataclass(frozen=True)
class WorkerInfo:
    """Another worker, as the workers table has it; age_s None: calls name it but it has no row."""

    worker_id: str
    machine: str | None
    pid: int | None
    age_s: float | None
    heartbeat: Any = None  # the backend's own value, to mark only if it has not moved since


@dataclass(frozen=True)
class CallFilter:
    agent: str | None = None
    outcome: str | None = None  # one of OUTCOMES, or "live" for calls without an end
    since: datetime | None = None  # started at or after
    until: datetime | None = None  # started before
    text: str | None = None  # case-folded

    def like_pattern(self) -> str | None:
        """`text` as a LIKE pattern (ESCAPE '\\') matching it anywhere in the transcript."""
        if not self.text:
            return None
        escaped = self.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return f"%{escaped}%"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """JSON both databases take: no NaN, no lone surrogates; unknown types as their str()."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        try:
            text = json.dumps(_finite(value), ensure_ascii=False, default=str, allow_nan=False)
        except (ValueError, RecursionError):
            text = json.dumps({"error": "not representable as JSON"})
    return text.encode("utf-8", "replace").decode("utf-8")


def parse_time(value: datetime | str) -> datetime:
    """An aware UTC datetime; naive values and ISO strings without an offset are taken as UTC."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


def now_iso() -> str:
    return iso(datetime.now(UTC))


def machine_id() -> str:
    """Which machine and pid namespace this is: pids are comparable only within one."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "|".join(parts)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    # A killed process nobody has reaped yet is a zombie: dead for our purpose.
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        ).strip()
    return ""


def transcript_lines(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The caller's and the agent's lines of a context, without the prompt and tool traffic."""
    lines = []
    for message in messages:
        role = message.get("role")
        if role in ("user", "assistant"):
            text = _message_text(message.get("content")).strip()
            if text:
                lines.append((str(role), text))
    return lines


def merge_lines(known: list[tuple[str, str]], lines: list[tuple[str, str]]) -> None:
    """Add a new context's lines to what a call has said so far.

    A transfer may trim the context to its last messages: the new lines then start with a tail
    of the known ones, and only what follows that tail is new. Search covers the whole call.
    """
    if lines[: len(known)] == known:
        known.extend(lines[len(known) :])
        return
    for start in range(max(0, len(known) - len(lines)), len(known)):
        overlap = len(known) - start
        if known[start:] == lines[:overlap]:
            known.extend(lines[overlap:])
            return
    known.extend(lines)
