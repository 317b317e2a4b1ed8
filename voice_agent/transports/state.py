"""Where a media stream is in its life, for every codec: a stream begins NEW, some protocols
have a CONNECTED step before the call's start (Exotel's `connected`), then STARTED, STOPPED."""

from __future__ import annotations

import enum


class StreamState(enum.Enum):
    NEW = "new"
    CONNECTED = "connected"
    STARTED = "started"
    STOPPED = "stopped"
