"""The server's own settings (ports, tokens, public URL, store, limits) and WebRTC's."""

from __future__ import annotations

import ipaddress

from pydantic import (
    Field,
    field_validator,
)

from voice_agent.config.base import (
    Strict,
    split_host_port,
)
from voice_agent.public_url import validate_public_url


class IceServer(Strict):
    """A STUN or TURN server for browsers behind NAT; localhost and LAN calls need none."""

    urls: list[str] = Field(min_length=1)
    username: str | None = None
    credential: str | None = None


class WebRtcSettings(Strict):
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Pages on these origins may call; the server's own origin always may.
    allowed_origins: list[str] = Field(default_factory=list)
    ice_timeout_s: float = Field(default=15.0, gt=0)


class ServerSettings(Strict):
    """Where call records go, who may connect, and how long records are kept."""

    @field_validator("control_listen", "agent_check_listen")
    @classmethod
    def _control(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)  # ValueError says what is wrong
        return value

    # "HOST:PORT" of the control API (POST /calls: voice_agent/server/control_api.py); off when
    # unset. Keep it off the public balancer.
    control_listen: str | None = None
    # The base URL carriers reach the control API at, for their status callbacks on placed
    # calls (only /callbacks/ need be public), e.g. https://voice.example.com:8444.
    control_public_url: str | None = None

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return validate_public_url(value) if value else value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for item in value:
            ipaddress.ip_network(item, strict=False)  # ValueError names the bad one
        return value

    # "sqlite" (calls.db in the data directory), "sqlite:///path/to/calls.db", or a
    # "postgresql://user:password@host:5432/db" URL for deployments on several hosts.
    store: str = "sqlite"
    data_dir: str | None = None  # default: $VOICE_AGENT_DATA_DIR, else ./data
    retention_days: float | None = Field(default=30.0, gt=0)  # None keeps calls forever
    recording: bool = False  # both directions of each call to a compressed audio file
    # Names of secrets (`voice-agent secrets set NAME`) holding the accepted bearer tokens.
    api_tokens: list[str] = Field(default_factory=list)
    # Name of the secret holding Twilio's auth token: /twilio then checks X-Twilio-Signature.
    twilio_auth_token: str | None = None
    # Twilio's REST API, for transfers on /twilio: an API key's SID and the name of the secret
    # holding its secret; without them the auth token above
    # (voice_agent/callcontrol/twilio_rest.py).
    twilio_api_key: str | None = None
    twilio_api_secret: str | None = None
    twilio_api_url: str = "https://api.twilio.com"
    # Without a token the server binds to loopback only; this overrides that refusal.
    allow_public_without_token: bool = False
    # The base URL clients and Twilio use (through proxies and tunnels), e.g.
    # https://voice.example.com: the URL X-Twilio-Signature is checked against, and an origin
    # the browser pages may call from.
    public_url: str | None = None
    # Proxies whose X-Forwarded-For is believed (addresses or CIDRs), for per-client limits.
    trusted_proxies: list[str] = Field(default_factory=list)
    max_failed_auth_per_minute: int = Field(default=10, ge=1)
    # Admission control, per worker process: beyond any of these, new calls are refused.
    max_calls: int = Field(default=200, ge=1)
    max_loop_lag_ms: float | None = Field(default=150.0, gt=0)
    max_cpu_percent: float | None = Field(default=None, gt=0)
    # Draining (SIGTERM, or POST /admin/drain on the control API) lets live calls run on this
    # long before each hears its agent's `drain_goodbye` and is ended. Ten minutes covers all
    # but the longest calls, and is what rolling deploys elsewhere allow a host to empty.
    drain_deadline_s: float = Field(default=600.0, ge=0)
    # "HOST:PORT" where HAProxy's agent-check reads this host's weight (or "drain");
    # off when unset (voice_agent/server/agent_check.py).
    agent_check_listen: str | None = None
