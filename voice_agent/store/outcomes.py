"""How a call ended, in a few words a filter can use: the outcome of an end reason.

The server ends a call with a free-text reason; the store keeps it and files the call under one
outcome. The reasons the server produces today, and their outcomes:

=================================================  ================  ==============================
reason                                             outcome           where it comes from
=================================================  ================  ==============================
"completed"                                        completed         CallSession.end()'s default
"call ended"                                       completed         webrtc: the pipeline finished
"agent ended the call"                             agent_ended       a flow route's `end_call`
"caller hung up"                                   caller_hung_up    endpoints, webrtc: Stop/Hangup
"caller hung up before the call connected"         caller_hung_up    webrtc, before ICE connected
"transferred..." / "transfer..."                   transferred       a transfer out of the call
"connection lost"                                  error             the socket or peer failed
"protocol error: ..."                              error             endpoints, webrtc
"ice failed: ..."                                  error             webrtc: ICE/DTLS never came up
"client is not reading: outbound buffer full"      error             endpoints: a stalled client
"no ACK from the caller", "media failed: ..."     error             sip: a 2xx never acknowledged,
                                                                     a call's RTP tick failed
"AudioSocket error ..."                            error             audiosocket: Asterisk's 0xff
"session expired: ..."                             error             sip: no session refresh came
                                                                     (RFC 4028), or ours failed
"media timeout: ..."                               error             sip: no RTP or RTCP came for
                                                                     sip.media_timeout_s
"callee hung up"                                   caller_hung_up    sip: a placed call's far end
"busy: ..."                                        busy              a placed call: SIP 486/600, a
                                                                     carrier's busy callback
"no answer: ..."                                   no_answer         SIP 480/408/487, ring timeout,
                                                                     a carrier's no-answer
"call failed: ..."                                 failed            a bad number, refused, a
                                                                     carrier's API refusing, ...
"server shutting down"                             interrupted       VoiceServer.shutdown()
"interrupted: server draining"                     interrupted       a drain's deadline (drain.py)
"interrupted..."                                   interrupted       the store: its writer died
anything else                                      error             a reason no rule knows yet
=================================================  ================  ==============================

A transfer between agents (`transfer_to_agent`, a flow's `transfer:`) keeps the call going, so
it is no end reason; "transferred" is for handing the call out of the server (a SIP REFER, a
Twilio <Dial>), whose reason should start with "transferred". An unknown reason is filed as an
error so it shows up in a filter for problems rather than among good calls: add it here.
"""

from __future__ import annotations

from typing import Final

COMPLETED: Final = "completed"
CALLER_HUNG_UP: Final = "caller_hung_up"
AGENT_ENDED: Final = "agent_ended"
TRANSFERRED: Final = "transferred"
ERROR: Final = "error"
INTERRUPTED: Final = "interrupted"
# A call the server placed that was never answered: the callee's line was busy, nobody picked
# up, or the number or the trunk refused it.
BUSY: Final = "busy"
NO_ANSWER: Final = "no_answer"
FAILED: Final = "failed"

OUTCOMES: Final = (
    COMPLETED,
    CALLER_HUNG_UP,
    AGENT_ENDED,
    TRANSFERRED,
    ERROR,
    INTERRUPTED,
    BUSY,
    NO_ANSWER,
    FAILED,
)

_EXACT: Final = {
    "completed": COMPLETED,
    "call ended": COMPLETED,
    "agent ended the call": AGENT_ENDED,
    "caller hung up": CALLER_HUNG_UP,
    "caller hung up before the call connected": CALLER_HUNG_UP,
    "callee hung up": CALLER_HUNG_UP,
    "connection lost": ERROR,
    "server shutting down": INTERRUPTED,
}

# Reasons that carry details after a fixed start; checked in order.
_PREFIXES: Final = (
    ("caller hung up", CALLER_HUNG_UP),
    ("agent ended", AGENT_ENDED),
    ("transfer", TRANSFERRED),
    ("interrupted", INTERRUPTED),
    ("protocol error", ERROR),
    ("busy", BUSY),
    ("no answer", NO_ANSWER),
    ("call failed", FAILED),
    ("ice failed", ERROR),
    ("client is not reading", ERROR),
    ("session expired", ERROR),
    ("media timeout", ERROR),
)


def outcome_for(reason: str) -> str:
    """The outcome (one of OUTCOMES) of an end reason; see the table above."""
    key = reason.strip().lower()
    if key in _EXACT:
        return _EXACT[key]
    for prefix, outcome in _PREFIXES:
        if key.startswith(prefix):
            return outcome
    return ERROR
