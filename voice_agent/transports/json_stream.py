"""What every JSON media-stream codec shares (Twilio, Telnyx, Plivo, Exotel): the envelope of
`receive` (the size limit, the JSON, the `event` field, media first, nothing after the stop,
an unknown event a warning rather than the end of a caller's call), the order check, and the
base64 payload of a media message, checked before and after decoding.

A codec says what it is (`PROTOCOL`, for a peer that sends binary frames), handles its media
(`_media`) and its other events (`_event`), and keeps its own fields' rules: the carriers
differ in how they spell and number things, not in this.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

from voice_agent.transports.errors import (
    POLICY_VIOLATION,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import json_message, malformed
from voice_agent.transports.state import StreamState

EventT = TypeVar("EventT")


class JsonMediaStream(Generic[EventT]):
    """One stream's inbound side: feed it each text message, get its codec's events back.

    Fatal problems raise `ProtocolError` (close the socket with its code and `close_reason`);
    harmless ones come back as a `ProtocolWarning` event in the list.
    """

    PROTOCOL: ClassVar[str]  # the carrier's name for its protocol, e.g. "Plivo Audio Stream"

    def __init__(self, *, max_message_chars: int, max_payload_bytes: int) -> None:
        self.max_message_chars = max_message_chars
        self.state = StreamState.NEW
        self._limit_payload(max_payload_bytes)

    def _limit_payload(self, max_payload_bytes: int) -> None:
        self.max_payload_bytes = max_payload_bytes
        # Longest base64 text that can decode to max_payload_bytes; checked before decoding.
        self._max_payload_chars = 4 * -(-max_payload_bytes // 3)

    # -- what a codec adds ---------------------------------------------------------------------

    def _media(self, message: Mapping[str, Any]) -> list[EventT | ProtocolWarning]:
        raise NotImplementedError

    def _event(
        self, event: str, message: Mapping[str, Any]
    ) -> list[EventT | ProtocolWarning] | None:
        """The events of a message other than media; None: an event this codec does not know."""
        raise NotImplementedError

    def _payload_limit_note(self) -> str:
        """What max_payload_bytes is in time, for the error that names it ("" if nothing)."""
        return ""

    # -- the envelope --------------------------------------------------------------------------

    def receive_bytes(self, data: bytes) -> NoReturn:
        """These carriers send text only: a binary frame is a peer not speaking the protocol."""
        raise ProtocolError(
            UNSUPPORTED_DATA,
            f"binary frame of {len(data)} bytes: {self.PROTOCOL} messages are JSON text",
            kind="binary_frame",
        )

    def receive_message(self, message: str | bytes) -> list[EventT | ProtocolWarning]:
        """One WebSocket message as it came: text to `receive`, a binary one refused."""
        if isinstance(message, bytes):
            self.receive_bytes(message)
        return self.receive(message)

    def receive(self, text: str) -> list[EventT | ProtocolWarning]:
        message = json_message(text, self.max_message_chars)
        event = message.get("event")
        # Media first: it is 50 messages a second, everything else a handful per call.
        if event == "media" and self.state is not StreamState.STOPPED:
            return self._media(message)
        if not isinstance(event, str):
            raise malformed('message has no "event" string')
        if self.state is StreamState.STOPPED:
            return [ProtocolWarning("after_stop", f"{event[:40]} message after stop ignored")]
        events = self._event(event, message)
        if events is None:
            # Carriers add event types over time; a new one must not end a caller's call.
            return [ProtocolWarning("unknown_event", f"unknown event {event[:40]!r} ignored")]
        return events

    def _require_started(self, event: str) -> None:
        if self.state is not StreamState.STARTED:
            raise ProtocolError(
                PROTOCOL_ERROR, f"{event} message before start", kind="out_of_order"
            )

    def _payload(self, media: Mapping[str, Any]) -> bytes:
        """`media.payload` decoded, or the ProtocolError that says what is wrong with it (the
        size is checked before decoding too, so an oversized one costs nothing)."""
        payload = media.get("payload")
        if not isinstance(payload, str):
            raise malformed(f"media.payload is {'missing' if payload is None else 'not a string'}")
        if len(payload) > self._max_payload_chars:
            raise self._payload_too_large(len(payload) * 3 // 4)
        try:
            data = binascii.a2b_base64(payload, strict_mode=True)
        except (binascii.Error, ValueError):
            # binascii's own wording differs between Python versions; the field says enough.
            raise ProtocolError(
                PROTOCOL_ERROR, "media.payload is not valid base64", kind="invalid_payload"
            ) from None
        if len(data) > self.max_payload_bytes:
            raise self._payload_too_large(len(data))
        return data

    def _payload_too_large(self, size: int) -> ProtocolError:
        note = self._payload_limit_note()
        return ProtocolError(
            POLICY_VIOLATION,
            f"media.payload of {size} bytes exceeds {self.max_payload_bytes}"
            + (f" ({note})" if note else ""),
            kind="payload_too_large",
        )
