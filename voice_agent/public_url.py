"""The server's public base URL: the one check the config and the access policy both make.

Kept out of `server/` so that the config schema, which every layer imports, depends on nothing
above it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

# The schemes a public URL may have, and the port each implies when none is written.
DEFAULT_PORTS = {"http": "80", "ws": "80", "https": "443", "wss": "443"}


def validate_public_url(url: str) -> str:
    """`url` without a trailing slash if it can serve as the server's public base URL.

    The base Twilio and browsers use to reach the server through proxies and tunnels:
    http(s) or ws(s), a host, an optional path prefix the proxy strips, no query or fragment.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(
            f"public URL {url!r} must be an absolute http(s):// or ws(s):// URL with a host"
        )
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"public URL {url!r} must not have a query string or fragment")
    return url.rstrip("/")
