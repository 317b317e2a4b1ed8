"""Who may use the server: bearer tokens, Twilio signatures, origins, failure rate limits.

Sans-I/O: `AccessPolicy.check` decides from the request target, its headers and the peer address
and returns a `Decision`; the server turns a refusal into an HTTP response before any WebSocket
handshake. The clock is injected so the failure limiter can be tested without sleeping.

What each path needs (the first matching rule wins):

* `/healthz` is always open: load balancers and Docker's HEALTHCHECK call it without a token,
  and it reveals only status, version and counts.
* The browser pages are open: `/`, the call viewer's `/calls/view` and `/calls/{id}/view`
  (exactly the paths `pages.calls_view_response` answers) and `/static/<name>`. They are
  public files holding nothing secret: each page reads `?token=` from its own URL and passes
  it on to the gated API (`/agents`, `/calls`, `/rtc`), so opened without a token it shows
  the API's 401 message. This holds only while the router answers these paths with the page
  (viewer pages before the `/calls/{id}` branch) and every `/static/` path with
  `pages.static_response` (a file or a 404), never with data.
* `/twilio` accepts a valid `X-Twilio-Signature` when Twilio's auth token is configured; Twilio
  cannot send our bearer token, and `<Stream url>` takes no query string (Twilio's docs), so
  the signature is the only credential a real Twilio call can carry. A valid bearer token is
  accepted too (test clients, a gateway of our own): whoever holds one may use `/ws` anyway.
  Without a Twilio auth token, `/twilio` follows the bearer rule like `/ws`: with API tokens
  configured, real Twilio calls are then refused (fail closed), and `startup_notices` says so.
* `/plivo/dial` is open: Plivo fetches a transfer's XML from it and cannot send our token. Each
  URL carries its own HMAC, which the page checks (callcontrol/plivo_rest.py); it only ever
  repeats a `<Dial>` the server signed.
* Everything else (`/agents`, `/calls`, `/calls/{id}`, `/metrics`, `/ws`, `/rtc`, and any
  unknown or odd-looking path such as `/calls/../x` or `//agents`) needs a bearer token when
  tokens are configured: default deny, decided on the same raw path the router matches.

Where a token may be: `Authorization: Bearer <token>`, always; `?token=<token>` only where a
browser needs it (`query_token_accepted`): the WebSocket endpoints, which browsers cannot
give headers, and the API the pages fetch (`/agents`, `/calls`, `/calls/{id}`). A query token
elsewhere (`/metrics`: scrapers send headers), a cookie, another header or `?access_token=`
do not count: query strings end up in access logs and browser history, so they are accepted
only where nothing else works. When several credentials are presented, all must be valid.

Only presented-and-wrong credentials (a wrong token, a bad Twilio signature) count as failed
authentication: a page opened without `?token=` is refused, but does not lock its user out.

Origins: a request with an Origin header (a browser's WebSocket upgrade or cross-site request)
to a gated path must come from the server's own origin, `public_url`'s or a configured one,
with or without tokens: without tokens it is what stops other sites' pages from calling.
"""

from __future__ import annotations

import hashlib
import hmac
import http
import ipaddress
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Response

from voice_agent.callcontrol.plivo_rest import PLIVO_DIAL_PATH  # open: signed per URL (above)
from voice_agent.callcontrol.twilio_rest import TWILIO_SIGNATURE_HEADER, valid_twilio_signature
from voice_agent.errors import SecretError
from voice_agent.public_url import DEFAULT_PORTS, validate_public_url
from voice_agent.server.binding import is_loopback_host
from voice_agent.server.pages import STATIC_PREFIX, calls_view_response
from voice_agent.server.paths import CALL_PATHS, CARRIER_PATHS, TWILIO_PATH

HEALTH_PATH = "/healthz"
# Paths that take `?token=`: browsers cannot set headers on a WebSocket, and the pages' fetches
# carry the token they were opened with (plus `/calls/{id}`, see `query_token_accepted`);
# Asterisk's websocket_client.conf and the carriers' stream URLs can only put it in the URL.
PLACED_CALL_PARAM = "placed_call"  # callcontrol/placed_calls.py PLACED_ARG
QUERY_TOKEN_PATHS = frozenset({*CALL_PATHS, "/agents", "/calls"})
CALLS_PREFIX = "/calls/"
WINDOW_S = 60.0  # the failure limiter's sliding window
REALM = "voice_agent"


class HeaderLookup(Protocol):
    """What `check` needs of request headers; `websockets.datastructures.Headers` has it."""

    def get_all(self, key: str) -> list[str]: ...


@dataclass(frozen=True)
class Decision:
    """Allow (status 200) or a refusal with its status, a short reason and headers to add.

    `reason` is safe to send and to log: it never contains a presented credential.
    `via` says what let an allowed request in ("open", "token", "twilio-signature",
    "no-token-configured"), for logs.
    """

    status: int
    reason: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    via: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == http.HTTPStatus.OK

    def response(self) -> Response:
        """The HTTP response for a refusal: JSON `{"error": reason}` plus the headers."""
        status = http.HTTPStatus(self.status)
        body = json.dumps({"error": self.reason}, ensure_ascii=False).encode()
        headers = Headers(
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                *self.headers,
            ]
        )
        return Response(status.value, status.phrase, headers, body)


def query_token_accepted(path: str) -> bool:
    """Whether `?token=` counts on `path` (the path alone, without its query string)."""
    return path in QUERY_TOKEN_PATHS or path.startswith(CALLS_PREFIX)


def is_page(path: str) -> bool:
    """The open browser pages (see the module docstring), by the path alone."""
    return path == "/" or path.startswith(STATIC_PREFIX) or calls_view_response(path) is not None


def _allow(via: str) -> Decision:
    return Decision(http.HTTPStatus.OK, via=via)


# ---- tokens -------------------------------------------------------------------------------


def tokens_from_secrets(names: Sequence[str], secrets: Mapping[str, str]) -> list[str]:
    """The values of the secrets named by `server.api_tokens`, in order, without duplicates.

    A name with no secret is an error rather than a silently open server.
    """
    tokens: list[str] = []
    for name in names:
        if name not in secrets:
            raise SecretError(
                f"server.api_tokens names secret {name!r}, which is not set: "
                f"set it with: voice-agent secrets set {name}"
            )
        value = secrets[name]
        if value not in tokens:
            tokens.append(value)
    return tokens


def _digest(value: str) -> bytes:
    # Comparing fixed-length digests keeps even the token's length out of the timing.
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def _matches_any(given: str, digests: Sequence[bytes]) -> bool:
    """Constant-time comparison against every configured token, without stopping early."""
    presented = _digest(given)
    found = False
    for expected in digests:
        found |= hmac.compare_digest(presented, expected)
    return found


def _split_netloc(netloc: str) -> tuple[str, str | None]:
    """(host, port or None) of a Host header or URL netloc; IPv6 hosts keep their brackets."""
    netloc = netloc.strip()
    if netloc.startswith("["):
        end = netloc.find("]")
        if end == -1:
            return netloc, None
        rest = netloc[end + 1 :]
        return netloc[: end + 1], rest[1:] if rest.startswith(":") else None
    host, sep, port = netloc.rpartition(":")
    if sep and ":" not in host:
        return host, port
    return netloc, None  # no port, or an unbracketed IPv6 address


def _port_variants(scheme: str, netloc: str) -> list[str]:
    """The netloc as given, and with the scheme's default port removed or added.

    Twilio's own validators try both: which form it signs depends on how the URL was written.
    """
    default = DEFAULT_PORTS.get(scheme)
    host, port = _split_netloc(netloc)
    if port is None:
        return [netloc, f"{host}:{default}"]
    if port == default:
        return [netloc, host]
    return [netloc]


# ---- origins and hosts --------------------------------------------------------------------


def _normalise_origin(origin: str) -> str | None:
    """`scheme://host[:port]`, lowercased, default port dropped; None if not an origin."""
    parts = urlsplit(origin.strip())
    scheme = parts.scheme.lower()
    try:
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not scheme or not host or parts.path not in ("", "/") or parts.query or parts.username:
        return None
    host = host.rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    if port is not None and str(port) != DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


def _origin_of(public_url: str) -> str | None:
    """The origin of the pages served at `public_url` (ws:// and wss:// name http and https)."""
    parts = urlsplit(public_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
    return _normalise_origin(f"{scheme}://{parts.netloc}")


def _host_and_port(netloc: str, scheme: str) -> str:
    """A Host header or URL netloc, lowercased and without the scheme's default port."""
    host, port = _split_netloc(netloc.lower())
    host = host.rstrip(".")
    if port is None or port == DEFAULT_PORTS.get(scheme):
        return host
    return f"{host}:{port}"


def _hostname(netloc: str) -> str:
    """The host part of a Host header or URL netloc: no port, no brackets, lowercased."""
    host, _ = _split_netloc(netloc.lower())
    return host.strip("[]").rstrip(".")


# ---- client address -----------------------------------------------------------------------


def client_address(
    peer: str | None, headers: HeaderLookup, trusted_proxies: Sequence[str] = ()
) -> str:
    """The caller's address: the peer's, or behind trusted proxies, from X-Forwarded-For.

    Only when the peer is one of `trusted_proxies` (addresses or CIDR networks): each proxy
    appends the address it saw, so the right-most entry that is not a trusted proxy is the
    client. An untrusted peer could write anything into the header, so it is ignored then.
    """
    if peer is None or not is_trusted_proxy(peer, trusted_proxies):
        return peer or "unknown"
    hops = [hop.strip() for value in headers.get_all("X-Forwarded-For") for hop in value.split(",")]
    for hop in reversed(hops):
        if hop and not is_trusted_proxy(hop, trusted_proxies):
            return hop
    return peer


def is_trusted_proxy(address: str | None, trusted_proxies: Sequence[str]) -> bool:
    """Whether `address` is one of `trusted_proxies` (addresses or CIDR networks)."""
    if address is None or not trusted_proxies:
        return False
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(proxy, strict=False) for proxy in trusted_proxies)


# ---- failure rate limiting ----------------------------------------------------------------


def _limit_key(address: str) -> str:
    """The rate-limit bucket: the address; for IPv6, its /64 (one host usually has all of it)."""
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class FailureLimiter:
    """At most `max_failures` failed authentications per address in a sliding window.

    Each address keeps only its last `max_failures` failure times, and addresses whose newest
    failure left the window are dropped; `max_tracked` bounds the table even under a flood of
    addresses (the least recently failing are forgotten first).
    """

    def __init__(
        self,
        max_failures: int,
        *,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = 10_000,
    ) -> None:
        if max_failures < 1:
            raise ValueError("max_failures must be at least 1")
        self.max_failures = max_failures
        self.window_s = window_s
        self.clock = clock
        self.max_tracked = max_tracked
        self._failures: dict[str, deque[float]] = {}
        self._last_prune = clock()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, address: str) -> float | None:
        """Seconds until `address` may try again, or None if it is not blocked."""
        times = self._failures.get(_limit_key(address))
        if times is None or len(times) < self.max_failures:
            return None
        wait = times[0] + self.window_s - self.clock()
        return wait if wait > 0 else None

    def record_failure(self, address: str) -> None:
        now = self.clock()
        key = _limit_key(address)
        times = self._failures.pop(key, None)
        if times is None:
            times = deque(maxlen=self.max_failures)
        times.append(now)
        self._failures[key] = times  # re-inserted: dict order is least recently failing first
        if len(self._failures) > self.max_tracked or now - self._last_prune >= self.window_s:
            self._prune(now)

    def _prune(self, now: float) -> None:
        self._last_prune = now
        stale = [key for key, times in self._failures.items() if now - times[-1] >= self.window_s]
        for key in stale:
            del self._failures[key]
        while len(self._failures) > self.max_tracked:
            del self._failures[next(iter(self._failures))]


# ---- the policy ---------------------------------------------------------------------------


class AccessPolicy:
    """Decides, per request, whether it may go on; see the module docstring for the rules.

    `tokens` are the bearer token values (secret values, not names); none means no token is
    required. `twilio_auth_token` turns on X-Twilio-Signature checking for /twilio.
    `allowed_origins` are the other origins whose pages may call (`webrtc.allowed_origins`).
    `public_url` is the base URL clients use (`server.public_url`): it fixes the URL Twilio
    signed and counts as the server's own origin and host. With no token and
    `allow_public` false, requests must name a loopback host (or public_url's): a web page
    the operator visits could otherwise reach the local server through DNS rebinding.
    """

    def __init__(
        self,
        tokens: Iterable[str] = (),
        *,
        twilio_auth_token: str | None = None,
        allowed_origins: Iterable[str] = (),
        public_url: str | None = None,
        allow_public: bool = False,
        max_failed_auth_per_minute: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        token_list = [token for token in tokens if token]
        self._digests = tuple(_digest(token) for token in token_list)
        self._twilio_auth_token = twilio_auth_token or None
        self.public_url = validate_public_url(public_url) if public_url else None
        self.allow_public = allow_public
        origins = {_normalise_origin(origin) for origin in allowed_origins}
        if self.public_url:
            origins.add(_origin_of(self.public_url))
        self._origins = frozenset(origin for origin in origins if origin)
        # Host names chosen by the operator, allowed by the DNS-rebinding guard.
        self._own_hosts = frozenset(_hostname(urlsplit(origin).netloc) for origin in self._origins)
        self.limiter = FailureLimiter(max_failed_auth_per_minute, clock=clock)
        # The stream of a call the server placed through a carrier names it in its URL
        # (`?placed_call=<call_id>.<key>`, callcontrol/placed_calls.py): that key, random per
        # call and good until its stream comes, lets the carrier in without an API token.
        self.placed_call_token: Callable[[str], bool] = lambda token: False

    @property
    def has_tokens(self) -> bool:
        return bool(self._digests)

    @property
    def twilio_configured(self) -> bool:
        return self._twilio_auth_token is not None

    # -- the decision -----------------------------------------------------------------------

    def check(self, request_path: str, headers: HeaderLookup, remote_ip: str) -> Decision:
        """Allow, or refuse with 401, 403 or 429, the request for `request_path` (the raw
        request target, query string included) from `remote_ip`."""
        path, _, query = request_path.partition("?")
        if path == HEALTH_PATH:
            return _allow("open")
        if not self.has_tokens and not self.allow_public and not self._host_allowed(headers):
            return Decision(
                http.HTTPStatus.FORBIDDEN,
                "this server has no API token and answers only to localhost host names "
                "(or server.public_url's)",
            )
        if is_page(path) or path == PLIVO_DIAL_PATH:
            return _allow("open")
        # Checked before the credentials: once blocked, even the right token waits.
        wait = self.limiter.retry_after(remote_ip)
        if wait is not None:
            return Decision(
                http.HTTPStatus.TOO_MANY_REQUESTS,
                "too many failed authentication attempts from this address: try again later",
                (("Retry-After", str(max(1, math.ceil(wait)))),),
            )
        presented, malformed = self._presented_tokens(path, query, headers)
        if path in CARRIER_PATHS and query:
            placed = parse_qs(query).get(PLACED_CALL_PARAM, [])
            if len(placed) == 1 and self.placed_call_token(placed[0]):
                return _allow("placed-call")
        if path == TWILIO_PATH and self._twilio_auth_token is not None:
            signatures = headers.get_all(TWILIO_SIGNATURE_HEADER)
            if signatures:
                # Checked before Origin: the signature proves Twilio, whatever else it sends.
                return self._check_twilio(path, query, signatures, headers, remote_ip)
            if not (self.has_tokens and (presented or malformed)):
                return Decision(http.HTTPStatus.FORBIDDEN, "X-Twilio-Signature is required")
        if not self._origin_allowed(headers):
            return Decision(
                http.HTTPStatus.FORBIDDEN,
                "pages on this origin may not call: add it to webrtc.allowed_origins",
            )
        if not self.has_tokens:
            return _allow("no-token-configured")
        if not presented and not malformed:
            return Decision(
                http.HTTPStatus.UNAUTHORIZED,
                "an API token is required: send Authorization: Bearer <token>"
                + (" or add ?token=<token>" if query_token_accepted(path) else ""),
                (("WWW-Authenticate", f'Bearer realm="{REALM}"'),),
            )
        if malformed or not all(_matches_any(token, self._digests) for token in presented):
            self.limiter.record_failure(remote_ip)
            return Decision(
                http.HTTPStatus.UNAUTHORIZED,
                "invalid API token",
                (("WWW-Authenticate", f'Bearer realm="{REALM}", error="invalid_token"'),),
            )
        return _allow("token")

    @staticmethod
    def _presented_tokens(path: str, query: str, headers: HeaderLookup) -> tuple[list[str], bool]:
        """Every bearer token the request presents where one counts, and whether an
        `Authorization: Bearer` header had no token after it.

        Other Authorization schemes (Basic from a proxy in front, say) are not ours: they count
        as no credential, not as a failed attempt."""
        presented: list[str] = []
        malformed = False
        for value in headers.get_all("Authorization"):
            scheme, _, credentials = value.partition(" ")
            if scheme.lower() != "bearer":  # scheme names are case-insensitive (RFC 7235)
                continue
            token = credentials.lstrip(" ")  # the token itself is compared exactly
            if token:
                presented.append(token)
            else:
                malformed = True
        if query and query_token_accepted(path):
            presented += parse_qs(query, keep_blank_values=True).get("token", [])
        return presented, malformed

    def _check_twilio(
        self,
        path: str,
        query: str,
        signatures: list[str],
        headers: HeaderLookup,
        remote_ip: str,
    ) -> Decision:
        assert self._twilio_auth_token is not None
        target = path + (f"?{query}" if query else "")
        if len(signatures) == 1:
            for url in self._signed_url_candidates(target, headers):
                if valid_twilio_signature(url, {}, signatures[0], self._twilio_auth_token):
                    return _allow("twilio-signature")
        self.limiter.record_failure(remote_ip)
        return Decision(http.HTTPStatus.FORBIDDEN, "invalid X-Twilio-Signature")

    def _signed_url_candidates(self, target: str, headers: HeaderLookup) -> list[str]:
        """The URLs Twilio may have signed for this upgrade request.

        Twilio signs the `<Stream url>` as written: wss://, though some of its products sign
        the https:// form of a WebSocket URL; both name this server, so both are tried, with
        and without the default port. With `public_url` the host comes only from it; without
        it, from X-Forwarded-Host or Host, which a client could set, so a signature made for
        another of the account's URLs could be replayed here: configure public_url.
        """
        if self.public_url:
            base = urlsplit(self.public_url)
            secure = base.scheme.lower() in ("https", "wss")
            netloc, prefix = base.netloc, base.path
        else:
            proto = _first(headers, "X-Forwarded-Proto").lower()
            secure = proto not in ("http", "ws")
            netloc = _first(headers, "X-Forwarded-Host") or _first(headers, "Host")
            prefix = ""
            if not netloc:
                return []
        schemes = ("wss", "https") if secure else ("ws", "http")
        urls: list[str] = []
        for scheme in schemes:
            for variant in _port_variants(scheme, netloc):
                url = f"{scheme}://{variant}{prefix}{target}"
                if url not in urls:
                    urls.append(url)
        return urls

    def _origin_allowed(self, headers: HeaderLookup) -> bool:
        """Browsers send Origin on WebSocket upgrades and cross-site requests: the server's own
        origin (Origin's host:port is the Host header), public_url's and the configured ones
        may call. No Origin: not a browser, so nothing to check (tokens still apply)."""
        origins = headers.get_all("Origin")
        if not origins:
            return True
        if len(origins) > 1:
            return False
        origin = _normalise_origin(origins[0])
        if origin is None:
            return False  # "null" (sandboxed frames, file://) or garbage
        if origin in self._origins:
            return True
        scheme, _, netloc = origin.partition("://")
        hosts = headers.get_all("Host")
        return len(hosts) == 1 and _host_and_port(hosts[0], scheme) == netloc

    def _host_allowed(self, headers: HeaderLookup) -> bool:
        """The DNS-rebinding guard of a token-less server: the Host must be a loopback name or
        one the operator configured. A rebinding page's requests carry its own host name."""
        hosts = headers.get_all("Host")
        if len(hosts) != 1:
            return len(hosts) == 0  # HTTP/1.0-style clients without Host are not browsers
        host = _hostname(hosts[0])
        return is_loopback_host(host, localhost_subdomains=True) or host in self._own_hosts


def _first(headers: HeaderLookup, name: str) -> str:
    """The first value of a header that proxies may have made a list of ("https, http")."""
    values = headers.get_all(name)
    return values[0].split(",", 1)[0].strip() if values else ""
