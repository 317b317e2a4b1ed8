"""Where the server may listen, and what it says at start-up about how it is protected: without
an API token only on loopback (anyone who reaches a public address could place calls and read
call records), unless the operator accepts the risk."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str, *, localhost_subdomains: bool = False) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) and `localhost`; any other name may resolve anywhere.

    `localhost_subdomains`: also `*.localhost`, which browsers resolve to loopback themselves
    (so no DNS answer can point them elsewhere) but a system resolver might not.
    """
    host = host.strip().strip("[]").lower().rstrip(".")
    if host == "localhost" or (localhost_subdomains and host.endswith(".localhost")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # "", "0", a LAN name: could be reachable from elsewhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def check_bind(host: str, has_tokens: bool, allow_public: bool) -> str | None:
    """Why the server must not listen on `host`, or None when it may.

    Without an API token, only loopback: anyone who could reach a public address could place
    calls (spending STT/TTS/LLM money) and read call records. `allow_public` overrides that.
    """
    if has_tokens or allow_public or is_loopback_host(host):
        return None
    shown = host if host else "all interfaces"
    return (
        f"refusing to listen on {shown!r} without an API token: anyone who can reach it could "
        "place calls and read call records. Set a token (voice-agent secrets set API_TOKEN, "
        "then list API_TOKEN under server.api_tokens), listen on 127.0.0.1, or set "
        "server.allow_public_without_token: true to accept the risk"
    )


def startup_notices(
    host: str,
    *,
    has_tokens: bool,
    allow_public: bool,
    twilio_configured: bool,
    public_url: str | None,
) -> list[str]:
    """Lines to print at start-up about how the server is protected, most important first."""
    notices: list[str] = []
    if not has_tokens:
        if is_loopback_host(host):
            notices.append(
                "no API token configured (server.api_tokens): listening on loopback only, "
                "and only requests naming localhost"
                + (f" or {public_url}'s host" if public_url else "")
                + " are answered (against DNS rebinding); anything running on this machine "
                "may call"
            )
        elif allow_public:
            notices.append(
                f"WARNING: listening on {host or 'all interfaces'!r} WITHOUT an API token "
                "(server.allow_public_without_token): anyone who can reach it can place calls "
                "and read call records"
            )
    if twilio_configured and not public_url:
        notices.append(
            "server.twilio_auth_token is set but server.public_url is not: the URL Twilio signed "
            "is rebuilt from the Host and X-Forwarded-Proto headers; set server.public_url to "
            "the base URL of your <Stream url> if signatures fail"
        )
    if has_tokens and not twilio_configured:
        notices.append(
            "API tokens are set but server.twilio_auth_token is not: Twilio cannot present a "
            "token, so /twilio refuses real Twilio calls until its auth token is configured"
        )
    return notices
