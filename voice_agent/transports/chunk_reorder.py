"""Putting a track's media back in `chunk` order when a carrier's dispatch swaps neighbours
(Telnyx's media streams number each track's frames; voice_agent.transports.telnyx says why a
window of five): in-order chunks pass straight through, a chunk after a gap is held until the
gap fills or the window is full, then the gap is given up for lost."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from voice_agent.transports.errors import ProtocolWarning

REORDER_WINDOW = 5  # chunks held per track while one is missing: 100 ms of 20 ms frames
CHUNK_RESET_DISTANCE = 50  # a chunk this far (1 s) behind the expected one restarts the count


class Chunked(Protocol):
    """A media frame numbered within its track."""

    @property
    def chunk(self) -> int: ...

    @property
    def track(self) -> str: ...


M = TypeVar("M", bound=Chunked)


class ChunkReorder(Generic[M]):
    """One track's reorder window over `media.chunk` (see voice_agent.transports.telnyx).

    `push` returns what can go out now, in chunk order, with a `ProtocolWarning` for each
    duplicate, late chunk or gap given up; at most `window` chunks are ever held.
    """

    def __init__(
        self, *, window: int = REORDER_WINDOW, reset_distance: int = CHUNK_RESET_DISTANCE
    ) -> None:
        if window < 1:
            raise ValueError("the reorder window holds at least one chunk")
        self.window = window
        self.reset_distance = reset_distance
        self.expected: int | None = None  # the next chunk to go out
        self._held: dict[int, M] = {}
        self._lost: set[int] = set()  # chunks given up for lost, within reset_distance

    @property
    def held(self) -> int:
        return len(self._held)

    def takes_now(self, chunk: int) -> bool:
        """Whether `chunk` would go straight out (the fast path's test)."""
        return not self._held and (self.expected is None or chunk == self.expected)

    def advance(self, chunk: int) -> None:
        """Record that `chunk`, for which `takes_now` held, went out."""
        self.expected = chunk + 1

    def push(self, media: M) -> list[M | ProtocolWarning]:
        chunk, expected = media.chunk, self.expected
        if expected is None:
            self.expected = chunk + 1
            return [media]
        if chunk < expected:
            if expected - chunk > self.reset_distance:
                restarted = self.flush()
                restarted.append(
                    ProtocolWarning(
                        "chunk_reset",
                        f"media chunk {chunk} of track {media.track[:20]!r} after {expected - 1}:"
                        " numbering restarted",
                    )
                )
                self.expected = chunk + 1
                restarted.append(media)
                return restarted
            if chunk in self._lost:
                self._lost.discard(chunk)
                what = "late_chunk", "arrived after its gap was given up"
            else:
                what = "duplicate_chunk", "already played"
            return [self._dropped(media, *what)]
        if chunk in self._held:
            return [self._dropped(media, "duplicate_chunk", "already held")]
        if chunk == expected:
            self.expected = chunk + 1
            return [media, *self._drain()]
        self._held[chunk] = media
        out: list[M | ProtocolWarning] = []
        while len(self._held) >= self.window:
            first = min(self._held)
            gap_from = self.expected if self.expected is not None else first
            out.append(
                ProtocolWarning(
                    "chunk_gap",
                    f"{first - gap_from} media chunk(s) of track {media.track[:20]!r} missing"
                    f" before {first}: given up after {self.window} later ones",
                )
            )
            self._forget_lost(first)
            self._lost.update(range(max(gap_from, first - self.reset_distance), first))
            self.expected = first
            out.extend(self._drain())
        return out

    def flush(self) -> list[M | ProtocolWarning]:
        """Everything held, in chunk order (gaps skipped): the stream is ending."""
        out: list[M | ProtocolWarning] = [self._held[c] for c in sorted(self._held)]
        if self._held:
            self.expected = max(self._held) + 1
        self._held.clear()
        return out

    def _drain(self) -> list[M | ProtocolWarning]:
        out: list[M | ProtocolWarning] = []
        expected = self.expected
        while expected is not None and expected in self._held:
            out.append(self._held.pop(expected))
            expected += 1
        self.expected = expected
        return out

    def _forget_lost(self, now: int) -> None:
        floor = now - self.reset_distance
        if self._lost:
            self._lost = {c for c in self._lost if c >= floor}

    @staticmethod
    def _dropped(media: M, kind: str, why: str) -> ProtocolWarning:
        return ProtocolWarning(
            kind, f"media chunk {media.chunk} of track {media.track[:20]!r} dropped: {why}"
        )
