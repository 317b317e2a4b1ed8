"""The telephony settings: SIP (listeners, trunks, media), AudioSocket's routes, and the carriers'
APIs for call control and placed calls."""

from __future__ import annotations

import ipaddress
import uuid
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from voice_agent.config.base import (
    Strict,
    split_host_port,
)

DigestAlgorithm = Literal["MD5", "SHA-256"]
SIP_TRANSPORTS = ("udp", "tcp", "tls")


class SipListener(NamedTuple):
    transport: str  # "udp", "tcp" or "tls"
    host: str
    port: int


def sip_listeners(listen: str | list[str]) -> list[SipListener]:
    """`sip.listen` (or `serve --sip`) as listeners: "HOST:PORT" is UDP, "tcp:HOST:PORT" and
    "tls:HOST:PORT" the connection transports, at most one of each. ValueError says what is
    wrong."""
    values = [listen] if isinstance(listen, str) else list(listen)
    if not values:
        raise ValueError("no address to listen on")
    listeners: list[SipListener] = []
    for value in values:
        scheme, colon, rest = value.partition(":")
        transport = scheme.lower() if colon and scheme.lower() in SIP_TRANSPORTS else None
        if transport is None and scheme.isalpha() and ":" in rest:
            raise ValueError(f"{value!r}: {scheme!r} is not a transport (udp, tcp or tls)")
        try:
            host, port = split_host_port(rest if transport else value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not [udp:|tcp:|tls:]HOST:PORT (e.g. tls:0.0.0.0:5061)"
            ) from None
        listener = SipListener(transport or "udp", host, port)
        if any(other.transport == listener.transport for other in listeners):
            raise ValueError(f"two {listener.transport} addresses: one of each transport at most")
        listeners.append(listener)
    return listeners


def _config_file(value: str, info: ValidationInfo) -> str:
    """A file the config names, relative to the config's folder, that must be readable."""
    base_dir = (info.context or {}).get("base_dir")
    path = Path(base_dir) / Path(value).expanduser() if base_dir is not None else Path(value)
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    return str(path)


class SipTls(Strict):
    """SIP over TLS (`tls:` in `sip.listen`): the server's certificate, and whether callers
    must show one of their own. The files are read again when they change (a renewed
    certificate needs no restart)."""

    @field_validator("certificate", "key", "ca")
    @classmethod
    def _readable(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _config_file(value, info) if value is not None else None

    @model_validator(mode="after")
    def _ca_to_verify(self) -> SipTls:
        if self.verify_client and self.ca is None:
            raise ValueError("verify_client needs ca, which callers' certificates are checked by")
        return self

    certificate: str  # PEM: the server's certificate, then its chain
    key: str  # PEM: its private key
    ca: str | None = None  # PEM bundle of the authorities that sign callers' certificates
    verify_client: bool = False  # a caller without a certificate that `ca` signed is refused


class SipTrunk(Strict):
    """Where calls the server places go (`POST /calls`): a SIP trunk or PBX taking INVITEs."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_host_port(value)  # ValueError says what is wrong
        return value

    address: str  # "HOST:PORT" of the trunk (an IP address: no DNS lookups)
    # Digest credentials, if the trunk challenges: the user name and the secret holding the
    # password.
    username: str | None = None
    password_secret: str | None = None
    caller_id: str = "voice-agent"  # the From user part: the number the callee sees
    ring_timeout_s: float = Field(default=45.0, gt=0, le=300)
    calls_per_minute: int = Field(default=10, ge=1)  # placed calls, a guard against abuse
    # An OPTIONS to the trunk this often, to know it answers (metrics, /healthz); 0: never.
    options_interval_s: float = Field(default=30.0, ge=0, le=3600)


class SipSettings(Strict):
    """SIP calls straight from a trunk or a PBX (docs/telephony.md); off unless `listen` or
    `serve --sip` gives an address."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is not None:
            sip_listeners(value)  # ValueError says what is wrong
        return value

    @field_validator("allowed_sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            ipaddress.ip_network(item, strict=False)  # ValueError names the bad one
        return value

    @model_validator(mode="after")
    def _ports(self) -> SipSettings:
        if self.rtp_port_max < self.rtp_port_min:
            raise ValueError(
                f"rtp_port_max {self.rtp_port_max} is below rtp_port_min {self.rtp_port_min}"
            )
        return self

    @model_validator(mode="after")
    def _session_timer(self) -> SipSettings:
        if 0 < self.session_expires_s < self.min_session_expires_s:
            raise ValueError(
                f"session_expires_s {self.session_expires_s} is below min_session_expires_s "
                f"{self.min_session_expires_s} (0 turns it off)"
            )
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> SipSettings:
        listens = sip_listeners(self.listen) if self.listen is not None else []
        if self.tls is None and any(item.transport == "tls" for item in listens):
            raise ValueError("a tls: address in listen needs sip.tls: certificate and key")
        return self

    # "HOST:PORT" (UDP), or several: ["0.0.0.0:5060", "tcp:0.0.0.0:5060", "tls:0.0.0.0:5061"]
    listen: str | list[str] | None = None
    tls: SipTls | None = None  # for a tls: listener
    # Open TCP and TLS connections at most; past it a new one is closed as it comes.
    max_connections: int = Field(default=4096, ge=1)
    # SRTP (RFC 3711, keys in the SDP by RFC 4568): "optional" takes a caller's offer of it,
    # "required" refuses plain RTP with 488, "off" takes plain RTP only.
    srtp: Literal["off", "optional", "required"] = "optional"
    # The keys travel in the SDP: over signalling that is not TLS anyone on the path reads
    # them, so they are refused unless this says the path is private.
    srtp_keys_over_plain_signalling: bool = False
    # The address callers reach this server at, for Contact and SDP: needed when `listen` is
    # 0.0.0.0 or behind NAT.
    public_address: str | None = None
    rtp_port_min: int = Field(default=20000, ge=1024, le=65535)
    rtp_port_max: int = Field(default=20999, ge=1024, le=65535)
    # Networks (CIDR or single addresses) whose INVITEs are taken; None takes any source.
    allowed_sources: list[str] | None = None
    # Digest credentials for INVITEs: user name -> name of the secret holding the password.
    credentials: dict[str, str] = Field(default_factory=dict)
    realm: str = "voice-agent"
    # Offered in this order (many clients take the first); ["SHA-256"] refuses MD5.
    digest_algorithms: list[DigestAlgorithm] = Field(
        default_factory=lambda: list(get_args(DigestAlgorithm)), min_length=1
    )
    # Which agent takes a call: this header's value if present, else `numbers` for the dialled
    # user part, else an agent of that name, else the default agent.
    agent_header: str | None = None
    numbers: dict[str, str] = Field(default_factory=dict)
    # SIP headers that become agent args: header name -> arg name (e.g. X-Customer: customer).
    headers: dict[str, str] = Field(default_factory=dict)
    # Audio sent is taken as heard this much later (network and the caller's jitter buffer).
    heard_delay_ms: float = Field(default=60.0, ge=0, le=1000)
    # Ring (180) this long before answering; 0 answers at once.
    answer_after_ms: float = Field(default=0.0, ge=0, le=60_000)
    # Session timers (RFC 4028): the interval a caller that supports them but asks for none
    # gets, refreshed by the caller (0: none unless asked for), and the shortest interval
    # taken (422 below it; the RFC's floor is 90 s). A call whose refresh never comes ends.
    session_expires_s: int = Field(default=1800, ge=0, le=86_400)
    min_session_expires_s: int = Field(default=90, ge=90, le=86_400)
    # A call from which neither RTP nor RTCP has come this long (off hold) is ended: the
    # caller's phone or network went away without a BYE. 0: never.
    media_timeout_s: float = Field(default=60.0, ge=0, le=3600)
    trunk: SipTrunk | None = None  # for calls the server places; none: POST /calls is off
    registrations: list[SipRegistration] = Field(default_factory=list)  # over UDP


class SipRegistration(Strict):
    """A registrar this server registers with (RFC 3261 section 10), so the calls for `user`
    come to it: a PBX or a hosted trunk that delivers calls to registered contacts only."""

    @field_validator("registrar")
    @classmethod
    def _registrar(cls, value: str) -> str:
        split_host_port(value)  # ValueError says what is wrong
        return value

    registrar: str  # "HOST:PORT" (an IP address: no DNS lookups)
    user: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.!~*'()&=+$,;?/%+-]+$")
    domain: str | None = None  # the address of record's host; None: the registrar's
    # Digest credentials if it challenges: the name (None: `user`) and the secret holding the
    # password.
    auth_user: str | None = None
    password_secret: str | None = None
    expires: int = Field(default=600, ge=60, le=86400)  # seconds asked for; refreshed before
    name: str | None = None  # for logs, metrics and /healthz; None: user@registrar


class AudioSocketRoute(Strict):
    agent: str | None = None  # None: the default agent
    args: dict[str, Any] = Field(default_factory=dict)


class AudioSocketSettings(Strict):
    """Asterisk AudioSocket calls (AudioSocket() / Dial(AudioSocket/...)); off unless `listen`."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value

    @field_validator("routes")
    @classmethod
    def _routes(cls, value: dict[str, AudioSocketRoute]) -> dict[str, AudioSocketRoute]:
        for key in value:
            uuid.UUID(key)  # ValueError names it
        return value

    listen: str | None = None  # "HOST:PORT", e.g. "10.0.0.5:9092"
    # The call's UUID (the dialplan's ${UUID} or a fixed one per agent) -> agent and args.
    routes: dict[str, AudioSocketRoute] = Field(default_factory=dict)


class TwilioApi(Strict):
    """Calls placed through Twilio (`POST /calls` with `via: twilio`); the credentials are
    server.twilio_api_key / twilio_api_secret (or twilio_auth_token), as for transfers."""

    account_sid: str
    caller_id: str  # the From number: one of the account's Twilio numbers


class TelnyxApi(Strict):
    """Telnyx's Call Control API v2: transfers and keys on /telnyx calls, and placed calls."""

    api_key_secret: str  # the name of the secret holding the API v2 key (Bearer)
    api_url: str = "https://api.telnyx.com"
    connection_id: str | None = None  # the Call Control application placed calls go out on
    caller_id: str | None = None  # the From number for placed calls
    # The portal's webhook public key (base64 Ed25519): callbacks are checked against it.
    webhook_public_key: str | None = None


class PlivoApi(Strict):
    """Plivo's REST API: transfers on /plivo calls, and placed calls (keys go on the stream)."""

    auth_id: str
    auth_token_secret: str  # the name of the secret holding the auth token
    api_url: str = "https://api.plivo.com"
    caller_id: str | None = None  # the From number for placed calls


class VonageApi(Strict):
    """Vonage's Voice API: transfers and keys on /vonage calls (JWT signed with the
    application's private key)."""

    application_id: str
    private_key_secret: str  # the name of the secret holding the application's PEM key
    api_url: str = "https://api.nexmo.com"


class CarrierApis(Strict):
    """The carriers' REST APIs, for call control on their streams and for placed calls
    (docs/telephony.md); each is off until configured."""

    twilio: TwilioApi | None = None
    telnyx: TelnyxApi | None = None
    plivo: PlivoApi | None = None
    vonage: VonageApi | None = None
    # Ask the carrier for its answering-machine detection on placed calls whose agent has
    # `answering_machine: true`; its verdict raises `voicemail` like the server's own detector.
    carrier_amd: bool = False
    ring_timeout_s: float = Field(default=45.0, gt=0, le=300)  # placed calls ring this long
    calls_per_minute: int = Field(default=10, ge=1)  # calls placed through carriers, all told
