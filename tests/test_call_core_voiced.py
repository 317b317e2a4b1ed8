"""The call core with replies an engine voices itself (a speech-to-speech model): audio and
transcript stream in together, no TTS, and a cut reports where in the reply's audio the caller
stopped hearing it. On a virtual clock, as tests/test_call_core.py."""

from __future__ import annotations

from tests.test_call_core import BYTES_PER_MS, Driver, of
from voice_agent.core.call import (
    Action,
    CommitReply,
    SendAudio,
    SendClear,
    SendMark,
    StartUserTurn,
    Synthesize,
)

ANSWER = "We have tables at seven and at eight tonight."


def voiced(d: Driver, reply_id: int, text: str, ms: float, pieces: int = 4) -> list[Action]:
    """The engine's reply: `pieces` deltas of audio, each with its share of the transcript."""
    words = text.split()
    out: list[Action] = []
    per = -(-len(words) // pieces)
    for index in range(pieces):
        part = " ".join(words[index * per : (index + 1) * per])
        delta = part if index == 0 else (" " + part if part else "")
        audio = b"\x7f" * int(ms / pieces * BYTES_PER_MS)
        out += d.run(d.core.spoken_audio(reply_id, delta, audio, d.now))
    return out


def test_a_voiced_reply_is_sent_as_it_comes_and_committed_whole_once_played() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    out = voiced(d, 1, ANSWER, 2000)
    assert not of(Synthesize, out)  # no TTS: the engine's own audio goes out
    assert sum(len(a.audio) for a in of(SendAudio, out)) == 2000 * BYTES_PER_MS
    assert not of(SendMark, out)  # the reply's one sentence is still streaming
    end = d.run(d.core.spoken_end(1, d.now))
    assert len(of(SendMark, end)) == 1 and not of(CommitReply, end)
    done = of(CommitReply, d.play(2500))
    assert done == [CommitReply(1, ANSWER)] and done[0].heard_ms is None


def test_a_cut_voiced_reply_commits_the_words_heard_and_where_its_audio_was_cut() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    voiced(d, 1, ANSWER, 2700)  # 9 words over 2.7 s
    d.run(d.core.spoken_end(1, d.now))
    d.play(1000)
    cut = d.frames(300, speech=True, partial="actually")
    assert of(SendClear, cut)
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("actually make it nine", d.now))
    (commit,) = of(CommitReply, final)
    assert commit.heard is not None and ANSWER.startswith(commit.heard)
    assert 3 <= len(commit.heard.split()) <= 5  # 1.3 s of 2.7: about four words
    assert commit.heard_ms == 1300  # the audio played when the caller cut in
    assert of(StartUserTurn, final) == [StartUserTurn("actually make it nine")]


def test_a_cut_while_the_reply_still_streams_places_its_words_over_the_likely_length() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    voiced(d, 1, "We have tables", 900, pieces=1)  # the rest not here yet
    d.play(200)
    d.frames(300, speech=True, partial="stop")
    d.frames(500, speech=False)
    (commit,) = of(CommitReply, d.run(d.core.stt_final("stop there", d.now)))
    assert commit.heard_ms == 500
    assert commit.heard in ("We", "We have")


def test_a_voiced_reply_cut_on_its_first_word_commits_nothing() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    voiced(d, 1, "Unfortunately we are fully booked tonight.", 2700)  # the first word 0.9 s
    d.frames(300, speech=True, partial="wait")
    d.frames(500, speech=False)
    (commit,) = of(CommitReply, d.run(d.core.stt_final("wait no", d.now)))
    assert commit.heard is None and commit.heard_ms == 300


def test_a_backchannel_over_a_voiced_reply_resumes_it_and_it_is_heard_whole() -> None:
    d = Driver(min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    voiced(d, 1, ANSWER, 2700)
    d.run(d.core.spoken_end(1, d.now))
    d.play(900)
    d.frames(400, speech=True, partial="uh huh")
    d.frames(500, speech=False)
    final = d.run(d.core.stt_final("uh huh", d.now))
    assert not of(StartUserTurn, final)
    done = of(CommitReply, d.play(10_000))
    assert done == [CommitReply(1, ANSWER)]


def test_a_reply_with_a_transcript_but_no_audio_was_not_said() -> None:
    d = Driver()
    d.core.agent_turn_started(d.now)
    d.run(d.core.spoken_audio(1, "Let me check.", b"", d.now))
    assert of(CommitReply, d.run(d.core.spoken_end(1, d.now))) == [CommitReply(1, None)]
