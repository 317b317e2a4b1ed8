"""SRTP for a SIP call: the keys both ends put in SDP (SDES, RFC 4568) and the transform of the
call's packets (RFC 3711), which is libsrtp's through `pylibsrtp` (the binding aiortc uses),
not ours: a voice server has no business writing its own AES counter mode or HMAC.

Keys come from `secrets`, one pair a call, and never leave the SDP: they are not logged, not
audited, not in the call record or metrics (`SrtpKeys` shows no key in its repr).

An offer's `a=crypto` lines are taken in its order of preference (RFC 4568 section 7.1.1); a
line is usable with one of SUITES, one inline key of that suite's length, no MKI (libsrtp's
binding has none) and no session parameters (UNENCRYPTED_SRTP and the like would weaken what
the operator asked for). A lifetime, if given, must be at least 2^31 packets: this server does
not re-key, and at 50 packets a second that is over a year of a call.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# RFC 4568 section 6.2 and RFC 7714 section 12: the suites libsrtp takes, with their master
# key and salt lengths in bytes.
SUITES: dict[str, tuple[str, int, int]] = {
    "AES_CM_128_HMAC_SHA1_80": ("SRTP_PROFILE_AES128_CM_SHA1_80", 16, 14),
    "AES_CM_128_HMAC_SHA1_32": ("SRTP_PROFILE_AES128_CM_SHA1_32", 16, 14),
    "AEAD_AES_128_GCM": ("SRTP_PROFILE_AEAD_AES_128_GCM", 16, 12),
}
MIN_LIFETIME = 2**31
_CRYPTO = re.compile(r"([0-9]{1,9})[ \t]+([A-Za-z0-9_]+)[ \t]+(\S+)(?:[ \t]+(.+))?")


class SrtpDropped(Exception):
    """A packet that failed libsrtp's check: a replay, or not authentic (forged, corrupted,
    or plain RTP on an SRTP call)."""

    def __init__(self, *, replay: bool) -> None:
        super().__init__("replayed" if replay else "not authentic")
        self.replay = replay


class SrtpUnavailable(RuntimeError):
    """pylibsrtp is not installed: `pip install voice_agent[srtp]`."""


def available() -> bool:
    """Whether SRTP can run here (the `srtp` extra is installed)."""
    return importlib.util.find_spec("pylibsrtp") is not None


@dataclass(frozen=True)
class CryptoOffer:
    """One usable `a=crypto` line of an offer."""

    tag: int
    suite: str
    key: bytes = field(repr=False)  # master key || salt


@dataclass(frozen=True)
class SrtpKeys:
    """What the call's SRTP runs on: the suite, the offer's tag, and both ends' keys."""

    suite: str
    tag: int
    remote: bytes = field(repr=False)  # the far end's key || salt: its packets to us
    local: bytes = field(repr=False)  # ours, sent in the answer: our packets to it

    def answer_line(self) -> str:
        """The answer's `a=crypto` line (section 7.1.2: the offer's tag, the chosen suite)."""
        return f"a=crypto:{self.tag} {self.suite} inline:{base64.b64encode(self.local).decode()}"


def read_crypto(value: str) -> CryptoOffer | None:
    """One `a=crypto` value (after the colon) as an offer, or None if this server cannot use
    it (a suite, key form or parameter it does not take)."""
    match = _CRYPTO.fullmatch(value.strip())
    if match is None or match[4]:
        return None
    suite = match[2].upper()
    if suite not in SUITES:
        return None
    method, _, key_info = match[3].partition(":")
    if method.lower() != "inline" or ";" in key_info:
        return None  # another key method, or several keys (section 9.2)
    key_salt, *rest = key_info.split("|")
    if len(rest) > 1 or (rest and (":" in rest[0] or not _long_enough(rest[0]))):
        return None  # an MKI, or a lifetime shorter than this server keeps a key
    try:
        key = base64.b64decode(key_salt, validate=True)
    except (binascii.Error, ValueError):
        return None
    _, key_length, salt_length = SUITES[suite]
    if len(key) != key_length + salt_length:
        return None
    return CryptoOffer(int(match[1]), suite, key)


def _long_enough(lifetime: str) -> bool:
    text = lifetime.strip()
    if text.startswith("2^") and text[2:].isdigit():
        return int(text[2:]) >= 31
    return text.isdigit() and int(text) >= MIN_LIFETIME


def choose(values: Sequence[str]) -> SrtpKeys | None:
    """The first usable offer of `values` (the stream's `a=crypto` values, in order) with a
    new key of ours for it; None if none is usable."""
    for value in values:
        offered = read_crypto(value)
        if offered is not None:
            _, key_length, salt_length = SUITES[offered.suite]
            local = secrets.token_bytes(key_length + salt_length)
            return SrtpKeys(offered.suite, offered.tag, offered.key, local)
    return None


class SrtpTransform:
    """One call's SRTP both ways. `unprotect` raises SrtpDropped for a packet that fails its
    check (a forgery, a replay): the caller drops and counts it, and the call goes on."""

    def __init__(self, keys: SrtpKeys) -> None:
        try:
            import pylibsrtp
        except ImportError:
            raise SrtpUnavailable("SRTP needs pylibsrtp: pip install 'voice_agent[srtp]'") from None
        profile = getattr(pylibsrtp.Policy, SUITES[keys.suite][0])
        self._error: Any = pylibsrtp.Error
        self._outbound = pylibsrtp.Session(
            policy=pylibsrtp.Policy(
                key=keys.local, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile
            )
        )
        self._inbound = pylibsrtp.Session(
            policy=pylibsrtp.Policy(
                key=keys.remote, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile
            )
        )

    def protect(self, packet: bytes) -> bytes:
        protected: bytes = self._outbound.protect(packet)
        return protected

    def unprotect(self, packet: bytes) -> bytes:
        try:
            plain: bytes = self._inbound.unprotect(packet)
        except self._error as exc:
            raise SrtpDropped(replay="replay" in str(exc)) from None
        return plain

    def protect_rtcp(self, packet: bytes) -> bytes:
        """SRTCP (RFC 3711 section 3.4): the same keys' RTCP transform."""
        protected: bytes = self._outbound.protect_rtcp(packet)
        return protected

    def unprotect_rtcp(self, packet: bytes) -> bytes:
        try:
            plain: bytes = self._inbound.unprotect_rtcp(packet)
        except self._error as exc:
            raise SrtpDropped(replay="replay" in str(exc)) from None
        return plain
