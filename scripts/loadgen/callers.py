"""One simulated call: the Twilio and native protocol clients it uses (which also note when each
mark arrived), `SimulatedCall`, which connects, plays its `Plan` against the agent in real time
and measures every turn, barge-in and backchannel, and `CallResult`/`Turn`, what it hands back.
`audio_gaps` finds the late frames a caller would have heard as gaps. The level and run a call
belongs to are passed in; their classes are imported for type checking only."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from voice_agent.callers import NativeClient, ReceivedAudio, TwilioClient

from .conversations import Line, Plan

if TYPE_CHECKING:
    from .levels import Level
    from .run import Run

T = TypeVar("T")

LATE_FRAME_S = 0.040
TRY_AGAIN_LATER = 1013  # the server's admission control refusing a call


@dataclass
class Turn:
    kind: str  # "line", or "barge_in" when the line interrupted the agent
    line: str
    t: float  # seconds into the level when the caller's speech ended
    live: int  # calls connected then
    latency_ms: float | None = None  # caller speech end -> first agent audio received
    clear_ms: float | None = None  # barge-in: caller speech start -> clear received
    talk_over_ms: float | None = None  # barge-in: agent audio played after the clear while
    # the caller was still speaking


@dataclass
class CallResult:
    number: int
    kind: str
    call_id: str | None = None
    outcome: str = "failed"  # completed, ended_by_agent, hung_up_at_end, refused, dropped, failed
    error: str | None = None
    close_code: int | None = None
    greeting_ms: float | None = None  # connected -> first audio of the greeting
    turns: list[Turn] = field(default_factory=list)
    dtmf_ms: list[float] = field(default_factory=list)
    unanswered: int = 0
    barge_ins_skipped: int = 0  # the reply was over before the planned barge-in point
    missed_clears: int = 0  # barged in, no clear came
    backchannels: int = 0
    backchannel_clears: int = 0  # ... that made the server clear the agent's audio
    backchannel_resumed: int = 0  # ... after which the agent went on
    reprompts: int = 0  # the agent's no-input prompt after a long silence
    coughs: int = 0
    cough_replies: int = 0  # the agent said something after a cough
    frames: int = 0
    late_frames: int = 0
    late_gaps: list[tuple[float, float]] = field(default_factory=list)  # (level time, ms)
    send_lateness_p99_ms: float | None = None  # how far this script's frames fell behind
    send_lateness_max_ms: float | None = None
    protocol_errors: list[str] = field(default_factory=list)
    server_turns: list[dict[str, Any]] = field(default_factory=list)
    server_barge_ins_ms: list[float] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    server_false_interruptions: int = 0


class LevelOver(Exception):
    """The level's duration is over: the caller hangs up where it is."""


class NoGreeting(Exception):
    pass


def audio_gaps(
    frames: list[ReceivedAudio], cuts: list[float], threshold: float = LATE_FRAME_S
) -> list[tuple[float, float]]:
    """Playback gaps over `threshold` inside utterances: (when the late frame came, seconds).

    A frame is late when it arrives after the audio before it finished playing: the caller's
    playout ran dry. Whether the server sends in real time (each frame due as the last one
    ends) or in bursts, that is the gap a caller hears. `cuts` (a caller action or a clear
    between two frames) start a new utterance: the silence before a reply is no gap.
    """
    gaps = []
    cut_index = 0
    for previous, frame in itertools.pairwise(frames):
        while cut_index < len(cuts) and cuts[cut_index] <= previous.received_at:
            cut_index += 1
        if cut_index < len(cuts) and cuts[cut_index] <= frame.received_at:
            continue
        if previous.cut_at is not None:
            continue
        gap = frame.received_at - previous.play_end
        if gap > threshold:
            gaps.append((frame.received_at, gap))
    return gaps


def new_client(run: Run, number: int) -> TwilioClient | NativeClient:
    # Safety net only: every wait of the callers has its own, shorter bound.
    timeout = 60.0
    if run.args.transport == "twilio":
        sid = f"{run.run_id}{number:010d}"
        params = {"agent": run.args.agent} if run.args.agent else {}
        return TwilioClient(
            run.ws_url("/twilio"),
            call_sid=f"CA{sid}",
            stream_sid=f"MZ{sid}",
            custom_parameters=params,
            timeout=timeout,
        )
    return NativeClient(run.ws_url("/ws"), agent=run.args.agent, timeout=timeout)


class SimulatedCall:
    def __init__(self, level: Level, plan: Plan, number: int, stopped: asyncio.Event) -> None:
        self.level = level
        self.stopped = stopped  # set when this caller's line of calls ends: it hangs up
        self.run_ctx = level.run
        self.args = level.run.args
        self.plan = plan
        self.rng = random.Random(self.args.seed * 7919 + number)
        self.result = CallResult(number, plan.kind)
        self.boundaries: list[float] = []  # caller actions: each starts a new agent utterance
        self._scan = 0  # frames before this index are older than any reply still awaited
        self._reply_frame: ReceivedAudio | None = None  # first frame of the latest reply
        self.client = new_client(level.run, number)

    def now(self) -> float:
        return self.client.clock.now()

    # -- waiting, bounded by the level's end -------------------------------------------------

    async def _stoppable(self, awaitable: Awaitable[T]) -> T:
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise LevelOver
        return task.result()

    def _check_stop(self) -> None:
        if self.stopped.is_set():
            raise LevelOver

    async def _sleep(self, seconds: float) -> None:
        await self._stoppable(asyncio.sleep(max(0.0, seconds)))

    async def _quiet(self, ms: float) -> None:
        """Until the agent's audio has played and `ms` of silence followed."""
        await self._stoppable(self.client.wait_silence_after_audio(ms))

    async def _reply(
        self, after: float, within: float | None = None, *, stoppable: bool = True
    ) -> ReceivedAudio | None:
        """The first frame of agent audio received after `after`; None if none comes in time.

        Not `stoppable`: a turn already spoken is measured even if the level ends meanwhile.
        """
        frames = self.client.frames

        def found() -> ReceivedAudio | None:
            while self._scan < len(frames) and frames[self._scan].received_at <= after:
                self._scan += 1
            return frames[self._scan] if self._scan < len(frames) else None

        try:
            async with asyncio.timeout(within or self.args.reply_timeout):
                waiting = self.client.wait_until(found, "the agent's reply")
                return await (self._stoppable(waiting) if stoppable else waiting)
        except TimeoutError:
            return None

    def _think_ms(self) -> float:
        return self.rng.uniform(400, 1200)

    # -- the call --------------------------------------------------------------------------

    async def run(self) -> CallResult:
        result = self.result
        client = self.client
        connected = False
        try:
            try:
                await client.connect()
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                result.outcome = "refused" if code == TRY_AGAIN_LATER else "failed"
                result.close_code = code
                result.error = f"connect: {exc}"
                return result
            except (OSError, TimeoutError, InvalidHandshake, ConnectionError) as exc:
                result.error = f"connect: {type(exc).__name__}: {exc}"
                return result
            connected = True
            self.level.live += 1
            result.call_id = client.call_sid if isinstance(client, TwilioClient) else client.call_id
            await self._greeting()
            for index, step in enumerate(self.plan.steps):
                await self._step(index, step)
            await self._end_of_script()
            result.outcome = "completed"
        except LevelOver:
            result.outcome = "hung_up_at_end"
        except NoGreeting as exc:
            result.outcome = self._closed_outcome() if client.closed else "failed"
            result.error = str(exc)
        except (ConnectionError, ConnectionClosed) as exc:
            result.outcome = self._closed_outcome()
            if result.outcome != "ended_by_agent":
                result.error = f"{type(exc).__name__}: {exc}"[:300]
        except Exception as exc:
            result.outcome = "failed"
            result.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if connected:
                self.level.live -= 1
                with contextlib.suppress(Exception):
                    await client.stop()
                result.close_code = client.close_code
                self._analyse()
        if result.call_id is not None:
            await self._fetch_server_record()
        return result

    def _closed_outcome(self) -> str:
        code = self.client.close_code
        if code == TRY_AGAIN_LATER:
            return "refused"
        if code == 1000:  # the agent ended the call (its goodbye), before the script did
            return "ended_by_agent"
        return "dropped"

    async def _greeting(self) -> None:
        connected_at = self.now()
        frame = await self._reply(connected_at, max(self.args.reply_timeout, 10.0))
        if frame is None:
            raise NoGreeting("no greeting from the agent")
        self.result.greeting_ms = (frame.received_at - connected_at) * 1000
        self._reply_frame = frame

    async def _step(self, index: int, step: str) -> None:
        if step.startswith("/dtmf"):
            await self._quiet(self._think_ms())
            self._check_stop()
            self.boundaries.append(self.now())
            sent = self.now()
            await self.client.send_dtmf(step.split()[1])
            frame = await self._reply(sent)
            if frame is None:
                self.result.unanswered += 1
            else:
                self.result.dtmf_ms.append((frame.received_at - sent) * 1000)
                self._reply_frame = frame
            return
        line = self.run_ctx.lines[step]
        if index == self.plan.backchannel_at:
            await self._backchannel()
        barge = False
        if index == self.plan.barge_in_at:
            barge = await self._mid_reply()
            if not barge:
                self.result.barge_ins_skipped += 1
        if not barge:
            if index == self.plan.long_silence_at:
                await self._long_silence()
            elif index in self.plan.pauses:
                await self._pause(cough=index in self.plan.coughs)
            else:
                await self._quiet(self._think_ms())
        self._check_stop()
        await self._say(line, barge=barge)

    async def _say(self, line: Line, *, barge: bool) -> None:
        client = self.client
        started = self.now()
        self.boundaries.append(started)
        clears_before = len(client.clears)
        await client.send_audio(line.audio)
        # send_audio returns as the last frame goes out: in real time, the line's last sample.
        finished = self.now()
        # What the agent sent while the caller spoke is one utterance, the answer another.
        self.boundaries.append(finished)
        speech_end = finished - line.trail_s
        speech_start = started + line.lead_s
        turn = Turn(
            "barge_in" if barge else "line",
            line.name,
            self.level.elapsed(),
            self.level.live,
        )
        after = speech_end
        if barge:
            clear = None
            if len(client.clears) > clears_before:
                clear = client.clears[clears_before]
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.args.reply_timeout):
                        clear = await client.wait_clear(clears_before + 1)
            if clear is None:
                self.result.missed_clears += 1
            else:
                turn.clear_ms = (clear.at - speech_start) * 1000
                # Audio sent before the clear is the interrupted reply, not the answer.
                after = max(after, clear.at)
                # Agent audio played after the clear while the caller still spoke: the server
                # resumed the interrupted reply over the caller.
                turn.talk_over_ms = 1000 * sum(
                    max(0.0, min(f.play_end, f.cut_at or f.play_end, finished) - f.play_start)
                    for f in client.frames
                    if f.received_at > clear.at and f.play_start < finished
                )
        frame = await self._reply(after, stoppable=False)
        self.result.turns.append(turn)
        if frame is None:
            self.result.unanswered += 1
            return
        turn.latency_ms = (frame.received_at - speech_end) * 1000
        self.level.live_latencies.append(turn.latency_ms)
        self._reply_frame = frame

    async def _mid_reply(self) -> bool:
        """Wait until some way into the agent's current reply; False if it is already over."""
        frame = self._reply_frame
        if frame is None:
            return False
        await self._sleep(frame.play_start + self.rng.uniform(0.6, 1.5) - self.now())
        left = self.client.playback_end - self.now()
        # A reply that streams as it is synthesised is only a little ahead of the caller.
        return left >= 0.4 or (left > 0 and self.client.sentence_streaming)

    async def _backchannel(self) -> None:
        if not await self._mid_reply():
            return
        client = self.client
        line = self.run_ctx.lines[self.rng.choice(self.run_ctx.backchannels)]
        self.boundaries.append(self.now())
        clears_before = len(client.clears)
        await client.send_audio(line.audio)
        self.boundaries.append(self.now())
        self.result.backchannels += 1
        # The server may stop the agent and resume once STT says it was a backchannel; wait
        # long enough to see both before the next line.
        await self._quiet(2000)
        if len(client.clears) > clears_before:
            self.result.backchannel_clears += 1
            cleared_at = client.clears[clears_before].at
            if any(f.received_at > cleared_at for f in client.frames[-50:]):
                self.result.backchannel_resumed += 1
            # A new utterance starts after the clear; no gap is counted across it.
            self.boundaries.append(cleared_at)

    async def _long_silence(self) -> None:
        await self._quiet(self._think_ms())
        self._check_stop()
        began = self.now()
        self.boundaries.append(began)
        frame = await self._reply(began, self.run_ctx.no_input_s + 5.0)
        if frame is not None:
            self.result.reprompts += 1
            self._reply_frame = frame
            await self._quiet(self._think_ms())

    async def _pause(self, *, cough: bool) -> None:
        pause_s = self.rng.uniform(2.0, 5.0)
        if not cough:
            await self._quiet(pause_s * 1000)
            return
        await self._quiet(pause_s * 500)
        self._check_stop()
        coughed = self.now()
        self.boundaries.append(coughed)
        await self.client.send_audio(self.run_ctx.lines["cough"].audio)
        self.result.coughs += 1
        await self._sleep(pause_s / 2)
        await self._quiet(300)
        if self.client.frames and self.client.frames[-1].received_at > coughed:
            self.result.cough_replies += 1

    async def _end_of_script(self) -> None:
        """After the last line the agent says goodbye and hangs up; wait for it a while."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20.0):
                await self._stoppable(self.client.wait_closed())

    # -- after the call ----------------------------------------------------------------------

    def _analyse(self) -> None:
        client, result = self.client, self.result
        frames = client.frames
        result.frames = len(frames)
        cuts = sorted([*self.boundaries, *(clear.at for clear in client.clears)])
        gaps = audio_gaps(frames, cuts)
        result.late_frames = len(gaps)
        result.late_gaps = [
            (round(at - self.level.t0, 2), round(gap * 1000, 1)) for at, gap in gaps
        ]
        result.protocol_errors = list(client.errors[:5])
        sent = np.asarray(client.sent_at)
        if len(sent) > 1:
            # Frames are due every 20 ms from the first: how late this script sent them.
            lateness = (sent - (sent[0] + np.arange(len(sent)) * 0.02)) * 1000
            result.send_lateness_p99_ms = round(float(np.percentile(lateness, 99)), 1)
            result.send_lateness_max_ms = round(float(lateness.max()), 1)

    async def _fetch_server_record(self) -> None:
        record: dict[str, Any] | None = None
        for _ in range(15):
            try:
                response = await self.run_ctx.http.get(f"/calls/{self.result.call_id}")
            except httpx.HTTPError:
                return
            if response.status_code != 200:
                return
            record = response.json()
            if record.get("ended_at"):
                break
            await asyncio.sleep(0.2)
        if record is None:
            return
        self.result.server_turns = list(record.get("turns") or [])
        for event in record.get("audit") or []:
            kind = event.get("type")
            if kind == "barge_in" and event.get("latency_ms") is not None:
                self.result.server_barge_ins_ms.append(float(event["latency_ms"]))
            elif kind == "error":
                self.result.server_errors.append(
                    f"{event.get('where')}: {event.get('message')}"[:200]
                )
            elif kind == "false_interruption":
                self.result.server_false_interruptions += 1
