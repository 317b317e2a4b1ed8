"""The gateways: each kind of connection a call arrives on (WebSocket carriers, /ws, WebRTC,
SIP, AudioSocket, chan_websocket), from its socket to a call's pipeline."""
