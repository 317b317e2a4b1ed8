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

Placed calls (`POST /calls` with `via: telnyx`, `TelnyxPlacer`): Telnyx's Dial command, `POST
{api_url}/v2/calls` with the Call Control application (`connection_id`), `to`, `from`, the
call's `webhook_url` (its callback URL on the control API), `timeout_secs`, and a media stream
started on answer: `stream_url` (`/telnyx?placed_call=<call>.<key>`: the key lets the stream in
without an API token), `stream_track: inbound_track`, `stream_bidirectional_mode: rtp` (audio
back on the same socket) with PCMU; with `carriers.carrier_amd`, `answering_machine_detection:
detect_beep`. Its webhooks (JSON `{"data": {"event_type": ..., "payload": {...}}}`) say what
became of it: `call.answered`, `call.hangup` (`hangup_cause`: user_busy, timeout,
call_rejected, ...), `call.machine.detection.ended` (human / machine / not_sure) and
`call.machine.greeting.ended` (beep_detected / ended), and their `premium` forms. With
`carriers.telnyx.webhook_public_key` each webhook's Ed25519 signature (`telnyx-signature-
ed25519` over `<telnyx-timestamp>|<body>`) is checked, and one older than five minutes is
refused: a replay.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from voice_agent.callcontrol.carrier_dialer import Callback, CallbackRefused, Reply
from voice_agent.callcontrol.carrier_rest import (
    TIMEOUT_S,
    is_sip,
    phone_number,
    request,
    request_json,
)
from voice_agent.callcontrol.placed_calls import (
    PLACED_ARG,
    Answered,
    CallStatus,
    PlacedCall,
    Unanswered,
    Verdict,
    Via,
)
from voice_agent.runtime.call_control import CallTransfer

__all__ = [
    "DEFAULT_API_URL",
    "DIGIT_MS",
    "TIMEOUT_S",
    "TelnyxPlacer",
    "TelnyxRest",
    "errors_said",
    "parse_webhook",
    "valid_webhook_signature",
]

DEFAULT_API_URL = "https://api.telnyx.com"
DIGIT_MS = 250  # each key's tone: a phone's press, well inside Telnyx's 100-500 ms
SIGNATURE_MAX_AGE_S = 300  # a webhook signed longer ago than this is a replay


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

    async def dial(self, body: dict[str, Any]) -> tuple[str | None, str | None]:
        """Telnyx's Dial: (the new call's call_control_id, None), or (None, why not)."""
        answer, error = await request_json(
            "Telnyx",
            "call",
            "POST",
            f"{self.api_url}/v2/calls",
            said=errors_said,
            json=body,
            headers={"Authorization": f"Bearer {self._api_key}"},
        )
        data = answer.get("data") if isinstance(answer, dict) else None
        control_id = data.get("call_control_id") if isinstance(data, dict) else None
        return (control_id if isinstance(control_id, str) else None), error


def valid_webhook_signature(
    public_key: str, timestamp: str, body: bytes, signature: str, now: float
) -> bool:
    """Whether `signature` (base64) is Telnyx's Ed25519 signature of `<timestamp>|<body>`
    under `public_key` (base64, the portal's), made within SIGNATURE_MAX_AGE_S of `now`."""
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True))
        raw = base64.b64decode(signature, validate=True)
        signed_at = int(timestamp)
    except (ValueError, binascii.Error):
        return False
    if abs(now - signed_at) > SIGNATURE_MAX_AGE_S:
        return False
    try:
        key.verify(raw, timestamp.encode() + b"|" + body)
    except InvalidSignature:
        return False
    return True


# hangup_cause of a call that ended before it was answered, and the end reason for each.
_HANGUPS = {
    "user_busy": "busy: the callee's line was busy",
    "call_rejected": "busy: the callee declined the call",
    "timeout": "no answer: nobody picked up",
    "normal_clearing": "callee hung up",  # answered, then gone before its stream came
}
# The verdicts of Telnyx's detection, standard and premium.
_DETECTION = {
    "human": "person",
    "human_residence": "person",
    "human_business": "person",
    "machine": "machine",
    "fax_detected": "machine",
}
_GREETING_ENDED = {"beep_detected": True, "ended": False, "no_beep_detected": False}


def parse_webhook(event: Any) -> CallStatus | None:
    """What a Call Control webhook says of a placed call; None when it changes nothing."""
    data = event.get("data") if isinstance(event, dict) else None
    if not isinstance(data, dict):
        return None
    kind, payload = data.get("event_type"), data.get("payload")
    payload = payload if isinstance(payload, dict) else {}
    result = str(payload.get("result", ""))
    if kind == "call.answered":
        return Answered()
    if kind == "call.hangup":
        cause = str(payload.get("hangup_cause", "unspecified"))
        reason = _HANGUPS.get(cause)
        if reason is None:
            sip = payload.get("sip_hangup_cause")
            reason = f"call failed: Telnyx ended the call ({cause}" + (
                f", SIP {sip})" if sip else ")"
            )
        return Unanswered(reason)
    if kind in ("call.machine.detection.ended", "call.machine.premium.detection.ended"):
        answer = _DETECTION.get(result)
        if answer == "person":
            return Verdict("person", said=result)
        return Verdict("machine", said=result) if answer == "machine" else None
    if kind in ("call.machine.greeting.ended", "call.machine.premium.greeting.ended"):
        beep = _GREETING_ENDED.get(result)
        return Verdict("message", beep=beep, said=result) if beep is not None else None
    return None


class TelnyxPlacer:
    """Calls placed through Telnyx (carrier_dialer.Placer); see the module docstring."""

    via: Via = "telnyx"

    def __init__(
        self,
        rest: TelnyxRest,
        *,
        connection_id: str | None,
        caller_id: str | None,
        public_key: str | None,
        ring_timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rest = rest
        self.connection_id = connection_id
        self.caller_id = caller_id
        self.public_key = public_key
        self.ring_timeout_s = ring_timeout_s
        self._clock = clock

    def unavailable(self) -> str | None:
        if not self.connection_id or not self.caller_id:
            return (
                "placing calls through telnyx needs carriers.telnyx.connection_id (the Call"
                " Control application) and carriers.telnyx.caller_id (the From number)"
            )
        return None

    def stream_path(self, token: str) -> str:
        return f"/telnyx?{PLACED_ARG}={quote(token)}"

    async def place(
        self, call: PlacedCall, stream_url: str, callback_url: str, *, amd: bool
    ) -> str | None:
        body: dict[str, Any] = {
            "connection_id": self.connection_id,
            "to": phone_number(call.to) if not is_sip(call.to) else call.to,
            "from": self.caller_id,
            "webhook_url": callback_url,
            "webhook_url_method": "POST",
            "timeout_secs": max(5, min(600, round(self.ring_timeout_s))),
            "stream_url": stream_url,
            "stream_track": "inbound_track",
            "stream_bidirectional_mode": "rtp",
            "stream_bidirectional_codec": "PCMU",
        }
        if amd:
            body["answering_machine_detection"] = "detect_beep"
        control_id, error = await self.rest.dial(body)
        call.carrier_id = control_id
        return error

    def read_callback(self, call: PlacedCall, callback: Callback, stream_url: str) -> Reply:
        if self.public_key is not None:
            headers = {k.lower(): v for k, v in callback.headers.items()}
            if not valid_webhook_signature(
                self.public_key,
                headers.get("telnyx-timestamp", ""),
                callback.body,
                headers.get("telnyx-signature-ed25519", ""),
                self._clock(),
            ):
                raise CallbackRefused("the webhook's telnyx-signature-ed25519 is not Telnyx's")
        try:
            event = json.loads(callback.body)
        except ValueError:
            return Reply(400, "not JSON")
        return Reply(200, "", status=parse_webhook(event))
