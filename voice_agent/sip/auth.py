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

from voice_agent.sip.message import quoted

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


# ---- the client side: answering a challenge (outbound calls) ----------------------------


@dataclass(frozen=True)
class Credentials:
    """What answers a trunk's digest challenge; `realm` None answers any realm."""

    username: str
    password: str
    realm: str | None = None


def digest_authorization(
    challenge: str,
    *,
    method: str,
    uri: str,
    credentials: Credentials,
    cnonce: str,
    nc: int = 1,
) -> str | None:
    """The credentials answering one digest challenge (RFC 3261 section 22.4 with RFC 8760's
    algorithms, RFC 7616's qop=auth): None for a challenge we cannot answer (not Digest, an
    algorithm other than MD5 and SHA-256, a qop without "auth", another realm than the
    credentials name)."""
    params = parse_digest(challenge)
    if params is None:
        return None
    realm, nonce = params.get("realm"), params.get("nonce")
    if realm is None or nonce is None:
        return None
    if credentials.realm is not None and credentials.realm != realm:
        return None
    algorithm = params.get("algorithm", "MD5").upper()
    hasher = ALGORITHMS.get(algorithm)
    if hasher is None:
        return None
    qops = {qop.strip().lower() for qop in params.get("qop", "").split(",") if qop.strip()}
    if qops and "auth" not in qops:
        return None

    def digest(text: str) -> str:
        return hasher(text.encode("utf-8")).hexdigest()

    ha1 = digest(f"{credentials.username}:{realm}:{credentials.password}")
    ha2 = digest(f"{method}:{uri}")
    fields = [
        f'username="{quoted(credentials.username)}"',
        f'realm="{quoted(realm)}"',
        f'nonce="{quoted(nonce)}"',
        f'uri="{quoted(uri)}"',
    ]
    if qops:
        count = f"{nc:08x}"
        response = digest(f"{ha1}:{nonce}:{count}:{cnonce}:auth:{ha2}")
        fields += [
            f'response="{response}"',
            f"algorithm={algorithm}",
            f'cnonce="{quoted(cnonce)}"',
            "qop=auth",
            f"nc={count}",
        ]
    else:
        response = digest(f"{ha1}:{nonce}:{ha2}")  # RFC 2069's form, section 22.4
        fields += [f'response="{response}"', f"algorithm={algorithm}"]
    if "opaque" in params:
        fields.append(f'opaque="{quoted(params["opaque"])}"')
    return "Digest " + ", ".join(fields)
