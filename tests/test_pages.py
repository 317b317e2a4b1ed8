"""The browser page's static files: types, headers, and nothing outside the static folder."""

from __future__ import annotations

import json

import pytest
from websockets.http11 import Response

from voice_agent.server.pages import static_response


def served(path: str) -> Response:
    response = static_response(path)
    assert response is not None, path
    return response


def assert_not_found(path: str) -> None:
    response = served(path)
    assert response.status_code == 404, path
    assert response.headers["Content-Type"] == "application/json"
    body = json.loads(response.body)
    assert body["error"].startswith("nothing at /static/"), body
    assert int(response.headers["Content-Length"]) == len(response.body)


def test_the_root_is_the_call_page_with_a_strict_policy() -> None:
    response = served("/")
    assert response.status_code == 200
    headers = response.headers
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert int(headers["Content-Length"]) == len(response.body)
    assert headers["Cache-Control"] == "no-cache"
    assert headers["X-Content-Type-Options"] == "nosniff"
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "style-src 'self'" in policy
    assert "connect-src 'self' ws: wss:" in policy
    assert "unsafe-inline" not in policy
    page = response.body.decode()
    assert "<title>voice_agent</title>" in page
    for element in ('id="agent"', 'id="call"', 'id="hangup"', 'id="status"', 'id="transcript"'):
        assert element in page
    assert '<script src="/static/app.js"' in page
    assert "<script>" not in page  # no inline script: the policy would block it


def test_a_query_string_on_the_root_is_ignored() -> None:
    assert served("/?token=abc").body == served("/").body


@pytest.mark.parametrize(
    ("name", "content_type", "marker"),
    [
        ("app.js", "text/javascript", b"window.voiceAgent"),
        ("style.css", "text/css", b"#transcript"),
        ("index.html", "text/html; charset=utf-8", b"<!doctype html>"),
    ],
)
def test_static_files_are_served_with_their_types(
    name: str, content_type: str, marker: bytes
) -> None:
    response = served(f"/static/{name}")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == content_type
    assert int(response.headers["Content-Length"]) == len(response.body)
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert marker in response.body


def test_each_response_is_fresh_but_the_bytes_are_read_once() -> None:
    first, second = served("/static/app.js"), served("/static/app.js")
    assert first is not second and first.headers is not second.headers
    assert first.body is second.body


@pytest.mark.parametrize(
    "path",
    [
        "/static/../pages.py",
        "/static/../__init__.py",
        "/static/%2e%2e/pages.py",
        "/static/%2E%2E%2Fpages.py",
        "/static/%252e%252e/pages.py",
        "/static/..%5Cpages.py",
        "/static/..\\pages.py",
        "/static/\\etc\\passwd",
        "/static//etc/passwd",
        "/static/%2Fetc%2Fpasswd",
        "/static/C:%5Cwindows%5Cwin.ini",
        "/static/app.js%00.css",
        "/static/app.js\x00",
        "/static/.hidden.css",
        "/static/..",
        "/static/",
        "/static/sub/app.js",
        "/static/%ff.js",
        "/static/missing.js",
        "/static/app.py",
        "/static/APP.JS",
    ],
)
def test_anything_but_a_plain_file_in_the_folder_is_not_found(path: str) -> None:
    assert_not_found(path)


@pytest.mark.parametrize("path", ["/healthz", "/agents", "/calls", "/static", "/index.html", ""])
def test_other_paths_are_not_ours(path: str) -> None:
    assert static_response(path) is None
