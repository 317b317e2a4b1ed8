"""The call core: caller audio and agent speech in, actions out, with an injected clock.

It decides when the caller's turn ends, when caller speech is a barge-in (and when it is only a
backchannel or a noise), and what of the agent's speech the caller heard, which is what gets
committed. It does no I/O: a driver runs the engines and the transport from its actions.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from voice_agent.core.actions import (
    Action,
    Audit,
    CancelAgentTurn,
    CommitReply,
    FeedStt,
    FinishStt,
    JudgeTurn,
    PauseStt,
    RaiseEvent,
    SendAudio,
    SendClear,
    SendMark,
    StartStt,
    StartUserTurn,
    Synthesize,
    TurnMetrics,
)
from voice_agent.core.continuation import join_utterances
from voice_agent.core.end_of_turn import EndOfTurnConfig, Evidence, silence_needed_ms
from voice_agent.core.playback import Chunk, PlaybackTracker, Word, estimate_words
from voice_agent.core.sentences import SentenceSplitter
from voice_agent.core.turns import TurnConfig, TurnDetector
from voice_agent.core.words import words_of

DEFAULT_BACKCHANNELS = (
    "uh-huh",
    "uh huh",
    "mm-hmm",
    "mhm",
    "mm",
    "yeah",
    "yep",
    "okay",
    "ok",
    "right",
)
# Hums and fillers as a recogniser spells them ("mm", "mhm", "hmm", "mm-m-m-m", "uh", "um",
# "ah", "erm"): never words that take a turn, whatever the backchannel list says.
_FILLER = re.compile(r"^(?:h?m+(?:h+m+)*|h+m+|u+[hm]*|a+h+|e+r+m*)$")


@dataclass(frozen=True)
class InterruptionConfig:
    min_interruption_ms: int = 400  # caller speech this long over the agent stops it
    min_interruption_words: int = 0  # and, when set, this many recognised (non-backchannel) words
    false_interruption_timeout_ms: int = 1500  # no words by then: the agent resumes
    backchannels: tuple[str, ...] = DEFAULT_BACKCHANNELS
    resume_after_false_interruption: bool = True
    # Caller speech over the agent that stops within this long is taken for a backchannel as
    # soon as the caller's pause is heard (TurnConfig.stt_tail_ms of silence): the paused agent goes
    # on from where it stopped, before the transcript; words in the transcript still stop it
    # and take the turn. 0: the agent waits for the transcript.
    backchannel_max_ms: int = 1000


@dataclass(frozen=True)
class CoreConfig:
    turn: TurnConfig = field(default_factory=TurnConfig)
    interruption: InterruptionConfig = field(default_factory=InterruptionConfig)
    end_of_turn: EndOfTurnConfig = field(default_factory=EndOfTurnConfig)
    no_input_timeout_ms: int | None = 8000


_START_STT = StartStt()
_PAUSE_STT = PauseStt()
_FINISH_STT = FinishStt()
_CLEAR = SendClear()
_CANCEL = CancelAgentTurn()


@dataclass
class _Reply:
    splitter: SentenceSplitter = field(default_factory=SentenceSplitter)
    generated: str = ""
    synth_pending: int = 0
    done: bool = False  # generation finished, or was cancelled
    cancelled: bool = False
    cut: bool = False  # a barge-in cut it: commit what was heard, not what was generated


@dataclass(frozen=True)
class _Utterance:
    """An utterance whose turn has ended, its transcript still to come."""

    start_ms: float
    end_ms: float  # when the server took its turn to have ended
    # It began before the agent's answer to the turn before had been heard to the end (the
    # agent still thinking, or speaking): it may be the rest of that turn, not a reply to it.
    over_answer: bool = False
    # It paused the agent, which went on before its transcript came (CallCore._speech_stopped).
    resumed_over: bool = False


@dataclass(frozen=True)
class _Closed:
    """A turn of the caller's: its words so far and when the server took it to have ended."""

    text: str
    end_ms: float
    continues: bool = False  # it replaces a turn the agent had already begun to answer


@dataclass
class _Interruption:
    """The agent stopped for the caller's speech. Until its words say whether it was a barge-in
    the agent is only paused: its reply goes on being generated and synthesised, and the audio
    that comes meanwhile joins `unheard`, to play on after a backchannel."""

    started_ms: float
    deadline_ms: float
    unheard: list[Chunk]
    heard: dict[int, str]
    into_unheard_ms: float = 0.0  # how much of the first unheard chunk had played
    paused: bool = True  # False: words had made it a barge-in at once, the agent's turn over


class CallCore:
    def __init__(self, config: CoreConfig, *, bytes_per_ms: float, sample_bytes: int) -> None:
        self.config = config
        self.turns = TurnDetector(config.turn)
        if config.end_of_turn.enabled:
            # Until a pause's evidence says otherwise, no turn ends before the longest wait.
            self.turns.default_silence_ms = config.end_of_turn.max_silence_ms
            self.turns.required_silence_ms = config.end_of_turn.max_silence_ms
        self._pause_id = 0
        self._judging: int | None = None  # the pause whose evidence is awaited
        # What the agent last asked for ("phone", "number", "yes_no", ...): the driver says.
        self.expecting: str | None = None
        self.playback = PlaybackTracker(bytes_per_ms, sample_bytes)
        self._backchannel_words = frozenset(
            word for phrase in config.interruption.backchannels for word in words_of(phrase)
        )
        self._replies: dict[int, _Reply] = {}
        self._interruption: _Interruption | None = None
        self._segment_spent = False  # this stretch of caller speech already made its barge-in
        self._partial = ""
        self._mark_seq = 0
        self.agent_busy = False
        self._no_input_deadline: float | None = None
        self._metrics: dict[str, float | None] | None = None
        self._streaming: Chunk | None = None  # the sentence whose audio is still arriving
        self._awaiting: deque[_Utterance] = deque()  # ended utterances, transcripts to come
        self._answered: _Closed | None = None  # the caller's last turn, which speech may continue
        self._held: _Closed | None = None  # a turn kept back: the caller spoke again at once
        self._began_over_answer = False  # of the utterance under way (see _Utterance)
        self._resumed_early = False  # of the utterance under way (see _Utterance)

    # ---- helpers -----------------------------------------------------------------------

    def _real_words(self, text: str) -> tuple[list[str], list[str]]:
        words = words_of(text)
        backchannel = self._backchannel_words
        return words, [w for w in words if w not in backchannel and not _FILLER.match(w)]

    def _agent_audible(self) -> bool:
        return self.playback.playing

    def next_deadline(self) -> float | None:
        """When tick() next has something to do; the driver sets one timer for it."""
        # Asked after every frame of speech: no list built for it.
        interruption = self._interruption.deadline_ms if self._interruption else None
        no_input = self._no_input_deadline
        if interruption is None or no_input is None:
            return no_input if interruption is None else interruption
        return min(interruption, no_input)

    def _arm_no_input(self, now_ms: float) -> None:
        timeout = self.config.no_input_timeout_ms
        idle = not (self.agent_busy or self.playback.playing or self.turns.in_speech)
        if timeout is not None and idle and self._interruption is None:
            self._no_input_deadline = now_ms + timeout

    # ---- caller audio ------------------------------------------------------------------

    def audio_frame(
        self, frame: bytes, is_speech: bool, partial: str, now_ms: float
    ) -> list[Action]:
        step = self.turns.feed(frame, is_speech, now_ms)
        self._partial = partial
        if not step.stt_frames and not step.ended and not self.turns.in_speech:
            return []
        actions: list[Action] = []
        if step.started:
            self._began_over_answer = self.agent_busy or self.playback.playing
            self._resumed_early = False
            self._no_input_deadline = None
            self._metrics = {"speech_start_ms": self.turns.speech_start_ms}
            actions.append(_START_STT)
            actions.append(Audit("caller_speech_started", {"at_ms": self.turns.speech_start_ms}))
        actions.extend(FeedStt(f) for f in step.stt_frames)
        if step.paused:
            actions.append(_PAUSE_STT)
            if self.config.end_of_turn.enabled:
                self._pause_id += 1
                self._judging = self._pause_id
                actions.append(JudgeTurn(self._pause_id))
        elif self._judging is not None and self.turns.silence_ms == 0:
            self._judging = None  # the caller spoke on: that pause's evidence is moot
        # Only a frame of speech can complete a barge-in: a pause inside the utterance cannot.
        if is_speech and not self._segment_spent and self._interruption is None:
            if self._agent_audible() and self._is_barge_in(now_ms):
                actions.extend(self._barge_in(now_ms))
        if (step.paused or step.ended) and self._interruption is not None:
            actions.extend(self._speech_stopped(now_ms))
        if step.ended:
            actions.extend(self._turn_ended(now_ms))
        return actions

    def _turn_ended(self, now_ms: float) -> list[Action]:
        self._segment_spent = False
        self._judging = None
        start = self.turns.speech_start_ms
        began = start if start is not None else now_ms
        self._awaiting.append(
            _Utterance(began, now_ms, self._began_over_answer, self._resumed_early)
        )
        self._resumed_early = False
        if self._metrics is not None:
            self._metrics["speech_end_ms"] = self.turns.speech_end_ms
            self._metrics["end_of_turn_ms"] = now_ms
        return [_FINISH_STT]

    def turn_judged(
        self, pause_id: int, acoustic: float | None, text: str | None, now_ms: float
    ) -> list[Action]:
        """The evidence JudgeTurn asked for: `acoustic`, the model's probability that the caller
        has finished (None: no model, or it failed or was late); `text`, the words so far (None:
        not known). Sets the silence that ends this pause's turn, and ends it now if that much
        has passed."""
        if pause_id != self._judging or not self.turns.in_speech:
            return []  # the caller spoke on, or the turn has ended meanwhile
        self._judging = None
        verdict = silence_needed_ms(
            Evidence(acoustic, text, self.expecting),
            self.config.end_of_turn,
            self.config.turn.end_of_turn_silence_ms,
        )
        self.turns.required_silence_ms = verdict.silence_ms
        actions: list[Action] = [
            Audit(
                "turn_judged",
                {
                    "acoustic": None if acoustic is None else round(acoustic, 3),
                    "text": text,
                    "expecting": self.expecting,
                    "silence_ms": verdict.silence_ms,
                    "reason": verdict.reason,
                },
            )
        ]
        if self.turns.silence_ms >= verdict.silence_ms:
            self.turns.end()
            actions.extend(self._turn_ended(now_ms))
        return actions

    def _is_barge_in(self, now_ms: float) -> bool:
        rules = self.config.interruption
        if self.turns.speech_ms(now_ms) < rules.min_interruption_ms:
            return False
        words, real = self._real_words(self._partial)
        if words and not real:
            return False  # a backchannel so far: the agent goes on
        return len(real) >= rules.min_interruption_words

    def _barge_in(self, now_ms: float) -> list[Action]:
        """Stop the agent's audio at once. Words already heard (an engine that streams them)
        make it a barge-in now; without them the agent is only paused, its reply going on
        being made, until words arrive (or don't) and say which it was."""
        self._segment_spent = True
        cut = self.playback.cut(now_ms)
        if self._streaming is not None:
            # The sentence still streaming is now (the rest of) one of the unheard chunks.
            self._streaming = next((c for c in cut.unheard if not c.complete), None)
        actions: list[Action] = [_CLEAR]
        _, real = self._real_words(self._partial)
        if real:
            actions.extend(self._stop_agent())
        started = self.turns.speech_start_ms if self.turns.speech_start_ms is not None else now_ms
        self._interruption = _Interruption(
            started,
            now_ms + self.config.interruption.false_interruption_timeout_ms,
            cut.unheard,
            cut.heard,
            cut.into_unheard_ms,
            paused=not real,
        )
        actions.append(
            Audit(
                "barge_in",
                {
                    "caller_speech_start_ms": started,
                    "clear_sent_ms": now_ms,
                    "latency_ms": now_ms - started,
                    "paused": not real,
                    "heard": {str(reply_id): text for reply_id, text in cut.heard.items()},
                    "unheard": " ".join(chunk.text for chunk in cut.unheard),
                },
            )
        )
        return actions

    def _stop_agent(self) -> list[Action]:
        """The agent's turn is over: nothing more of its replies is made or spoken."""
        actions: list[Action] = []
        if self.agent_busy:
            actions.append(_CANCEL)
            self.agent_busy = False
        for reply in self._replies.values():
            reply.cancelled = True
            reply.done = True
            reply.synth_pending = 0
        return actions

    def _speech_stopped(self, now_ms: float) -> list[Action]:
        """The caller's speech that paused the agent has stopped (or its turn has ended). Brief,
        and with no word in it so far that is not a backchannel, it is most likely one: the
        agent goes on now, from the sample where it stopped, rather than a transcript's wait
        later. The transcript still decides: words in it stop the agent and take the turn."""
        interruption = self._interruption
        limit = self.config.interruption.backchannel_max_ms
        start, end = self.turns.speech_start_ms, self.turns.speech_end_ms
        if interruption is None or not interruption.paused or limit <= 0:
            return []
        if start is None or end is None:
            return []
        if end - start > limit or self._real_words(self._partial)[1]:
            return []
        before = self._answered
        window = self.config.turn.continuation_window_ms
        if self._began_over_answer and before is not None and start - before.end_ms <= window:
            return []  # begun straight after the caller's own turn: likely the rest of it
        if not self.config.interruption.resume_after_false_interruption:
            return []  # nothing resumes before the transcript: it alone decides
        self._interruption = None
        self._segment_spent = False  # speaking on over the resumed agent pauses it again
        self._resumed_early = True
        return self._resume(interruption, now_ms, "brief", from_sample=True)

    # ---- STT results -------------------------------------------------------------------

    def stt_final(self, text: str, now_ms: float, confidence: float | None = None) -> list[Action]:
        """The utterance's transcript (and the engine's confidence in it, 0-1, if it gives one).

        Words are never thrown away: only an utterance with no words, or whose words are all
        backchannels and hums said over the agent, is dropped; anything else is a turn, or the
        rest of the turn before it (core/continuation.py), however short or unsure.
        """
        utterance = self._awaiting.popleft() if self._awaiting else _Utterance(now_ms, now_ms)
        words, real = self._real_words(text)
        if self._metrics is not None:
            self._metrics["stt_final_ms"] = now_ms
        interruption, self._interruption = self._interruption, None
        held, self._held = self._held, None
        if held is not None:
            # The words before the caller's pause started no reply: they waited for these.
            actions: list[Action] = []
            if interruption is not None:
                actions.extend(self._commit_cut(interruption.heard))
            if words:
                actions.append(self._continued(held, text, utterance))
                text = join_utterances(held.text, text)
            else:
                actions.append(Audit("user_utterance_dropped", {"text": text, "reason": "empty"}))
                text = held.text
            return [*actions, *self._take_turn(text, now_ms, utterance, held=held)]
        if interruption is not None:
            if not real:
                reason = "backchannel" if words else "noise"
                return [
                    Audit("user_utterance_dropped", {"text": text, "reason": reason}),
                    *self._resume(interruption, now_ms, reason),
                ]
            return [
                *self._commit_cut(interruption.heard),
                *self._take_turn(text, now_ms, utterance),
            ]
        if not words:
            actions = [Audit("user_utterance_dropped", {"text": text, "reason": "empty"})]
            self._arm_no_input(now_ms)
            return actions
        if utterance.resumed_over and not real:
            # The agent went on when this stopped, and may have finished since: still only a
            # backchannel, never a turn to answer.
            return [Audit("user_utterance_dropped", {"text": text, "reason": "backchannel"})]
        if self._agent_audible():
            if not real:
                return [Audit("user_utterance_dropped", {"text": text, "reason": "backchannel"})]
            # Real words too short to count as a barge-in while the agent spoke: still a turn.
            actions = self._barge_in(now_ms)
            cut, self._interruption = self._interruption, None
            assert cut is not None
            actions.extend(self._commit_cut(cut.heard))
            return [*actions, *self._take_turn(text, now_ms, utterance)]
        if self.agent_busy:
            # Said while the agent was thinking: the reply under way was for less than this.
            actions = [_CANCEL]
            self.agent_busy = False
            actions.extend(self._commit_cut({}))
            return [*actions, *self._take_turn(text, now_ms, utterance)]
        return self._take_turn(text, now_ms, utterance)

    def _take_turn(
        self, text: str, now_ms: float, utterance: _Utterance, held: _Closed | None = None
    ) -> list[Action]:
        """A transcript with words becomes the caller's turn: a new one, the rest of the one
        before (speech that began within the continuation window of its end), or, while the
        caller is already speaking again, nothing yet: it waits for what they are saying."""
        window = self.config.turn.continuation_window_ms
        before = self._answered
        continues = held.continues if held is not None else False
        actions: list[Action] = []
        if (
            held is None
            and before is not None
            and utterance.over_answer
            and utterance.start_ms - before.end_ms <= window
        ):
            actions.append(self._continued(before, text, utterance))
            text, continues = join_utterances(before.text, text), True
        speaking = self.turns.speech_start_ms if self.turns.in_speech else None
        if speaking is not None and utterance.end_ms <= speaking <= utterance.end_ms + window:
            self._held = _Closed(text, utterance.end_ms, continues)
            return actions
        self._answered = _Closed(text, utterance.end_ms, continues)
        return [*actions, *self._user_turn(text, now_ms, continues)]

    @staticmethod
    def _continued(before: _Closed, text: str, utterance: _Utterance) -> Audit:
        gap_ms = round(utterance.start_ms - before.end_ms, 1)
        return Audit(
            "user_turn_continued", {"before": before.text, "added": text, "gap_ms": gap_ms}
        )

    def _user_turn(self, text: str, now_ms: float, continues: bool = False) -> list[Action]:
        self.agent_busy = True
        self._no_input_deadline = None
        if self._metrics is None:
            self._metrics = {}
        self._metrics["user_turn_ms"] = now_ms
        return [StartUserTurn(text, continues)]

    def _answer_metrics(self) -> dict[str, float | None] | None:
        """The latency figures of the caller's turn being answered, if one is: the agent going on
        with an earlier reply (after a pause for the caller) is no answer to it."""
        metrics = self._metrics
        return metrics if metrics is not None and "user_turn_ms" in metrics else None

    def _committed_text(self, reply_id: int, heard: str) -> str | None:
        """The generated text cut to as many words as were heard.

        Heard words come from TTS word timings, which may drop punctuation; counting them
        against the generated text keeps the reply as the LLM wrote it.
        """
        reply = self._replies.get(reply_id)
        count = len(heard.split())
        if reply is None or not reply.generated.strip():
            return heard or None
        return " ".join(reply.generated.split()[:count]) or None

    def _commit_cut(self, heard: dict[int, str]) -> list[Action]:
        """A real interruption: the agent's turn is over (if a pause had kept it going), and
        every reply not yet committed keeps only what was heard."""
        actions = self._stop_agent()
        for reply_id in list(self._replies):
            text = heard.get(reply_id, self.playback.heard_text(reply_id))
            heard_ms = self.playback.heard_ms.get(reply_id, 0.0)
            actions.append(CommitReply(reply_id, self._committed_text(reply_id, text), heard_ms))
            self._forget(reply_id)
        return actions

    def _resume(
        self, interruption: _Interruption, now_ms: float, reason: str, from_sample: bool = False
    ) -> list[Action]:
        """The agent goes on with what it had not said: from the start of the word it stopped
        in, or, straight after a brief pause (`from_sample`), from the sample it stopped at, as
        a person goes on after an "uh-huh" without saying the word again."""
        actions: list[Action] = [
            Audit(
                "false_interruption",
                {"reason": reason, "resumed": " ".join(c.text for c in interruption.unheard)},
            )
        ]
        if not self.config.interruption.resume_after_false_interruption:
            actions.extend(self._commit_cut(interruption.heard))
            return actions
        unheard = interruption.unheard
        if from_sample and unheard and interruption.into_unheard_ms > 0:
            first = self.playback.trim(unheard[0], interruption.into_unheard_ms)
            if self._streaming is unheard[0]:
                self._streaming = first
            unheard = [first, *unheard[1:]]
        for chunk in unheard:
            actions.extend(self._send_chunk(chunk, now_ms))
        for reply_id in list(self._replies):
            actions.extend(self._maybe_commit(reply_id))
        return actions

    # ---- timers ------------------------------------------------------------------------

    def tick(self, now_ms: float) -> list[Action]:
        actions: list[Action] = []
        interruption = self._interruption
        if interruption is not None and now_ms >= interruption.deadline_ms:
            _, real = self._real_words(self._partial)
            if not real and self.turns.in_speech:
                # Still speaking but no words yet: an STT without partial results (a hosted
                # one) says nothing until the utterance ends. Its final result decides.
                interruption.deadline_ms = float("inf")
            elif not real:
                self._interruption = None
                actions.extend(self._resume(interruption, now_ms, "no words"))
            else:
                # Words are coming: wait for the caller's turn to end.
                interruption.deadline_ms = float("inf")
        if self._no_input_deadline is not None and now_ms >= self._no_input_deadline:
            self._no_input_deadline = None
            actions.append(RaiseEvent("no-input"))
        return actions

    # ---- agent speech ------------------------------------------------------------------

    def agent_turn_started(self, now_ms: float) -> None:
        """The driver started a turn of the agent's own (call start, an event)."""
        self.agent_busy = True
        self._no_input_deadline = None

    def agent_turn_done(self, now_ms: float) -> list[Action]:
        self.agent_busy = False
        self._arm_no_input(now_ms)
        return []

    def agent_text(self, reply_id: int, text: str, now_ms: float) -> list[Action]:
        reply = self._replies.setdefault(reply_id, _Reply())
        if reply.cancelled:
            return []
        metrics = self._answer_metrics()
        if metrics is not None and "first_token_ms" not in metrics:
            metrics["first_token_ms"] = now_ms
        reply.generated += text
        sentences = reply.splitter.push(text)
        reply.synth_pending += len(sentences)
        return [Synthesize(reply_id, sentence) for sentence in sentences]

    def agent_reply_end(self, reply_id: int, now_ms: float) -> list[Action]:
        reply = self._replies.setdefault(reply_id, _Reply())
        if reply.cancelled:
            return []
        sentences = reply.splitter.flush()
        reply.synth_pending += len(sentences)
        reply.done = True
        actions: list[Action] = [Synthesize(reply_id, sentence) for sentence in sentences]
        actions.extend(self._maybe_commit(reply_id))
        return actions

    def tts_audio(
        self,
        reply_id: int,
        text: str,
        audio: bytes,
        duration_ms: float,
        now_ms: float,
        *,
        words: tuple[Word, ...] | None = None,
        last: bool = True,
    ) -> list[Action]:
        """Audio for a Synthesize, already in the carrier's format: the whole sentence at once,
        or streamed (`last=False` for every part but the final one, which may be empty).

        A part goes out as it comes; the sentence's mark and its words (the engine's timings,
        else an estimate over its full duration) follow the final part.
        """
        chunk = self._streaming
        if chunk is not None and chunk.reply_id != reply_id:
            chunk = self._streaming = None  # a stream the driver never finished: let it go
        reply = self._replies.get(reply_id)
        if reply is None or reply.cancelled:
            # A barge-in cut this sentence while it streamed: the rest of its audio still
            # belongs to the unheard part kept for a resume (or playing again after one).
            return self._stream_on(chunk, text, audio, duration_ms, None, last) if chunk else []
        if last:
            reply.synth_pending -= 1
        actions: list[Action] = []
        if chunk is not None:
            actions.extend(self._stream_on(chunk, text, audio, duration_ms, words, last))
        elif audio:
            # A sentence's first audio (the rest of a streamed one may still come in after the
            # caller has started a new turn, and is not that turn's).
            metrics = self._answer_metrics()
            if metrics is not None and "first_tts_audio_ms" not in metrics:
                metrics["first_tts_audio_ms"] = now_ms
            if last:
                timed = words if words is not None else estimate_words(text, duration_ms)
                self.playback.learn_rate(text, duration_ms)
                chunk = Chunk(reply_id, text, timed, audio, duration_ms, "")
            else:
                chunk = Chunk(reply_id, text, (), audio, duration_ms, "", complete=False)
                self._streaming = chunk
            if self._interruption is not None:
                # The agent is paused for the caller: this plays if it goes on.
                self._interruption.unheard.append(chunk)
            else:
                actions.extend(self._send_chunk(chunk, now_ms))
        actions.extend(self._maybe_commit(reply_id))
        return actions

    def spoken_audio(self, reply_id: int, text: str, audio: bytes, now_ms: float) -> list[Action]:
        """Audio the agent's engine made itself (a speech-to-speech model), in the carrier's
        format, with the new part of its transcript (either may be empty): the reply streams
        as one sentence, its words placed over its audio by the transcript (playback.py)."""
        reply = self._replies.get(reply_id)
        if reply is None:
            reply = self._replies[reply_id] = _Reply(synth_pending=1)
        if not reply.cancelled:
            reply.generated += text
            metrics = self._answer_metrics()
            if text and metrics is not None and "first_token_ms" not in metrics:
                metrics["first_token_ms"] = now_ms
        chunk = self._streaming
        if chunk is not None and chunk.reply_id == reply_id:
            chunk.text += text
        elif not audio or reply.cancelled:
            return []  # the text is in `generated`; the chunk takes it with its first audio
        return self.tts_audio(
            reply_id,
            reply.generated,
            audio,
            len(audio) / self.playback.bytes_per_ms,
            now_ms,
            last=False,
        )

    def spoken_end(self, reply_id: int, now_ms: float) -> list[Action]:
        """The engine's reply is complete: its words are placed over all of its audio."""
        reply = self._replies.get(reply_id)
        if reply is None:
            return []
        reply.done = True
        chunk = self._streaming
        if chunk is None or chunk.reply_id != reply_id:
            reply.generated = ""  # no audio came: nothing of it was said
            return self.tts_audio(reply_id, "", b"", 0.0, now_ms, last=True)
        return self.tts_audio(reply_id, chunk.text, b"", 0.0, now_ms, last=True)

    def reply_wanted(self, reply_id: int) -> bool:
        """Whether sentences of `reply_id` not yet streaming are still to be spoken: not after
        a barge-in or once the reply is committed. The driver drops those that are not."""
        reply = self._replies.get(reply_id)
        return reply is not None and not reply.cancelled

    def stream_wanted(self, reply_id: int) -> bool:
        """Whether more audio of `reply_id`'s sentence now streaming has anywhere to go: its
        reply goes on, or a barge-in cut it and its rest is kept for a resume. When not, the
        driver stops the engine rather than wait for audio nobody will hear."""
        if self.reply_wanted(reply_id):
            return True
        chunk = self._streaming
        if chunk is None or chunk.reply_id != reply_id:
            return False
        interruption = self._interruption
        return self.playback.holds(chunk) or (
            interruption is not None and any(c is chunk for c in interruption.unheard)
        )

    def _stream_on(
        self,
        chunk: Chunk,
        text: str,
        audio: bytes,
        duration_ms: float,
        words: tuple[Word, ...] | None,
        last: bool,
    ) -> list[Action]:
        """More of the sentence that is streaming, wherever its chunk now is."""
        interruption = self._interruption
        playing = self.playback.holds(chunk)
        held = interruption is not None and any(c is chunk for c in interruption.unheard)
        if not playing and not held:
            self._streaming = None  # its reply was committed cut: nothing of it plays again
            return []
        chunk.extend(audio, duration_ms)
        actions: list[Action] = []
        if playing and audio:
            actions.append(SendAudio(audio))
        if last:
            self._streaming = None
            chunk.complete = True
            whole = chunk.text == text  # not the unheard rest of a cut
            if whole:
                self.playback.learn_rate(text, chunk.duration_ms)
            chunk.words = (
                words
                if words is not None and whole
                else estimate_words(chunk.text, chunk.duration_ms)
            )
            if playing:
                actions.append(SendMark(chunk.mark))
        return actions

    def _send_chunk(self, chunk: Chunk, now_ms: float) -> list[Action]:
        self._mark_seq += 1
        chunk.mark = f"m{self._mark_seq}"
        chunk.started_ms = None
        self.playback.sent(chunk, now_ms)
        actions: list[Action] = [SendAudio(chunk.all_audio())]
        if chunk.complete:
            actions.append(SendMark(chunk.mark))
        metrics = self._answer_metrics()
        if metrics is not None and "first_audio_sent_ms" not in metrics:
            metrics["first_audio_sent_ms"] = now_ms
            # How much audio that first send held: a whole sentence when the engine gives one
            # at once, the first streamed part otherwise.
            metrics["first_audio_duration_ms"] = chunk.duration_ms
            actions.append(TurnMetrics(dict(metrics)))
            self._metrics = None
        return actions

    def mark_played(self, name: str, now_ms: float) -> list[Action]:
        actions: list[Action] = []
        for reply_id in {chunk.reply_id for chunk in self.playback.played(name, now_ms)}:
            actions.extend(self._maybe_commit(reply_id))
        self._arm_no_input(now_ms)
        return actions

    def _maybe_commit(self, reply_id: int) -> list[Action]:
        reply = self._replies.get(reply_id)
        if reply is None or not reply.done or reply.synth_pending > 0:
            return []
        if reply_id in self.playback.pending_replies() or self._interruption is not None:
            return []
        text = reply.generated.strip() or None
        heard_ms = None
        if reply.cancelled:
            text = self._committed_text(reply_id, self.playback.heard_text(reply_id))
            heard_ms = self.playback.heard_ms.get(reply_id, 0.0)
        self._forget(reply_id)
        return [CommitReply(reply_id, text, heard_ms)]

    def _forget(self, reply_id: int) -> None:
        self._replies.pop(reply_id, None)
        self.playback.forget(reply_id)

    def preempt(self, now_ms: float) -> list[Action]:
        """The server takes the floor to end the call (a drain's deadline): the agent stops
        as at a barge-in, what the caller heard of it is committed, and nothing resumes."""
        actions: list[Action] = []
        if self.agent_busy:
            actions.append(_CANCEL)
            self.agent_busy = False
        if self.playback.playing:
            actions.append(_CLEAR)
        self._interruption = None
        self._streaming = None
        self._no_input_deadline = None
        cut = self.playback.cut(now_ms)
        actions.extend(self._commit_cut(cut.heard))
        actions.extend(self._unanswered())
        return actions

    def hang_up(self, now_ms: float) -> list[Action]:
        """The caller is gone: what had played by now is what was heard."""
        actions: list[Action] = []
        if self.agent_busy:
            actions.append(_CANCEL)
            self.agent_busy = False
        self._interruption = None
        self._streaming = None
        cut = self.playback.cut(now_ms)
        actions.extend(self._commit_cut(cut.heard))
        actions.extend(self._unanswered())
        return actions

    def _unanswered(self) -> list[Action]:
        """A turn kept back for the caller's next words that will never come: the audit keeps
        it, since everything the caller said is kept."""
        held, self._held = self._held, None
        if held is None:
            return []
        return [Audit("user_utterance_unanswered", {"text": held.text})]
