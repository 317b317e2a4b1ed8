"""What every caller shares (voice_agent.callers): the WebSocket it dials, the clock it plays the
server's audio on, the marks it echoes once their audio has played, the frames it writes."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask


T = TypeVar("T")

FRAME_MS = 20
MULAW_SILENCE = 0xFF
ALAW_SILENCE = 0xD5
DEFAULT_TIMEOUT_S = 10.0
# Messages go straight to the socket while less than this is waiting to be sent.
_WRITE_AT_ONCE_BELOW = 64 * 1024


_FINAL_TEXT = 0x81
_FINAL_BINARY = 0x82
# Mask keys for the frames a caller sends. RFC 6455 asks a browser for unpredictable keys so
# that script cannot steer the bytes on the wire; this client sends only its own messages, and
# `websockets` drawing four bytes from the OS for every frame was a twentieth of a load
# generator's CPU.
_mask_keys = random.Random()


def client_frame(first_byte: int, payload: bytes) -> bytes:
    """One final, masked frame (RFC 6455 section 5.2), as `websockets` writes it for a client;
    the server's own parser checks every byte of it."""
    size = len(payload)
    if size < 126:
        header = bytes((first_byte, 0x80 | size))
    elif size < 65536:
        header = bytes((first_byte, 0x80 | 126)) + size.to_bytes(2, "big")
    else:
        header = bytes((first_byte, 0x80 | 127)) + size.to_bytes(8, "big")
    mask = _mask_keys.randbytes(4)
    return header + mask + apply_mask(payload, mask)


class Clock(Protocol):
    """Where the client reads the time and waits: real time, or a test's hand-driven time."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self.now()))


class ManualClock:
    """Time that moves only when the test calls `advance`; sleepers wake once it passes them."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        await future

    def advance(self, seconds: float) -> None:
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


@dataclass
class ReceivedAudio:
    """One frame of the server's audio and where it sits on the playback timeline."""

    data: bytes
    received_at: float
    play_start: float
    play_end: float
    cut_at: float | None = None  # a clear stopped it here (at or before play_start: never heard)

    def played_bytes(self, now: float, bytes_per_second: int) -> int:
        end = min(now, self.cut_at) if self.cut_at is not None else now
        if end <= self.play_start:
            return 0
        return min(len(self.data), int((end - self.play_start) * bytes_per_second + 1e-6))


@dataclass(frozen=True)
class EchoedMark:
    name: str
    received_at: float
    echoed_at: float
    cleared: bool  # returned by a clear rather than reached by playback


@dataclass(frozen=True)
class Clear:
    at: float
    dropped_bytes: int
    marks_returned: tuple[str, ...]
    frames_before: int = 0  # how many frames of audio had arrived when it came


@dataclass
class _PendingMark:
    name: str
    received_at: float
    due: float


@dataclass
class _Outgoing:
    buffer: bytearray = field(default_factory=bytearray)
    queued: int = 0  # bytes ever queued
    sent: int = 0  # bytes ever sent
    done: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)


class Caller:
    """What both callers share: the sender, the playback timeline, marks, clears and waits."""

    def __init__(
        self,
        url: str,
        *,
        bytes_per_second: int,
        silence: bytes,
        pace: bool,
        continuous: bool | None,
        clock: Clock | None,
        timeout: float,
    ) -> None:
        self.url = url
        self.clock: Clock = clock or RealClock()
        self.pace = pace
        # A phone line never goes quiet on the wire: paced callers send silence between words.
        self.continuous = pace if continuous is None else continuous
        if self.continuous and not pace:
            raise ValueError("continuous audio needs pace=True (it would be an endless burst)")
        self.timeout = timeout
        self.bytes_per_second = bytes_per_second
        self.frame_bytes = bytes_per_second * FRAME_MS // 1000
        self._silence_frame = silence * (self.frame_bytes // len(silence))
        self.frames: list[ReceivedAudio] = []
        self.marks_echoed: list[EchoedMark] = []
        self.clears: list[Clear] = []
        self.errors: list[str] = []  # what the server sent that its real peer would reject
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.sent_at: list[float] = []  # the clock's time as each of the caller's frames went out
        self._ws: ClientConnection | None = None
        self._pending: deque[_PendingMark] = deque()
        self._play_end = 0.0
        self._unmarked_audio = False  # audio came after the last mark: a sentence streams on
        self._out = _Outgoing()
        self._out_ready = asyncio.Event()
        self._wake_playback = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._send_lock = asyncio.Lock()
        self._stopping = False
        # Headers of the WebSocket handshake (a carrier's signature, say), set before connect().
        self.headers: dict[str, str] = {}

    # -- subclass hooks ------------------------------------------------------------------------

    async def _open(self, ws: ClientConnection) -> None:
        raise NotImplementedError

    def _media(self, chunk: bytes) -> str | bytes:
        raise NotImplementedError

    def _mark_echo(self, name: str) -> str:
        raise NotImplementedError

    def _stop_message(self) -> str:
        raise NotImplementedError

    async def _on_message(self, message: str | bytes, now: float) -> None:
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------------------

    async def connect(self) -> None:
        # No compression: Twilio offers none, and a load generator should not pay for it.
        self._ws = await connect(
            self.url,
            compression=None,
            open_timeout=self.timeout,
            additional_headers=self.headers or None,
        )
        self._play_end = self.clock.now()
        await self._open(self._ws)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._receive_loop()),
            loop.create_task(self._playback_loop()),
            loop.create_task(self._send_loop()),
        ]

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Hang up: send the stop message, close the socket, end the client's tasks."""
        if self._ws is None or self._stopping:
            return
        self._stopping = True
        if not self._closed.is_set():
            try:
                await self._send(self._stop_message())
                await self._ws.close()
            except ConnectionClosed:
                pass
        await self._shutdown()

    async def abort(self) -> None:
        """Drop the connection without a stop message, as a network failure would."""
        if self._ws is None or self._stopping:
            return
        self._stopping = True
        self._ws.transport.abort()
        await self._shutdown()

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._mark_closed()

    def _mark_closed(self) -> None:
        if self._ws is not None and self.close_code is None:
            self.close_code = self._ws.close_code
            self.close_reason = self._ws.close_reason
        self._closed.set()
        for _, future in self._out.done:
            if not future.done():
                future.set_exception(ConnectionError("the call ended before the audio was sent"))
        self._out.done.clear()
        self._notify()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def _send(self, message: str | bytes) -> None:
        ws = self._ws
        assert ws is not None, "connect() first"
        if (
            not self._send_lock.locked()
            and ws.protocol.state is State.OPEN
            and ws.transport.get_write_buffer_size() < _WRITE_AT_ONCE_BELOW
        ):
            # Written at once: send()'s context manager costs more than the message itself
            # when a load generator runs hundreds of callers; a backed-up socket takes the
            # slow path, which waits for it to drain.
            ws.send_data()  # anything the protocol has queued (a pong) goes first
            if isinstance(message, str):
                ws.transport.write(client_frame(_FINAL_TEXT, message.encode()))
            else:
                ws.transport.write(client_frame(_FINAL_BINARY, message))
            return
        async with self._send_lock:
            await ws.send(message)

    # -- the caller's audio --------------------------------------------------------------------

    async def send_audio(self, audio: bytes) -> None:
        """Queue the caller's audio; returns once all of it is on the wire (paced if `pace`).

        It goes out in 20 ms frames; a last partial frame is filled up with silence.
        """
        if self.closed:
            raise ConnectionError(f"the call has ended; {self._summary()}")
        if not audio:
            return
        self._out.buffer += audio
        self._out.queued += len(audio)
        whole = -(-self._out.queued // self.frame_bytes) * self.frame_bytes
        # The padding is part of this audio's last frame, so it counts as this call's.
        pad = whole - self._out.queued
        self._out.buffer += self._silence_frame[:pad]
        self._out.queued = whole
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._out.done.append((whole, future))
        self._out_ready.set()
        await future

    async def send_silence(self, ms: int) -> None:
        await self.send_audio(self._silence_frame * (ms // FRAME_MS))

    async def _send_loop(self) -> None:
        next_at = self.clock.now()
        while True:
            if not self._out.buffer and not self.continuous:
                self._out_ready.clear()
                await self._out_ready.wait()
                next_at = max(next_at, self.clock.now())
            if self.pace:
                await self.clock.sleep_until(next_at)
                next_at += FRAME_MS / 1000
            if self._out.buffer:
                chunk = bytes(self._out.buffer[: self.frame_bytes])
                del self._out.buffer[: self.frame_bytes]
                self._out.sent += len(chunk)
            else:
                chunk = self._silence_frame
            self.sent_at.append(self.clock.now())
            try:
                await self._send(self._media(chunk))
            except ConnectionClosed:
                return
            while self._out.done and self._out.done[0][0] <= self._out.sent:
                _, future = self._out.done.pop(0)
                if not future.done():
                    future.set_result(None)
            if not self.pace:
                await asyncio.sleep(0)  # let the other tasks (and the server) run between frames

    # -- the server's audio, marks and clears --------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._ws is not None
        try:
            async for message in self._ws:
                await self._on_message(message, self.clock.now())
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            self._mark_closed()
            self._wake_playback.set()

    def _play(self, data: bytes, now: float) -> None:
        start = max(now, self._play_end)
        end = start + len(data) / self.bytes_per_second
        self.frames.append(ReceivedAudio(data, now, start, end))
        self._play_end = end
        self._unmarked_audio = True

    def _add_mark(self, name: str, now: float) -> None:
        self._pending.append(_PendingMark(name, now, max(now, self._play_end)))
        self._unmarked_audio = False
        self._wake_playback.set()

    async def _clear(self, now: float) -> None:
        dropped = 0
        for frame in reversed(self.frames):
            if frame.play_end <= now or frame.cut_at is not None:
                break
            frame.cut_at = max(now, frame.play_start)
            dropped += len(frame.data) - frame.played_bytes(now, self.bytes_per_second)
        self._play_end = now
        self._unmarked_audio = False
        returned = list(self._pending)
        self._pending.clear()
        self._wake_playback.set()
        self.clears.append(Clear(now, dropped, tuple(m.name for m in returned), len(self.frames)))
        for mark in returned:
            await self._echo(mark, cleared=True)

    async def _echo(self, mark: _PendingMark, *, cleared: bool) -> None:
        self.marks_echoed.append(EchoedMark(mark.name, mark.received_at, self.clock.now(), cleared))
        self._notify()
        try:
            await self._send(self._mark_echo(mark.name))
        except ConnectionClosed:
            pass

    async def _playback_loop(self) -> None:
        while not self._closed.is_set():
            self._wake_playback.clear()
            if not self._pending:
                await self._wake_playback.wait()
                continue
            head = self._pending[0]
            if self.clock.now() >= head.due:
                self._pending.popleft()
                await self._echo(head, cleared=False)
                continue
            sleeper = asyncio.ensure_future(self.clock.sleep_until(head.due))
            woken = asyncio.ensure_future(self._wake_playback.wait())
            try:
                await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                woken.cancel()

    # -- what the test reads -------------------------------------------------------------------

    @property
    def audio_received(self) -> bytes:
        return b"".join(frame.data for frame in self.frames)

    @property
    def received_ms(self) -> float:
        return sum(len(f.data) for f in self.frames) * 1000 / self.bytes_per_second

    def audio_played(self, now: float | None = None) -> bytes:
        """The server's audio the caller has heard by `now` (default: the clock's now)."""
        at = self.clock.now() if now is None else now
        return b"".join(f.data[: f.played_bytes(at, self.bytes_per_second)] for f in self.frames)

    def played_ms(self, now: float | None = None) -> float:
        return len(self.audio_played(now)) * 1000 / self.bytes_per_second

    @property
    def pending_marks(self) -> list[str]:
        return [mark.name for mark in self._pending]

    @property
    def playback_end(self) -> float:
        """When the audio queued so far will have played (the clock's time)."""
        return self._play_end

    @property
    def sentence_streaming(self) -> bool:
        """The server's latest audio has no mark after it yet: more of that sentence is on its
        way (a server sends a sentence's mark after its last audio)."""
        return self._unmarked_audio

    # -- waiting -------------------------------------------------------------------------------

    def _notify(self) -> None:
        for future in self._waiters:
            if not future.done():
                future.set_result(None)
        self._waiters.clear()

    async def _changed(self) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future

    def _summary(self) -> str:
        marks = [m.name for m in self.marks_echoed]
        closed = f", closed {self.close_code} {self.close_reason!r}" if self.closed else ""
        return (
            f"received {self.received_ms:.0f} ms of audio, echoed marks {marks}, "
            f"pending marks {self.pending_marks}, {len(self.clears)} clears{closed}"
        )

    async def wait_until(self, check: Callable[[], T | None], what: str) -> T:
        """Wait until `check()` returns something other than None (or False) and return it.

        Fails at once if the connection closes first. Every wait gives up after the client's
        `timeout` in wall-clock seconds, whatever its clock: a safety net, not a measurement.
        """
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    result = check()
                    if result is not None and result is not False:
                        return result
                    if self.closed:
                        raise ConnectionError(f"closed while waiting for {what}; {self._summary()}")
                    await self._changed()
        except TimeoutError:
            raise TimeoutError(f"timed out waiting for {what}; {self._summary()}") from None

    async def wait_for_mark(self, name: str) -> EchoedMark:
        """Wait until mark `name` has been echoed (played through, or returned by a clear)."""

        def echoed() -> EchoedMark | None:
            return next((m for m in self.marks_echoed if m.name == name), None)

        return await self.wait_until(echoed, f"mark {name!r}")

    async def wait_audio(self, min_ms: float) -> float:
        """Wait until at least `min_ms` of the server's audio has been received."""

        def enough() -> float | None:
            received = self.received_ms
            return received if received >= min_ms else None

        return await self.wait_until(enough, f"{min_ms} ms of audio")

    async def wait_audio_after(self, clear: Clear) -> ReceivedAudio:
        """Wait until audio arrives that the server sent after `clear` (the agent speaking
        again); returns its first frame. Unlike `received_ms` read after `wait_clear`, this
        holds however soon that audio follows the clear."""

        def after() -> ReceivedAudio | None:
            count = clear.frames_before
            return self.frames[count] if len(self.frames) > count else None

        return await self.wait_until(after, f"audio after the clear at {clear.at:.3f}")

    async def wait_clear(self, count: int = 1) -> Clear:
        """Wait until `count` clears have arrived in all; returns the `count`-th."""

        def arrived() -> Clear | None:
            return self.clears[count - 1] if len(self.clears) >= count else None

        return await self.wait_until(arrived, f"clear #{count}")

    async def wait_silence_after_audio(self, ms: float) -> float:
        """Wait until some audio has been heard and then `ms` of silence followed its playback.

        Silence is measured on the playback clock, as a caller hears it: a server that sends
        audio faster than real time is still speaking until that audio has played. Returns
        the time playback ended.
        """
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    if not self.frames:
                        if self.closed:
                            raise ConnectionError(f"closed before any audio; {self._summary()}")
                        await self._changed()
                        continue
                    end = self._play_end
                    if self.clock.now() >= end + ms / 1000:
                        return end
                    sleeper = asyncio.ensure_future(self.clock.sleep_until(end + ms / 1000))
                    changed = asyncio.ensure_future(self._changed())
                    try:
                        await asyncio.wait({sleeper, changed}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        sleeper.cancel()
                        changed.cancel()
        except TimeoutError:
            raise TimeoutError(
                f"timed out waiting for {ms} ms of silence; {self._summary()}"
            ) from None

    async def wait_closed(self) -> tuple[int | None, str | None]:
        """Wait until the server closes the connection; returns its close code and reason."""
        async with asyncio.timeout(self.timeout):
            await self._closed.wait()
        return self.close_code, self.close_reason
