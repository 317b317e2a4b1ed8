"""The browser pages: `/` and `/static/<name>`, served from the package's `static` folder, and the
call viewer's pages (`/calls/view`, `/calls/{id}/view`) through `calls_view_response`.

Files are read once, on first use, through `importlib.resources`, so an installed package
serves them as well as a source checkout. Only plain file names with a known type are served:
anything else under `/static/` (subfolders, `..`, encoded or backslashed tricks) is a 404.
"""

from __future__ import annotations

import functools
import http
import json
import re
from importlib.resources import files
from urllib.parse import unquote

from websockets.datastructures import Headers
from websockets.http11 import Response

STATIC_PREFIX = "/static/"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}

# The page's own scripts and styles only; the signalling WebSocket; no inline script.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "media-src 'self' blob:",
        "connect-src 'self' ws: wss:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

_COMMON_HEADERS = (
    ("Cache-Control", "no-cache"),
    ("X-Content-Type-Options", "nosniff"),
    # The page may carry `?token=` in its URL: never leak it to another site.
    ("Referrer-Policy", "no-referrer"),
)

# One plain file name: no separators, no leading dot, nothing outside this alphabet.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@functools.cache
def _static_files() -> dict[str, bytes]:
    """Every servable file in the static folder, by name, read once."""
    folder = files("voice_agent.server") / "static"
    found: dict[str, bytes] = {}
    if not folder.is_dir():
        return found
    for entry in folder.iterdir():
        if _servable(entry.name) and entry.is_file():
            found[entry.name] = entry.read_bytes()
    return found


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def _servable(name: str) -> bool:
    return (
        len(name) <= 100
        and _NAME.fullmatch(name) is not None
        and ".." not in name
        and _suffix(name) in CONTENT_TYPES
    )


def _file_response(name: str, data: bytes) -> Response:
    headers = Headers(
        [
            ("Content-Type", CONTENT_TYPES[_suffix(name)]),
            ("Content-Length", str(len(data))),
            *_COMMON_HEADERS,
        ]
    )
    if name.endswith(".html"):
        headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    status = http.HTTPStatus.OK
    return Response(status.value, status.phrase, headers, data)


def _not_found(path: str) -> Response:
    body = json.dumps({"error": f"nothing at {path}"}, ensure_ascii=False).encode()
    headers = Headers(
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *_COMMON_HEADERS,
        ]
    )
    status = http.HTTPStatus.NOT_FOUND
    return Response(status.value, status.phrase, headers, body)


def static_response(path: str) -> Response | None:
    """The response for the page's paths, or None when `path` is not one of them.

    `path` is the request target; a query string (`/?token=...`) is ignored. A fresh Response
    is built each time (the server adds headers to it); the bytes are cached.
    """
    path = path.split("?", 1)[0]
    if path == "/":
        name = "index.html"
    elif path.startswith(STATIC_PREFIX):
        name = unquote(path[len(STATIC_PREFIX) :])  # bad UTF-8 becomes U+FFFD: refused
    else:
        return None
    if not _servable(name):
        return _not_found(path)
    data = _static_files().get(name)
    if data is None:
        return _not_found(path)
    return _file_response(name, data)


def page_response(name: str) -> Response:
    """One static file by its plain name (`calls.html`), or a 404 when there is no such file."""
    data = _static_files().get(name) if _servable(name) else None
    if data is None:
        return _not_found(f"{STATIC_PREFIX}{name}")
    return _file_response(name, data)


# `/calls/{id}/view`: one path segment of an id, never `view` itself (that is the list page).
_CALL_VIEW = re.compile(r"/calls/([^/]+)/view/?")


def calls_view_response(path: str) -> Response | None:
    """The call viewer's pages: the list at `/calls/view`, one call at `/calls/{id}/view`.

    None for any other path. The pages are static: their scripts read the id from the URL and
    fetch `/calls` and `/calls/{id}` (passing on a `?token=` from the page's URL).
    """
    path = path.split("?", 1)[0]
    if path in ("/calls/view", "/calls/view/"):
        return page_response("calls.html")
    if _CALL_VIEW.fullmatch(path) is not None:
        return page_response("call.html")
    return None
