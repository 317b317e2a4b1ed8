"""Plivo's REST API, what call control on /plivo streams needs, and the XML page it fetches.

A transfer is Plivo's "Transfer a call": `POST {api_url}/v1/Account/{auth_id}/Call/{call_uuid}/`
with the JSON `{"legs": "aleg", "aleg_url": URL, "aleg_method": "GET"}` (Plivo takes JSON bodies
only; HTTP basic auth with the auth ID and token; 202 when taken; a refusal is `{"api_id":
..., "error": ...}`). Plivo then fetches new XML for the call from the URL, leaves the `<Stream>`
(the socket closes) and runs it: `<Response><Dial><Number>+1...</Number></Dial></Response>`, or
`<User>sip:...</User>` for a SIP URI.

This server serves that XML itself, on the main port: `GET {server.public_url}/plivo/dial?to=
<target>&call=<call uuid>&sig=<HMAC>`. The page is open (Plivo cannot send our API token) and
stateless: the signed query holds everything the XML needs, so it answers whichever worker
Plivo reaches, and after the call's stream has gone. `sig` is HMAC-SHA256 over the call and the
target under a key derived from the auth token (every worker and restart derives the same one;
the token itself is used for nothing else here): without it nobody can make the page emit a
`<Dial>` to a number of their choosing, and a valid URL only ever repeats the transfer the
server asked for. Plivo adds its own call parameters (`CallUUID`, `From`, `To`, ...) to the
query of a GET: they are ignored.

Keys on /plivo go on the stream itself (`sendDTMF`, voice_agent.transports.plivo), not here.

Placed calls (`POST /calls` with `via: plivo`, `PlivoPlacer`): Plivo's "Make a call", `POST
{api_url}/v1/Account/{auth_id}/Call/` with `from`, `to`, `ring_timeout`, an `answer_url` Plivo
fetches (GET) when the callee answers, a `hangup_url` it posts to when the call ends, and with
`carriers.carrier_amd` `machine_detection: true` and its `machine_detection_url`. All three
are the call's callback URL on the control API (the answer one with `step=answer`): the
answer is Plivo XML starting a bidirectional `<Stream>` to `/plivo?placed_call=<call>.<key>`
(the key lets it in without an API token); the hangup post's `CallStatus` (busy, no-answer,
timeout, failed, cancel, completed) and `HangupCause` end a call that never streamed; the
machine detection post's `Machine` (true / false) is the carrier's verdict (Plivo says
machine or not, not when its greeting ends: the server's own detector listens for the beep).
Plivo's callbacks are checked by the key in their URL, then by Plivo's V3 signature
(`X-Plivo-Signature-V3` over the URL, its parameters and `X-Plivo-Signature-V3-Nonce`, an
HMAC-SHA256 under the auth token; `v3_signature`): Plivo signs every voice callback, and one
unsigned or signed otherwise is refused (403) and changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit
from xml.sax.saxutils import escape

from websockets.datastructures import Headers
from websockets.http11 import Response

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
from voice_agent.destination import DESTINATION
from voice_agent.runtime.call_control import CallTransfer

__all__ = [
    "DEFAULT_API_URL",
    "PLIVO_DIAL_PATH",
    "TIMEOUT_S",
    "PlivoPlacer",
    "PlivoRest",
    "dial_key",
    "dial_response",
    "dial_signature",
    "dial_xml",
    "error_said",
    "v3_signature",
]

DEFAULT_API_URL = "https://api.plivo.com"
# Where Plivo fetches a transfer's XML: open to it (it cannot send our token), each URL
# signed with its own HMAC (dial_signature), which dial_response checks.
PLIVO_DIAL_PATH = "/plivo/dial"
_KEY_LABEL = b"voice_agent /plivo/dial v1"  # what the derived key is for, and its version


def dial_key(auth_token: str) -> bytes:
    """The dial page's signing key: derived, so the auth token signs nothing of ours itself."""
    return hmac.new(auth_token.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()


def dial_signature(key: bytes, call_uuid: str, target: str) -> str:
    # A target never holds a newline (DESTINATION), so no two (call, target) pairs sign alike.
    message = f"{call_uuid}\n{target}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _sorted_query(query: Mapping[str, list[str]]) -> str:
    return "&".join(f"{key}={value}" for key in sorted(query) for value in sorted(query[key]))


def v3_signature(
    auth_token: str, method: str, url: str, params: Mapping[str, str], nonce: str
) -> str:
    """Plivo's V3 signature of a request to `url` (as Plivo was given it) with `params` (a
    POST's form, or the query parameters Plivo adds to a GET), base64.

    What is signed, then `.` and the nonce: the URL without its query; for a GET, `?` and
    every query parameter (the URL's and Plivo's) as `key=value`, sorted, joined by `&`; for
    a POST, `?` and the URL's own query so sorted (the `?` also when the query is empty but
    the form is not), `.` when there are both, and the form's parameters as `keyvalue`,
    sorted, run together.
    """
    parts = urlsplit(url)
    text = f"{parts.scheme}://{parts.netloc}{parts.path}"
    query = parse_qs(parts.query, keep_blank_values=True)
    if method.upper() == "GET":
        joined = _sorted_query({key: [value] for key, value in params.items()} | query)
        text += f"?{joined}" if joined else ""
    else:
        joined = _sorted_query(query)
        if joined or params:
            text += f"?{joined}"
        if joined and params:
            text += "."
        text += "".join(f"{key}{params[key]}" for key in sorted(params))
    digest = hmac.new(auth_token.encode(), f"{text}.{nonce}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def dial_xml(target: str) -> str:
    """Plivo XML handing the call to `target`: `<User>` for a SIP URI, else `<Number>`."""
    if is_sip(target):
        inner = f"<User>{escape(target)}</User>"
    else:
        inner = f"<Number>{escape(phone_number(target))}</Number>"
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Dial>{inner}</Dial></Response>'


def error_said(body: Any) -> str | None:
    """Plivo's `error` (a sentence, or an object of them) as one line."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):
        return error or None
    if isinstance(error, dict):
        return "; ".join(f"{key}: {value}" for key, value in error.items()) or None
    return None


def _text(status: http.HTTPStatus, text: str) -> Response:
    body = text.encode()
    headers = Headers(
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


def dial_response(request_target: str, key: bytes | None) -> Response:
    """GET /plivo/dial: the signed transfer's XML; 403 for a signature that does not match, 404
    when Plivo is not configured (`key` None: the path then means nothing here)."""
    if key is None:
        return _text(http.HTTPStatus.NOT_FOUND, f"nothing at {PLIVO_DIAL_PATH}\n")
    query = parse_qs(urlsplit(request_target).query, keep_blank_values=True)
    values = [query.get(name, []) for name in ("to", "call", "sig")]
    if any(len(value) != 1 for value in values):
        return _text(http.HTTPStatus.FORBIDDEN, "to, call and sig are each required once\n")
    (target,), (call_uuid,), (sig,) = values
    expected = dial_signature(key, call_uuid, target)
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "surrogatepass")):
        return _text(http.HTTPStatus.FORBIDDEN, "the signature does not match\n")
    if not DESTINATION.fullmatch(target):  # signed by us, so never; but never emit anything else
        return _text(http.HTTPStatus.BAD_REQUEST, "not a destination\n")
    body = dial_xml(target).encode()
    headers = Headers(
        [
            ("Content-Type", "application/xml"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ]
    )
    return Response(http.HTTPStatus.OK.value, "OK", headers, body)


class PlivoRest:
    def __init__(self, auth_id: str, auth_token: str, api_url: str = DEFAULT_API_URL) -> None:
        self.auth_id = auth_id
        self._auth_token = auth_token
        self.api_url = api_url.rstrip("/")
        self.dial_key = dial_key(auth_token)

    def v3_signature(self, method: str, url: str, params: Mapping[str, str], nonce: str) -> str:
        return v3_signature(self._auth_token, method, url, params, nonce)

    def dial_url(self, public_url: str, call_uuid: str, target: str) -> str:
        """Where Plivo fetches the XML handing `call_uuid` to `target` (see the docstring)."""
        sig = dial_signature(self.dial_key, call_uuid, target)
        query = urlencode({"to": target, "call": call_uuid, "sig": sig})
        return f"{public_url.rstrip('/')}{PLIVO_DIAL_PATH}?{query}"

    async def transfer(self, call_uuid: str, transfer: CallTransfer, public_url: str) -> str | None:
        """Send the call to this server's `<Dial>` for the destination; None once Plivo took
        it, else why not."""
        account, call = quote(self.auth_id, safe=""), quote(call_uuid, safe="")
        return await request(
            "Plivo",
            "transfer",
            "POST",
            f"{self.api_url}/v1/Account/{account}/Call/{call}/",
            said=error_said,
            json={
                "legs": "aleg",
                "aleg_url": self.dial_url(public_url, call_uuid, transfer.target),
                "aleg_method": "GET",
            },
            auth=(self.auth_id, self._auth_token),
        )

    async def make_call(self, body: dict[str, Any]) -> tuple[str | None, str | None]:
        """Plivo's "Make a call": (its request_uuid, None), or (None, why not)."""
        account = quote(self.auth_id, safe="")
        answer, error = await request_json(
            "Plivo",
            "call",
            "POST",
            f"{self.api_url}/v1/Account/{account}/Call/",
            said=error_said,
            json=body,
            auth=(self.auth_id, self._auth_token),
        )
        uuid = answer.get("request_uuid") if isinstance(answer, dict) else None
        return (uuid if isinstance(uuid, str) else None), error


ANSWER_STEP = "answer"  # the `step` query parameter of the answer URL

# CallStatus of a hangup post for a call that never reached its stream, and the end reason.
_UNANSWERED = {
    "busy": "busy: the callee's line was busy",
    "no-answer": "no answer: nobody picked up",
    "timeout": "no answer: nobody picked up",
    "cancel": "call failed: the call was canceled before it was answered",
    "failed": "call failed: Plivo could not place the call",
    "completed": "callee hung up",  # answered, then gone before its stream came
}


def stream_xml(stream_url: str) -> str:
    """The answer URL's XML: the call's audio streamed to `stream_url`, both ways, 8 kHz
    mu-law, the call kept up while the stream lives."""
    url = escape(stream_url)
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Response>'
        '<Stream bidirectional="true" keepCallAlive="true" '
        f'contentType="audio/x-mulaw;rate=8000">{url}</Stream></Response>'
    )


def parse_callback(form: dict[str, str]) -> CallStatus | None:
    """What a hangup or machine-detection post says; None when it changes nothing."""
    machine = form.get("Machine")
    if machine is not None:
        if machine.lower() == "true":
            return Verdict("machine", said="Machine=true")
        return Verdict("person", said="Machine=false")
    reason = _UNANSWERED.get(form.get("CallStatus", ""))
    if reason is None:
        return None
    cause = form.get("HangupCause")
    return Unanswered(f"{reason} ({cause})" if cause and reason != "callee hung up" else reason)


class PlivoPlacer:
    """Calls placed through Plivo (carrier_dialer.Placer); see the module docstring."""

    via: Via = "plivo"

    def __init__(self, rest: PlivoRest, *, caller_id: str | None, ring_timeout_s: float) -> None:
        self.rest = rest
        self.caller_id = caller_id
        self.ring_timeout_s = ring_timeout_s

    def unavailable(self) -> str | None:
        if not self.caller_id:
            return "placing calls through plivo needs carriers.plivo.caller_id (the From number)"
        return None

    def stream_path(self, token: str) -> str:
        return f"/plivo?{PLACED_ARG}={quote(token)}"

    async def place(
        self, call: PlacedCall, stream_url: str, callback_url: str, *, amd: bool
    ) -> str | None:
        body: dict[str, Any] = {
            "from": self.caller_id,
            "to": phone_number(call.to) if not is_sip(call.to) else call.to,
            "answer_url": f"{callback_url}&step={ANSWER_STEP}",
            "answer_method": "GET",
            "hangup_url": callback_url,
            "hangup_method": "POST",
            "ring_timeout": max(5, min(600, round(self.ring_timeout_s))),
        }
        if amd:
            body |= {
                "machine_detection": "true",
                "machine_detection_url": callback_url,
                "machine_detection_method": "POST",
            }
        request_uuid, error = await self.rest.make_call(body)
        call.carrier_id = request_uuid
        return error

    def read_callback(self, call: PlacedCall, callback: Callback, stream_url: str) -> Reply:
        form = dict(callback.form)
        self._check_signature(callback)
        if form.get("step") == ANSWER_STEP:
            return Reply(200, stream_xml(stream_url), "application/xml", Answered())
        return Reply(200, "", status=parse_callback(form))

    def _check_signature(self, callback: Callback) -> None:
        headers = {key.lower(): value for key, value in callback.headers.items()}
        nonce = headers.get("x-plivo-signature-v3-nonce", "")
        # Plivo signs once per auth token the account has in force, comma-separated.
        given = [part.strip() for part in headers.get("x-plivo-signature-v3", "").split(",")]
        if nonce:
            expected = self.rest.v3_signature(callback.method, callback.url, callback.form, nonce)
            known = expected.encode("ascii")
            for part in given:
                if part and hmac.compare_digest(known, part.encode("utf-8", "surrogatepass")):
                    return
        raise CallbackRefused("the callback's X-Plivo-Signature-V3 is not Plivo's")
