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
"""

from __future__ import annotations

from xml.sax.saxutils import escape

import httpx

from voice_agent.runtime.call_control import CallTransfer

DEFAULT_API_URL = "https://api.twilio.com"
TIMEOUT_S = 10.0


def dial_twiml(target: str) -> str:
    """The TwiML that hands the call to `target`: `<Dial><Sip>` for a SIP URI, else a number."""
    if target.lower().startswith(("sip:", "sips:")):
        return f"<Response><Dial><Sip>{escape(target)}</Sip></Dial></Response>"
    number = target[4:] if target.lower().startswith("tel:") else target
    return f"<Response><Dial>{escape(number)}</Dial></Response>"


class TwilioRest:
    """`username` None: the call's account SID (with the auth token as `password`)."""

    def __init__(self, username: str | None, password: str, api_url: str = DEFAULT_API_URL) -> None:
        self._username = username
        self._password = password
        self.api_url = api_url.rstrip("/")

    async def redirect(self, account_sid: str, call_sid: str, twiml: str) -> str | None:
        """Give the live call new TwiML; None when Twilio took it, else why not."""
        url = f"{self.api_url}/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
                response = await http.post(
                    url,
                    data={"Twiml": twiml},
                    auth=(self._username or account_sid, self._password),
                )
        except httpx.HTTPError as exc:
            return f"Twilio's API could not be reached: {type(exc).__name__}: {exc}"
        if response.is_success:
            return None
        try:
            body = response.json()
            said = f"{body.get('code')} {body.get('message')}"
        except ValueError:
            said = response.text[:200]
        return f"Twilio refused the redirect: HTTP {response.status_code}: {said}"

    async def transfer(self, account_sid: str, call_sid: str, transfer: CallTransfer) -> str | None:
        return await self.redirect(account_sid, call_sid, dial_twiml(transfer.target))
