"""The driver of one voice call: runs the call core's actions with real engines and a transport.

Everything that decides lives in the sans-I/O core and the runtime; this module only moves
audio and text between them: carrier audio -> PCM16 16 kHz frames -> VAD -> core; core actions
-> STT, agent turns, TTS and the transport, each on its own task so nothing blocks a frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.frames import Framer
from voice_agent.audio.resample import StreamResampler
from voice_agent.config import VoiceSettings
from voice_agent.core import call as core
from voice_agent.core.answer_gate import AnswerGate, Begin, GateAction, MessageMayStart, Verdict
from voice_agent.core.playback import Word
from voice_agent.core.voicemail import VoicemailDetector
from voice_agent.engines.stt import Stt, SttStream
from voice_agent.engines.tts import Tts
from voice_agent.engines.turn import TurnModel
from voice_agent.engines.vad import Vad
from voice_agent.observability import call_context
from voice_agent.pipeline.caller_turns import CallerTurns, EngineVoice
from voice_agent.pipeline.calls import CallRecord
from voice_agent.pipeline.core_settings import core_config
from voice_agent.pipeline.hold import CHUNK_MS, LEAD_MS, HoldLoop
from voice_agent.pipeline.recording import CallRecorder
from voice_agent.pipeline.speech_queue import SpeechQueue
from voice_agent.runtime.audit import AuditEvent
from voice_agent.runtime.call_control import (
    TRANSFER_FAILED_EVENT,
    VOICEMAIL_EVENT,
    CallTransfer,
    SendDigits,
)
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import (
    AgentAudio,
    AgentAudioEnd,
    AgentEvent,
    AgentSpeech,
    AgentSpeechEnd,
    CallEnd,
)

log = logging.getLogger("voice_agent.call")

STT_RATE = 16000
VAD_RATES = (8000, 16000, 32000, 48000)  # what webrtcvad takes as it is
FRAME_MS = 20
# A transcript later than this is given up: the turn gets the agent's fallback line.
STT_TIMEOUT_S = 10.0
# The end-of-turn evidence at a pause (core/end_of_turn.py): the acoustic model's verdict is
# given up after this (the silence rule then decides that turn), and the speculative
# transcript after this (the verdict is then taken on the acoustic model alone).
TURN_MODEL_TIMEOUT_S = 1.5
SPECULATION_TIMEOUT_S = 1.5
TURN_MODEL_RATE = 16000
TURN_MODEL_WINDOW_S = 8  # the most of the turn's audio the model looks at
# The acoustic model runs here, never on the event loop; onnxruntime frees the GIL as it runs.
_TURN_MODEL_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="turn-model")


class Outbound(Protocol):
    """What a transport does for the pipeline; calls queue and return at once."""

    def audio(self, data: bytes) -> None: ...
    def mark(self, name: str) -> None: ...
    def clear(self) -> None: ...
    def event(self, payload: dict[str, Any]) -> None: ...
    def close(self, code: int, reason: str) -> None: ...


class CallControl(Protocol):
    """What a transport that can do more than audio offers (voice_agent.runtime.call_control),
    handed to the pipeline with its Outbound; without one, the audit says the transport
    cannot."""

    def send_digits(self, digits: str) -> str | None:
        """Send keypad digits to the far end, in order; None once on their way (a later
        failure is the transport's to report), else why not."""

    async def transfer(self, transfer: CallTransfer) -> str | None:
        """Hand the call to `transfer.target`; None once it has gone there, else why not (the
        call is still on)."""


@dataclass(frozen=True)
class Engines:
    """One agent's engines, shared by its calls (a VAD is made per call: it has state)."""

    make_vad: Callable[[int], Vad]  # takes the sample rate of the frames it will see
    stt: Stt
    tts: Tts
    turn_model: TurnModel | None = None  # the acoustic end-of-turn model, if the agent has one


class CallPipeline:
    def __init__(
        self,
        session: CallSession,
        record: CallRecord,
        engines: Engines,
        voice: VoiceSettings,
        carrier: CarrierFormat,
        out: Outbound,
        *,
        on_end: Callable[[CallPipeline, str], None] | None = None,
        recorder: CallRecorder | None = None,
        placed: bool = False,
        control: CallControl | None = None,
    ) -> None:
        self.recorder = recorder
        self.control = control
        # A call the server placed: the agent speaks after the callee's hello (core/answer_gate).
        self.placed = placed
        self._gate_timer: asyncio.TimerHandle | None = None
        self._gate_deadline: float | None = None  # what _gate_timer is armed for
        self.session = session
        self.record = record
        self.engines = engines
        self.carrier = carrier
        self.out = out
        self._on_end = on_end
        # Frames stay at the carrier's rate when VAD takes it: most of a call is silence, and
        # resampling it all for nothing would be the media path's largest cost. Only speech
        # going to STT is resampled, one stream per utterance.
        self.frame_rate = carrier.sample_rate if carrier.sample_rate in VAD_RATES else STT_RATE
        self.vad = engines.make_vad(self.frame_rate)
        self.core = core.CallCore(
            core_config(
                voice,
                session.agent.config.no_input_timeout_s,
                vad_release_ms=getattr(self.vad, "release_ms", 0),
            ),
            bytes_per_ms=carrier.bytes_per_ms,
            sample_bytes=carrier.sample_bytes,
        )
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._inbound = (
            StreamResampler(carrier.sample_rate, self.frame_rate)
            if carrier.sample_rate != self.frame_rate
            else None
        )
        self._framer = Framer(self.frame_rate * 2 * FRAME_MS // 1000)
        self._decode = carrier.decoder
        self._stt: SttStream | None = None
        # A hosted STT takes the frames as they are; pocketsphinx needs 16 kHz.
        self._stt_rate = engines.stt.sample_rate or self.frame_rate
        self._to_stt = self._stt_resampler()
        # The caller's turn so far at 16 kHz, for the acoustic end-of-turn model (its last
        # TURN_MODEL_WINDOW_S); from the audio STT gets, resampled again only if STT's is not.
        self._turn_model = engines.turn_model if self.core.config.end_of_turn.enabled else None
        self._turn_audio = bytearray()
        self._to_turn_model: StreamResampler | None = None
        self._turn_model_failed = False
        self._turn: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._speech = SpeechQueue(
            engines.tts,
            carrier,
            spawn=self._spawn,
            now_ms=self.now_ms,
            at_ms=lambda ms, callback: self._loop.call_at(self._t0 + ms / 1000, callback),
            reply_wanted=self.core.reply_wanted,
            stream_wanted=self.core.stream_wanted,
            on_audio=self._tts_part,
            on_failure=self._tts_failed,
            on_done=self._maybe_finish,
        )
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pending_events: list[tuple[str, dict[str, Any]]] = []
        self._ending: str | None = None
        self._close_code = 1000  # normal closure; 1001 (going away) when the server ends it
        self._last_words: str | None = None  # the reason, once the server is ending the call
        self._hanging_up = False
        self._transfer: CallTransfer | None = None  # once the agent's last line has played
        # The detector runs at the VAD's rate; its tone filters take 8 and 16 kHz.
        detector = None
        if session.agent.config.answering_machine and self.frame_rate in (8000, 16000):
            detector = VoicemailDetector(self.frame_rate)
        # Who answered and when the agent begins; `_listening` is the gate while it still
        # takes the caller's frames (the media path's only cost of it: one check a frame).
        self._gate = AnswerGate(placed=placed, detector=detector)
        self._listening: AnswerGate | None = self._gate
        hold = session.agent.config.hold
        self._hold_after_s = hold.after_s if hold is not None else 0.0
        self._hold = HoldLoop(hold.audio, carrier) if hold is not None and hold.audio else None
        self._hold_timer: asyncio.TimerHandle | None = None
        self._holding: asyncio.Task[None] | None = None
        self._hold_started_ms = 0.0
        # An agent whose engine hears the caller and speaks itself (brains/realtime.py) gets
        # each turn's audio, and its replies' audio in its own format, converted here if need be.
        session.voice_format = (carrier.encoding, carrier.sample_rate)
        hears = getattr(session.agent.brain, "hears_audio", False)
        self._caller_turns = CallerTurns(self.frame_rate, session.voice_format) if hears else None
        self._voiced = EngineVoice(carrier)
        self.ended = False
        self.finished = asyncio.Event()
        session.audit.subscribe(self._on_audit)

    # ---- clock and tasks ---------------------------------------------------------------

    def _stt_resampler(self) -> StreamResampler | None:
        if self._stt_rate == self.frame_rate:
            return None
        return StreamResampler(self.frame_rate, self._stt_rate)

    def now_ms(self) -> float:
        return (self._loop.time() - self._t0) * 1000

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        # In the call's logging context: aiortc's callbacks run outside the handler's task.
        task = self._loop.create_task(coro, context=call_context(self.session.call_id))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("call %s: %s", self.session.call_id, error, exc_info=error)
            self.session.audit.add(
                "error", where="pipeline", message=f"{type(error).__name__}: {error}"
            )

    # ---- inputs from the transport -------------------------------------------------------

    async def start(self) -> None:
        self._gated(self._gate.start(self.now_ms()))

    def _begin(self, *, greet: bool) -> None:
        """The agent's start: its entry steps and, unless a machine answered, its greeting."""
        self.core.agent_turn_started(self.now_ms())
        self._run_turn(self.session.start(greet=greet))

    def _gated(self, actions: list[GateAction]) -> None:
        """What the answer gate says: the audit told, the agent begun, `voicemail` raised."""
        for action in actions:
            if isinstance(action, Begin):
                self._begin(greet=action.greet)
            elif isinstance(action, MessageMayStart):
                data = {"reason": action.reason, "beep": action.beep}
                self._queue_event(VOICEMAIL_EVENT, data)
            else:
                self.session.audit.add(action.type, **action.data)
        if self._gate.done:
            self._listening = None
        deadline = self._gate.next_deadline_ms()
        if deadline == self._gate_deadline:
            return  # as it was: this runs for every frame the gate takes
        self._gate_deadline = deadline
        if self._gate_timer is not None:
            self._gate_timer.cancel()
            self._gate_timer = None
        if deadline is not None and not self.ended:
            delay_s = max(0.0, deadline - self.now_ms()) / 1000
            self._gate_timer = self._loop.call_later(delay_s, self._gate_tick)

    def _gate_tick(self) -> None:
        # No audio came in (a stream that sends none while quiet): the clock decides alone.
        self._gate_timer = None
        self._gate_deadline = None
        if not self.ended:
            self._gated(self._gate.tick(self.now_ms()))

    def audio(self, payload: bytes) -> None:
        """Carrier audio, any length: framed into 20 ms for VAD and the core."""
        # Every call runs this 50 times a second: no call here that the common case can skip.
        if self.ended:
            return
        pcm = self._decode(payload)
        if self.recorder is not None:
            self.recorder.caller(pcm, self.now_ms())
        if self._inbound is not None:
            pcm = self._inbound.process(pcm)
        for frame in self._framer.push(pcm):
            is_speech = self.vad.is_speech(frame)
            partial = self._stt.partial() if self._stt is not None else ""
            now_ms = (self._loop.time() - self._t0) * 1000
            gate = self._listening
            if gate is not None:
                self._gated(gate.frame(frame, is_speech, now_ms))
                if gate.took_frame:
                    continue  # the callee's hello, or a machine's greeting, is no user turn
            actions = self.core.audio_frame(frame, is_speech, partial, now_ms)
            if actions:
                self._apply(actions)

    def mark(self, name: str) -> None:
        self._apply(self.core.mark_played(name, self.now_ms()))
        self._maybe_finish()

    def dtmf(self, digit: str) -> None:
        self._queue_event("dtmf", {"digit": digit})

    async def hang_up(self, reason: str) -> None:
        """The caller is gone (or the server ends the call): commit what was heard, stop."""
        if self.ended:
            return
        self.ended = True
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        self._stop_hold()
        self._apply(self.core.hang_up(self.now_ms()))
        if self.recorder is not None:
            self._finish_recording(self.recorder)
        if self._timer is not None:
            self._timer.cancel()
        if self._stt is not None:
            self._stt.cancel()
        me = asyncio.current_task()
        others = [task for task in self._tasks if task is not me]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self.session.end(reason)
        if self._on_end is not None:
            self._on_end(self, reason)
        # A cancelled task keeps its exception, whose traceback holds this pipeline: without
        # these references the call's objects are freed as it ends, not in a pause of the
        # whole worker for a full garbage collection.
        self._turn = None
        self._speech.close()
        self.session.audit.close()
        self.finished.set()

    def _finish_recording(self, recorder: CallRecorder) -> None:
        # Before the call ends, so the reference is in the audit and the store with the call.
        recording = recorder.finish(self.now_ms())
        if recording is not None:
            data_dir = recorder.path.parents[1]
            self.session.audit.add("recording", **recording.as_audit(relative_to=data_dir))
        elif recorder.error:
            self.session.audit.add("recording", error=recorder.error)

    # ---- the core's actions ------------------------------------------------------------

    def _apply(self, actions: list[core.Action]) -> None:
        prune = False
        for action in actions:
            if isinstance(action, core.FeedStt):
                if self._stt is not None:
                    to_stt = self._to_stt
                    pcm = to_stt.process(action.frame) if to_stt else action.frame
                    self._stt.push(pcm)
                    if self._turn_model is not None:
                        self._keep_turn_audio(action.frame, pcm)
                    if self._caller_turns is not None:
                        self._caller_turns.feed(action.frame)
            elif isinstance(action, core.SendAudio):
                if self._hold_timer is not None or self._holding is not None:
                    self._stop_hold()  # the answer is here
                self.out.audio(action.audio)
                if self.recorder is not None:
                    self.recorder.agent(self.carrier.decode(action.audio), self.now_ms())
            elif isinstance(action, core.SendMark):
                self.out.mark(action.name)
            elif isinstance(action, core.StartStt):
                if self._stt is not None:
                    self._stt.cancel()
                self._stt = self.engines.stt.start(self._stt_rate)
                self._to_stt = self._stt_resampler()
                if self._caller_turns is not None:
                    self._caller_turns.start()
                self._turn_audio.clear()
                if self._turn_model is not None and self._stt_rate != TURN_MODEL_RATE:
                    self._to_turn_model = StreamResampler(self.frame_rate, TURN_MODEL_RATE)
            elif isinstance(action, core.PauseStt):
                if self._stt is not None:
                    # All it has: the resampler's tail too, so that finish() adds nothing
                    # and a decoding started now is the final one.
                    tail = self._to_stt.flush() if self._to_stt else b""
                    if tail:
                        self._stt.push(tail)
                    self._stt.pause()
            elif isinstance(action, core.FinishStt):
                stream, self._stt = self._stt, None
                if stream is not None:
                    tail = self._to_stt.flush() if self._to_stt else b""
                    if tail:
                        stream.push(tail)
                    if self._caller_turns is not None:
                        self._caller_turns.finish()
                    self._spawn(self._finish_stt(stream))
            elif isinstance(action, core.JudgeTurn):
                self._spawn(self._judge_turn(action.pause_id))
            elif isinstance(action, core.StartUserTurn):
                self.out.event({"type": "transcript", "text": action.text, "final": True})
                if self._last_words is not None:
                    self._end_now(self._last_words)  # the call is over: no new turn
                else:
                    self._run_turn(self.session.user_turn(action.text, continues=action.continues))
            elif isinstance(action, core.CancelAgentTurn):
                self._cancel_turn()
                prune = True
                if self._last_words is not None:
                    # The caller talked over the goodbye: they have heard what they will.
                    self._end_now(self._last_words)
            elif isinstance(action, core.Synthesize):
                self._speech.add(action.reply_id, action.text)
            elif isinstance(action, core.SendClear):
                self.out.clear()
                if self.recorder is not None:
                    self.recorder.clear(self.now_ms())
                prune = True
            elif isinstance(action, core.CommitReply):
                prune = True
                if self.session.conversation.is_pending(action.reply_id):
                    self.session.commit_reply(action.reply_id, action.heard, action.heard_ms)
                    self.out.event(
                        {
                            "type": "committed",
                            "reply_id": action.reply_id,
                            "text": action.heard or "",
                        }
                    )
            elif isinstance(action, core.RaiseEvent):
                self._queue_event(action.name, {})
            elif isinstance(action, core.Audit):
                self.session.audit.add(action.type, **action.data)
            elif isinstance(action, core.TurnMetrics):
                self._turn_metrics(action.data)
        if prune:
            self._speech.prune()
        self._set_timer()

    def _set_timer(self) -> None:
        deadline = self.core.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None and deadline != float("inf"):
            self._timer = self._loop.call_at(self._t0 + deadline / 1000, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = None
        if not self.ended:
            self._apply(self.core.tick(self.now_ms()))

    def _turn_metrics(self, data: dict[str, float | None]) -> None:
        metrics = {
            key: round(value, 1) if value is not None else None for key, value in data.items()
        }
        end, sent = metrics.get("speech_end_ms"), metrics.get("first_audio_sent_ms")
        if end is not None and sent is not None:
            metrics["speech_end_to_first_audio_ms"] = round(sent - end, 1)
        self.record.turns.append(metrics)
        self.out.event({"type": "turn_metrics", "metrics": metrics})
        self.session.audit.add("turn_metrics", **metrics)
        log.info(
            "call %s turn %d: speech end -> first audio %s ms (stt final %s, first token %s, "
            "first tts %s)",
            self.session.call_id,
            len(self.record.turns),
            metrics.get("speech_end_to_first_audio_ms"),
            metrics.get("stt_final_ms"),
            metrics.get("first_token_ms"),
            metrics.get("first_tts_audio_ms"),
        )

    # ---- the end of the caller's turn (core/end_of_turn.py) -------------------------------

    def _keep_turn_audio(self, frame: bytes, to_stt: bytes) -> None:
        if self._stt_rate == TURN_MODEL_RATE:
            pcm = to_stt
        elif self._to_turn_model is not None:
            pcm = self._to_turn_model.process(frame)
        else:
            pcm = frame
        audio = self._turn_audio
        audio += pcm
        keep = TURN_MODEL_WINDOW_S * TURN_MODEL_RATE * 2
        if len(audio) > 2 * keep:
            del audio[:-keep]  # now and then, not every frame

    async def _judge_turn(self, pause_id: int) -> None:
        """Gathers the evidence the core asked for: the acoustic model's verdict (in a thread)
        and the speculative transcript, at once; a failure or a late answer is no evidence."""
        model, stream = self._turn_model, self._stt
        audio = bytes(self._turn_audio[-TURN_MODEL_WINDOW_S * TURN_MODEL_RATE * 2 :])

        async def acoustic() -> float | None:
            if model is None:
                return None
            try:
                run = self._loop.run_in_executor(_TURN_MODEL_THREADS, model.end_probability, audio)
                return await asyncio.wait_for(run, TURN_MODEL_TIMEOUT_S)
            except Exception as exc:
                if isinstance(exc, TimeoutError):
                    exc = TimeoutError(f"no verdict within {TURN_MODEL_TIMEOUT_S:g} s")
                if not self._turn_model_failed:  # once a call: the silence rule carries on
                    self._turn_model_failed = True
                    log.warning("call %s: end-of-turn model: %s", self.session.call_id, exc)
                    message = f"{type(exc).__name__}: {exc}; the silence rule decides instead"
                    self.session.audit.add("error", where="turn_model", message=message)
                return None

        async def words() -> str | None:
            if stream is None:
                return None
            try:
                return await asyncio.wait_for(stream.speculation(), SPECULATION_TIMEOUT_S)
            except Exception:
                return None  # finish() decodes again, and reports a failure

        probability, text = await asyncio.gather(acoustic(), words())
        if not self.ended:
            self._apply(self.core.turn_judged(pause_id, probability, text, self.now_ms()))

    # ---- STT ---------------------------------------------------------------------------

    async def _finish_stt(self, stream: SttStream) -> None:
        failed = False
        confidence = None
        try:
            transcript = await asyncio.wait_for(stream.finish(), STT_TIMEOUT_S)
            text, confidence = transcript.text, transcript.confidence
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                stream.cancel()
                exc = TimeoutError(f"no transcript within {STT_TIMEOUT_S:g} s")
            self.session.audit.add("error", where="stt", message=f"{type(exc).__name__}: {exc}")
            text, failed = "", True
        if not self.ended:
            actions = self.core.stt_final(text, self.now_ms(), confidence)
            if self._caller_turns is not None:
                self.session.caller_audio = self._caller_turns.decided(actions)
            self._apply(actions)
            if failed:
                # The caller said something nobody understood: the agent's fallback line
                # (a flow's no_match; a playbook's @EventTrigger("no-match")), not silence.
                self._queue_event("no-match", {"reason": "speech recognition failed"})

    # ---- agent turns -------------------------------------------------------------------

    def _run_turn(self, events: AsyncIterator[AgentEvent]) -> None:
        self._turn = self._spawn(self._drive(events))
        if self._hold is not None:
            self._stop_hold()
            self._hold_timer = self._loop.call_later(self._hold_after_s, self._start_hold)

    def _cancel_turn(self) -> None:
        self._stop_hold()
        if self._turn is not None and not self._turn.done():
            self._turn.cancel()
        self._turn = None

    def _queue_event(self, name: str, data: dict[str, Any]) -> None:
        """Events wait for the agent's current turn: one turn runs at a time."""
        if self._last_words is not None:
            return  # the server is ending the call: no-input, keys and the like change nothing
        if self._turn is None or self._turn.done():
            self.core.agent_turn_started(self.now_ms())
            self._run_turn(self.session.event(name, **data))
        else:
            self._pending_events.append((name, data))

    async def _drive(self, events: AsyncIterator[AgentEvent]) -> None:
        try:
            async for event in events:
                now = self.now_ms()
                if isinstance(event, AgentSpeech):
                    self.out.event(
                        {"type": "agent_text", "reply_id": event.reply_id, "text": event.text}
                    )
                    self._apply(self.core.agent_text(event.reply_id, event.text, now))
                elif isinstance(event, AgentSpeechEnd):
                    self._apply(self.core.agent_reply_end(event.reply_id, now))
                elif isinstance(event, AgentAudio):
                    if event.text:
                        self.out.event(
                            {"type": "agent_text", "reply_id": event.reply_id, "text": event.text}
                        )
                    audio = self._voiced.to_carrier(event)
                    self._apply(self.core.spoken_audio(event.reply_id, event.text, audio, now))
                elif isinstance(event, AgentAudioEnd):
                    self._apply(self.core.spoken_end(event.reply_id, now))
                elif isinstance(event, CallEnd):
                    self._ending = event.reason
                elif isinstance(event, CallTransfer):
                    self._transfer = event
                elif isinstance(event, SendDigits):
                    self._send_digits(event.digits)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.session.audit.add("error", where="agent", message=f"{type(exc).__name__}: {exc}")
        self._stop_hold()
        self.core.expecting = self.session.expecting()
        self._apply(self.core.agent_turn_done(self.now_ms()))
        if self._pending_events:
            name, data = self._pending_events.pop(0)
            self._turn = None
            self._queue_event(name, data)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if (self._ending is None and self._transfer is None) or self.ended or self._hanging_up:
            return
        if self.core.playback.playing or self.core.agent_busy or self._speech.busy:
            return
        if self._transfer is not None:
            transfer, self._transfer = self._transfer, None
            self._spawn(self._hand_over(transfer))
            return
        assert self._ending is not None
        reason, self._ending = self._ending, None
        self.out.event({"type": "end", "reason": reason})
        self.out.close(self._close_code, reason)
        self._spawn(self.hang_up(reason))

    # ---- the server ending the call ------------------------------------------------------

    def end_with_goodbye(self, text: str | None, reason: str) -> None:
        """End the call for the server (a drain's deadline): what the agent was saying stops,
        `text` plays, then the call ends with `reason`; without `text` it ends at once."""
        if self.ended or self._last_words is not None:
            return
        self._stop_hold()
        self._pending_events.clear()
        self._transfer = None
        self._apply(self.core.preempt(self.now_ms()))
        self._last_words = reason
        self._close_code = 1001
        self.session.audit.add("server_ending_call", reason=reason, goodbye=text or None)
        if not text:
            self._end_now(reason)
            return
        self.core.agent_turn_started(self.now_ms())
        self._run_turn(self._goodbye(text, reason))

    async def _goodbye(self, text: str, reason: str) -> AsyncIterator[AgentEvent]:
        async for event in self.session.say(text):
            yield event
        yield CallEnd(reason)

    def _end_now(self, reason: str) -> None:
        if self.ended or self._hanging_up:
            return
        self._hanging_up = True  # once: a barge-in and its transcript both come here
        self._ending = None
        self.out.event({"type": "end", "reason": reason})
        self.out.close(self._close_code, reason)
        self._spawn(self.hang_up(reason))

    # ---- hold audio (pipeline/hold.py) ------------------------------------------------------

    def _start_hold(self) -> None:
        self._hold_timer = None
        if self.ended or self._turn is None or self._turn.done() or self._holding is not None:
            return
        if self.core.playback.playing:
            # The agent's last words still play (a key pressed over them started this turn):
            # hold audio would queue behind them, and its clear would cut them.
            self._hold_timer = self._loop.call_later(CHUNK_MS / 1000, self._start_hold)
            return
        self._hold_started_ms = self.now_ms()
        self.session.audit.add("hold", started=True)
        self._holding = self._spawn(self._play_hold())

    async def _play_hold(self) -> None:
        assert self._hold is not None
        self.out.audio(self._hold.next_chunk(LEAD_MS))
        start, sent = self._loop.time(), 0
        while True:
            sent += 1
            await asyncio.sleep(max(0.0, start + sent * CHUNK_MS / 1000 - self._loop.time()))
            self.out.audio(self._hold.next_chunk(CHUNK_MS))

    def _stop_hold(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if self._holding is not None:
            self._holding.cancel()
            self._holding = None
            self.out.clear()  # what of it is still queued, before the answer goes out
            held = round(self.now_ms() - self._hold_started_ms)
            self.session.audit.add("hold", started=False, held_ms=held)

    # ---- call control ------------------------------------------------------------------

    def machine_answer(self, decision: Verdict) -> None:
        """The carrier's answering-machine detection (a placed call's status callback): taken
        like the server's own detector's, whichever answers first."""
        if not self.ended:
            self._gated(self._gate.carrier_verdict(decision))

    def _send_digits(self, digits: str) -> None:
        control = self.control
        refused = (
            f"the {self.record.transport} transport cannot send digits"
            if control is None
            else control.send_digits(digits)
        )
        if refused is not None:
            self.session.audit.add("error", where="send_dtmf", message=refused)
            return
        self.session.audit.add("dtmf_sent", digits=digits)

    async def _hand_over(self, transfer: CallTransfer) -> None:
        """The agent's transfer, once its line has played: the transport's to do; the call ends
        "transferred to <destination>" or goes on with the `transfer_failed` event."""
        audit = self.session.audit
        audit.add(
            "transfer_call",
            destination=transfer.destination,
            target=transfer.target,
            reason=transfer.reason,
        )
        control = self.control
        error: str | None
        if control is None:
            error = f"the {self.record.transport} transport cannot transfer calls"
        else:
            try:
                error = await control.transfer(transfer)
            except Exception as exc:  # a transport's failure is this call's, never the server's
                log.exception("transfer of call %s failed", self.session.call_id)
                error = f"{type(exc).__name__}: {exc}"
        if self.ended:
            return  # the caller hung up meanwhile
        if error is None:
            reason = f"transferred to {transfer.destination}"
            audit.add("transferred", destination=transfer.destination, target=transfer.target)
            self.out.close(1000, reason)
            await self.hang_up(reason)
            return
        audit.add("error", where="transfer_call", message=error)
        self._queue_event(
            TRANSFER_FAILED_EVENT, {"destination": transfer.destination, "error": error}
        )

    # ---- TTS (pipeline/speech_queue.py) -------------------------------------------------

    def _tts_part(
        self,
        reply_id: int,
        text: str,
        audio: bytes,
        last: bool,
        words: tuple[Word, ...] | None,
    ) -> None:
        duration_ms = len(audio) / self.carrier.bytes_per_ms
        self._apply(
            self.core.tts_audio(
                reply_id, text, audio, duration_ms, self.now_ms(), words=words, last=last
            )
        )

    def _tts_failed(self, reply_id: int, text: str, exc: Exception) -> None:
        self.session.audit.add("error", where="tts", message=f"{type(exc).__name__}: {exc}")
        self._apply(self.core.tts_audio(reply_id, text, b"", 0.0, self.now_ms()))

    # ---- events for the native protocol --------------------------------------------------

    def _on_audit(self, event: AuditEvent) -> None:
        if event.type == "state_change":
            self.out.event({"type": "state", "changes": event.data.get("diff", {})})
        elif event.type == "error":
            self.out.event(
                {
                    "type": "error",
                    "code": event.data.get("where", "error"),
                    "message": str(event.data.get("message", "")),
                }
            )
