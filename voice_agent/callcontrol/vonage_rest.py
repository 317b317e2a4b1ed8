"""Vonage's Voice API, what call control on /vonage streams needs: a transfer of the call to a new
NCCO, and keys played into it.

* Transfer: `PUT {api_url}/v1/calls/{uuid}` with `{"action": "transfer", "destination": {"type":
  "ncco", "ncco": [{"action": "connect", "endpoint": [ENDPOINT]}]}}`, the endpoint
  `{"type": "phone", "number": "14155550199"}` (E.164 without the plus, as Vonage writes it) or
  `{"type": "sip", "uri": "sip:..."}`. The call leaves its NCCO, and with it the websocket
  `connect` that streams to this server. 204 when taken.
* Keys: `PUT {api_url}/v1/calls/{uuid}/dtmf` with `{"digits": "12#"}`.
* Auth: `Authorization: Bearer <JWT>`, RS256 with the Vonage application's private key, claims
  `application_id`, `iat`, `exp` and a unique `jti` (`application_jwt`: one per request, living
  JWT_LIFETIME_S). Keys other than RSA are refused when the server starts.
* A refusal is an RFC 7807 problem (`title`, `detail`), or in older answers `error_title`.

The call's uuid: Vonage's stream carries none of its own; the NCCO that connects the websocket
passes the answer webhook's `uuid` as the endpoint header `uuid` (voice_agent.transports.vonage,
`Connected.call_id`).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any
from urllib.parse import quote

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from voice_agent.callcontrol.carrier_rest import TIMEOUT_S, is_sip, phone_number, request
from voice_agent.runtime.call_control import CallTransfer

__all__ = [
    "DEFAULT_API_URL",
    "JWT_LIFETIME_S",
    "TIMEOUT_S",
    "VonageRest",
    "application_jwt",
    "connect_endpoint",
    "load_private_key",
    "problem_said",
]

DEFAULT_API_URL = "https://api.nexmo.com"
# A token is made for each request, so it need only outlive the request and a clock's skew.
JWT_LIFETIME_S = 300


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _json_part(value: dict[str, Any]) -> str:
    return _b64url(json.dumps(value, separators=(",", ":")).encode())


def load_private_key(pem: str) -> rsa.RSAPrivateKey:
    """The application's key from its PEM text (ValueError: not an unencrypted RSA key)."""
    try:
        key = serialization.load_pem_private_key(pem.strip().encode(), password=None)
    except (TypeError, ValueError) as exc:  # TypeError: an encrypted key, no password
        raise ValueError(f"not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError(f"a {type(key).__name__}, not the RSA key Vonage signs with RS256")
    return key


def application_jwt(
    application_id: str,
    key: rsa.RSAPrivateKey,
    *,
    now: float | None = None,
    lifetime_s: int = JWT_LIFETIME_S,
    jti: str | None = None,
) -> str:
    """A JWT (RFC 7519) for Vonage's APIs: RS256, that is RSASSA-PKCS1-v1_5 with SHA-256 over
    `base64url(header) "." base64url(claims)` (RFC 7518 section 3.3)."""
    issued = int(time.time() if now is None else now)
    header = {"alg": "RS256", "typ": "JWT"}
    claims = {
        "application_id": application_id,
        "iat": issued,
        "exp": issued + lifetime_s,
        "jti": jti or uuid.uuid4().hex,
    }
    signing_input = f"{_json_part(header)}.{_json_part(claims)}"
    signature = key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


def connect_endpoint(target: str) -> dict[str, str]:
    """The NCCO `connect` endpoint dialling `target`."""
    if is_sip(target):
        return {"type": "sip", "uri": target}
    return {"type": "phone", "number": phone_number(target).lstrip("+")}


def problem_said(body: Any) -> str | None:
    """An RFC 7807 problem's title and detail (or the older `error_title`) as one line."""
    if not isinstance(body, dict):
        return None
    title = body.get("title") or body.get("error_title")
    detail = body.get("detail")
    parts = [str(part) for part in (title, detail) if part]
    return ": ".join(parts) or None


class VonageRest:
    def __init__(
        self, application_id: str, private_key_pem: str, api_url: str = DEFAULT_API_URL
    ) -> None:
        self.application_id = application_id
        self._key = load_private_key(private_key_pem)
        self.api_url = api_url.rstrip("/")

    async def _put(self, path: str, body: dict[str, Any], what: str) -> str | None:
        token = application_jwt(self.application_id, self._key)
        return await request(
            "Vonage",
            what,
            "PUT",
            f"{self.api_url}{path}",
            said=problem_said,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        )

    async def transfer(self, call_uuid: str, transfer: CallTransfer) -> str | None:
        """Move the call to an NCCO that connects it to the destination; None once Vonage took
        it, else why not."""
        ncco = [{"action": "connect", "endpoint": [connect_endpoint(transfer.target)]}]
        body = {"action": "transfer", "destination": {"type": "ncco", "ncco": ncco}}
        return await self._put(f"/v1/calls/{quote(call_uuid, safe='')}", body, "transfer")

    async def send_digits(self, call_uuid: str, digits: str) -> str | None:
        """Play `digits` into the call; None once Vonage took them, else why not."""
        path = f"/v1/calls/{quote(call_uuid, safe='')}/dtmf"
        return await self._put(path, {"digits": digits}, "keys")
