"""The call core on a virtual clock: turn-taking, barge-in, backchannels, false interruptions.

No sockets and no sleeping: frames are fed by hand, time is a number.
"""

from __future__ import annotations

from typing import Any

from voice_agent.core.call import (
    Action,
    Audit,
    CallCore,
    CancelAgentTurn,
    CommitReply,
    CoreConfig,
    FeedStt,
    FinishStt,
    InterruptionConfig,
    RaiseEvent,
    SendAudio,
    SendClear,
    SendMark,
    StartStt,
    StartUserTurn,
    Synthesize,
    TurnMetrics,
)
from voice_agent.core.end_of_turn import EndOfTurnConfig
from voice_agent.core.playback import Word
from voice_agent.core.turns import TurnConfig, TurnDetector

FRAME = b"\x00" * 640
BYTES_PER_MS = 8.0  # 8 kHz mu-law


class Driver:
    """Plays the parts of the engines and the carrier around one CallCore."""

    def __init__(
        self,
        vad_release_ms: int = 0,
        end_of_turn: EndOfTurnConfig | None = None,
        **interruption: Any,
    ) -> None:
        config = CoreConfig(
            TurnConfig(
                min_speech_ms=100,
                end_of_turn_silence_ms=500,
                pre_roll_ms=200,
                vad_release_ms=vad_release_ms,
            ),
            InterruptionConfig(**interruption),
            end_of_turn=end_of_turn or EndOfTurnConfig(),
            no_input_timeout_ms=5000,
        )
        self.core = CallCore(config, bytes_per_ms=BYTES_PER_MS, sample_bytes=1)
        self.now = 0.0
        self.actions: list[Action] = []
        self.marks: list[str] = []
        self._streamed = 0

    def run(self, actions: list[Action]) -> list[Action]:
        self.actions.extend(actions)
        self.marks.extend(a.name for a in actions if isinstance(a, SendMark))
        return actions

    def frames(self, ms: int, speech: bool, partial: str = "") -> list[Action]:
        out: list[Action] = []
        for _ in range(ms // 20):
            self.now += 20
            out += self.run(self.core.audio_frame(FRAME, speech, partial, self.now))
            out += self.run(self.core.tick(self.now))
        return out

    def say(self, reply_id: int, text: str, ms_per_word: float = 300) -> list[Action]:
        """The agent speaks `text`: one sentence per Synthesize, audio sent at once."""
        out = self.run(self.core.agent_text(reply_id, text, self.now))
        out += self.run(self.core.agent_reply_end(reply_id, self.now))
        for synth in [a for a in out if isinstance(a, Synthesize)]:
            words = synth.text.split()
            timed = tuple(
                Word(w, i * ms_per_word, (i + 1) * ms_per_word) for i, w in enumerate(words)
            )
            duration = len(words) * ms_per_word
            audio = b"\xff" * int(duration * BYTES_PER_MS)
            out += self.run(
                self.core.tts_audio(reply_id, synth.text, audio, duration, self.now, words=timed)
            )
        return out

    def part(self, reply_id: int, text: str, ms: float, *, last: bool = False) -> list[Action]:
        """A piece of a sentence the engine streams: `ms` of audio, no two pieces alike."""
        audio = bytes((self._streamed + i) % 251 for i in range(int(ms * BYTES_PER_MS)))
        self._streamed += len(audio)
        return self.run(self.core.tts_audio(reply_id, text, audio, ms, self.now, last=last))

    def reply(self, reply_id: int, text: str) -> str:
        """The agent's reply is one sentence, to be streamed: the sentence."""
        out = self.run(self.core.agent_text(reply_id, text, self.now))
        out += self.run(self.core.agent_reply_end(reply_id, self.now))
        (synth,) = of(Synthesize, out)
        return str(synth.text)

    def play(self, ms: float) -> list[Action]:
        """The carrier plays `ms` of audio: marks whose audio ended come back."""
        out: list[Action] = []
        end = self.now + ms
        while self.core.playback.queue:
            head = self.core.playback.queue[0]
            assert head.started_ms is not None
            finish = head.started_ms + head.duration_ms
            if finish > end:
                break
            self.now = finish
            out += self.run(self.core.mark_played(head.mark, self.now))
        self.now = end
        out += self.run(self.core.tick(self.now))
        return out


def of(kind: type, actions: list[Action]) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def test_turn_detection_with_pre_roll_and_end_of_turn_silence() -> None:
    d = Driver()
    assert d.frames(200, speech=False) == []
    started = d.frames(100, speech=True)
    assert of(StartStt, started) and len(of(FeedStt, started)) == 10  # 200 ms pre-roll capped
    d.frames(600, speech=True)
    ended = d.frames(500, speech=False)
    assert of(FinishStt, ended)
    assert of(StartUserTurn, d.run(d.core.stt_final("book a table", d.now))) == [
        StartUserTurn("book a table")
    ]


def test_the_vads_hangover_counts_towards_the_end_of_turn_silence() -> None:
    # A VAD that says "speech" for 100 ms after the caller stops: the turn ends 500 ms after
    # the real end of speech, which is 400 ms after the VAD's first "silence".
    d = Driver(vad_release_ms=100)
    d.frames(600, speech=True)
    assert not of(FinishStt, d.frames(380, speech=False))
    assert of(FinishStt, d.frames(20, speech=False))


def level_frame(amplitude: int) -> bytes:
    """20 ms at 16 kHz of a square wave: its RMS is `amplitude`."""
    return (
        amplitude.to_bytes(2, "little", signed=True)
        + (-amplitude).to_bytes(2, "little", signed=True)
    ) * 160


def ends_after(detector: TurnDetector, frames: list[tuple[bytes, bool]]) -> int | None:
    """Feeds the frames (20 ms each); the ms, from the first, at which the turn ended."""
    for index, (frame, speech) in enumerate(frames):
        if detector.feed(frame, speech, (index + 1) * 20.0).ended:
            return (index + 1) * 20
    return None


def test_a_quiet_tail_the_vad_calls_speech_counts_as_silence() -> None:
    # 600 ms of speech, then a tail the VAD calls speech for 200 ms at 40 dB below the speech,
    # then silence. The turn ends 500 ms after the last loud frame, not 500 ms after the VAD
    # gave up on the tail.
    config = TurnConfig(min_speech_ms=100, end_of_turn_silence_ms=500, vad_release_ms=100)
    loud, quiet, silent = level_frame(10_000), level_frame(100), level_frame(0)
    frames = [(loud, True)] * 30 + [(quiet, True)] * 10 + [(silent, False)] * 40
    assert ends_after(TurnDetector(config), frames) == 600 + 500


def test_without_the_quiet_gate_the_vad_alone_decides() -> None:
    config = TurnConfig(
        min_speech_ms=100, end_of_turn_silence_ms=500, vad_release_ms=100, quiet_db=None
    )
    loud, quiet, silent = level_frame(10_000), level_frame(100), level_frame(0)
    frames = [(loud, True)] * 30 + [(quiet, True)] * 10 + [(silent, False)] * 40
    # The tail is speech; the VAD's hangover (100 ms) is taken off its end.
    assert ends_after(TurnDetector(config), frames) == 600 + 200 + 400


def test_a_loud_tail_in_noise_falls_back_on_the_vads_hangover() -> None:
    # Background noise keeps the hangover frames loud: the VAD's release is what is known.
    config = TurnConfig(min_speech_ms=100, end_of_turn_silence_ms=500, vad_release_ms=100)
    loud, noise = level_frame(10_000), level_frame(3_000)
    frames = [(loud, True)] * 30 + [(noise, True)] * 5 + [(noise, False)] * 40
    assert ends_after(TurnDetector(config), frames) == 600 + 100 + 400


def test_loud_speech_after_a_quiet_stretch_keeps_the_turn_going() -> None:
    config = TurnConfig(min_speech_ms=100, end_of_turn_silence_ms=500, vad_release_ms=100)
    loud, quiet, silent = level_frame(10_000), level_frame(100), level_frame(0)
    frames = [(loud, True)] * 30 + [(quiet, True)] * 20 + [(loud, True)] * 10
    frames += [(silent, False)] * 40
    assert ends_after(TurnDetector(config), frames) == 600 + 400 + 200 + 400


def test_short_silences_inside_an_utterance_do_not_end_it() -> None:
    d = Driver()
    d.frames(300, speech=True)
    assert not of(FinishStt, d.frames(400, speech=False))
    d.frames(300, speech=True)
    assert of(FinishStt, d.frames(500, speech=False))


def test_a_reply_heard_to_the_end_is_committed_whole() -> None:
    d = Driver()
    d.core.agent_turn_started(d.now)
    d.say(1, "Hello there, welcome to Bella Vista. How can I help you today?")
    assert len(d.marks) == 2  # one chunk per sentence, a mark after each
    assert of(CommitReply, d.play(400)) == []
    committed = of(CommitReply, d.play(10_000))
    assert committed == [
        CommitReply(1, "Hello there, welcome to Bella Vista. How can I help you today?")
    ]


def test_barge_in_on_the_first_word_commits_nothing() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "Our opening hours are noon to eleven every day.", ms_per_word=400)
    cut = d.frames(300, speech=True, partial="wait")  # caller talks over the first word
    assert of(SendClear, cut) and of(CancelAgentTurn, cut)
    barge = next(a for a in cut if isinstance(a, Audit) and a.type == "barge_in")
    assert barge.data["latency_ms"] == 300
    d.frames(200, speech=True, partial="wait i need")
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("wait i need to cancel", d.now))
    assert of(CommitReply, final) == [CommitReply(1, None)]
    assert of(StartUserTurn, final) == [StartUserTurn("wait i need to cancel")]


def test_barge_in_mid_sentence_commits_the_heard_prefix() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "Our opening hours are noon to eleven every day.")
    d.play(1250)  # "Our opening hours are" played (4 x 300 ms), "noon" not finished
    d.frames(300, speech=True, partial="no")
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("no i meant the terrace", d.now))
    # The caller spoke from 1250 ms; the cut came 300 ms later, when "noon" had also played.
    assert of(CommitReply, final) == [CommitReply(1, "Our opening hours are noon")]


def test_backchannel_does_not_interrupt_and_is_not_a_turn() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "So that is a table for two tomorrow at seven in the evening.")
    d.play(600)
    during = d.frames(400, speech=True, partial="uh huh")
    assert not of(SendClear, during)
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("uh huh", d.now))
    assert of(StartUserTurn, final) == []
    assert [a.data["reason"] for a in of(Audit, final)] == ["backchannel"]
    done = of(CommitReply, d.play(10_000))
    assert done == [CommitReply(1, "So that is a table for two tomorrow at seven in the evening.")]


def test_a_hum_spelt_as_letters_is_a_backchannel() -> None:
    """Whisper writes a drawn-out "mm-hmm" as "Mm-m-m-m-m": no words, so the agent resumes."""
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "So that is a table for two tomorrow at seven in the evening.")
    d.play(600)
    assert of(SendClear, d.frames(400, speech=True))  # no words while it lasts: a pause
    assert of(SendAudio, d.frames(500, speech=False))  # brief: the agent went on at its end
    final = d.run(d.core.stt_final("Mm-m-m-m-m-m-m-m-", d.now))
    assert of(StartUserTurn, final) == [] and of(SendAudio, final) == []
    assert [a.data["reason"] for a in of(Audit, final) if a.type == "user_utterance_dropped"] == [
        "backchannel"
    ]
    # Longer than a backchannel: the agent waits for the transcript, which lets it go on.
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "So that is a table for two tomorrow at seven in the evening.")
    d.play(600)
    assert of(SendClear, d.frames(1100, speech=True))
    assert of(SendAudio, d.frames(500, speech=False)) == []
    final = d.run(d.core.stt_final("Mm-m-m-m-m-m-m-m-", d.now))
    assert of(StartUserTurn, final) == [] and of(SendAudio, final)


def test_words_over_the_agent_take_the_turn_however_unsure_the_engine_is() -> None:
    """Nothing a caller says in words is dropped as noise: an unsure reading is still theirs."""
    for confidence in (0.2, 0.45, 0.9, None):
        d = Driver(min_interruption_ms=300)
        d.core.agent_turn_started(d.now)
        d.say(1, "So that is a table for two tomorrow at seven in the evening.")
        d.play(600)
        d.frames(600, speech=True)
        d.frames(500, speech=False)
        final = d.run(d.core.stt_final("And I'm not.", d.now, confidence))
        assert of(StartUserTurn, final) == [StartUserTurn("And I'm not.")]
        assert not [a for a in of(Audit, final) if a.type == "user_utterance_dropped"]
        assert of(CommitReply, final) == [CommitReply(1, "So that is")]  # cut at 900 ms


def test_noise_burst_stops_the_agent_then_it_resumes_from_the_cut_word() -> None:
    # Waiting for words (or their absence) rather than going on at the pause: the way a
    # longer noise goes, and every noise with backchannel_max_ms 0.
    d = Driver(min_interruption_ms=300, false_interruption_timeout_ms=800, backchannel_max_ms=0)
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(650)  # "Your table" heard
    cough = d.frames(300, speech=True)  # a cough: VAD fires, no words
    assert of(SendClear, cough)
    sent_before = len(of(SendAudio, d.actions))
    resumed = d.frames(800, speech=False)
    resent = of(SendAudio, resumed)
    assert len(of(SendAudio, d.actions)) == sent_before + 1
    # Cut at 950 ms: resent from "booked", the first word not heard in full (eleven words of
    # 300 ms, 8 bytes per ms).
    assert len(resent[0].audio) == (11 - 3) * 300 * 8
    assert [a.data["reason"] for a in of(Audit, resumed) if a.type == "false_interruption"] == [
        "no words"
    ]
    final = d.run(d.core.stt_final("", d.now))
    assert of(StartUserTurn, final) == []
    done = of(CommitReply, d.play(10_000))
    assert done == [CommitReply(1, "Your table is booked for Friday at eight in the evening.")]


def test_without_partial_words_the_agent_waits_for_the_callers_turn_to_end() -> None:
    """A hosted STT gives no partials: a caller still talking at the timeout is not noise."""
    d = Driver(min_interruption_ms=300, false_interruption_timeout_ms=800)
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(650)
    talking = d.frames(2000, speech=True)  # well past the timeout, no partial words
    assert of(SendClear, talking)
    assert not [a for a in of(Audit, talking) if a.type == "false_interruption"]
    sent = len(of(SendAudio, d.actions))
    d.frames(600, speech=False)  # the turn ends; nothing is resent meanwhile
    assert len(of(SendAudio, d.actions)) == sent
    final = d.run(d.core.stt_final("actually make it saturday", d.now))
    assert of(StartUserTurn, final) == [StartUserTurn("actually make it saturday")]
    assert of(CommitReply, final) == [CommitReply(1, "Your table is")]  # cut at 950 ms


def test_min_interruption_words_waits_for_recognised_words() -> None:
    d = Driver(min_interruption_ms=200, min_interruption_words=2)
    d.core.agent_turn_started(d.now)
    d.say(1, "Let me read the whole menu to you now, starting with the pasta.")
    assert not of(SendClear, d.frames(300, speech=True, partial="uh"))
    assert of(SendClear, d.frames(40, speech=True, partial="stop please"))


def test_empty_transcript_is_never_a_turn_and_no_input_fires() -> None:
    d = Driver()
    d.frames(200, speech=True)
    d.frames(500, speech=False)
    dropped = d.run(d.core.stt_final("", d.now))
    assert of(StartUserTurn, dropped) == []
    assert of(RaiseEvent, d.frames(5000, speech=False)) == [RaiseEvent("no-input")]


def test_turn_metrics_cover_every_stage() -> None:
    d = Driver()
    d.frames(400, speech=True)
    d.frames(500, speech=False)
    d.run(d.core.stt_final("hello", d.now + 30))
    d.now += 100
    out = d.say(1, "Hi, how can I help you today?")
    metrics = of(TurnMetrics, out)[0].data
    assert metrics["speech_start_ms"] == 0
    assert metrics["speech_end_ms"] == 400
    assert metrics["end_of_turn_ms"] == 900
    assert metrics["stt_final_ms"] == 930
    assert metrics["first_token_ms"] == metrics["first_audio_sent_ms"] == 1000
    assert metrics["first_audio_duration_ms"] == 7 * 300  # seven words at 300 ms


def test_hang_up_mid_reply_commits_what_played() -> None:
    d = Driver()
    d.core.agent_turn_started(d.now)
    d.say(1, "One two three four five six seven eight.")
    d.play(900)
    assert of(CommitReply, d.run(d.core.hang_up(d.now))) == [CommitReply(1, "One two three")]


def test_preempting_mid_reply_clears_it_commits_what_played_and_lets_a_goodbye_play() -> None:
    """A drain's deadline: the agent is cut as at a barge-in, and the goodbye that follows
    plays whole and is committed once its mark comes back."""
    d = Driver()
    d.core.agent_turn_started(d.now)
    d.say(1, "One two three four five six seven eight.")
    d.play(900)
    cut = d.run(d.core.preempt(d.now))
    assert of(SendClear, cut) and of(CancelAgentTurn, cut)
    assert of(CommitReply, cut) == [CommitReply(1, "One two three")]
    assert not d.core.playback.playing and d.core.next_deadline() is None
    d.core.agent_turn_started(d.now)
    goodbye = d.say(2, "Sorry, I have to go. Goodbye.")
    assert of(SendAudio, goodbye)
    d.run(d.core.agent_turn_done(d.now))
    assert of(CommitReply, d.play(5000)) == [CommitReply(2, "Sorry, I have to go. Goodbye.")]


def test_preempting_a_quiet_agent_sends_no_clear() -> None:
    d = Driver()
    assert d.run(d.core.preempt(d.now)) == []


def test_a_short_real_answer_over_the_agent_is_a_turn_not_noise() -> None:
    for answer in ("no", "four", "Friday."):
        d = Driver(min_interruption_ms=300)
        d.core.agent_turn_started(d.now)
        d.say(1, "Your table is booked for Friday at eight in the evening.")
        d.play(650)
        d.frames(400, speech=True)
        d.frames(500, speech=False)
        final = d.run(d.core.stt_final(answer, d.now))
        assert of(StartUserTurn, final) == [StartUserTurn(answer)], answer
        assert not [a for a in of(Audit, final) if a.type == "false_interruption"]
    # Said too briefly to stop the agent at once, a word still takes the turn.
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(650)
    assert not of(SendClear, d.frames(200, speech=True))
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("no", d.now))
    assert of(SendClear, final) and of(StartUserTurn, final) == [StartUserTurn("no")]


def test_a_streamed_sentence_plays_from_its_first_part_and_its_mark_follows_the_last() -> None:
    d = Driver()
    d.frames(400, speech=True)
    d.frames(500, speech=False)
    d.run(d.core.stt_final("is my table booked", d.now))
    text = d.reply(1, "Your table is booked for Friday.")
    first = d.part(1, text, 100)
    # The caller hears the first 100 ms at once, not when the whole sentence is synthesised.
    assert [len(a.audio) for a in of(SendAudio, first)] == [100 * 8] and not of(SendMark, first)
    assert of(TurnMetrics, first)[0].data["first_audio_duration_ms"] == 100
    d.now += 25
    assert len(of(SendAudio, d.part(1, text, 2000))) == 1 and d.marks == []
    end = d.part(1, text, 0, last=True)
    assert of(SendAudio, end) == [] and len(of(SendMark, end)) == 1
    assert of(CommitReply, d.play(1000)) == []  # heard in part: nothing committed yet
    assert of(CommitReply, d.play(2000)) == [CommitReply(1, "Your table is booked for Friday.")]


def test_a_noise_while_a_sentence_streams_resumes_it_with_the_audio_that_came_meanwhile() -> None:
    d = Driver(min_interruption_ms=300, false_interruption_timeout_ms=800)
    d.core.agent_turn_started(d.now)
    text = d.reply(1, "Your table is booked for Friday at eight in the evening.")
    d.part(1, text, 1000)
    d.play(650)
    assert of(SendClear, d.frames(300, speech=True))  # a cough: no words
    # The rest of the sentence arrives while the agent is stopped: kept, not sent.
    assert of(SendAudio, d.part(1, text, 2000)) == []
    assert of(SendMark, d.part(1, text, 0, last=True)) == []
    resumed = d.frames(800, speech=False)
    (resent,) = of(SendAudio, resumed)
    sentence = bytes(i % 251 for i in range(3000 * 8))  # both parts, as Driver.part made them
    # From the first word not heard in full (after ~950 ms of play) to the sentence's end.
    assert sentence.endswith(resent.audio) and 2000 * 8 < len(resent.audio) < 2350 * 8
    assert len(of(SendMark, resumed)) == 1  # the sentence is whole now: its mark follows it
    d.run(d.core.stt_final("", d.now))
    assert of(CommitReply, d.play(10_000)) == [
        CommitReply(1, "Your table is booked for Friday at eight in the evening.")
    ]


def test_a_barge_in_while_a_sentence_streams_commits_the_words_heard_of_it() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    text = d.reply(1, "Your table is booked for Friday at eight in the evening.")
    d.part(1, text, 1000)
    d.play(650)
    d.frames(300, speech=True, partial="no")
    assert of(SendAudio, d.part(1, text, 2000, last=True)) == []  # dropped after the clear
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("no make it saturday", d.now))
    # Cut at 950 ms. Only a second of the sentence had come, so its words are placed over
    # its likely length, 70 ms per character: "Your" ends at 344 ms, "table" at 756, "is"
    # at 962.
    assert of(CommitReply, final) == [CommitReply(1, "Your table")]


def test_a_sentence_cut_while_it_streams_is_wanted_only_while_it_may_resume() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    text = d.reply(1, "Your table is booked for Friday at eight in the evening.")
    assert d.core.stream_wanted(1)
    d.part(1, text, 1000)
    d.play(650)
    d.frames(300, speech=True, partial="no")
    # Stopped: no more sentences of it, but the rest of this one may still play if the
    # caller's words turn out to be noise.
    assert not d.core.reply_wanted(1) and d.core.stream_wanted(1)
    d.frames(500, speech=False)
    d.run(d.core.stt_final("no make it saturday", d.now))
    # Committed cut: the engine's rest of the sentence has nowhere to go.
    assert not d.core.stream_wanted(1)
    # A reply the caller talked over before any of its audio had come is not wanted either.
    d.core.agent_turn_started(d.now)
    d.reply(2, "Saturday it is.")
    d.frames(300, speech=True)
    d.frames(500, speech=False)
    assert of(CancelAgentTurn, d.run(d.core.stt_final("no wait", d.now)))
    assert not d.core.stream_wanted(2)


# ---- a caller's sentence split by a pause (core/continuation.py) -------------------------


def closed_turn(d: Driver, text: str) -> list[Action]:
    """The caller says `text`; the server ends the turn at the pause and the agent starts."""
    d.frames(1200, speech=True)
    d.frames(500, speech=False)  # the end-of-turn silence: the turn ends here
    return d.run(d.core.stt_final(text, d.now))


def test_a_sentence_continued_over_the_agents_first_words_is_one_turn() -> None:
    for gap_ms in (300, 900, 1400):
        d = Driver(min_interruption_ms=300)
        first = closed_turn(d, "He might even have been.")
        assert of(StartUserTurn, first) == [StartUserTurn("He might even have been.")]
        end_of_turn = d.now
        d.now += 100
        d.say(1, "Sorry, I didn't catch that.")  # five words, 1.5 s
        d.play(gap_ms - 100)
        assert end_of_turn + gap_ms == d.now
        more = d.frames(600, speech=True)
        assert of(SendClear, more)  # the agent stops as at any barge-in
        d.frames(500, speech=False)
        final = d.run(d.core.stt_final("Made amiable himself.", d.now))
        joined = "He might even have been made amiable himself."
        assert of(StartUserTurn, final) == [StartUserTurn(joined, continues=True)], gap_ms
        heard = " ".join("Sorry, I didn't catch that.".split()[: (gap_ms - 100 + 300) // 300])
        assert of(CommitReply, final) == [CommitReply(1, heard or None)], gap_ms
        (continued,) = [a for a in of(Audit, final) if a.type == "user_turn_continued"]
        assert continued.data["added"] == "Made amiable himself."
        assert not [a for a in of(Audit, final) if a.type == "user_utterance_dropped"]


def test_words_while_the_agent_thinks_continue_the_turn_and_stop_its_reply() -> None:
    d = Driver()
    closed_turn(d, "I'd like a table for")
    d.frames(300, speech=False)
    d.frames(400, speech=True)
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("four people please", d.now))
    assert of(CancelAgentTurn, final)
    assert of(StartUserTurn, final) == [
        StartUserTurn("I'd like a table for four people please", continues=True)
    ]


def test_a_backchannel_right_after_a_turn_does_not_continue_it() -> None:
    d = Driver(min_interruption_ms=300)
    closed_turn(d, "A table for two please.")
    d.say(1, "Lovely, for what day would that be?")
    d.play(400)
    d.frames(500, speech=True, partial="uh huh")
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("uh huh", d.now))
    assert of(StartUserTurn, final) == []
    assert [a.data["reason"] for a in of(Audit, final)] == ["backchannel"]


def test_an_answer_after_the_agents_whole_question_is_a_new_turn() -> None:
    """Quick as it comes, a reply to a question heard to its end answers it."""
    d = Driver()
    closed_turn(d, "A table please.")
    d.say(1, "For how many?", ms_per_word=200)  # 600 ms
    d.run(d.core.agent_turn_done(d.now))
    d.play(700)
    assert not d.core.playback.playing
    d.frames(400, speech=True)
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("four", d.now))
    assert of(StartUserTurn, final) == [StartUserTurn("four")]


def test_words_after_the_window_are_a_turn_of_their_own() -> None:
    d = Driver(min_interruption_ms=300)
    closed_turn(d, "I want to change my booking.")
    d.say(1, "Sure. " + "What phone number is the booking under? " * 3)
    d.play(1600)
    d.frames(600, speech=True)
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("it's under smith", d.now))
    assert of(StartUserTurn, final) == [StartUserTurn("it's under smith")]


def test_a_transcript_waits_while_the_caller_is_already_speaking_again() -> None:
    """The caller went on before their first words were even transcribed: no reply starts
    for half a sentence; the two transcripts make one turn."""
    d = Driver()
    d.frames(1200, speech=True)
    d.frames(500, speech=False)  # turn ends
    d.frames(200, speech=False)
    d.frames(200, speech=True)  # speaking again...
    first = d.run(d.core.stt_final("My number is oh seven seven", d.now))
    assert of(StartUserTurn, first) == []  # ...so nothing starts yet
    d.frames(1000, speech=True)
    d.frames(500, speech=False)
    rest = d.run(d.core.stt_final("double four one two three.", d.now))
    (turn,) = of(StartUserTurn, rest)
    assert turn == StartUserTurn("My number is oh seven seven double four one two three.")


def test_a_kept_back_transcript_is_answered_when_the_rest_was_a_cough() -> None:
    d = Driver()
    d.frames(1200, speech=True)
    d.frames(500, speech=False)
    d.frames(300, speech=True)
    assert d.run(d.core.stt_final("Friday at eight.", d.now)) == []
    d.frames(500, speech=False)
    rest = d.run(d.core.stt_final("", d.now))
    assert of(StartUserTurn, rest) == [StartUserTurn("Friday at eight.")]


def test_a_kept_back_transcript_stays_in_the_audit_if_the_caller_hangs_up() -> None:
    d = Driver()
    d.frames(1200, speech=True)
    d.frames(500, speech=False)
    d.frames(300, speech=True)
    d.run(d.core.stt_final("Cancel it.", d.now))
    gone = d.run(d.core.hang_up(d.now))
    assert [a.data for a in of(Audit, gone)] == [{"text": "Cancel it."}]


# ---- a pause, not a stop: brief speech over the agent (interruption.backchannel_max_ms) --------


def paused_by(d: Driver, ms: int) -> tuple[list[Action], list[Action]]:
    """The agent says a sentence of eleven 300 ms words; 650 ms in, the caller speaks for `ms`
    with no partial words (Whisper, a hosted STT), then falls silent. What the speech did, and
    what the silence did until the caller's turn ended."""
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(650)
    return d.frames(ms, speech=True), d.frames(500, speech=False)


def sent_bytes(actions: list[Action]) -> int:
    return sum(len(a.audio) for a in of(SendAudio, actions))


def test_brief_speech_pauses_the_agent_which_goes_on_from_the_sample_it_stopped_at() -> None:
    d = Driver(min_interruption_ms=300)
    speech, silence = paused_by(d, 400)
    # Stopped at 300 ms of speech, but its turn goes on: nothing cancelled.
    assert of(SendClear, speech) and not of(CancelAgentTurn, speech)
    (barge,) = [a for a in of(Audit, speech) if a.type == "barge_in"]
    assert barge.data["paused"] is True
    (resumed,) = [a for a in silence if isinstance(a, SendAudio)]
    stopped_at_ms = barge.data["clear_sent_ms"]  # 950 ms into the sentence
    # It went on at the caller's pause, 220 ms after their speech ended, without the transcript.
    resumed_ms = 650 + 400 + 220
    assert d.core.playback.queue[0].started_ms == resumed_ms
    assert [a.data["reason"] for a in of(Audit, silence) if a.type == "false_interruption"] == [
        "brief"
    ]
    # Nothing said twice: what had played before the stop and what is sent now make the
    # sentence once.
    assert stopped_at_ms == 950 and len(resumed.audio) == (3300 - 950) * 8
    # Going on is not an answer to the caller: no turn latency is taken from it.
    assert of(TurnMetrics, silence) == []
    final = d.run(d.core.stt_final("uh huh", d.now))
    assert of(StartUserTurn, final) == [] and of(SendAudio, final) == []
    assert [a.data["reason"] for a in of(Audit, final)] == ["backchannel"]
    assert of(CommitReply, d.play(10_000)) == [
        CommitReply(1, "Your table is booked for Friday at eight in the evening.")
    ]


def test_a_paused_agent_goes_on_making_its_reply_and_says_all_of_it() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    out = d.run(d.core.agent_text(1, "Your table is booked. ", d.now))
    (first,) = of(Synthesize, out)
    d.run(d.core.tts_audio(1, first.text, b"\xff" * 1200 * 8, 1200, d.now))
    d.play(650)
    speech = d.frames(300, speech=True)
    assert of(SendClear, speech) and d.core.reply_wanted(1)
    # The rest of the reply is written and synthesised while the agent is paused: kept.
    out = d.run(d.core.agent_text(1, "See you on Friday.", d.now))
    out += d.run(d.core.agent_reply_end(1, d.now))
    (second,) = of(Synthesize, out)
    held = d.run(d.core.tts_audio(1, second.text, b"\xfe" * 900 * 8, 900, d.now))
    assert of(SendAudio, held) == [] and of(CommitReply, held) == []
    resumed = d.frames(300, speech=False)
    # The rest of the first sentence from where it stopped (to a sample), then the second.
    rest, after = (len(a.audio) for a in of(SendAudio, resumed))
    assert abs(rest - (1200 - 950) * 8) <= 8 and after == 900 * 8
    d.frames(300, speech=False)
    d.run(d.core.stt_final("mm-hmm", d.now))
    assert of(CommitReply, d.play(10_000)) == [
        CommitReply(1, "Your table is booked. See you on Friday.")
    ]


def test_words_in_the_transcript_after_the_agent_went_on_stop_it_and_take_the_turn() -> None:
    d = Driver(min_interruption_ms=300)
    paused_by(d, 400)  # went on at 1270 ms, from 950 ms into the sentence
    d.play(400)  # "booked" (900-1200) and "for" (1200-1500) heard since, then the transcript
    final = d.run(d.core.stt_final("wait", d.now))
    assert of(SendClear, final) and of(CancelAgentTurn, final)
    assert of(CommitReply, final) == [CommitReply(1, "Your table is booked for")]
    assert of(StartUserTurn, final) == [StartUserTurn("wait")]


def test_a_backchannel_whose_transcript_comes_after_the_agent_finished_is_not_a_turn() -> None:
    d = Driver(min_interruption_ms=300)
    paused_by(d, 400)
    committed = of(CommitReply, d.play(10_000))
    assert committed == [CommitReply(1, "Your table is booked for Friday at eight in the evening.")]
    final = d.run(d.core.stt_final("uh-huh", d.now))
    assert of(StartUserTurn, final) == []
    assert [a.data["reason"] for a in of(Audit, final)] == ["backchannel"]


def test_speaking_on_after_the_agent_went_on_pauses_it_again() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(650)
    d.frames(400, speech=True)
    assert of(SendAudio, d.frames(240, speech=False))  # went on at the pause
    again = d.frames(40, speech=True)  # "uh-huh ... but what about" : the same utterance
    assert of(SendClear, again)


def test_longer_speech_waits_for_its_transcript_and_nothing_is_said_meanwhile() -> None:
    for speech_ms, limit in ((1200, 1000), (400, 0)):
        d = Driver(min_interruption_ms=300, backchannel_max_ms=limit)
        speech, silence = paused_by(d, speech_ms)
        assert of(SendClear, speech) and of(SendAudio, silence) == []
        final = d.run(d.core.stt_final("mm-hmm", d.now))
        assert len(of(SendAudio, final)) == 1  # the transcript said backchannel: on it goes
        assert [a.data["reason"] for a in of(Audit, final) if a.type == "false_interruption"] == [
            "backchannel"
        ]


def test_brief_speech_with_a_real_partial_word_is_a_barge_in_at_once() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(650)
    speech = d.frames(400, speech=True, partial="stop")
    assert of(SendClear, speech) and of(CancelAgentTurn, speech)
    assert of(SendAudio, d.frames(500, speech=False)) == []
    final = d.run(d.core.stt_final("stop", d.now))
    assert of(CommitReply, final) == [CommitReply(1, "Your table is")]
    assert of(StartUserTurn, final) == [StartUserTurn("stop")]
