"""The carriers' REST clients for call control, built once per server from the config and the
secrets, and handed to every call on a carrier's stream (gateways/carrier_call.py) and to the
placers of outbound calls (server/app.py)."""

from __future__ import annotations

from dataclasses import dataclass

from voice_agent.agents.registry import AgentRegistry
from voice_agent.callcontrol.plivo_rest import PlivoRest
from voice_agent.callcontrol.telnyx_rest import TelnyxRest
from voice_agent.callcontrol.twilio_rest import TwilioRest
from voice_agent.callcontrol.vonage_rest import VonageRest
from voice_agent.errors import ConfigError


@dataclass(frozen=True)
class CallControlApis:
    """The carriers' REST clients; None where not configured."""

    telnyx: TelnyxRest | None = None
    plivo: PlivoRest | None = None
    vonage: VonageRest | None = None
    public_url: str | None = None  # server.public_url: where Plivo fetches a transfer's XML
    twilio: TwilioRest | None = None


NO_APIS = CallControlApis()


def _secret(registry: AgentRegistry, key: str, name: str) -> str:
    """The secret `name` that config key `key` names, or a ConfigError saying how to set it."""
    if name not in registry.secrets:
        raise ConfigError(
            f"{key} names secret {name!r}, which is not set: voice-agent secrets set {name}",
            file=str(registry.loaded.path),
            key=key,
        )
    return registry.secrets[name]


def twilio_rest(registry: AgentRegistry) -> TwilioRest | None:
    """Twilio's REST API for call control, when credentials for it are configured."""
    settings, secrets = registry.loaded.config.server, registry.secrets
    if settings.twilio_api_key:
        name = settings.twilio_api_secret
        if not name or name not in secrets:
            raise ConfigError(
                f"server.twilio_api_secret names secret {name!r}, which is not set: "
                f"voice-agent secrets set {name or 'NAME'}",
                file=str(registry.loaded.path),
                key="server.twilio_api_secret",
            )
        return TwilioRest(settings.twilio_api_key, secrets[name], settings.twilio_api_url)
    token = settings.twilio_auth_token
    if token and token in secrets:
        return TwilioRest(None, secrets[token], settings.twilio_api_url)
    return None


def call_control_apis(registry: AgentRegistry) -> CallControlApis:
    """The clients for the APIs `carriers:` and `server.twilio_*` configure (a ConfigError for
    a missing secret or a Vonage key that is not an RSA key in PEM)."""
    config = registry.loaded.config
    apis = config.carriers
    telnyx = plivo = vonage = None
    if apis.telnyx is not None:
        key = _secret(registry, "carriers.telnyx.api_key_secret", apis.telnyx.api_key_secret)
        telnyx = TelnyxRest(key, apis.telnyx.api_url)
    if apis.plivo is not None:
        name = apis.plivo.auth_token_secret
        token = _secret(registry, "carriers.plivo.auth_token_secret", name)
        plivo = PlivoRest(apis.plivo.auth_id, token, apis.plivo.api_url)
    if apis.vonage is not None:
        where = "carriers.vonage.private_key_secret"
        pem = _secret(registry, where, apis.vonage.private_key_secret)
        try:
            vonage = VonageRest(apis.vonage.application_id, pem, apis.vonage.api_url)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: secret {apis.vonage.private_key_secret!r} is {exc}",
                file=str(registry.loaded.path),
                key=where,
            ) from None
    return CallControlApis(
        telnyx, plivo, vonage, config.server.public_url, twilio=twilio_rest(registry)
    )
