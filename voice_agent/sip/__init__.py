"""SIP and RTP for calls straight from a trunk or a PBX, sans-I/O, one module per part of the
RFCs (docs/telephony.md lists them); voice_agent.gateways.sip moves their bytes."""
