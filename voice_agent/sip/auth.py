"""Digest authentication of incoming requests (RFC 3261 section 22.4 with the algorithms of
RFC 8760: SHA-256 and MD5, qop "auth" or none), with nonces that need no server state.

A nonce is the time it was made and an HMAC of that time under a key only this process holds,
so any nonce the server made can be checked without remembering it, and a scanner's thousands
of challenges cost nothing. A nonce is good for NONCE_LIFETIME_MS; past it the client is
challenged again with `stale=true` (RFC 7616 section 3.3). Nonce counts are not tracked, so a
captured response can be replayed within the nonce's lifetime: the same trade as stateless
proxies make, and why allowed source networks are the first defence (docs/telephony.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass

NONCE_LIFETIME_MS = 300_000.0
ALGORITHMS = {"SHA-256": hashlib.sha256, "MD5": hashlib.md5}
# RFC 8760 section 2.4: the challenges go in the server's order of preference. MD5 first: many
# deployed clients (sipp 3.6 among them) read only the first challenge and know only MD5, and
# since both are accepted, the order changes what clients pick, not what an attacker can use.
# `algorithms=("SHA-256",)` takes SHA-256 only.
OFFERED = ("MD5", "SHA-256")
_PARAM = re.compile(r'\s*([A-Za-z0-9_-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)\s*(?:,|$)')
MAX_CREDENTIALS_CHARS = 4096


@dataclass(frozen=True)
class Verdict:
    ok: bool
    username: str | None = None
    stale: bool = False
    reason: str = ""


def _hash(algorithm: str, text: str) -> str:
    return ALGORITHMS[algorithm](text.encode("utf-8")).hexdigest()


class DigestAuthenticator:
    def __init__(
        self,
        realm: str,
        credentials: Mapping[str, str],
        *,
        algorithms: tuple[str, ...] = OFFERED,
        key: bytes | None = None,
    ) -> None:
        unknown = [name for name in algorithms if name not in ALGORITHMS]
        if unknown or not algorithms:
            raise ValueError(f"digest algorithms {unknown or 'none'} not in {sorted(ALGORITHMS)}")
        self.algorithms = algorithms
        self.realm = realm
        self.credentials = dict(credentials)
        self._key = key if key is not None else secrets.token_bytes(32)

    def _nonce(self, now_ms: float) -> str:
        stamp = struct.pack(">Q", int(now_ms))
        mac = hmac.new(self._key, stamp + self.realm.encode(), hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(stamp + mac).decode("ascii").rstrip("=")

    def _nonce_age_ms(self, nonce: str, now_ms: float) -> float | None:
        """How old a nonce this server made is; None for one it did not make."""
        try:
            raw = base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4))
        except (ValueError, TypeError):
            return None
        if len(raw) != 24:
            return None
        stamp, mac = raw[:8], raw[8:]
        expected = hmac.new(self._key, stamp + self.realm.encode(), hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(mac, expected):
            return None
        return now_ms - struct.unpack(">Q", stamp)[0]

    def challenges(self, now_ms: float, *, stale: bool = False) -> list[tuple[str, str]]:
        """The WWW-Authenticate headers of a 401, one per algorithm."""
        nonce = self._nonce(now_ms)
        tail = ", stale=true" if stale else ""
        return [
            (
                "WWW-Authenticate",
                f'Digest realm="{self.realm}", nonce="{nonce}", algorithm={algorithm}, '
                f'qop="auth"{tail}',
            )
            for algorithm in self.algorithms
        ]

    def verify(self, method: str, authorization: str | None, now_ms: float) -> Verdict:
        if authorization is None:
            return Verdict(False, reason="no credentials")
        params = parse_digest(authorization)
        if params is None:
            return Verdict(False, reason="Authorization is not a Digest header we can read")
        username = params.get("username", "")
        algorithm = params.get("algorithm", "MD5").upper()
        if algorithm not in self.algorithms:
            return Verdict(False, username, reason=f"algorithm {algorithm[:20]!r} not offered")
        if params.get("realm") != self.realm:
            return Verdict(False, username, reason="wrong realm")
        nonce = params.get("nonce", "")
        age = self._nonce_age_ms(nonce, now_ms)
        if age is None or age < 0:
            return Verdict(False, username, reason="a nonce this server did not issue")
        password = self.credentials.get(username)
        if password is None:
            return Verdict(False, username, reason="unknown user")
        ha1 = _hash(algorithm, f"{username}:{self.realm}:{password}")
        ha2 = _hash(algorithm, f"{method}:{params.get('uri', '')}")
        qop = params.get("qop")
        if qop is None:
            expected = _hash(algorithm, f"{ha1}:{nonce}:{ha2}")
        elif qop.lower() == "auth":
            nc, cnonce = params.get("nc", ""), params.get("cnonce", "")
            expected = _hash(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}")
        else:
            return Verdict(False, username, reason=f"qop {qop[:20]!r} not offered")
        if not hmac.compare_digest(expected, params.get("response", "").lower()):
            return Verdict(False, username, reason="wrong password")
        if age > NONCE_LIFETIME_MS:
            # The password was right: the client only needs a fresh nonce.
            return Verdict(False, username, stale=True, reason="nonce expired")
        return Verdict(True, username)


def parse_digest(value: str) -> dict[str, str] | None:
    """The parameters of a `Digest ...` credentials value, names in lower case; None if it is
    not one."""
    if len(value) > MAX_CREDENTIALS_CHARS:
        return None
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        return None
    params: dict[str, str] = {}
    position = 0
    rest = rest.strip()
    while position < len(rest):
        match = _PARAM.match(rest, position)
        if match is None:
            return None
        raw = match[2]
        if raw.startswith('"'):
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        params[match[1].lower()] = raw
        position = match.end()
    return params


def digest_response(
    *,
    method: str,
    uri: str,
    username: str,
    password: str,
    realm: str,
    nonce: str,
    algorithm: str = "MD5",
    cnonce: str = "",
    nc: str = "00000001",
) -> str:
    """An Authorization value for a challenge (qop=auth): what a client sends. The server
    only verifies; this is for outbound calls (issue 18) and the tests' own clients."""
    ha1 = _hash(algorithm, f"{username}:{realm}:{password}")
    ha2 = _hash(algorithm, f"{method}:{uri}")
    cnonce = cnonce or secrets.token_hex(8)
    response = _hash(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}")
    return (
        f'Digest username="{username}", realm="{realm}", nonce="{nonce}", uri="{uri}", '
        f'response="{response}", algorithm={algorithm}, cnonce="{cnonce}", qop=auth, nc={nc}'
    )
