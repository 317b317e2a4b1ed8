"""Telnyx's Call Control API v2, what call control on /telnyx streams needs: the `transfer` and
`send_dtmf` commands on the call the stream belongs to.

* `POST {api_url}/v2/calls/{call_control_id}/actions/transfer` with `{"to": ...}`: an E.164
  number or a SIP URI. Telnyx dials the destination and bridges the caller to it once it
  answers; a 200 means the command was taken, not that anyone answered (if nobody does, Telnyx
  reports the other leg's hang-up to the application's webhook and the caller's call stays up).
* `POST {api_url}/v2/calls/{call_control_id}/actions/send_dtmf` with `{"digits": "12#",
  "duration_millis": 250}` (Telnyx takes 100 to 500 ms a digit).
* `Authorization: Bearer <API v2 key>` (`carriers.telnyx.api_key_secret` names the secret).
* A refusal is `{"errors": [{"code": "...", "title": "...", "detail": "..."}]}`: said back as
  "code title: detail" for each error.

The call_control_id is the stream's `start.call_control_id` (voice_agent.transports.telnyx).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from voice_agent.runtime.call_control import CallTransfer
from voice_agent.server.carrier_rest import TIMEOUT_S, is_sip, phone_number, request

__all__ = ["DEFAULT_API_URL", "DIGIT_MS", "TIMEOUT_S", "TelnyxRest", "errors_said"]

DEFAULT_API_URL = "https://api.telnyx.com"
DIGIT_MS = 250  # each key's tone: a phone's press, well inside Telnyx's 100-500 ms


def errors_said(body: Any) -> str | None:
    """Telnyx's `errors` list as one line, or None when the body is not that shape."""
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, list):
        return None
    lines = []
    for error in errors:
        if isinstance(error, dict):
            code, title, detail = (error.get(key) or "" for key in ("code", "title", "detail"))
            head = f"{code} {title}".strip()
            lines.append(f"{head}: {detail}" if detail else head)
    return "; ".join(line for line in lines if line) or None


def transfer_to(target: str) -> str:
    """The `to` of a transfer: a SIP URI as it is, a number without its `tel:`."""
    return target if is_sip(target) else phone_number(target)


class TelnyxRest:
    def __init__(self, api_key: str, api_url: str = DEFAULT_API_URL) -> None:
        self._api_key = api_key
        self.api_url = api_url.rstrip("/")

    async def _command(
        self, call_control_id: str, action: str, body: dict[str, Any], what: str
    ) -> str | None:
        # call_control_id is "v3:" and URL-safe base64: the colon is a legal path character.
        call = quote(call_control_id, safe=":")
        return await request(
            "Telnyx",
            what,
            "POST",
            f"{self.api_url}/v2/calls/{call}/actions/{action}",
            said=errors_said,
            json=body,
            headers={"Authorization": f"Bearer {self._api_key}"},
        )

    async def transfer(self, call_control_id: str, transfer: CallTransfer) -> str | None:
        """Hand the call to the destination; None once Telnyx took the command, else why not."""
        body = {"to": transfer_to(transfer.target)}
        return await self._command(call_control_id, "transfer", body, "transfer")

    async def send_digits(self, call_control_id: str, digits: str) -> str | None:
        """Play `digits` into the call as tones; None once Telnyx took them, else why not."""
        body = {"digits": digits, "duration_millis": DIGIT_MS}
        return await self._command(call_control_id, "send_dtmf", body, "keys")
