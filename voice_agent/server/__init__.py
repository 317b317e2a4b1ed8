"""The voice server: HTTP and WebSocket on one port, a pipeline per call, the call records."""
