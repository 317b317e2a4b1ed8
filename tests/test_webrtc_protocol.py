"""The sans-I/O half of WebRTC: signalling and data channel messages, and the playout model."""

from __future__ import annotations

import pytest

from voice_agent.transports import webrtc
from voice_agent.transports.errors import ProtocolError, ProtocolWarning

AUDIO_SDP = "v=0\\r\\nm=audio 9 UDP 96\\r\\n"  # as it appears inside a JSON string


def test_playout_fires_a_mark_once_its_audio_has_played_out() -> None:
    playout = webrtc.RtpPlayout(16000)
    playout.report_delay(40)
    frame = playout.frame_bytes
    playout.audio(bytes(frame * 2))
    playout.mark("r1:1")
    assert playout.next_frame(0) == (bytes(frame), [])
    _, heard = playout.next_frame(20)
    assert heard == []  # the last frame left at 20 ms; it plays until 40 ms, then 40 ms of delay
    _, heard = playout.next_frame(60)
    assert heard == []
    _, heard = playout.next_frame(80)
    assert heard == ["r1:1"]


def test_clear_drops_unsent_audio_and_its_marks() -> None:
    playout = webrtc.RtpPlayout(16000)
    playout.audio(bytes(playout.frame_bytes * 10))
    playout.mark("r1:1")
    playout.next_frame(0)
    playout.clear()
    assert playout.pending_ms == 0
    heard = [name for t in range(20, 400, 20) for name in playout.next_frame(t)[1]]
    assert heard == []


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("not json", "malformed_message"),
        ("[1]", "malformed_message"),
        ('{"type": "offer"}', "bad_sdp"),
        ('{"type": "offer", "sdp": "v=0\\r\\nm=video 9 UDP 96\\r\\n"}', "no_audio"),
        (
            '{"type": "offer", "sdp": "v=0\\r\\nm=audio 9 UDP 96\\r\\n", "agent": 7}',
            "invalid_offer",
        ),
        (
            '{"type": "offer", "sdp": "v=0\\r\\nm=audio 9 UDP 96\\r\\n", "args": []}',
            "invalid_offer",
        ),
        ("x" * 70_000, "message_too_big"),
    ],
)
def test_bad_signalling_messages_are_named(message: str, kind: str) -> None:
    with pytest.raises(ProtocolError) as error:
        webrtc.parse_signal(message)
    assert error.value.kind == kind


def test_data_channel_messages_are_never_fatal() -> None:
    assert webrtc.parse_channel('{"type":"playout","delay_ms":85.5}') == webrtc.Playout(85.5)
    assert webrtc.parse_channel('{"type":"dtmf","digit":"5"}') == webrtc.Dtmf("5")
    for bad in ("nope", '{"type":"playout","delay_ms":-1}', '{"type":"dtmf","digit":"55"}', b"x"):
        assert isinstance(webrtc.parse_channel(bad), ProtocolWarning)
