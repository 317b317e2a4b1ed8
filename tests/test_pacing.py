"""When a sentence's streamed audio goes out: at once while the caller is short of it, in
larger pieces once it is well ahead."""

from __future__ import annotations

from voice_agent.audio.pacing import SentencePacer

BYTES_PER_MS = 8.0  # 8 kHz mu-law
PIECE = b"\xff" * 800  # 100 ms


def sent_ms(pacer: SentencePacer, arrivals_ms: list[float]) -> list[float]:
    """Feeds a 100 ms piece at each arrival time; the length of each send, in ms."""
    sends = [len(out) / BYTES_PER_MS for at in arrivals_ms if (out := pacer.push(PIECE, at))]
    if tail := pacer.finish():
        sends.append(len(tail) / BYTES_PER_MS)
    return sends


def test_an_engine_four_times_faster_than_real_time_is_sent_in_fewer_larger_pieces() -> None:
    arrivals = [i * 25.0 for i in range(30)]  # 3 s of speech in 750 ms
    sends = sent_ms(SentencePacer(BYTES_PER_MS), arrivals)
    assert sends[0] == 100  # the first piece at once
    assert sum(sends) == 3000  # nothing lost or repeated
    assert len(sends) <= 12 and max(sends) <= 400


def test_an_engine_at_real_time_has_every_piece_sent_as_it_comes() -> None:
    arrivals = [i * 100.0 for i in range(30)]
    assert sent_ms(SentencePacer(BYTES_PER_MS), arrivals) == [100.0] * 30


def test_audio_is_held_back_only_while_the_caller_has_300_ms_or_more_to_play() -> None:
    # Fast, then the engine stalls for a second, then fast again.
    arrivals = [i * 25.0 for i in range(10)] + [1300 + i * 25.0 for i in range(10)]
    pacer = SentencePacer(BYTES_PER_MS)
    pushed = sent = 0.0
    held_at = []
    for at in arrivals:
        pushed += 100
        sent += len(pacer.push(PIECE, at)) / BYTES_PER_MS
        if sent < pushed:
            held_at.append(at)
            assert sent - at >= 300  # playing since the first piece, at 0 ms
    # It did hold audio back, and what it held at the stall went out with the next piece.
    assert held_at and 1300 not in held_at


def test_audio_held_when_the_engine_stalls_is_due_before_the_caller_runs_short() -> None:
    pacer = SentencePacer(BYTES_PER_MS)
    for at in (0.0, 10.0, 20.0, 30.0):  # 400 ms of speech in 30 ms
        assert pacer.push(PIECE, at) == PIECE  # the caller's lead is still short: sent
    assert pacer.due_ms() is None
    assert pacer.push(PIECE, 40.0) == b""  # 360 ms ahead: held
    # Then the engine goes quiet. 400 ms were sent from 0 ms: the caller is down to 300 ms
    # left at 100 ms, which is when the held piece must go.
    assert pacer.due_ms() == 100.0
    assert pacer.take() == PIECE and pacer.due_ms() is None
