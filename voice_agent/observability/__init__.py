"""What an operator sees of a running server: Prometheus metrics, structured logs and
event-loop lag."""

from voice_agent.observability.logs import (
    add_log_secrets,
    bind_call_id,
    call_context,
    configure_logging,
    current_call_id,
    set_call_id,
)
from voice_agent.observability.loop_lag import LagMeter, LoopLagMonitor
from voice_agent.observability.metrics import ServerMetrics, turn_stages

__all__ = [
    "LagMeter",
    "LoopLagMonitor",
    "ServerMetrics",
    "add_log_secrets",
    "bind_call_id",
    "call_context",
    "configure_logging",
    "current_call_id",
    "set_call_id",
    "turn_stages",
]
