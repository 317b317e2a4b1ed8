"""What tests/test_attacks.py attacks the server with: raw HTTP requests (no client library to
normalise the path or refuse odd bytes), Twilio's signature written out independently of the
server's, and a search for a secret value in everything an attacker or an operator could see.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

MAX_RESPONSE = 4 * 1024 * 1024


@dataclass(frozen=True)
class RawResponse:
    """An HTTP response as read off the socket; `status` None: the server closed without one."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)  # names lowercased, last value wins
    body: bytes = b""
    raw: bytes = b""

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def request_bytes(
    target: str | bytes,
    headers: Sequence[tuple[str, str]] = (),
    *,
    host: str = "127.0.0.1",
    method: bytes = b"GET",
) -> bytes:
    """A raw HTTP/1.1 request: `target` goes on the request line byte for byte."""
    if isinstance(target, str):
        target = target.encode("latin-1")
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: " + host.encode()]
    lines += [f"{name}: {value}".encode("latin-1") for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def raw_http(
    port: int,
    request: bytes,
    *,
    source: str | None = None,
    hang_up: bool = False,
    within_s: float = 10.0,
) -> RawResponse:
    """Send `request` to 127.0.0.1:port (from `source`, another loopback address if given) and
    read until the server closes the connection; the `websockets` server closes after any
    non-upgrade answer, and closes without one when it cannot parse the request. `hang_up`:
    shut the sending side once the request is out (a request cut short, then nothing)."""
    local = (source, 0) if source else None
    async with asyncio.timeout(within_s):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
        try:
            try:
                writer.write(request)
                await writer.drain()
                if hang_up:
                    writer.write_eof()
            except ConnectionError:
                pass  # it may hang up before reading everything: what it answered still counts
            data = b""
            try:
                while len(data) < MAX_RESPONSE:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    data += chunk
                    if _complete(data):
                        break
            except ConnectionError:
                pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except ConnectionError:
                pass
    return parse_response(data)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    if head.startswith(b"HTTP/1.1 101 "):
        return True  # the WebSocket opened: the connection stays up, nothing more to read
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip() or b"0")
    return False


def parse_response(data: bytes) -> RawResponse:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 "):
        return RawResponse(None, raw=data)
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
    length = headers.get("content-length")
    if length is not None:
        body = body[: int(length)]
    return RawResponse(status, headers, body, data)


def twilio_signature(url: str, auth_token: str) -> str:
    """X-Twilio-Signature of a Media Streams upgrade, as Twilio documents it: base64 of the
    HMAC-SHA1, keyed with the account's auth token, of the full URL (a GET: no parameters)."""
    digest = hmac.new(auth_token.encode(), url.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def secret_forms(secret: str) -> list[str]:
    """The ways a secret value shows up in text that carries it: as is, its distinctive tail
    (a value cut in two), URL-quoted, base64 and hex (inside a header or a blob)."""
    encoded = secret.encode()
    forms = [
        secret,
        secret[len(secret) // 2 :],
        quote(secret, safe=""),
        base64.b64encode(encoded).decode(),
        encoded.hex(),
    ]
    return list(dict.fromkeys(forms))


def _texts(item: Any) -> Iterable[str]:
    if isinstance(item, bytes | bytearray):
        yield bytes(item).decode("latin-1")
    elif isinstance(item, str):
        yield item
    else:
        yield json.dumps(item, ensure_ascii=False, default=repr)
        yield json.dumps(item, ensure_ascii=True, default=repr)


class LeakSearch:
    """Everything collected from one place (responses, messages, log lines...), searched for a
    secret's forms; `where` names each item so a failure says where the value leaked."""

    def __init__(self, secret: str) -> None:
        self.forms = secret_forms(secret)
        self.searched: dict[str, int] = {}
        self.leaks: list[str] = []

    def check(self, place: str, items: Iterable[tuple[str, Any]]) -> None:
        count = 0
        for where, item in items:
            count += 1
            leak = self._find(item)
            if leak is not None:
                self.leaks.append(f"{place}: {where}: ...{leak}...")
        self.searched[place] = self.searched.get(place, 0) + count

    def _find(self, item: Any) -> str | None:
        for text in _texts(item):
            for form in self.forms:
                index = text.find(form)
                if index != -1:
                    return text[max(0, index - 80) : index + len(form) + 80]
        return None
