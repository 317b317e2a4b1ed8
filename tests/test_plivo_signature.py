"""Plivo's V3 callback signature as Plivo computes it.

The expected values were computed with the algorithm of Plivo's own Python SDK (plivo 4.63.0,
`plivo.utils.signature_v3`), outside this project, for the auth token and nonce below: a
check against Plivo's definition rather than against this project's reading of it.
"""

from __future__ import annotations

import pytest

from voice_agent.callcontrol.plivo_rest import v3_signature

TOKEN = "plivo-token-123"
NONCE = "12345678901234567890"
CALLBACK = "https://control.example.com/callbacks/abc"

CASES = [
    pytest.param(
        "POST",
        f"{CALLBACK}?key=K-1_x",
        {"CallUUID": "x", "CallStatus": "busy", "HangupCause": "Busy Line"},
        "qahro20pG6qn185PGQjOxBhLXttNvRBHFF3cMHCj/p0=",
        id="a hangup post",
    ),
    pytest.param(
        "POST",
        f"{CALLBACK}?key=K",
        {},
        "sKZjngqfrJI6SjYllS1CGT5FbkqOcP8Oubm7DKl+ziI=",
        id="an empty post",
    ),
    pytest.param(
        "GET",
        f"{CALLBACK}?key=K&step=answer",
        {"CallUUID": "abc", "From": "+1312", "To": "+1555"},
        "jcQpWjyUTQ6N2XXcl7/S8tnfhz6pLJHeV7I+/6dvxxM=",
        id="the answer URL with Plivo's parameters",
    ),
    pytest.param(
        "GET",
        f"{CALLBACK}?key=K",
        {},
        "sKZjngqfrJI6SjYllS1CGT5FbkqOcP8Oubm7DKl+ziI=",
        id="a bare get",
    ),
    pytest.param(
        "POST",
        CALLBACK,
        {"b": "2", "a": "1"},
        "If55v/mS2Xyp6PHVwRow2Ftsv5vTkVC8R8jp+7KukxY=",
        id="a post to a URL without a query",
    ),
]


@pytest.mark.parametrize(("method", "url", "params", "expected"), CASES)
def test_the_signature_is_plivos(
    method: str, url: str, params: dict[str, str], expected: str
) -> None:
    assert v3_signature(TOKEN, method, url, params, NONCE) == expected


def test_a_changed_parameter_token_or_nonce_changes_it() -> None:
    form = {"CallUUID": "x", "CallStatus": "busy"}
    signed = v3_signature(TOKEN, "POST", f"{CALLBACK}?key=K", form, NONCE)
    assert (
        v3_signature(TOKEN, "POST", f"{CALLBACK}?key=K", {**form, "CallStatus": "completed"}, NONCE)
        != signed
    )
    assert v3_signature("another", "POST", f"{CALLBACK}?key=K", form, NONCE) != signed
    assert v3_signature(TOKEN, "POST", f"{CALLBACK}?key=K", form, NONCE + "0") != signed
    assert v3_signature(TOKEN, "POST", f"{CALLBACK}?key=L", form, NONCE) != signed
