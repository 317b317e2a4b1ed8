"""The voice server: one asyncio process, HTTP and WebSocket on one port (the `websockets` server).

HTTP: /healthz, /metrics, /calls, /calls/{id}, /agents, the browser call page (/ and /static/)
and the XML Plivo fetches for a transfer (/plivo/dial), answered by server/http_routes.py once
access and call admission (here) have let the request through.
WebSocket: /twilio (Twilio Media Streams), /ws (native), /rtc (WebRTC signalling), /asterisk
(Asterisk chan_websocket) and the carriers' streams /telnyx, /plivo, /vonage, /exotel and
/jambonz (gateways/carriers.py). SIP and AudioSocket have listeners of their own (gateways/sip.py,
gateways/audiosocket.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import os
import signal
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from voice_agent.agents.registry import AgentRegistry
from voice_agent.audio.codec import CarrierFormat
from voice_agent.callcontrol.apis import call_control_apis
from voice_agent.callcontrol.carrier_dialer import CarrierDialer, decision
from voice_agent.callcontrol.placed_calls import PlacedCall, Via
from voice_agent.config import split_host_port
from voice_agent.errors import VoiceAgentError
from voice_agent.gateways import carriers
from voice_agent.gateways.asterisk_ws import asterisk_endpoint
from voice_agent.gateways.audiosocket import AudioSocketServer
from voice_agent.gateways.carrier_call import stream_endpoint
from voice_agent.gateways.media_socket import MediaConnection
from voice_agent.gateways.sip import SipGateway
from voice_agent.gateways.webrtc import RtcGateway
from voice_agent.observability import (
    LoopLagMonitor,
    ServerMetrics,
    add_log_secrets,
    set_call_id,
)
from voice_agent.observability.worker_metrics import SharedMetrics
from voice_agent.pipeline.calls import CallRecord, MemoryCallStore, now_iso
from voice_agent.pipeline.driver import CallControl, CallPipeline, Engines, Outbound
from voice_agent.pipeline.recording import (
    FORMATS,
    CallRecorder,
    prune_recordings,
    recording_format,
    recordings_dir,
)
from voice_agent.runtime.agent import CompiledAgent
from voice_agent.runtime.audit import AuditEvent
from voice_agent.runtime.session import CallSession
from voice_agent.server import drain
from voice_agent.server.admission import (
    RETRY_AFTER_S,
    Admission,
    CpuSampler,
    RefusalReport,
)
from voice_agent.server.agent_check import AgentCheck, Load, WorkerReport, weight_percent
from voice_agent.server.auth import (
    client_address,
    is_trusted_proxy,
)
from voice_agent.server.control_api import CallRequest, ControlApi, NoWayOut, RateLimit
from voice_agent.server.engine_set import EngineSet
from voice_agent.server.from_config import (
    access_policy,
    api_tokens,
    data_dir_of,
    open_durable_store,
    placers,
)
from voice_agent.server.http_routes import answer_http, json_response
from voice_agent.server.paths import CALL_PATHS  # admission applies; messages held for the endpoint
from voice_agent.server.workers import SUPERVISOR_PID_ENV
from voice_agent.store import CallStore as DurableStore
from voice_agent.store import outcome_for
from voice_agent.transports import asterisk_ws
from voice_agent.transports.errors import TRY_AGAIN_LATER, close_reason

log = logging.getLogger("voice_agent.server")


# The largest WebSocket message any endpoint takes: `websockets`' limit, and the media
# sockets' own once they read the call's frames themselves.
WEBSOCKET_MAX_SIZE = max(asterisk_ws.WEBSOCKET_MAX_SIZE, carriers.WEBSOCKET_MAX_SIZE)


def _select_subprotocol(connection: ServerConnection, offered: Sequence[Subprotocol]) -> Any:
    path = connection.request.path.split("?", 1)[0] if connection.request else ""
    return carriers.select_subprotocol(path, list(offered))


def _log_errors(call_id: str) -> Callable[[AuditEvent], None]:
    """Errors a call lives through (an engine request failing, a function raising) go to the
    log as well as the call's audit: the log is where an operator looks first."""

    def listener(event: AuditEvent) -> None:
        where = event.data.get("where")
        # The pipeline's own failures are logged with their traceback where they happen.
        if event.type == "error" and where != "pipeline":
            log.warning("call %s: %s error: %s", call_id, where, event.data.get("message", ""))

    return listener


class VoiceServer:
    def __init__(
        self,
        registry: AgentRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        store: DurableStore | None = None,
        reuse_port: bool = False,
        worker_id: int = 0,
        sip_listen: str | list[str] | None = None,
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.reuse_port = reuse_port
        self.worker_id = worker_id
        # Live calls' records, for this worker; every call's record also goes to the durable
        # store, which answers /calls and /calls/{id} for all workers and across restarts.
        self.live = MemoryCallStore(keep_ended=0)
        self.store: DurableStore = store if store is not None else open_durable_store(registry)
        self.pipelines: dict[str, CallPipeline] = {}
        self.engine_set = EngineSet(registry)
        self._server: Server | None = None
        self._closing = False
        settings = registry.loaded.config.webrtc
        self.rtc = RtcGateway(self.start_call, settings)
        sip_settings = registry.loaded.config.sip
        listen = sip_listen or sip_settings.listen
        self.sip = (
            SipGateway(
                sip_settings,
                listen=listen,
                start_call=self.start_call,
                admit=self.refuse_call,
                agents=registry.agents,
                secrets=registry.secrets,
                on_refused=lambda refused: self.metrics.sip_request_refused(refused.status),
                on_connection_closed=lambda reason: self.metrics.sip_connection_closed(reason),
                on_media_report=lambda report: self.metrics.sip_media_report(report),
                on_registration=lambda change: self.metrics.sip_registration(
                    change.name, change.state
                ),
                on_trunk=lambda reachable: self.metrics.sip_trunk_reachable.set(int(reachable)),
                max_failed_auth_per_minute=registry.loaded.config.server.max_failed_auth_per_minute,
            )
            if listen
            else None
        )
        audiosocket = registry.loaded.config.audiosocket
        self.audiosocket = (
            AudioSocketServer(
                audiosocket.listen,
                start_call=self.start_call,
                admit=self.refuse_call,
                routes={key: (r.agent, r.args) for key, r in audiosocket.routes.items()},
                reuse_port=reuse_port,
            )
            if audiosocket.listen
            else None
        )
        server_settings = registry.loaded.config.server
        self.admission = Admission(
            max_calls=server_settings.max_calls,
            max_loop_lag_ms=server_settings.max_loop_lag_ms,
            max_cpu_percent=server_settings.max_cpu_percent,
        )
        self.cpu = CpuSampler()
        self._refusal_report = RefusalReport()
        self.loop_lag_ms = 0.0  # kept current by the loop-lag monitor
        self.refused_calls = 0
        # Connections in a call endpoint: calls still being set up count against max_calls too.
        self._call_connections = 0
        self._refusals: weakref.WeakKeyDictionary[ServerConnection, str] = (
            weakref.WeakKeyDictionary()
        )
        self.access = access_policy(registry)
        self.carrier_apis = call_control_apis(registry)  # the carrier streams' call control
        carriers = registry.loaded.config.carriers
        self.dialer = CarrierDialer(
            placers(registry, self.carrier_apis),
            public_url=server_settings.public_url,
            control_public_url=server_settings.control_public_url,
            ring_timeout_s=carriers.ring_timeout_s,
            record_unanswered=self._placed_unanswered,
            pipeline_of=self.pipelines.get,
        )
        self.access.placed_call_token = self.dialer.calls.valid_token
        trunk = self.sip.trunk if self.sip is not None else None
        carrier_rate = RateLimit(carriers.calls_per_minute)  # one budget for every carrier
        rates = {via: carrier_rate for via in self.dialer.vias}
        if trunk is not None:
            rates["sip"] = RateLimit(trunk.calls_per_minute)
        self.control = (
            ControlApi(
                tokens=api_tokens(registry),
                place=self.place_call,
                rate_limits=rates,
                default_via=self._default_via,
                on_callback=self.dialer.callback,
                drain=self._drain_from_api,
                # A draining or full worker places no call (503).
                busy=lambda: self.refuse_call("POST /calls"),
            )
            if server_settings.control_listen
            else None
        )
        self.drain_state = drain.Drain(server_settings.drain_deadline_s)
        self.drained = asyncio.Event()  # set once a drain has ended the last call
        self._calls_changed = asyncio.Event()
        self._drainer: asyncio.Task[None] | None = None
        self.data_dir = data_dir_of(registry)
        check_listen = server_settings.agent_check_listen
        # With --workers, worker 0 answers the agent port for the host and every worker
        # writes its load beside its metrics (server/agent_check.py).
        self.agent_check = (
            AgentCheck(
                self._load_report,
                listen=split_host_port(check_listen) if worker_id == 0 or not reuse_port else None,
                shared_dir=self.data_dir / "metrics" / f"port-{port}" if reuse_port else None,
            )
            if check_listen
            else None
        )
        self.recording = registry.loaded.config.server.recording
        self._pruner: asyncio.Task[None] | None = None
        self.metrics = ServerMetrics(worker=worker_id)
        # Workers sharing the port answer /metrics for one another (observability.worker_metrics).
        self.shared_metrics = (
            SharedMetrics(self.metrics, self.data_dir / "metrics" / f"port-{port}", worker_id)
            if reuse_port
            else None
        )
        self.lag = LoopLagMonitor(self._on_loop_lag)
        self._lags: deque[float] = deque(maxlen=3)
        add_log_secrets(registry.secrets)

    def _on_loop_lag(self, lag_s: float) -> None:
        # Admission looks at the median of the last three samples (1.5 s): one stall (a first
        # call's imports, a GC pause) must not refuse calls, a loop that stays late must.
        self._lags.append(lag_s)
        self.loop_lag_ms = sorted(self._lags)[len(self._lags) // 2] * 1000
        self.metrics.loop_lag(lag_s)

    @property
    def loop_lag_max_ms(self) -> float:
        """The worst of the samples whose median admission reads: a stall the median hides."""
        return max(self._lags, default=0.0) * 1000

    def engines(self, agent: CompiledAgent) -> Engines:
        """The agent's engines (built once; agents with the same settings share them)."""
        return self.engine_set.engines(agent)

    # ---- calls ---------------------------------------------------------------------------

    async def start_call(
        self,
        *,
        transport: str,
        agent: str | None,
        args: dict[str, Any],
        call_id: str | None,
        carrier: CarrierFormat,
        out: Outbound,
        placed: bool = False,
        control: CallControl | None = None,
    ) -> CallPipeline:
        args = dict(args)
        try:
            dialled = self.dialer.claim(args)
        except LookupError as exc:
            raise VoiceAgentError(str(exc)) from None
        if dialled is not None:
            # The stream of a call placed through a carrier: the request's agent and args,
            # under the id POST /calls gave, whatever else the stream says.
            agent, call_id, placed = dialled.agent, dialled.call_id, True
            args = {**dialled.args, "callee": dialled.to}
        if call_id is not None and call_id in self.pipelines:
            # Live calls are keyed by call id: a second live call under a carrier's id (a call
            # streamed twice, a stream back before its old socket is seen gone) gets its own,
            # or the first one's end would take the second out of the server's books.
            log.warning("call id %s is already live: the new call gets an id of its own", call_id)
            call_id = None
        try:
            session = CallSession(
                self.registry, agent=agent, args=args, call_id=call_id, auto_commit=False
            )
        except Exception as exc:
            if dialled is not None:  # its stream came and cannot start: the record says so
                self.dialer.ended(dialled.call_id)
                self._placed_unanswered(dialled, f"call failed: the call could not start: {exc}")
            raise
        set_call_id(session.call_id)  # this task's log lines, and its children's, name the call
        record = CallRecord(session, transport)
        voice = session.agent.config.voice(self.registry.loaded.config.voice)
        recorder = (
            CallRecorder.for_call(self.data_dir, session.call_id, carrier.sample_rate)
            if self.recording
            else None
        )
        pipeline = CallPipeline(
            session,
            record,
            self.engines(session.agent),
            voice,
            carrier,
            out,
            on_end=self._call_ended,
            recorder=recorder,
            placed=placed,
            control=control,
        )
        if dialled is not None:
            for verdict in dialled.verdicts:  # the carrier's, before the stream came
                pipeline.machine_answer(decision(verdict))
        self.live.add(record)
        self._record_durably(session, record)
        session.audit.subscribe(
            self.metrics.audit_listener(
                {
                    "stt": voice.stt.provider,
                    "tts": voice.tts.provider,
                    "llm": session.agent.config.llm.provider,
                }
            )
        )
        session.audit.subscribe(_log_errors(session.call_id))
        self.metrics.call_started(transport)
        self.pipelines[session.call_id] = pipeline
        log.info(
            "call %s started on %s with agent %s", session.call_id, transport, session.agent.name
        )
        return pipeline

    def _default_via(self) -> str | None:
        """Where POST /calls without `via` goes: the trunk, else the only carrier configured."""
        if self.sip is not None and self.sip.trunk is not None:
            return "sip"
        vias = self.dialer.vias
        return vias[0] if len(vias) == 1 else None

    async def place_call(self, request: CallRequest) -> str:
        """POST /calls: dial through the SIP trunk or a carrier; the call's id, at once
        (LookupError for an agent that does not exist, NoWayOut for a way out not set up)."""
        agent = request.agent or self.registry.loaded.config.default_agent
        if agent not in self.registry.agents:
            raise LookupError(f"no agent named {agent!r}")
        via = request.via or "sip"
        call_id = uuid.uuid4().hex
        if via != "sip":
            why_not = self.dialer.unavailable(via)
            if why_not is not None:
                raise NoWayOut(why_not)
            amd = self.registry.agents[agent].config.answering_machine
            carriers = self.registry.loaded.config.carriers
            self.dialer.place(
                call_id,
                agent,
                request.to,
                request.args,
                cast(Via, via),
                amd=amd and carriers.carrier_amd,
            )
            log.info(
                "call %s: dialling %s through %s for agent %s", call_id, request.to, via, agent
            )
            return call_id
        if self.sip is None or self.sip.trunk is None:
            raise NoWayOut("no sip.trunk is configured: there is nowhere to place SIP calls")
        task = self.sip.place_call(
            call_id=call_id, agent=agent, target=request.to, args=request.args
        )
        log.info("call %s: dialling %s for agent %s", call_id, request.to, agent)

        def done(finished: asyncio.Task[tuple[str, bool]]) -> None:
            if finished.cancelled() or finished.exception() is not None:
                reason, answered = "call failed: the server stopped dialling", False
            else:
                reason, answered = finished.result()
            if not answered:
                self._record_unanswered(call_id, agent, request.to, request.args, reason, "sip")

        task.add_done_callback(done)
        return call_id

    def _record_unanswered(
        self,
        call_id: str,
        agent: str,
        to: str,
        args: dict[str, Any],
        reason: str,
        transport: str,
    ) -> None:
        """A placed call that never reached the agent: a record with how it ended."""
        now = now_iso()
        state = {**args, "callee": to}
        self.store.call_started(
            call_id, agent=agent, transport=transport, started_at=now, state=state
        )
        self.store.audit(call_id, {"type": "dial", "t": 0.0, "to": to, "result": reason})
        outcome = outcome_for(reason)
        self.store.call_ended(call_id, ended_at=now_iso(), outcome=outcome, reason=reason)
        self.metrics.call_ended(transport, outcome)
        log.info("call %s to %s: %s", call_id, to, reason)

    def _placed_unanswered(self, call: PlacedCall, reason: str) -> None:
        self._record_unanswered(call.call_id, call.agent, call.to, call.args, reason, call.via)

    def _call_ended(self, pipeline: CallPipeline, reason: str) -> None:
        call_id = pipeline.session.call_id
        self.pipelines.pop(call_id, None)
        self.dialer.ended(call_id)
        self._calls_changed.set()
        self.live.ended(call_id, reason)
        self.metrics.call_ended(pipeline.record.transport, outcome_for(reason))
        self.store.call_ended(
            call_id, ended_at=now_iso(), outcome=outcome_for(reason), reason=reason
        )
        log.info("call %s ended: %s", call_id, reason)

    def _record_durably(self, session: CallSession, record: CallRecord) -> None:
        """Feed the durable store from the call's audit log; it batches, nothing here waits."""
        store, call_id = self.store, session.call_id
        store.call_started(
            call_id,
            agent=session.agent.name,
            transport=record.transport,
            started_at=record.started_at,
            state=session.public_state(),
        )

        def on_audit(event: AuditEvent) -> None:
            store.audit(call_id, event.as_dict())
            if event.type in ("state_change", "transition", "call_ended"):
                store.state(call_id, session.public_state())
            if event.type in ("user_utterance", "agent_utterance", "transition", "call_ended"):
                store.context(call_id, session.context_view()["messages"])
            if event.type == "turn_metrics":
                store.turn(call_id, dict(event.data))

        session.audit.subscribe(on_audit)

    # ---- HTTP and WebSocket --------------------------------------------------------------

    async def _prune_recordings(self, days: float) -> None:
        """Recordings follow the call records' retention (the store prunes those itself)."""
        while True:
            try:
                await asyncio.to_thread(prune_recordings, recordings_dir(self.data_dir), days)
            except OSError as exc:
                log.warning("pruning recordings failed: %s", exc)
            await asyncio.sleep(3600)

    def refuse_call(self, where: str) -> str | None:
        """Admission for a call arriving on `where`: why it is refused, or None to take it."""
        if self._closing:
            return "the server is shutting down"
        if self.drain_state.draining:
            self.refused_calls += 1
            self.metrics.admission_refused("draining")
            return drain.REFUSAL
        refusal = self.admission.decide(
            live_calls=max(self.live.live_count(), self._call_connections),
            loop_lag_ms=self.loop_lag_ms,
            cpu_percent=self.cpu.sample(),
        )
        if refusal is None:
            return None
        self.refused_calls += 1
        self.metrics.admission_refused(refusal.reason)
        line = self._refusal_report.refused(
            f"call refused on {where}: {refusal.message}", time.monotonic()
        )
        if line is not None:
            log.warning("%s", line)
        return refusal.message

    async def process_request(
        self, connection: ServerConnection, request: Request
    ) -> Response | None:
        if not request.path.isascii():
            # websockets hands raw bytes on as surrogates; nothing below could encode them.
            return json_response(
                http.HTTPStatus.BAD_REQUEST, {"error": "the request target must be ASCII"}
            )
        path = request.path.split("?", 1)[0]
        peer = connection.remote_address[0] if connection.remote_address else None
        trusted = self.registry.loaded.config.server.trusted_proxies
        decision = self.access.check(
            request.path, request.headers, client_address(peer, request.headers, trusted)
        )
        if not decision.allowed:
            log.warning("refused %s from %s: %d %s", path, peer, decision.status, decision.reason)
            return decision.response()
        if path in CALL_PATHS:
            if self._closing:
                response = connection.respond(
                    http.HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n"
                )
                response.headers["Retry-After"] = str(RETRY_AFTER_S)
                return response
            refused = self.refuse_call(path)
            if refused is not None and is_trusted_proxy(peer, trusted):
                # A balancer can still send a call it has not connected to another host
                # (HAProxy's `retry-on 503`, deploy/haproxy.cfg), but not one whose WebSocket
                # is open: so it gets the refusal as an HTTP answer. This closes the seconds
                # between a drain's start and the balancer's next check, when it still picks
                # this host.
                response = connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, f"{refused}\n")
                response.headers["Retry-After"] = str(RETRY_AFTER_S)
                return response
            if refused is not None:
                # The handshake completes so the caller gets a WebSocket close code it knows.
                self._refusals[connection] = refused
            elif path != "/rtc" and isinstance(connection, MediaConnection):
                connection.hold_messages(WEBSOCKET_MAX_SIZE)
            return None  # the WebSocket handshake goes on
        return await answer_http(self, path, request)

    async def _handler(self, ws: ServerConnection) -> None:
        refused = self._refusals.pop(ws, None)
        if refused is not None:
            await ws.close(TRY_AGAIN_LATER, close_reason(refused))
            return
        path = ws.request.path.split("?", 1)[0] if ws.request else ""
        self._call_connections += 1
        try:
            if path == "/rtc":
                await self.rtc.endpoint(ws)
            elif path == "/asterisk":
                await asterisk_endpoint(cast(MediaConnection, ws), self.start_call)
            else:  # /twilio, the carriers' streams, and /ws for anything else
                await stream_endpoint(
                    cast(MediaConnection, ws), self.start_call, path, self.carrier_apis
                )
        finally:
            self._call_connections -= 1
            self._calls_changed.set()

    async def start(self) -> None:
        await self.engine_set.start()
        await self.store.start()
        if self.recording:
            # The first PyAV import takes ~0.2 s: pay it now, not on a call.
            log.info(
                "recording calls as %s in %s",
                FORMATS[recording_format()].description,
                recordings_dir(self.data_dir),
            )
        self.lag.start()
        retention = self.registry.loaded.config.server.retention_days
        if self.recording and retention is not None:
            self._pruner = asyncio.ensure_future(self._prune_recordings(retention))
        self._server = await serve(
            self._handler,
            self.host,
            self.port,
            process_request=self.process_request,
            max_size=WEBSOCKET_MAX_SIZE,
            select_subprotocol=_select_subprotocol,
            compression=None,
            create_connection=MediaConnection,
            reuse_port=self.reuse_port or None,
        )
        sockets = list(self._server.sockets)
        if sockets:
            self.port = sockets[0].getsockname()[1]
        if self.sip is not None:
            await self.sip.start()
            self.metrics.sip_connections.set_function(
                lambda: self.sip.open_connections if self.sip else 0
            )
        if self.audiosocket is not None:
            await self.audiosocket.start()
        control = self.registry.loaded.config.server.control_listen
        if self.control is not None and control:
            # With --workers every worker binds it; the kernel hands a request to any one.
            await self.control.start(*split_host_port(control), reuse_port=self.reuse_port)
        if self.shared_metrics is not None:
            self.shared_metrics.start()
        if self.agent_check is not None:
            await self.agent_check.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def shutdown(self, deadline_s: float = 10.0) -> None:
        """Stop accepting calls, let live ones finish until the deadline, then end them."""
        self._closing = True
        if self._drainer is not None:
            self._drainer.cancel()
        if self.agent_check is not None:
            await self.agent_check.stop()
        await self.lag.stop()
        if self.shared_metrics is not None:
            await self.shared_metrics.stop()
        if self._pruner is not None:
            self._pruner.cancel()
        if self._server is None:
            return
        self._server.close(close_connections=False)
        pipelines = list(self.pipelines.values())
        if pipelines:
            waiters = [asyncio.ensure_future(p.finished.wait()) for p in pipelines]
            _, pending = await asyncio.wait(waiters, timeout=deadline_s)
            for waiter in pending:
                waiter.cancel()
            for pipeline in list(self.pipelines.values()):
                pipeline.out.close(1001, "server shutting down")
                await pipeline.hang_up("server shutting down")
        if self.control is not None:
            await self.control.stop()
        if self.sip is not None:
            await self.sip.stop()
        if self.audiosocket is not None:
            await self.audiosocket.stop()
        await self._server.wait_closed()
        await self.store.aclose()
        await self.engine_set.aclose()

    async def serve_until_signal(
        self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """Serve until a drain (a signal, or POST /admin/drain) has ended the last call.

        The first signal drains; a second one brings the deadline to now (the operator will
        not wait): the live calls hear their goodbye and end."""
        loop = asyncio.get_running_loop()
        seen = 0

        def on_signal(signum: int) -> None:
            nonlocal seen
            seen += 1
            name = signal.Signals(signum).name
            if seen == 1:
                self.start_drain(name)
            else:
                log.warning("%s again: ending the %d live call(s) now", name, len(self.pipelines))
                self.hurry_drain()

        for sig in signals:
            loop.add_signal_handler(sig, on_signal, sig)
        await self.drained.wait()
        await self.shutdown(0)

    # ---- draining (server/drain.py) ------------------------------------------------------

    @property
    def live_call_count(self) -> int:
        # Calls still being set up count too, as they do for admission.
        return max(self.live.live_count(), self._call_connections)

    def _load_report(self) -> WorkerReport:
        settings = self.registry.loaded.config.server
        live = self.live_call_count
        load = Load(
            live_calls=live,
            max_calls=settings.max_calls,
            loop_lag_ms=self.loop_lag_ms,
            max_loop_lag_ms=settings.max_loop_lag_ms,
            cpu_percent=self.cpu.sample(),
            max_cpu_percent=settings.max_cpu_percent,
        )
        return WorkerReport(self.worker_id, weight_percent(load), self.drain_state.draining, live)

    def start_drain(self, why: str) -> dict[str, Any]:
        """Refuse new calls, let live ones run until `server.drain_deadline_s`, then end them
        with their agent's goodbye; `drained` is set when the last has ended. Asking again
        changes nothing. The drain's status, for the caller to show."""
        now = time.monotonic()
        if self.drain_state.start(now, why):
            log.warning(
                "draining (%s): refusing new calls; %d live call(s) may run %.0f s more",
                why,
                self.live_call_count,
                self.drain_state.deadline_s,
            )
            if self.sip is not None:
                self.sip.drain()
            self._drainer = asyncio.ensure_future(self._drain_calls())
        return self.drain_state.status(now, self.live_call_count)

    def hurry_drain(self) -> None:
        """The drain's deadline is now: the live calls hear their goodbye and end."""
        self.start_drain("told to stop at once")
        self.drain_state.hurry(time.monotonic())
        self._calls_changed.set()

    def _drain_from_api(self) -> dict[str, Any]:
        status = self.start_drain("POST /admin/drain")
        supervisor = os.environ.get(SUPERVISOR_PID_ENV)
        if supervisor and self.reuse_port:
            # The workers share the port: the host drains as a whole, or the kernel would
            # keep handing this worker calls it refuses. The supervisor passes SIGTERM on
            # to every worker (this one is draining already: it changes nothing here).
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(supervisor), signal.SIGTERM)
        return status

    def _calls_live(self) -> bool:
        return bool(self.pipelines) or self._call_connections > 0

    async def _drain_calls(self) -> None:
        while self._calls_live():
            left = self.drain_state.time_left_s(time.monotonic())
            if not left:
                break
            self._calls_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._calls_changed.wait(), left)
        pipelines = list(self.pipelines.values())
        if pipelines:
            log.warning("drain deadline: ending %d live call(s)", len(pipelines))
            for pipeline in pipelines:
                pipeline.end_with_goodbye(pipeline.session.agent.config.drain_goodbye, drain.REASON)
            waiters = [asyncio.ensure_future(p.finished.wait()) for p in pipelines]
            _, pending = await asyncio.wait(waiters, timeout=drain.GOODBYE_GRACE_S)
            for waiter in pending:
                waiter.cancel()
            for pipeline in list(self.pipelines.values()):
                pipeline.out.close(1001, drain.REASON)
                await pipeline.hang_up(drain.REASON)
        check = self.agent_check
        if check is not None and check.answers_for_others:
            # Worker 0 answers the agent port for the host: it stays (answering "drain")
            # while other workers still have calls, at most until they must have ended.
            ends_at = time.monotonic() + (self.drain_state.time_left_s(time.monotonic()) or 0)
            limit = ends_at + drain.GOODBYE_GRACE_S
            # Polled: their state is in files, rewritten every second; no event says so.
            while check.others_busy() and time.monotonic() < limit:  # noqa: ASYNC110
                await asyncio.sleep(1)
        log.info("drained: no call left")
        self.drained.set()
