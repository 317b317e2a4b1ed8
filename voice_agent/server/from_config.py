"""What the server builds from its config and secrets before it serves: the API tokens, the
access policy, the placers of outbound calls, where its data lives and its durable store.
Each raises a ConfigError that names the key when a secret it needs is not set."""

from __future__ import annotations

import os
from pathlib import Path

from voice_agent.agents.registry import AgentRegistry
from voice_agent.callcontrol.apis import CallControlApis
from voice_agent.callcontrol.carrier_dialer import Placer
from voice_agent.callcontrol.plivo_rest import PlivoPlacer
from voice_agent.callcontrol.telnyx_rest import TelnyxPlacer
from voice_agent.callcontrol.twilio_rest import TwilioPlacer
from voice_agent.config import ConfigError
from voice_agent.runtime.secrets import DATA_DIR_ENV
from voice_agent.server.auth import AccessPolicy, tokens_from_secrets
from voice_agent.store import CallStore as DurableStore
from voice_agent.store import open_store

TOKEN_ENV = "VOICE_AGENT_TOKEN"  # a token from the environment, for containers


def api_tokens(registry: AgentRegistry) -> list[str]:
    """Tokens from the secrets `server.api_tokens` names, plus $VOICE_AGENT_TOKEN."""
    tokens = tokens_from_secrets(registry.loaded.config.server.api_tokens, registry.secrets)
    if os.environ.get(TOKEN_ENV):
        tokens.append(os.environ[TOKEN_ENV])
    return tokens


def placers(registry: AgentRegistry, apis: CallControlApis) -> dict[str, Placer]:
    """The carriers configured to place calls (`carriers.*`)."""
    config = registry.loaded.config
    carriers, secrets = config.carriers, registry.secrets
    found: dict[str, Placer] = {}
    if carriers.telnyx is not None and apis.telnyx is not None:
        found["telnyx"] = TelnyxPlacer(
            apis.telnyx,
            connection_id=carriers.telnyx.connection_id,
            caller_id=carriers.telnyx.caller_id,
            public_key=carriers.telnyx.webhook_public_key,
            ring_timeout_s=carriers.ring_timeout_s,
        )
    if carriers.plivo is not None and apis.plivo is not None:
        found["plivo"] = PlivoPlacer(
            apis.plivo, caller_id=carriers.plivo.caller_id, ring_timeout_s=carriers.ring_timeout_s
        )
    if carriers.twilio is not None:
        token_name = config.server.twilio_auth_token
        found["twilio"] = TwilioPlacer(
            apis.twilio,
            account_sid=carriers.twilio.account_sid,
            caller_id=carriers.twilio.caller_id,
            auth_token=secrets.get(token_name) if token_name else None,
            ring_timeout_s=carriers.ring_timeout_s,
        )
    return found


def access_policy(registry: AgentRegistry) -> AccessPolicy:
    config = registry.loaded.config
    settings = config.server
    secrets = registry.secrets
    tokens = api_tokens(registry)
    twilio_name = settings.twilio_auth_token
    if twilio_name and twilio_name not in secrets:
        raise ConfigError(
            f"server.twilio_auth_token names secret {twilio_name!r}, which is not set: "
            f"voice-agent secrets set {twilio_name}",
            file=str(registry.loaded.path),
            key="server.twilio_auth_token",
        )
    return AccessPolicy(
        tokens,
        twilio_auth_token=secrets[twilio_name] if twilio_name else None,
        allowed_origins=config.webrtc.allowed_origins,
        public_url=settings.public_url,
        allow_public=settings.allow_public_without_token,
        max_failed_auth_per_minute=settings.max_failed_auth_per_minute,
    )


def data_dir_of(registry: AgentRegistry) -> Path:
    """`server.data_dir`, else $VOICE_AGENT_DATA_DIR, else ./data."""
    return Path(registry.loaded.config.server.data_dir or os.environ.get(DATA_DIR_ENV) or "data")


def open_durable_store(registry: AgentRegistry) -> DurableStore:
    settings = registry.loaded.config.server
    return open_store(settings.store, data_dir_of(registry), retention_days=settings.retention_days)
