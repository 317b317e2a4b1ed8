"""The text simulator: a call on the same runtime a phone call uses, typed or scripted."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Any, TextIO

from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.audit import AuditEvent
from voice_agent.runtime.call_control import CallTransfer, SendDigits
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import AgentEvent, AgentSpeech, AgentSpeechEnd, CallEnd

_SHOWN = {
    "tool_call",
    "state_change",
    "trigger",
    "override",
    "transition",
    "error",
    "respond",
    "intent_match",
}


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(event: AuditEvent) -> str | None:
    """One line per runtime event worth watching while debugging an agent."""
    data = event.data
    if event.type not in _SHOWN:
        return None
    if event.type == "tool_call":
        outcome = f"error: {data['error']}" if data.get("error") else _short(data.get("result"))
        return f"  [tool] {data['name']}({_short(data.get('arguments'))}) -> {outcome}"
    if event.type == "state_change":
        changes = ", ".join(
            f"{key}: {_short(d['old'], 40)} -> {_short(d['new'], 40)}"
            for key, d in sorted(data["diff"].items())
        )
        return f"  [state] {changes} ({data['source']})"
    if event.type == "trigger":
        suffix = f" {data['event']}" if data.get("event") else ""
        return f"  [trigger] {data['kind']}{suffix}: {data['function']}"
    if event.type == "override":
        return f"  [override] {data['action']}({_short(data.get('inputs'))})"
    if event.type == "transition":
        return f"  [transfer] {data['source']} -> {data['target']}"
    if event.type == "intent_match":
        if data.get("intent") is None:
            return "  [intent] no match"
        return f"  [intent] {data['intent']} ({data['confidence']}) {_short(data['parameters'])}"
    if event.type == "respond":
        return None  # the speech line shows it
    return f"  [error] {data.get('where')}: {data.get('message')}"


class Simulator:
    def __init__(self, session: CallSession, out: TextIO) -> None:
        self.session = session
        self.out = out
        self._line_open = False
        session.audit.subscribe(self._on_audit)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _on_audit(self, event: AuditEvent) -> None:
        line = describe(event)
        if line is not None:
            self._close_line()
            self._write(line + "\n")

    def _close_line(self) -> None:
        if self._line_open:
            self._write("\n")
            self._line_open = False

    async def play(self, events: AsyncIterator[AgentEvent]) -> bool:
        """Print agent speech as it streams; False once the call has ended."""
        async for event in events:
            if isinstance(event, AgentSpeech):
                if not self._line_open:
                    self._write("agent> ")
                    self._line_open = True
                self._write(event.text)
            elif isinstance(event, AgentSpeechEnd):
                self._close_line()
            elif isinstance(event, CallEnd):
                self._close_line()
                await self.session.end(event.reason)
                return False
            elif isinstance(event, SendDigits):
                self._close_line()
                self._write(f"  [keys] {event.digits}\n")
            elif isinstance(event, CallTransfer):
                # No phone line here: the hand-over is shown and the call ends as it would.
                self._close_line()
                self._write(f"  [transfer] to {event.destination} ({event.target})\n")
                await self.session.end(f"transferred to {event.destination}")
                return False
        self._close_line()
        return not self.session.ended

    async def handle(self, line: str) -> bool:
        line = line.strip()
        if not line or line.startswith("#"):
            return True
        if line.startswith("/"):
            command, _, rest = line[1:].partition(" ")
            if command == "dtmf":
                return await self.play(self.session.event("dtmf", digit=rest.strip()))
            if command == "no-input":
                return await self.play(self.session.event("no-input"))
            if command == "event":
                return await self.play(self.session.event(rest.strip()))
            if command in ("end", "hangup", "quit"):
                await self.session.end("caller hung up")
                return False
            self._write(
                f"  unknown command /{command}; try /dtmf 1, /no-input, /event NAME, /end\n"
            )
            return True
        self._write(f"you> {line}\n")
        return await self.play(self.session.user_turn(line))

    async def run(self, lines: Iterable[str] | None) -> None:
        alive = await self.play(self.session.start())
        if lines is not None:
            for line in lines:
                if not alive:
                    break
                alive = await self.handle(line)
        else:
            while alive:
                try:
                    line = await asyncio.to_thread(input, "you> ")
                except EOFError:
                    break
                alive = await self.handle_typed(line)
        if not self.session.ended:
            await self.session.end("caller hung up")
        self._write(f"[call ended] state: {_short(self.session.public_state(), 400)}\n")

    async def handle_typed(self, line: str) -> bool:
        """Like handle(), without echoing the line the person just typed."""
        if line.strip() and not line.strip().startswith(("/", "#")):
            return await self.play(self.session.user_turn(line.strip()))
        return await self.handle(line)


async def chat(
    registry: AgentRegistry,
    *,
    agent: str | None,
    variables: dict[str, str],
    script: Iterable[str] | None,
    out: TextIO | None = None,
) -> CallSession:
    out = out or sys.stdout
    session = CallSession(registry, agent=agent, args=variables)
    if script is None:
        out.write(f"Talking to agent {session.agent.name!r}. Type a line; /end to hang up.\n")
    await Simulator(session, out).run(script)
    return session
