"""The speech-to-speech brain (`llm.provider: openai_realtime`): a Realtime model hears each of
the caller's turns and speaks its reply itself, the runtime running its tools between.

What stays the server's: when the caller's turn ends (its VAD, end-of-turn rule and STT, so a
backchannel or a cough never reaches the model), barge-in, the triggers, the agent's functions
with their implicit `state`, `context` and `secrets`, and the rule that only what the caller
heard is committed. The model's conversation is kept to that rule: a reply the caller cut off
is truncated at the audio they heard (`conversation.item.truncate`), one cut on its first word
is deleted, and lines the server said by other means (the first message, a trigger's
`respond`, the fallback line, spoken by the agent's TTS) go in as the assistant's text once
heard. Each turn goes in as the caller's audio (with no voice side, as its text).

When the model fails: a response that fails on a working socket gets the `fallback_line` and
the call goes on, as with a chat model. A socket that drops is reopened at once, the call's
history restored, and the turn asked again (the caller's audio of it is gone; its transcript
stands in). A model that cannot be reached after that, or refuses the key or the model, gets
the `unavailable_line` and the call ends `interrupted`: no caller is left asking a line that
will never answer. A refusal is logged once per agent, not once per call. A session older than
`session_max_s` is replaced at the caller's next turn, before the service ends it mid-reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from voice_agent.brains.playbook import decode_arguments, first_message
from voice_agent.config import LlmConfig
from voice_agent.engines.openai_http import load_sdk
from voice_agent.engines.realtime import (
    AudioFormat,
    AudioOut,
    FunctionCallOut,
    RealtimeError,
    RealtimeSettings,
    RealtimeSocket,
    ResponseEnd,
    TranscriptOut,
    format_for,
)
from voice_agent.runtime.conversation import CommitOutcome, ToolCallRecord
from voice_agent.runtime.turn_events import (
    AgentAudio,
    AgentAudioEnd,
    AgentEvent,
    CallEnd,
    CallerAudio,
    StepOutcome,
)

if TYPE_CHECKING:
    from voice_agent.runtime.session import CallSession

log = logging.getLogger(__name__)


class _Call:
    """One call's socket to the model, and what the brain knows of the items in it."""

    def __init__(self, brain: RealtimeBrain, session: CallSession) -> None:
        self.session = session
        encoding, rate = session.voice_format or ("pcm16", 24000)
        self.audio: AudioFormat = format_for(encoding, rate)
        self.voiced = session.voice_format is not None
        self.socket = RealtimeSocket(
            brain.settings,
            self.audio,
            modality="audio" if self.voiced else "text",
            restore=self._restore,
            on_input_transcript=self._input_transcript,
            on_error=self._error,
        )
        self.replies: dict[int, str] = {}  # reply id -> the model's item voicing it
        self.caller_items: set[str] = set()
        # Edits to the model's conversation run in order, each after the one before. Each
        # follows a change to the committed history (numbered); a session opened since it was
        # restored from that history, the change included, and the edit is left out.
        self._edits: asyncio.Future[None] | None = None
        self._changes = 0
        self._restored_upto = -1
        self.leaving_out_last_user = False
        self.opening: asyncio.Task[None] | None = None

    # ---- the session -------------------------------------------------------------------

    def instructions(self) -> str:
        # The prompt as the LLM of a playbook gets it: rendered now, secrets redacted.
        return self.session.redactor.text(self.session.system_prompt())

    async def ready(self) -> None:
        """The socket open (once, or again after a drop) with the prompt as state renders it."""
        if self.opening is not None:
            opening, self.opening = self.opening, None
            with contextlib.suppress(RealtimeError):
                await opening  # a failed first try: opened again below, its error raised
        await self.socket.open(self.instructions(), self.session.agent.llm_tools())

    def _restore(self) -> list[dict[str, Any]]:
        """The committed history as the model's items, for a session (re)opened mid-call."""
        messages = self.session.committed_history()
        if self.leaving_out_last_user and messages and messages[-1]["role"] == "user":
            messages.pop()  # the turn being taken: it goes in as the caller's audio
        self.replies.clear()
        self._restored_upto = self._changes
        return history_items(messages)

    # ---- edits that follow commits -----------------------------------------------------

    def edit(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self._changes += 1
        change = self._changes
        before = self._edits

        async def run() -> None:
            if before is not None:
                with contextlib.suppress(Exception):
                    await before
            opening = self.opening
            if opening is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(opening)
            if self._restored_upto >= change or not self.socket.is_open:
                return  # restored with it, or the next session will be
            try:
                await make()
            except RealtimeError as exc:
                self._error(str(exc))

        self._edits = asyncio.ensure_future(run())

    async def settled(self) -> None:
        if self._edits is not None:
            with contextlib.suppress(Exception):
                await self._edits

    def committed(self, reply_id: int, outcome: CommitOutcome, heard_ms: float | None) -> None:
        item_id = self.replies.pop(reply_id, None)
        heard = outcome.committed
        socket = self.socket
        if item_id is None or not socket.holds(item_id):
            if heard:  # a line the TTS said, or a reply from a session gone since
                self.edit(lambda: socket.add_assistant_text(heard))
            return
        if heard_ms is None:
            return  # heard to the end: the model's item is what was said
        if not heard or heard_ms <= 0:
            self.edit(lambda: socket.delete(item_id))
        else:
            self.edit(lambda: socket.truncate(item_id, round(heard_ms)))

    # ---- what the model says of itself -------------------------------------------------

    def _input_transcript(self, item_id: str, text: str) -> None:
        if item_id in self.caller_items:
            self.session.audit.add("model_heard", text=text)

    def _error(self, message: str) -> None:
        log.warning("call %s: Realtime session: %s", self.session.call_id, message)
        self.session.audit.add("error", where="realtime", message=message)

    async def close(self) -> None:
        if self.opening is not None:
            self.opening.cancel()
        await self.settled()
        await self.socket.close()


def history_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat-format messages (the committed `context`) as Realtime conversation items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "user" and content:
            items.append(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": str(content)}],
                }
            )
        elif role == "assistant":
            if content:
                part = {"type": "output_text", "text": str(content)}
                items.append({"type": "message", "role": "assistant", "content": [part]})
            for call in message.get("tool_calls") or ():
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": str(content or ""),
                }
            )
    return items


def _tool_result(session: CallSession, call_id: str) -> str:
    for message in reversed(session.llm_messages()):
        if message["role"] == "tool" and message.get("tool_call_id") == call_id:
            return str(message.get("content") or "")
    return json.dumps({"error": "no result"})


@dataclass
class _Step:
    """What one response of the model gave besides its reply's events."""

    calls: list[FunctionCallOut] = field(default_factory=list)
    failure: str | None = None
    reply_id: int | None = None

    @property
    def unanswered(self) -> bool:
        """Failed with nothing said and nothing asked: the caller got no answer."""
        return self.failure is not None and self.reply_id is None and not self.calls


class RealtimeBrain:
    """A playbook whose model is a Realtime session per call."""

    hears_audio = True  # the voice pipeline hands it each turn's audio (pipeline/caller_turns)

    def __init__(self, config: LlmConfig) -> None:
        self.config = config
        self.settings = RealtimeSettings(
            model=config.model,
            voice=config.voice,
            base_url=config.base_url,
            api_key=config.api_key,
            input_transcription=config.input_transcription,
            connect_timeout_s=config.request_timeout_s,
            response_timeout_s=config.turn_deadline_s,
            read_timeout_s=config.request_timeout_s,
        )
        self._calls: dict[str, _Call] = {}
        self._refusal_said = False  # a wrong key or model: logged once, for the first call
        load_sdk()

    async def aclose(self) -> None:
        for call in list(self._calls.values()):
            await call.close()
        self._calls.clear()

    def _call(self, session: CallSession) -> _Call:
        call = self._calls.get(session.call_id)
        if call is None:
            call = self._calls[session.call_id] = _Call(self, session)
            session.commit_listeners.append(call.committed)

            async def ended() -> None:
                self._calls.pop(session.call_id, None)
                await call.close()

            session.end_listeners.append(ended)
        return call

    async def enter(self, session: CallSession, outcome: StepOutcome) -> AsyncIterator[AgentEvent]:
        call = self._call(session)
        if call.opening is None and not call.socket.is_open:
            # Opened while the first message plays, so the caller's first turn does not wait.
            call.opening = asyncio.ensure_future(
                call.socket.open(call.instructions(), session.agent.llm_tools())
            )
        async for item in first_message(session, outcome):
            yield item

    async def event(
        self, session: CallSession, name: str, data: Mapping[str, Any], outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        return  # as a playbook: events reach it through @EventTrigger functions only
        yield  # pragma: no cover - makes this an async generator

    def expecting(self, session: CallSession) -> str | None:
        return None

    async def turn(self, session: CallSession, text: str) -> AsyncIterator[AgentEvent]:
        call = self._call(session)
        heard, session.caller_audio = session.caller_audio, None
        # Until its own item is in, a session opening restores the history without this turn.
        call.leaving_out_last_user = True
        try:
            await call.settled()
            limit = self.config.session_max_s
            if limit is not None and call.socket.age_s > limit:
                log.info("call %s: Realtime session renewed after %.0f s", session.call_id, limit)
                await call.socket.renew()
            await call.ready()
            await self._add_turn(call, text, heard)
        except asyncio.CancelledError:
            call.leaving_out_last_user = False
            raise
        except RealtimeError as exc:
            call.leaving_out_last_user = False  # the model never got it: a new session should
            async for item in self._unavailable(session, exc):
                yield item
            return
        call.leaving_out_last_user = False
        for _ in range(session.agent.config.max_steps_per_turn):
            outcome = StepOutcome()
            async for item in session.run_triggers("before_model", outcome):
                yield item
            if outcome.ends_turn or outcome.transferred:
                return
            step = _Step()
            for attempt in range(2):
                step = _Step()
                try:
                    await call.settled()  # the tools' results, and any cut, before it answers
                    await call.ready()
                except RealtimeError as exc:
                    async for item in self._unavailable(session, exc):
                        yield item
                    return
                async for event in self._respond(call, step):
                    yield event
                if step.failure is not None:
                    session.audit.add("error", where="realtime", message=step.failure)
                if attempt == 0 and step.unanswered and not call.socket.is_open:
                    continue  # a new session, restored with this turn in it, answers it
                break
            if step.unanswered:
                if not call.socket.is_open:
                    assert step.failure is not None
                    async for item in self._unavailable(session, RealtimeError(step.failure)):
                        yield item
                    return
                async for item in session.say(session.agent.config.llm.fallback_line):
                    yield item
                return
            if not step.calls:
                return
            outcome = StepOutcome()
            async for item in self._run_calls(call, step.calls, step.reply_id, outcome):
                yield item
            if outcome.ends_turn or outcome.transferred or session.ended:
                return
        session.audit.add("error", where="realtime", message="too many action steps in one turn")

    async def _respond(self, call: _Call, step: _Step) -> AsyncIterator[AgentEvent]:
        """One response of the model, streamed as the reply's events; what else it gave (tool
        calls, a failure) goes into `step`."""
        session = call.session
        try:
            async for output in call.socket.respond():
                if isinstance(output, AudioOut | TranscriptOut):
                    if step.reply_id is None:
                        step.reply_id = session.begin_reply()
                        call.replies[step.reply_id] = output.item_id
                    for event in self._voiced(call, step.reply_id, output):
                        yield event
                elif isinstance(output, FunctionCallOut):
                    step.calls.append(output)
                elif isinstance(output, ResponseEnd) and output.status == "failed":
                    step.failure = output.detail or "the response failed"
        except RealtimeError as exc:
            step.failure = str(exc)
        if step.reply_id is not None:
            end = session.finish_reply(step.reply_id)
            yield AgentAudioEnd(step.reply_id, end.text) if call.voiced else end

    async def _add_turn(self, call: _Call, text: str, heard: CallerAudio | None) -> None:
        if heard is not None and heard.pcm and call.voiced:
            audio = call.audio.from_pcm(heard.pcm, heard.sample_rate)
            item_id = await call.socket.add_user_audio(audio)
        else:
            item_id = await call.socket.add_user_text(text)
        call.caller_items.add(item_id)

    def _voiced(
        self, call: _Call, reply_id: int, output: AudioOut | TranscriptOut
    ) -> list[AgentEvent]:
        session = call.session
        text = output.text if isinstance(output, TranscriptOut) else ""
        if not call.voiced:
            return [session.extend_reply(reply_id, text)] if text else []
        if text:
            session.extend_reply(reply_id, text)
        audio = output.audio if isinstance(output, AudioOut) else b""
        fmt = call.audio
        return [AgentAudio(reply_id, audio, fmt.encoding, fmt.sample_rate, text)]

    async def _run_calls(
        self,
        call: _Call,
        outputs: list[FunctionCallOut],
        reply_id: int | None,
        outcome: StepOutcome,
    ) -> AsyncIterator[AgentEvent]:
        session = call.session
        records: list[ToolCallRecord] = []
        invalid: list[tuple[ToolCallRecord, str]] = []
        for output in outputs:
            arguments, problem = decode_arguments(output.arguments)
            record = ToolCallRecord(output.call_id, output.name, arguments)
            records.append(record)
            if problem:
                invalid.append((record, problem))
        session.audit.add(
            "llm_actions", actions=[{"name": r.name, "arguments": r.arguments} for r in records]
        )
        try:
            async for item in session.run_llm_calls(records, reply_id, outcome, invalid=invalid):
                yield item
        finally:
            # Every call gets its result, run or not, before the model is asked again.
            for record in records:
                result = _tool_result(session, record.call_id)
                call.edit(partial(call.socket.add_function_output, record.call_id, result))

    async def _unavailable(
        self, session: CallSession, error: RealtimeError
    ) -> AsyncIterator[AgentEvent]:
        """No session can be had: the caller is told so, and the call ends."""
        why = str(error)
        session.audit.add("error", where="realtime", message=why)
        if error.lasting and not self._refusal_said:
            self._refusal_said = True
            log.error(
                "agent %s: the Realtime endpoint refuses its calls (agents.%s.llm: "
                "api_key, model, base_url): %s",
                session.agent.name,
                session.agent.name,
                why,
            )
        async for item in session.say(self.config.unavailable_line or ""):
            yield item
        yield CallEnd(f"interrupted: the speech-to-speech model is unavailable ({why})")
