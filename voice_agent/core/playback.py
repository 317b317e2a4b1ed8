"""What the caller has heard of the agent: audio chunks sent, marks played, words per chunk.

A chunk is one synthesised sentence sent with a mark after it; the carrier echoes the mark when
that audio has played. Inside the chunk that is playing, elapsed time maps to words through the
TTS engine's word timings, or an estimate from the text and the chunk's duration.

A sentence's audio goes out as the engine streams it, so a chunk may still be growing when the
caller cuts in: its words are then placed over the duration it will most likely have (the
audio so far, or its text at this call's speaking rate if that is longer).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

_WORD = re.compile(r"\S+")

# Speaking rate before a call has a finished sentence to learn its own: about 150 words a
# minute of average English words.
DEFAULT_MS_PER_CHAR = 70.0


@dataclass(frozen=True)
class Word:
    text: str
    start_ms: float  # from the start of its chunk
    end_ms: float


def estimate_words(text: str, duration_ms: float) -> tuple[Word, ...]:
    """Without engine timings: time shared in proportion to each word's length (plus a gap)."""
    words = _WORD.findall(text)
    if not words:
        return ()
    weights = [len(word) + 1 for word in words]
    scale = duration_ms / sum(weights)
    timed: list[Word] = []
    position = 0.0
    for word, weight in zip(words, weights, strict=True):
        timed.append(Word(word, position, position + weight * scale))
        position += weight * scale
    return tuple(timed)


@dataclass
class Chunk:
    reply_id: int
    text: str
    words: tuple[Word, ...]
    audio: bytes  # as sent to the carrier, kept so unheard audio can be sent again
    duration_ms: float
    mark: str
    started_ms: float | None = None  # when it began to play, once it has
    complete: bool = True  # False while the engine still streams the sentence's audio
    # Where this chunk's audio starts in its reply's: past 0 for the unheard rest of a cut one.
    origin_ms: float = 0.0
    # Parts streamed after `audio`, joined only when the whole is needed (a resend): adding
    # each part to `audio` would copy the sentence so far for every part.
    _more: list[bytes] = field(default_factory=list, repr=False)

    def extend(self, audio: bytes, duration_ms: float) -> None:
        if audio:
            self._more.append(audio)
        self.duration_ms += duration_ms

    def all_audio(self) -> bytes:
        if self._more:
            self.audio = b"".join([self.audio, *self._more])
            self._more.clear()
        return self.audio


@dataclass
class Cut:
    """The state of playback at a barge-in."""

    heard: dict[int, str]  # reply_id -> the words heard of it
    unheard: list[Chunk]  # what was not heard, from the first unheard word, in order
    position_ms: float  # how far into the playing chunk the caller got
    # How much of the first unheard chunk had played: the start of the word the cut fell in.
    into_unheard_ms: float = 0.0


@dataclass
class PlaybackTracker:
    bytes_per_ms: float
    sample_bytes: int = 1
    queue: deque[Chunk] = field(default_factory=deque)
    heard_words: dict[int, list[str]] = field(default_factory=dict)
    # How far into each reply's audio the caller got (one chunk's reply: a speech-to-speech
    # model's, whose item is truncated there).
    heard_ms: dict[int, float] = field(default_factory=dict)
    ms_per_char: float = DEFAULT_MS_PER_CHAR  # learnt from each finished sentence

    def learn_rate(self, text: str, duration_ms: float) -> None:
        if text and duration_ms > 0:
            self.ms_per_char = duration_ms / len(text)

    def holds(self, chunk: Chunk) -> bool:
        return any(queued is chunk for queued in self.queue)

    @property
    def playing(self) -> bool:
        return bool(self.queue)

    def sent(self, chunk: Chunk, now_ms: float) -> None:
        if not self.queue:
            chunk.started_ms = now_ms
        self.queue.append(chunk)

    def played(self, mark: str, now_ms: float) -> list[Chunk]:
        """A mark came back: its chunk (and any before it) were heard in full."""
        if not any(chunk.mark == mark for chunk in self.queue):
            return []
        done: list[Chunk] = []
        while self.queue:
            chunk = self.queue.popleft()
            self.heard_words.setdefault(chunk.reply_id, []).extend(w.text for w in chunk.words)
            self._reached(chunk, chunk.duration_ms)
            done.append(chunk)
            if chunk.mark == mark:
                break
        if self.queue:
            self.queue[0].started_ms = now_ms
        return done

    def pending_replies(self) -> set[int]:
        return {chunk.reply_id for chunk in self.queue}

    def heard_text(self, reply_id: int) -> str:
        return " ".join(self.heard_words.get(reply_id, ()))

    def _reached(self, chunk: Chunk, played_ms: float) -> None:
        end = chunk.origin_ms + max(0.0, min(played_ms, chunk.duration_ms))
        self.heard_ms[chunk.reply_id] = max(self.heard_ms.get(chunk.reply_id, 0.0), end)

    def cut(self, now_ms: float) -> Cut:
        """Barge-in: count the words of the playing chunk heard so far; the rest is unheard."""
        unheard: list[Chunk] = []
        position = 0.0
        into_unheard = 0.0
        if self.queue:
            head = self.queue[0]
            position = max(
                0.0, now_ms - (head.started_ms if head.started_ms is not None else now_ms)
            )
            words = head.words
            if not head.complete:
                likely_ms = max(head.duration_ms, len(head.text) * self.ms_per_char)
                words = estimate_words(head.text, likely_ms)
            # A word counts as heard once it has played to its end: "within one word".
            done = [w for w in words if w.end_ms <= position]
            rest = words[len(done) :]
            self.heard_words.setdefault(head.reply_id, []).extend(w.text for w in done)
            self._reached(head, position)
            if rest:
                into_unheard = max(0.0, min(position, head.duration_ms) - rest[0].start_ms)
                offset = int(rest[0].start_ms * self.bytes_per_ms)
                offset -= offset % self.sample_bytes
                unheard.append(
                    Chunk(
                        head.reply_id,
                        " ".join(w.text for w in rest),
                        tuple(
                            Word(w.text, w.start_ms - rest[0].start_ms, w.end_ms - rest[0].start_ms)
                            for w in rest
                        ),
                        head.all_audio()[offset:],
                        max(0.0, head.duration_ms - rest[0].start_ms),
                        head.mark,
                        complete=head.complete,
                        origin_ms=head.origin_ms + rest[0].start_ms,
                    )
                )
            unheard.extend(list(self.queue)[1:])
        replies = {chunk.reply_id for chunk in self.queue}
        self.queue.clear()
        heard = {reply_id: self.heard_text(reply_id) for reply_id in replies}
        return Cut(heard, unheard, position, into_unheard)

    def trim(self, chunk: Chunk, ms: float) -> Chunk:
        """`chunk` less its first `ms` of audio: the rest of a sentence from the sample where it
        stopped. A word begun in the part left out keeps its place, starting at 0."""
        offset = int(ms * self.bytes_per_ms)
        offset -= offset % self.sample_bytes
        audio = chunk.all_audio()
        if offset <= 0 or offset >= len(audio):
            return chunk
        ms = offset / self.bytes_per_ms
        words = tuple(
            Word(w.text, max(0.0, w.start_ms - ms), w.end_ms - ms)
            for w in chunk.words
            if w.end_ms > ms
        )
        return Chunk(
            chunk.reply_id,
            " ".join(w.text for w in words) if chunk.complete else chunk.text,
            words,
            audio[offset:],
            chunk.duration_ms - ms,
            chunk.mark,
            complete=chunk.complete,
            origin_ms=chunk.origin_ms + ms,
        )

    def forget(self, reply_id: int) -> None:
        self.heard_words.pop(reply_id, None)
        self.heard_ms.pop(reply_id, None)
