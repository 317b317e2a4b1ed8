"""Reading the JSON messages of the carriers' stream protocols: the message itself (its size,
its JSON, an object), then one field at a time, with an error that names the field's path
("start.callSid is missing"), for every codec alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from voice_agent.transports.errors import MESSAGE_TOO_BIG, PROTOCOL_ERROR, ProtocolError


def malformed(reason: str) -> ProtocolError:
    return ProtocolError(PROTOCOL_ERROR, reason, kind="malformed_message")


def json_message(
    text: str,
    max_chars: int,
    *,
    loads: Callable[[str], Any] = orjson.loads,
    what: str = "message",
) -> dict[str, Any]:
    """One text message of a stream as a JSON object, or the ProtocolError saying what is wrong
    with it: longer than `max_chars` (checked before parsing), not JSON, not an object.

    orjson by default: a third of json's time on the 50 media messages a second of every call.
    `/ws` and WebRTC signalling keep the standard library's parser, whose error texts their
    clients have been shown."""
    if len(text) > max_chars:
        raise ProtocolError(
            MESSAGE_TOO_BIG,
            f"{what} of {len(text)} characters exceeds the {max_chars} limit",
            kind="message_too_big",
        )
    try:
        message = loads(text)
    except ValueError as exc:
        raise malformed(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise malformed(f"{what} is not a JSON object")
    return message


def json_object(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        missing = value is None
        raise malformed(f"{path} is {'missing' if missing else 'not an object'}")
    return value


def json_text(parent: Mapping[str, Any], key: str, path: str) -> str:
    value = parent.get(key)
    if not isinstance(value, str) or not value:
        missing = value is None
        raise malformed(f"{path} is {'missing' if missing else 'not a non-empty string'}")
    return value


def loose_texts(parent: Mapping[str, Any], key: str, names: tuple[str, ...]) -> list[str]:
    """The fields `names` of the object under `key`, each "" where it is missing or not text:
    for a message read as it comes, unchecked (a stop ends the call whatever it holds)."""
    fields = parent.get(key)
    fields = fields if isinstance(fields, dict) else {}
    return [value if isinstance(value := fields.get(name), str) else "" for name in names]
