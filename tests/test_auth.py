"""Tests for voice_agent.server.auth: tokens, Twilio signatures, origins, rate limits, binding."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http
import json
from typing import Any

import pytest
from websockets.datastructures import Headers

from voice_agent.callcontrol.twilio_rest import twilio_signature, valid_twilio_signature
from voice_agent.errors import SecretError
from voice_agent.public_url import validate_public_url
from voice_agent.server import auth
from voice_agent.server.auth import (
    AccessPolicy,
    Decision,
    FailureLimiter,
    client_address,
    tokens_from_secrets,
)
from voice_agent.server.binding import check_bind, startup_notices
from voice_agent.server.pages import static_response

TOKEN = "tok-9f2c4e7a1b3d5c8e"
OTHER_TOKEN = "tok-other-0a1b2c3d4e"
TWILIO_TOKEN = "twilio-auth-token-5e6f"
PUBLIC = "https://voice.example.com"
IP = "203.0.113.7"
HOST = "localhost:8765"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def headers(*pairs: tuple[str, str], host: str | None = HOST) -> Headers:
    items = [("Host", host)] if host is not None else []
    return Headers([*items, *pairs])


def bearer(token: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


def policy(clock: Clock | None = None, **kwargs: Any) -> AccessPolicy:
    kwargs.setdefault("tokens", [TOKEN])
    return AccessPolicy(clock=clock or Clock(), **kwargs)


def reference_signature(url: str, params: dict[str, str], key: str) -> str:
    """Twilio's documented algorithm, written out independently of the module."""
    data = url + "".join(name + params[name] for name in sorted(params))
    return base64.b64encode(hmac.new(key.encode(), data.encode(), hashlib.sha1).digest()).decode()


# ---- Twilio signatures --------------------------------------------------------------------

# The example in Twilio's webhook security docs (TwilioDevEd/api-snippets,
# security/signature_validation): auth token 12345, this URL and these POST parameters.
DOC_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
DOC_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+14158675309",
    "Digits": "1234",
    "From": "+14158675309",
    "To": "+18005551212",
}
DOC_SIGNATURE = "RSOYDt4T1cUTdK1PDd93/VVr8B8="


def test_twilio_signature_matches_twilios_published_example() -> None:
    assert twilio_signature(DOC_URL, DOC_PARAMS, "12345") == DOC_SIGNATURE
    assert valid_twilio_signature(DOC_URL, DOC_PARAMS, DOC_SIGNATURE, "12345")


def test_twilio_signature_matches_an_independent_implementation() -> None:
    url = "wss://voice.example.com/twilio"
    assert twilio_signature(url, {}, TWILIO_TOKEN) == reference_signature(url, {}, TWILIO_TOKEN)
    params = {"b": "2", "a": "1", "Z": "x"}
    assert twilio_signature(url, params, "k") == reference_signature(url, params, "k")


def test_twilio_signature_sorts_a_repeated_parameters_values() -> None:
    together = twilio_signature("https://x/y", {"p": ["b", "a"]}, "k")
    assert together == reference_signature("https://x/y", {"p": "a", "pb": ""}, "k")


@pytest.mark.parametrize(
    ("url", "params", "signature", "key"),
    [
        ("https://mycompany.com/myapp.php?foo=1&bar=3", DOC_PARAMS, DOC_SIGNATURE, "12345"),
        ("https://evil.example/myapp.php?foo=1&bar=2", DOC_PARAMS, DOC_SIGNATURE, "12345"),
        (DOC_URL, {**DOC_PARAMS, "Digits": "9999"}, DOC_SIGNATURE, "12345"),
        (DOC_URL, DOC_PARAMS, DOC_SIGNATURE, "12346"),
        (DOC_URL, DOC_PARAMS, "", "12345"),
        (DOC_URL, DOC_PARAMS, DOC_SIGNATURE.lower(), "12345"),
        (DOC_URL, DOC_PARAMS, DOC_SIGNATURE + " ", "12345"),
        (DOC_URL, DOC_PARAMS, "ünïcode\udcff", "12345"),
        (DOC_URL, DOC_PARAMS, DOC_SIGNATURE, ""),
    ],
)
def test_twilio_signature_refuses_any_change(
    url: str, params: dict[str, str], signature: str, key: str
) -> None:
    assert not valid_twilio_signature(url, params, signature, key)


# ---- /twilio -------------------------------------------------------------------------------


def twilio_policy(clock: Clock | None = None, **kwargs: Any) -> AccessPolicy:
    kwargs.setdefault("twilio_auth_token", TWILIO_TOKEN)
    kwargs.setdefault("public_url", PUBLIC)
    return policy(clock, **kwargs)


def signed(url: str) -> tuple[str, str]:
    return ("X-Twilio-Signature", twilio_signature(url, {}, TWILIO_TOKEN))


@pytest.mark.parametrize(
    "url",
    [
        "wss://voice.example.com/twilio",
        "https://voice.example.com/twilio",
        "wss://voice.example.com:443/twilio",
    ],
)
def test_twilio_upgrade_with_a_valid_signature_is_allowed(url: str) -> None:
    decision = twilio_policy().check("/twilio", headers(signed(url), host="10.0.0.5:8765"), IP)
    assert decision.allowed and decision.via == "twilio-signature"


def test_twilio_signature_covers_the_query_string() -> None:
    url = "wss://voice.example.com/twilio?agent=concierge"
    check = twilio_policy().check
    assert check("/twilio?agent=concierge", headers(signed(url)), IP).allowed
    assert check("/twilio?agent=other", headers(signed(url)), IP).status == 403


def test_twilio_signature_replayed_on_another_url_is_refused() -> None:
    p = twilio_policy()
    for url in (
        "wss://attacker.example/twilio",  # the same account's signature for another app
        "wss://voice.example.com/ws",
        "wss://voice.example.com/twilio/",
        "wss://voice.example.com:8443/twilio",
    ):
        decision = p.check("/twilio", headers(signed(url)), IP)
        assert decision.status == http.HTTPStatus.FORBIDDEN, url
        assert decision.reason == "invalid X-Twilio-Signature"


def test_a_twilio_signature_only_opens_twilio() -> None:
    url = "wss://voice.example.com/ws"
    assert twilio_policy().check("/ws", headers(signed(url)), IP).status == 401


def test_forged_or_doubled_twilio_signatures_are_refused_and_count() -> None:
    clock = Clock()
    p = twilio_policy(clock, max_failed_auth_per_minute=2)
    forged = ("X-Twilio-Signature", base64.b64encode(b"x" * 20).decode())
    assert p.check("/twilio", headers(forged), IP).status == 403
    good = signed("wss://voice.example.com/twilio")
    assert p.check("/twilio", headers(good, good), IP).status == 403
    assert p.check("/twilio", headers(good), IP).status == 429


def test_twilio_without_signature_is_refused_unless_a_valid_token_is_presented() -> None:
    p = twilio_policy()
    missing = p.check("/twilio", headers(), IP)
    assert missing.status == 403 and "X-Twilio-Signature" in missing.reason
    assert p.check("/twilio", headers(bearer(TOKEN)), IP).via == "token"
    assert p.check(f"/twilio?token={TOKEN}", headers(), IP).allowed
    assert p.check("/twilio", headers(bearer(OTHER_TOKEN)), IP).status == 401


def test_twilio_with_only_a_twilio_token_needs_the_signature() -> None:
    p = twilio_policy(tokens=[])
    assert p.check("/twilio", headers(), IP).status == 403
    assert p.check("/twilio", headers(bearer("anything")), IP).status == 403
    assert p.check("/twilio", headers(signed("wss://voice.example.com/twilio")), IP).allowed
    assert p.check("/ws", headers(), IP).via == "no-token-configured"


def test_twilio_url_is_rebuilt_from_forwarded_headers_without_public_url() -> None:
    p = twilio_policy(public_url=None)
    url = "wss://abc.ngrok.app/twilio"
    forwarded = headers(signed(url), ("X-Forwarded-Proto", "https"), host="abc.ngrok.app")
    assert p.check("/twilio", forwarded, IP).allowed
    assert p.check("/twilio", headers(signed(url), host="abc.ngrok.app"), IP).allowed
    proxied = headers(signed(url), ("X-Forwarded-Host", "abc.ngrok.app"), host="127.0.0.1:8765")
    assert p.check("/twilio", proxied, IP).allowed
    plain = headers(signed(url), ("X-Forwarded-Proto", "http"), host="abc.ngrok.app")
    assert p.check("/twilio", plain, IP).status == 403


def test_twilio_url_keeps_public_urls_path_prefix() -> None:
    p = twilio_policy(public_url="https://example.com/voice/")
    assert p.check("/twilio", headers(signed("wss://example.com/voice/twilio")), IP).allowed
    assert p.check("/twilio", headers(signed("wss://example.com/twilio")), IP).status == 403


def test_twilio_without_its_auth_token_follows_the_bearer_rule() -> None:
    p = policy()
    assert p.check("/twilio", headers(), IP).status == 401
    assert p.check("/twilio", headers(signed("wss://voice.example.com/twilio")), IP).status == 401
    assert p.check(f"/twilio?token={TOKEN}", headers(), IP).allowed


# ---- bearer tokens ------------------------------------------------------------------------

GATED = [
    "/agents",
    "/calls",
    "/calls/abc123",
    "/metrics",
    "/ws",
    "/rtc",
    "/nothing-here",
    "/calls/../healthz",
    "/healthz/../calls",
    "/healthz/",
    "/Healthz",
    "//agents",
    "/%61gents",
    "/./calls",
    "/static",
    "/calls/a/b/view",
    "/calls//view",
    "/calls/view/x",
    "/view",
    "http://localhost:8765/calls",
    "*",
    "",
]


@pytest.mark.parametrize("path", GATED)
def test_every_other_path_needs_a_token(path: str) -> None:
    p = policy()
    refused = p.check(path, headers(), IP)
    assert refused.status == http.HTTPStatus.UNAUTHORIZED
    assert dict(refused.headers)["WWW-Authenticate"] == 'Bearer realm="voice_agent"'
    assert p.check(path, headers(bearer(TOKEN)), IP).via == "token"


@pytest.mark.parametrize(
    "path",
    [
        "/healthz",
        "/healthz?verbose=1",
        "/",
        "/?token=wrong",
        "/calls/view",
        "/calls/view/?token=wrong",
        "/calls/CA123/view",
        "/calls/CA123/view/?token=wrong",
    ],
)
def test_health_and_the_page_shells_are_open(path: str) -> None:
    p = policy()
    assert p.check(path, headers(), IP).via == "open"
    assert len(p.limiter) == 0  # a wrong ?token= on an open path is no attempt


@pytest.mark.parametrize("path", ["/static/app.js", "/static/../calls", "/static/%2e%2e/calls"])
def test_static_is_open_because_the_router_only_serves_files_there(path: str) -> None:
    assert policy().check(path, headers(), IP).via == "open"
    response = static_response(path)
    assert response is not None
    if path != "/static/app.js":
        assert response.status_code == 404


@pytest.mark.parametrize("path", ["/ws", "/rtc", "/agents", "/twilio", "/calls", "/calls/CA1"])
def test_query_token_counts_where_browsers_need_it(path: str) -> None:
    assert policy().check(f"{path}?token={TOKEN}&agent=x", headers(), IP).allowed


@pytest.mark.parametrize("path", ["/metrics", "/nothing", "/agents/", "/rtc/x", "/callsx"])
def test_query_token_does_not_count_elsewhere(path: str) -> None:
    p = policy()
    decision = p.check(f"{path}?token={TOKEN}", headers(), IP)
    assert decision.status == 401 and "?token=" not in decision.reason
    assert len(p.limiter) == 0


@pytest.mark.parametrize(
    "request_headers",
    [
        [("Cookie", f"token={TOKEN}")],
        [("X-Api-Token", TOKEN)],
        [("X-Authorization", f"Bearer {TOKEN}")],
        [("Authorization", f"Token {TOKEN}")],
        [("Authorization", TOKEN)],
        [("Authorization", "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode())],
        [("Proxy-Authorization", f"Bearer {TOKEN}")],
    ],
)
def test_a_token_anywhere_else_does_not_count(request_headers: list[tuple[str, str]]) -> None:
    p = policy()
    decision = p.check("/ws", headers(*request_headers), IP)
    assert decision.status == 401 and decision.reason.startswith("an API token is required")


@pytest.mark.parametrize(
    "query", [f"access_token={TOKEN}", f"Token={TOKEN}", f"tok={TOKEN}", f"x=1&bearer={TOKEN}"]
)
def test_other_query_names_do_not_count(query: str) -> None:
    assert policy().check(f"/ws?{query}", headers(), IP).status == 401


@pytest.mark.parametrize(
    "given",
    [
        TOKEN.upper(),
        TOKEN + " ",
        " " + TOKEN + "x",
        TOKEN + "\t",
        TOKEN[:-1],
        TOKEN + "0",
        TOKEN[1:],
        "",
        "ünïcødé-tøkén",
        "x" * 10_000,
    ],
)
def test_a_near_miss_token_is_invalid(given: str) -> None:
    p = policy()
    for path in (f"/ws?token={given}", "/calls"):
        extra = [] if path.startswith("/ws") else [("Authorization", f"Bearer {given}")]
        decision = p.check(path, headers(*extra), IP)
        assert decision.status == 401, (path, given)
    refused = p.check("/calls", headers(bearer(TOKEN + " ")), IP)
    assert refused.reason == "invalid API token"
    assert dict(refused.headers)["WWW-Authenticate"].endswith('error="invalid_token"')


def test_the_scheme_name_is_case_insensitive_and_any_configured_token_works() -> None:
    p = policy(tokens=[TOKEN, OTHER_TOKEN])
    assert p.check("/calls", headers(("Authorization", f"bearer {TOKEN}")), IP).allowed
    assert p.check("/calls", headers(("Authorization", f"BEARER  {OTHER_TOKEN}")), IP).allowed


def test_every_presented_credential_must_be_valid() -> None:
    p = policy()
    both = headers(bearer(TOKEN), bearer(OTHER_TOKEN))
    assert p.check("/calls", both, IP).status == 401
    assert p.check(f"/ws?token={OTHER_TOKEN}", headers(bearer(TOKEN)), IP).status == 401
    assert p.check(f"/ws?token={TOKEN}&token=x", headers(), IP).status == 401
    assert p.check(f"/ws?token={TOKEN}", headers(bearer(TOKEN)), IP).allowed


def test_an_empty_bearer_is_a_failed_attempt() -> None:
    p = policy()
    assert p.check("/calls", headers(("Authorization", "Bearer")), IP).status == 401
    assert p.check("/calls", headers(("Authorization", "Bearer ")), IP).status == 401
    assert len(p.limiter) == 1


def test_tokens_are_compared_in_constant_time_against_every_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    p = policy(tokens=[TOKEN, OTHER_TOKEN, "third-token-xyz"])
    assert p.check("/calls", headers(bearer(TOKEN)), IP).allowed
    # All three compared, though the first matched; fixed-length digests, not the tokens.
    assert len(compared) == 3
    assert all(len(a) == len(b) == 32 for a, b in compared)


def test_without_tokens_everything_is_open_on_loopback() -> None:
    p = policy(tokens=[])
    for path in ["/calls", "/agents", "/ws", "/rtc", "/twilio", "/metrics"]:
        assert p.check(path, headers(), IP).via == "no-token-configured"
    assert p.check("/calls", headers(bearer("whatever")), IP).allowed


def test_refusals_never_echo_the_credential() -> None:
    p = policy(clock=Clock(), max_failed_auth_per_minute=2)
    secret_guess = "guess-SECRET-8d7c"
    cases = [
        p.check("/calls", headers(bearer(secret_guess)), IP),
        p.check(f"/ws?token={secret_guess}", headers(), IP),
        p.check(f"/ws?token={secret_guess}", headers(), IP),
        p.check(f"/rtc?token={TOKEN}", headers(("Origin", "https://evil.example")), "10.1.1.1"),
    ]
    assert [d.status for d in cases] == [401, 401, 429, 403]
    for decision in cases:
        text = decision.response().body.decode() + repr(decision)
        assert secret_guess not in text and TOKEN not in text


# ---- origins ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://localhost:8765", "localhost:8765", True),
        ("http://LOCALHOST:8765", "localhost:8765", True),
        ("https://voice.example.com", "voice.example.com:443", True),
        ("http://[::1]:8765", "[::1]:8765", True),
        ("http://localhost:8766", "localhost:8765", False),
        ("https://localhost:8765", "localhost:8765", True),  # same host:port, as specified
        ("http://127.0.0.1:8765", "localhost:8765", False),
        ("https://evil.example", "localhost:8765", False),
        ("https://localhost:8765.evil.example", "localhost:8765", False),
        ("null", "localhost:8765", False),
        ("", "localhost:8765", False),
        ("http://user@localhost:8765", "localhost:8765", False),
    ],
)
def test_origin_must_be_the_servers_own(origin: str, host: str, allowed: bool) -> None:
    p = policy()
    decision = p.check(f"/rtc?token={TOKEN}", headers(("Origin", origin), host=host), IP)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.status == 403 and "webrtc.allowed_origins" in decision.reason
    assert len(p.limiter) == 0  # a wrong origin is not a failed authentication


def test_configured_and_public_origins_may_call() -> None:
    p = policy(
        allowed_origins=["https://App.Example.org:443/", "http://partner.example:8080"],
        public_url="wss://voice.example.com/prefix",
    )
    for origin in [
        "https://app.example.org",
        "http://partner.example:8080",
        "https://voice.example.com",
    ]:
        request = headers(bearer(TOKEN), ("Origin", origin), host="127.0.0.1:8765")
        assert p.check("/rtc", request, IP).allowed, origin
    request = headers(bearer(TOKEN), ("Origin", "http://partner.example"), host="127.0.0.1:8765")
    assert p.check("/rtc", request, IP).status == 403


def test_origin_checks_apply_to_ws_and_api_but_not_to_non_browsers() -> None:
    p = policy()
    evil = ("Origin", "https://evil.example")
    assert p.check(f"/ws?token={TOKEN}", headers(evil), IP).status == 403
    assert p.check("/calls", headers(bearer(TOKEN), evil), IP).status == 403
    assert p.check(f"/ws?token={TOKEN}", headers(), IP).allowed
    assert p.check("/", headers(evil), IP).allowed  # the public page shell
    assert p.check("/rtc", headers(evil, evil, bearer(TOKEN)), IP).status == 403
    # Without tokens the origin check is what stops other sites' pages (CSWSH).
    assert policy(tokens=[]).check("/ws", headers(evil), IP).status == 403


# ---- DNS rebinding guard (no tokens, loopback only) ---------------------------------------


@pytest.mark.parametrize(
    "host",
    ["localhost:8765", "127.0.0.1:8765", "127.5.5.5", "[::1]:8765", "app.localhost:8765", None],
)
def test_tokenless_server_answers_loopback_host_names(host: str | None) -> None:
    assert policy(tokens=[]).check("/calls", headers(host=host), IP).allowed


@pytest.mark.parametrize(
    "host", ["evil.example:8765", "192.168.1.20:8765", "localhost.evil.example"]
)
def test_tokenless_server_refuses_other_host_names(host: str) -> None:
    p = policy(tokens=[])
    for path in ["/calls", "/", "/rtc", "/static/app.js"]:
        assert p.check(path, headers(host=host), IP).status == 403
    assert p.check("/healthz", headers(host=host), IP).allowed
    assert (
        policy(tokens=[], public_url=f"https://{host}")
        .check("/calls", headers(host=host), IP)
        .allowed
    )
    assert policy(tokens=[], allow_public=True).check("/calls", headers(host=host), IP).allowed
    assert policy().check("/calls", headers(bearer(TOKEN), host=host), IP).allowed


def test_tokenless_server_accepts_its_public_url_host() -> None:
    p = policy(tokens=[], public_url="https://abc.ngrok.app")
    assert p.check("/calls", headers(host="abc.ngrok.app"), IP).allowed
    assert p.check("/calls", headers(host="abd.ngrok.app"), IP).status == 403


# ---- rate limiting ------------------------------------------------------------------------


def test_rate_limit_kicks_in_blocks_the_right_token_and_recovers() -> None:
    clock = Clock()
    p = policy(clock, max_failed_auth_per_minute=3)
    for _ in range(3):
        assert p.check("/calls", headers(bearer("wrong")), IP).status == 401
        clock.now += 1
    blocked = p.check("/calls", headers(bearer(TOKEN)), IP)
    assert blocked.status == http.HTTPStatus.TOO_MANY_REQUESTS
    assert dict(blocked.headers)["Retry-After"] == "57"
    assert p.check("/healthz", headers(), IP).allowed and p.check("/", headers(), IP).allowed
    assert p.check("/calls", headers(bearer(TOKEN)), "198.51.100.1").allowed  # others unaffected
    clock.now += 56.5
    assert dict(p.check("/calls", headers(), IP).headers)["Retry-After"] == "1"
    clock.now += 0.5
    assert p.check("/calls", headers(bearer(TOKEN)), IP).allowed


def test_rate_limit_window_slides() -> None:
    clock = Clock()
    p = policy(clock, max_failed_auth_per_minute=3)
    for at in (0, 30, 40):
        clock.now = 1000 + at
        p.check("/calls", headers(bearer("wrong")), IP)
    clock.now = 1059
    assert p.check("/calls", headers(bearer(TOKEN)), IP).status == 429
    clock.now = 1060  # the failure at 0 left the window
    assert p.check("/calls", headers(bearer(TOKEN)), IP).allowed
    clock.now = 1061
    p.check("/calls", headers(bearer("wrong")), IP)  # 30, 40, 61: three in a minute again
    blocked = p.check("/calls", headers(bearer(TOKEN)), IP)
    assert blocked.status == 429 and dict(blocked.headers)["Retry-After"] == "29"


def test_blocked_attempts_and_successes_do_not_count() -> None:
    clock = Clock()
    p = policy(clock, max_failed_auth_per_minute=2)
    for _ in range(50):
        assert p.check("/calls", headers(bearer(TOKEN)), IP).allowed
        assert p.check("/calls", headers(), IP).status == 401  # no credential: no attempt
    p.check("/calls", headers(bearer("a")), IP)
    p.check("/calls", headers(bearer("b")), IP)
    for _ in range(20):
        clock.now += 1
        assert p.check("/calls", headers(bearer("c")), IP).status == 429
    clock.now = 1000 + 60
    assert p.check("/calls", headers(bearer(TOKEN)), IP).allowed


def test_ipv6_addresses_share_their_64() -> None:
    p = policy(Clock(), max_failed_auth_per_minute=2)
    p.check("/calls", headers(bearer("x")), "2001:db8:1:2::1")
    p.check("/calls", headers(bearer("x")), "2001:db8:1:2:ffff::9")
    assert p.check("/calls", headers(bearer(TOKEN)), "2001:db8:1:2::abcd").status == 429
    assert p.check("/calls", headers(bearer(TOKEN)), "2001:db8:1:3::1").allowed
    q = policy(Clock(), max_failed_auth_per_minute=1)
    q.check("/calls", headers(bearer("x")), "::ffff:192.0.2.1")
    assert q.check("/calls", headers(bearer(TOKEN)), "192.0.2.1").status == 429


def test_limiter_memory_stays_bounded() -> None:
    clock = Clock()
    limiter = FailureLimiter(5, clock=clock, max_tracked=100)
    for n in range(5000):
        limiter.record_failure(f"10.0.{n // 256}.{n % 256}")
        for _ in range(3):
            limiter.record_failure("192.0.2.9")  # keeps at most max_failures times
    assert len(limiter) <= 100
    assert all(len(times) <= 5 for times in limiter._failures.values())
    clock.now += 61
    limiter.record_failure("198.51.100.1")
    assert len(limiter) == 1  # every stale address dropped


def test_limiter_rejects_a_zero_limit() -> None:
    with pytest.raises(ValueError):
        FailureLimiter(0)


# ---- binding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST", "::ffff:127.0.0.1"]
)
def test_loopback_binding_needs_no_token(host: str) -> None:
    assert check_bind(host, has_tokens=False, allow_public=False) is None


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "192.168.1.10", "10.0.0.1", "example.com", "myhost", "127.1"]
)
def test_public_binding_without_token_is_refused_unless_overridden(host: str) -> None:
    message = check_bind(host, has_tokens=False, allow_public=False)
    assert message is not None
    assert "server.api_tokens" in message and "allow_public_without_token" in message
    assert check_bind(host, has_tokens=True, allow_public=False) is None
    assert check_bind(host, has_tokens=False, allow_public=True) is None


def test_startup_notices() -> None:
    loopback = startup_notices(
        "127.0.0.1", has_tokens=False, allow_public=False, twilio_configured=False, public_url=None
    )
    assert len(loopback) == 1 and "loopback only" in loopback[0]
    public = startup_notices(
        "0.0.0.0", has_tokens=False, allow_public=True, twilio_configured=False, public_url=None
    )
    assert public[0].startswith("WARNING") and "WITHOUT an API token" in public[0]
    twilio = startup_notices(
        "0.0.0.0", has_tokens=True, allow_public=False, twilio_configured=True, public_url=None
    )
    assert len(twilio) == 1 and "server.public_url" in twilio[0]
    no_twilio = startup_notices(
        "0.0.0.0", has_tokens=True, allow_public=False, twilio_configured=False, public_url=PUBLIC
    )
    assert len(no_twilio) == 1 and "/twilio refuses" in no_twilio[0]


# ---- helpers ------------------------------------------------------------------------------


def test_tokens_from_secrets() -> None:
    secrets = {"API_TOKEN": TOKEN, "OTHER": OTHER_TOKEN, "DUP": TOKEN}
    assert tokens_from_secrets(["API_TOKEN", "DUP", "OTHER"], secrets) == [TOKEN, OTHER_TOKEN]
    with pytest.raises(SecretError, match="MISSING") as error:
        tokens_from_secrets(["API_TOKEN", "MISSING"], secrets)
    assert TOKEN not in str(error.value)


def test_refusal_response() -> None:
    decision = Decision(429, "slow down", (("Retry-After", "7"),))
    response = decision.response()
    assert response.status_code == 429
    assert json.loads(response.body) == {"error": "slow down"}
    assert response.headers["Retry-After"] == "7"
    assert response.headers["Content-Type"] == "application/json"
    assert not decision.allowed


def test_client_address() -> None:
    forwarded = Headers(
        [("X-Forwarded-For", "198.51.100.9, 10.0.0.2"), ("X-Forwarded-For", "10.0.0.3")]
    )
    assert client_address("203.0.113.5", forwarded) == "203.0.113.5"
    assert client_address("203.0.113.5", forwarded, ["10.0.0.0/8"]) == "203.0.113.5"
    assert client_address("10.0.0.3", forwarded, ["10.0.0.0/8"]) == "198.51.100.9"
    assert client_address("10.0.0.3", Headers(), ["10.0.0.0/8"]) == "10.0.0.3"
    spoofed = Headers([("X-Forwarded-For", "10.9.9.9")])
    assert client_address("10.0.0.3", spoofed, ["10.0.0.0/8"]) == "10.0.0.3"
    assert client_address(None, forwarded) == "unknown"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://voice.example.com/", "https://voice.example.com"),
        ("wss://voice.example.com:8443/prefix", "wss://voice.example.com:8443/prefix"),
    ],
)
def test_validate_public_url(url: str, expected: str) -> None:
    assert validate_public_url(url) == expected


@pytest.mark.parametrize(
    "url",
    ["voice.example.com", "ftp://x.example", "https://", "https://x.example/?a=1", "https://x#f"],
)
def test_validate_public_url_refuses(url: str) -> None:
    with pytest.raises(ValueError):
        validate_public_url(url)
