"""The commands Asterisk's chan_websocket takes (voice_agent.transports.asterisk_ws), in the
control-message form the connection uses, within Asterisk's limits on what it is sent."""

from __future__ import annotations

import json
import re
from typing import Literal

ControlForm = Literal["plain-text", "json"]  # Asterisk's own names (control_message_format)
PLAIN: ControlForm = "plain-text"
JSON: ControlForm = "json"

# Asterisk's limits on what it is sent (chan_websocket.c MAX_TEXT_MESSAGE_LEN; the 65500-byte
# payload limit of res_http_websocket the documentation warns about).
MAX_COMMAND_BYTES = 128
MAX_MEDIA_MESSAGE_BYTES = 65_500

# A correlation id comes back verbatim; in plain text as a bare word after the event's, so no
# spaces and no colon (which would make it a `name:value` pair).
MAX_CORRELATION_ID = 64
_CORRELATION_ID = re.compile(r"[A-Za-z0-9._-]+")


def _correlation_id(value: str) -> str:
    if len(value) > MAX_CORRELATION_ID or not _CORRELATION_ID.fullmatch(value):
        raise ValueError(
            f"correlation id {value[:80]!r} must be 1 to {MAX_CORRELATION_ID} characters of "
            "A-Z, a-z, 0-9, '.', '_' or '-'"
        )
    return value


def command(form: ControlForm, name: str, correlation_id: str | None = None) -> str:
    """A command in `form`; only MARK_MEDIA and STOP_MEDIA_BUFFERING take a correlation id."""
    if form == JSON:
        body: dict[str, str] = {"command": name}
        if correlation_id is not None:
            body["correlation_id"] = _correlation_id(correlation_id)
        message = json.dumps(body, separators=(",", ":"))
    else:
        message = name if correlation_id is None else f"{name} {_correlation_id(correlation_id)}"
    if len(message) > MAX_COMMAND_BYTES:
        # Asterisk drops a longer TEXT message unread; the id limit keeps every command below.
        raise ValueError(f"{name} command of {len(message)} bytes exceeds {MAX_COMMAND_BYTES}")
    return message


def answer(form: ControlForm) -> str:
    return command(form, "ANSWER")


def hangup(form: ControlForm) -> str:
    return command(form, "HANGUP")


def mark_media(form: ControlForm, correlation_id: str) -> str:
    """Ask for MEDIA_MARK_PROCESSED `correlation_id` once the media sent so far has played."""
    return command(form, "MARK_MEDIA", correlation_id)


def flush_media(form: ControlForm) -> str:
    """Drop the media Asterisk has queued (and the marks in it: they are not reported)."""
    return command(form, "FLUSH_MEDIA")


def start_media_buffering(form: ControlForm) -> str:
    return command(form, "START_MEDIA_BUFFERING")


def stop_media_buffering(form: ControlForm, correlation_id: str | None = None) -> str:
    return command(form, "STOP_MEDIA_BUFFERING", correlation_id)


def get_status(form: ControlForm) -> str:
    return command(form, "GET_STATUS")


def report_queue_drained(form: ControlForm) -> str:
    return command(form, "REPORT_QUEUE_DRAINED")


def pause_media(form: ControlForm) -> str:
    return command(form, "PAUSE_MEDIA")


def continue_media(form: ControlForm) -> str:
    return command(form, "CONTINUE_MEDIA")
