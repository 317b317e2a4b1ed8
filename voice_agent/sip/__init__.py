"""SIP for calls straight from a trunk or a PBX, sans-I/O: messages (message.py, RFC 3261
section 7) first; transactions, dialogs, SDP and RTP follow (issue 17)."""
