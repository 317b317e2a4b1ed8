"""Twilio's REST API, the little of it call control needs: redirecting a live call to new TwiML
(`POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json` with `Twiml`, HTTP basic auth
with the account SID and auth token, as Twilio's "Modify a live call" reference documents).

A transfer is the call redirected to `<Dial>`: Twilio leaves the `<Connect><Stream>` (it sends
`stop` and closes the stream) and dials the destination, a phone number or, for a SIP URI,
`<Dial><Sip>`. Keys cannot be sent this way without ending the stream (TwiML `<Play digits>`
replaces the `<Connect>`), so /twilio has no send_dtmf.

Credentials: an API key (`server.twilio_api_key`, its SID, and `server.twilio_api_secret`, the
secret holding its secret: what Twilio recommends for servers), else the account's auth token
(`server.twilio_auth_token`) with the call's own account SID. The account SID in the URL is
always the call's, from its `start` message. `server.twilio_api_url` points elsewhere for a
region's edge or a stand-in.

Placed calls (`POST /calls` with `via: twilio`, `carriers.twilio`): `POST .../Calls.json` with
`To`, `From`, TwiML that connects the answered call's stream back to `/twilio` (its `placed_call`
`<Parameter>` names the placed call: Twilio's stream URL takes no query string), status
callbacks for each step, a ring `Timeout`, and with `carriers.carrier_amd` asynchronous
answering-machine detection (`MachineDetection=DetectMessageEnd`, `AsyncAmd`), whose
`AnsweredBy` comes to its own callback. `parse_status` reads both callbacks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape

import httpx

from voice_agent.callcontrol.carrier_dialer import Callback, CallbackRefused, Reply
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

DEFAULT_API_URL = "https://api.twilio.com"
TIMEOUT_S = 10.0
TWILIO_SIGNATURE_HEADER = "X-Twilio-Signature"


# ---- Twilio's signatures, which /twilio's access check reads too ----------------------------


ParamValue = str | Sequence[str]


def twilio_signature(url: str, params: Mapping[str, ParamValue], auth_token: str) -> str:
    """Twilio's X-Twilio-Signature for a request: base64(HMAC-SHA1(auth_token, data)).

    data is the full URL Twilio requested (scheme, host, path, query string, as given), then
    for a form POST each parameter's name and value, sorted by name (a repeated parameter:
    its values sorted). The Media Streams WebSocket upgrade is a GET: the URL alone.
    """
    data = url
    for name in sorted(params):
        value = params[name]
        values = [value] if isinstance(value, str) else sorted(value)
        for item in values:
            data += name + item
    mac = hmac.new(auth_token.encode("utf-8"), data.encode("utf-8"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def valid_twilio_signature(
    url: str, params: Mapping[str, ParamValue], signature: str, auth_token: str
) -> bool:
    """Whether `signature` is Twilio's for this URL and parameters (constant-time compare)."""
    if not signature or not auth_token:
        return False
    expected = twilio_signature(url, params, auth_token)
    return hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "surrogatepass"))


def dial_twiml(target: str) -> str:
    """The TwiML that hands the call to `target`: `<Dial><Sip>` for a SIP URI, else a number."""
    if target.lower().startswith(("sip:", "sips:")):
        return f"<Response><Dial><Sip>{escape(target)}</Sip></Dial></Response>"
    number = target[4:] if target.lower().startswith("tel:") else target
    return f"<Response><Dial>{escape(number)}</Dial></Response>"


def stream_twiml(stream_url: str, placed_token: str) -> str:
    """The TwiML of a placed call: its answered audio streamed to `stream_url`, both ways."""
    url, token = escape(stream_url, {'"': "&quot;"}), escape(placed_token, {'"': "&quot;"})
    return (
        f'<Response><Connect><Stream url="{url}">'
        f'<Parameter name="{PLACED_ARG}" value="{token}"/>'
        "</Stream></Connect></Response>"
    )


# CallStatus values of a call that ended without being answered, and the end reason for each.
_UNANSWERED = {
    "busy": "busy: the callee's line was busy",
    "no-answer": "no answer: nobody picked up",
    "canceled": "call failed: the call was canceled before it was answered",
    "failed": "call failed: Twilio could not place the call",
}
# AnsweredBy: a person, a machine whose greeting goes on (machine_start: MachineDetection
# Enable), a machine whose greeting has ended (DetectMessageEnd: speak now).
_ANSWERED_BY: dict[str, Verdict] = {
    "human": Verdict("person", said="human"),
    "machine_start": Verdict("machine", said="machine_start"),
    "machine_end_beep": Verdict("message", beep=True, said="machine_end_beep"),
    "machine_end_silence": Verdict("message", said="machine_end_silence"),
    "machine_end_other": Verdict("message", said="machine_end_other"),
    "fax": Verdict("machine", said="fax"),
}


def parse_status(form: dict[str, str]) -> CallStatus | None:
    """What a status or AMD callback says (Twilio posts them form-encoded); None when it
    changes nothing (queued, initiated, ringing, completed, AnsweredBy unknown)."""
    answered_by = form.get("AnsweredBy")
    if answered_by is not None:
        return _ANSWERED_BY.get(answered_by)
    status = form.get("CallStatus", "")
    if status == "in-progress":
        return Answered()
    reason = _UNANSWERED.get(status)
    if reason is None:
        return None
    detail = form.get("SipResponseCode") or form.get("ErrorCode")
    return Unanswered(f"{reason} (code {detail})" if detail else reason)


class TwilioRest:
    """`username` None: the call's account SID (with the auth token as `password`)."""

    def __init__(self, username: str | None, password: str, api_url: str = DEFAULT_API_URL) -> None:
        self._username = username
        self._password = password
        self.api_url = api_url.rstrip("/")

    async def create_call(
        self,
        account_sid: str,
        *,
        to: str,
        caller_id: str,
        twiml: str,
        status_url: str,
        ring_timeout_s: float,
        amd: bool,
    ) -> tuple[str | None, str | None]:
        """Place a call: (Twilio's call SID, None), or (None, why Twilio would not)."""
        url = f"{self.api_url}/2010-04-01/Accounts/{account_sid}/Calls.json"
        form: dict[str, str | list[str]] = {
            "To": to,
            "From": caller_id,
            "Twiml": twiml,
            "StatusCallback": status_url,
            "StatusCallbackMethod": "POST",
            "StatusCallbackEvent": ["initiated", "ringing", "answered", "completed"],
            "Timeout": str(max(5, min(600, round(ring_timeout_s)))),
        }
        if amd:
            form |= {
                "MachineDetection": "DetectMessageEnd",
                "AsyncAmd": "true",
                "AsyncAmdStatusCallback": status_url,
                "AsyncAmdStatusCallbackMethod": "POST",
            }
        response, error = await self._post(url, form, account_sid)
        if response is None:
            return None, error
        if not response.is_success:
            return None, f"Twilio refused the call: {_said(response)}"
        try:
            sid = response.json().get("sid")
        except ValueError:
            sid = None
        return (sid if isinstance(sid, str) else None), None

    async def _post(
        self, url: str, form: dict[str, str | list[str]], account_sid: str
    ) -> tuple[httpx.Response | None, str]:
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
                response = await http.post(
                    url, data=form, auth=(self._username or account_sid, self._password)
                )
        except httpx.HTTPError as exc:
            return None, f"Twilio's API could not be reached: {type(exc).__name__}: {exc}"
        return response, ""

    async def redirect(self, account_sid: str, call_sid: str, twiml: str) -> str | None:
        """Give the live call new TwiML; None when Twilio took it, else why not."""
        url = f"{self.api_url}/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"
        response, error = await self._post(url, {"Twiml": twiml}, account_sid)
        if response is None:
            return error
        if response.is_success:
            return None
        return f"Twilio refused the redirect: {_said(response)}"

    async def transfer(self, account_sid: str, call_sid: str, transfer: CallTransfer) -> str | None:
        return await self.redirect(account_sid, call_sid, dial_twiml(transfer.target))


def _said(response: httpx.Response) -> str:
    """Twilio's error, from its JSON (`code`, `message`) or the start of the body."""
    try:
        body = response.json()
        said = f"{body.get('code')} {body.get('message')}"
    except (ValueError, AttributeError):
        said = response.text[:200]
    return f"HTTP {response.status_code}: {said}"


class TwilioPlacer:
    """Calls placed through Twilio (carrier_dialer.Placer). `auth_token` checks the callbacks'
    X-Twilio-Signature; it is also what lets the answered call's stream in (Twilio signs the
    handshake, and its stream URL takes no query string that could carry a key)."""

    via: Via = "twilio"

    def __init__(
        self,
        rest: TwilioRest | None,
        *,
        account_sid: str,
        caller_id: str,
        auth_token: str | None,
        ring_timeout_s: float,
    ) -> None:
        self.rest = rest
        self.account_sid = account_sid
        self.caller_id = caller_id
        self.auth_token = auth_token
        self.ring_timeout_s = ring_timeout_s

    def unavailable(self) -> str | None:
        if self.rest is None:
            return (
                "placing calls through twilio needs Twilio's REST API: set"
                " server.twilio_api_key and server.twilio_api_secret (or server.twilio_auth_token)"
            )
        if self.auth_token is None:
            return (
                "placing calls through twilio needs server.twilio_auth_token: Twilio signs the"
                " stream it connects back with it, and its stream URL can carry no key"
            )
        return None

    def stream_path(self, token: str) -> str:
        return "/twilio"  # the token goes in the TwiML's <Parameter>

    async def place(
        self, call: PlacedCall, stream_url: str, callback_url: str, *, amd: bool
    ) -> str | None:
        assert self.rest is not None
        sid, error = await self.rest.create_call(
            self.account_sid,
            to=call.to,
            caller_id=self.caller_id,
            twiml=stream_twiml(stream_url, call.token),
            status_url=callback_url,
            ring_timeout_s=self.ring_timeout_s,
            amd=amd,
        )
        call.carrier_id = sid
        return error

    def read_callback(self, call: PlacedCall, callback: Callback, stream_url: str) -> Reply:
        signature = callback.headers.get("X-Twilio-Signature", "")
        assert self.auth_token is not None
        if not valid_twilio_signature(callback.url, callback.form, signature, self.auth_token):
            raise CallbackRefused("the callback's X-Twilio-Signature is not Twilio's")
        return Reply(200, "<Response/>", "text/xml", parse_status(dict(callback.form)))
