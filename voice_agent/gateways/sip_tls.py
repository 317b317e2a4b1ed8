"""The TLS side of SIP over TLS: the server's context from `sip.tls` (the standard library's
`ssl`), kept current as its files change, so a renewed certificate (certbot, a CA's agent)
takes effect on the next connection without a restart.

The files are looked at every CHECK_S by the gateway; a change is loaded into the same
context, which every later handshake uses (connections already up keep theirs). A file that
does not load (half written, a key that does not match) leaves the old certificate in use and
is logged once; the next change is tried again.
"""

from __future__ import annotations

import logging
import os
import ssl

from voice_agent.config import SipTls
from voice_agent.errors import ConfigError

log = logging.getLogger("voice_agent.sip")

CHECK_S = 2.0


def _stamp(paths: list[str]) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            stamps.append((-1, -1))
            continue
        stamps.append((info.st_mtime_ns, info.st_size))
    return tuple(stamps)


class ServerTls:
    def __init__(self, settings: SipTls) -> None:
        self.settings = settings
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # TLS 1.2 at least (RFC 8996 retires 1.0 and 1.1; every current PBX and trunk has 1.2).
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if settings.verify_client:
            context.verify_mode = ssl.CERT_REQUIRED
        self.context = context
        self._paths = [settings.certificate, settings.key, *([settings.ca] if settings.ca else [])]
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"sip.tls: {settings.certificate} and {settings.key} do not load: {exc}",
                key="sip.tls.certificate",
            ) from None
        self._stamp = _stamp(self._paths)
        self._failed_stamp: tuple[tuple[int, int], ...] | None = None

    def _load(self) -> None:
        # Tried on a scratch context first: a failure half-way through loading into the live
        # one could leave it holding a new certificate with the old key.
        for context in (ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.context):
            context.load_cert_chain(self.settings.certificate, self.settings.key)
            if self.settings.ca is not None:
                context.load_verify_locations(cafile=self.settings.ca)

    def reload_if_changed(self) -> bool:
        """Load the files again if any changed since they last loaded; True if they did."""
        stamp = _stamp(self._paths)
        if stamp == self._stamp or stamp == self._failed_stamp:
            return False
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            self._failed_stamp = stamp
            log.warning("sip.tls: the changed files do not load (%s); the old ones stay", exc)
            return False
        self._stamp, self._failed_stamp = stamp, None
        log.info("sip.tls: certificate loaded again from %s", self.settings.certificate)
        return True
