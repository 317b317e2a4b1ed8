"""The WebSocket paths that carry a call, listed once: the server routes them and holds their
messages for the endpoint (app.py), and the access policy guards them (auth.py)."""

from __future__ import annotations

from voice_agent.gateways.asterisk_ws import PATH as ASTERISK_PATH
from voice_agent.gateways.carriers import CARRIERS

TWILIO_PATH = "/twilio"
NATIVE_PATH = "/ws"
RTC_PATH = "/rtc"
CARRIER_PATHS = tuple(CARRIERS)  # /telnyx, /plivo, /vonage, /exotel, /jambonz
CALL_PATHS = frozenset({TWILIO_PATH, NATIVE_PATH, RTC_PATH, ASTERISK_PATH, *CARRIER_PATHS})
