"""Reading the JSON messages of the carriers' stream protocols: one field at a time, with an
error that names the field's path ("start.callSid is missing"), for every codec alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voice_agent.transports.errors import PROTOCOL_ERROR, ProtocolError


def malformed(reason: str) -> ProtocolError:
    return ProtocolError(PROTOCOL_ERROR, reason, kind="malformed_message")


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
