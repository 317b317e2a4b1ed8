"""What the carriers' REST clients (telnyx_rest, plivo_rest, vonage_rest) share: one request whose
refusal comes back as a sentence naming the carrier and what it said, and the two kinds of
destination a transfer dials.

Every client returns None when the carrier took the request, else why not, as the pipeline's
`CallControl` wants it: the reason goes to the call's audit and, for a transfer, to the agent's
`transfer_failed` event. Nothing here raises for a carrier's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

TIMEOUT_S = 10.0
MAX_SAID_CHARS = 300  # of a carrier's error, in the audit and the agent's event


def is_sip(target: str) -> bool:
    """Whether the destination is a SIP URI (else a phone number or a tel: URI)."""
    return target.lower().startswith(("sip:", "sips:"))


def phone_number(target: str) -> str:
    """A phone-number destination as the carriers' APIs take it: `tel:` dropped."""
    return target[4:] if target.lower().startswith("tel:") else target


def body_text(response: httpx.Response) -> str:
    """A response's text, short enough for the audit: what a carrier said when it said no JSON."""
    return " ".join(response.text.split())[:MAX_SAID_CHARS] or "(no body)"


async def request(
    carrier: str,
    what: str,
    method: str,
    url: str,
    *,
    said: Callable[[Any], str | None],
    **options: Any,
) -> str | None:
    """One request to `carrier`'s API: None on a 2xx, else "<carrier> refused the <what>: HTTP
    <status>: <said>", where `said` reads the carrier's error JSON (None: it did not fit)."""
    _, error = await request_json(carrier, what, method, url, said=said, **options)
    return error


async def request_json(
    carrier: str,
    what: str,
    method: str,
    url: str,
    *,
    said: Callable[[Any], str | None],
    **options: Any,
) -> tuple[Any, str | None]:
    """`request`, with the 2xx answer's JSON (None when it had none) as well."""
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            response = await http.request(method, url, **options)
    except httpx.HTTPError as exc:
        return None, f"{carrier}'s API could not be reached: {type(exc).__name__}: {exc}"
    try:
        body = response.json()
    except ValueError:  # not JSON
        body = None
    if response.is_success:
        return body, None
    text = said(body) if body is not None else None
    if not text:
        text = body_text(response)
    error = f"{carrier} refused the {what}: HTTP {response.status_code}: {text[:MAX_SAID_CHARS]}"
    return None, error
