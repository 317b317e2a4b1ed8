"""The plain parts of placing calls: when an outbound agent speaks first (the callee's hello),
the table tying a placed call's stream and callbacks to its request, and how the carriers'
status and answering-machine callbacks read (Twilio's, Telnyx's signed webhooks, Plivo's)."""

from __future__ import annotations

import base64
import math

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from voice_agent.callcontrol.placed_calls import Answered, PlacedCalls, Unanswered, Verdict
from voice_agent.callcontrol.plivo_rest import parse_callback as plivo_callback
from voice_agent.callcontrol.plivo_rest import stream_xml
from voice_agent.callcontrol.telnyx_rest import parse_webhook, valid_webhook_signature
from voice_agent.callcontrol.twilio_rest import parse_status, stream_twiml
from voice_agent.core.callee_hello import MIN_SPEECH_MS, PAUSE_MS, QUIET_MS, CalleeHello


def feed(hello: CalleeHello, pattern: list[tuple[bool, float]], start_ms: float = 0.0) -> float:
    """Frames of (speech?, for ms); the time at which `frame` first said go, or -1."""
    now = start_ms
    for is_speech, ms in pattern:
        for _ in range(int(ms // 20)):
            now += 20
            if hello.frame(is_speech, now):
                return now
    return -1.0


PAUSE = 20 * math.ceil(PAUSE_MS / 20)  # the pause, in whole 20 ms frames


def test_the_greeting_follows_the_callees_hello_after_a_short_pause() -> None:
    hello = CalleeHello(0.0)
    went = feed(hello, [(False, 400), (True, 500), (False, 1000)])
    assert went == 400 + 500 + PAUSE


def test_a_callee_who_says_nothing_is_greeted_after_the_quiet_spell() -> None:
    hello = CalleeHello(0.0)
    assert feed(hello, [(False, 5000)]) == QUIET_MS
    assert not hello.heard


def test_a_click_is_no_hello_and_a_hello_that_goes_on_is_waited_for() -> None:
    hello = CalleeHello(0.0)
    # A 60 ms click at 2 s: not a hello; the quiet spell waits out its pause, then goes.
    went = feed(hello, [(False, 2000), (True, 60), (False, 3000)])
    assert not hello.heard and went == 2060 + PAUSE
    talker = CalleeHello(0.0)
    # "Hello, Bella Vista, Ada speaking": pauses shorter than PAUSE_MS within it.
    went = feed(talker, [(True, 400), (False, 300), (True, 800), (False, 1000)])
    assert talker.heard and went == 400 + 300 + 800 + PAUSE
    assert MIN_SPEECH_MS < 400


def test_a_placed_calls_token_is_taken_once_and_only_with_its_key() -> None:
    now = [0.0]
    calls = PlacedCalls(expire_s=100.0, clock=lambda: now[0])
    call = calls.add("c1", "booking", {"name": "Ada"}, "+14155550123", "twilio")
    assert calls.get("c1", "wrong") is None and calls.get("c2", call.key) is None
    assert calls.valid_token(call.token) and not calls.valid_token("c1.guess")
    assert calls.claim(call.token) is call
    assert calls.claim(call.token) is None  # a replayed stream
    assert not calls.valid_token(call.token)


def test_placed_calls_their_carrier_never_reports_on_are_dropped() -> None:
    now = [0.0]
    calls = PlacedCalls(expire_s=100.0, clock=lambda: now[0])
    waiting = calls.add("c1", "booking", {}, "+1", "twilio")
    streaming = calls.add("c2", "booking", {}, "+2", "twilio")
    calls.claim(streaming.token)
    now[0] = 99.0
    assert calls.expired() == []
    now[0] = 100.0
    assert calls.expired() == [waiting]
    assert len(calls) == 1  # the one on a call stays until its stream ends


def test_twilios_callbacks_read_as_what_became_of_the_call() -> None:
    assert parse_status({"CallStatus": "ringing"}) is None
    assert parse_status({"CallStatus": "busy"}) == Unanswered("busy: the callee's line was busy")
    assert parse_status({"CallStatus": "no-answer"}) == Unanswered("no answer: nobody picked up")
    failed = parse_status({"CallStatus": "failed", "SipResponseCode": "404"})
    assert failed == Unanswered("call failed: Twilio could not place the call (code 404)")
    assert parse_status({"AnsweredBy": "human"}) == Verdict("person", said="human")
    beep = parse_status({"AnsweredBy": "machine_end_beep", "CallStatus": "in-progress"})
    assert beep == Verdict("message", beep=True, said="machine_end_beep")
    assert parse_status({"AnsweredBy": "unknown"}) is None


def test_the_stream_twiml_escapes_what_it_carries() -> None:
    twiml = stream_twiml('wss://h/twilio?a="b"', "id.k&y")
    assert 'url="wss://h/twilio?a=&quot;b&quot;"' in twiml
    assert 'value="id.k&amp;y"' in twiml


def test_telnyxs_webhooks_read_as_what_became_of_the_call() -> None:
    def event(kind: str, **payload: str) -> dict[str, object]:
        return {"data": {"event_type": kind, "payload": payload}}

    assert parse_webhook(event("call.initiated")) is None
    assert parse_webhook(event("call.answered")) == Answered()
    busy = parse_webhook(event("call.hangup", hangup_cause="user_busy"))
    assert busy == Unanswered("busy: the callee's line was busy")
    odd = parse_webhook(event("call.hangup", hangup_cause="not_found", sip_hangup_cause="404"))
    assert odd == Unanswered("call failed: Telnyx ended the call (not_found, SIP 404)")
    human = parse_webhook(event("call.machine.premium.detection.ended", result="human_business"))
    assert human == Verdict("person", said="human_business")
    assert parse_webhook(event("call.machine.detection.ended", result="not_sure")) is None
    beep = parse_webhook(event("call.machine.greeting.ended", result="beep_detected"))
    assert beep == Verdict("message", beep=True, said="beep_detected")
    assert parse_webhook({"data": "junk"}) is None and parse_webhook([]) is None


def test_a_telnyx_signature_must_be_its_own_and_recent() -> None:
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    body, now = b'{"data": {}}', 1_800_000_000

    def signed(timestamp: int, data: bytes = body) -> str:
        return base64.b64encode(key.sign(f"{timestamp}|".encode() + data)).decode()

    check = public.decode()
    assert valid_webhook_signature(check, str(now), body, signed(now), now + 10)
    assert not valid_webhook_signature(check, str(now), b"{}", signed(now), now)  # other body
    assert not valid_webhook_signature(check, str(now), body, signed(now), now + 301)  # replay
    assert not valid_webhook_signature(check, "soon", body, signed(now), now)
    assert not valid_webhook_signature(check, str(now), body, "not base64!", now)


def test_plivos_callbacks_read_as_what_became_of_the_call() -> None:
    busy = plivo_callback({"CallStatus": "busy", "HangupCause": "Busy Line"})
    assert busy == Unanswered("busy: the callee's line was busy (Busy Line)")
    assert plivo_callback({"CallStatus": "in-progress"}) is None
    assert plivo_callback({"Machine": "true"}) == Verdict("machine", said="Machine=true")
    assert plivo_callback({"Machine": "false"}) == Verdict("person", said="Machine=false")
    xml = stream_xml("wss://h/plivo?placed_call=a.b")
    assert 'bidirectional="true"' in xml and ">wss://h/plivo?placed_call=a.b</Stream>" in xml
