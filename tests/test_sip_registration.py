"""Registering with a registrar (voice_agent/sip/registration.py, RFC 3261 section 10),
sans-I/O: the registrar here is the server's own digest authenticator (voice_agent/sip/auth.py)
checking what the registration answers, and the clock is the `now_ms` each test passes in.
At the end, the server registering with a real peer: sipp as the registrar."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest

from tests.support.configs import QUICK_VOICE, default_config_with, ended_call, serving
from tests.support.sipp import SippCallee, free_udp_port, scenario
from tests.test_sip_calls import received
from voice_agent.sip.auth import Credentials, DigestAuthenticator
from voice_agent.sip.events import Send
from voice_agent.sip.message import SipMessage, build_response, parse_message
from voice_agent.sip.registration import (
    BACKOFF_BASE_MS,
    Registration,
    RegistrationChanged,
    RegistrationSettings,
)
from voice_agent.sip.transaction import T1_MS, TIMEOUT_MS

REGISTRAR = ("127.0.0.1", 5080)
SETTINGS = RegistrationSettings(
    name="pbx",
    registrar=REGISTRAR,
    registrar_uri="sip:127.0.0.1:5080",
    aor="sip:alice@pbx.example",
    contact="sip:alice@127.0.0.1:5060",
    via_host="127.0.0.1:5060",
    expires_s=600,
    credentials=Credentials("alice", "s3cret"),
)


def sent(actions: Iterable[object]) -> list[SipMessage]:
    return [parse_message(a.data) for a in actions if isinstance(a, Send)]


def changes(actions: Iterable[object]) -> list[str]:
    return [a.state for a in actions if isinstance(a, RegistrationChanged)]


def answer(
    request: SipMessage, status: int, headers: list[tuple[str, str]] | None = None
) -> SipMessage:
    return parse_message(build_response(request, status, to_tag="reg1", headers=headers or []))


def registered(
    registration: Registration, registrar: DigestAuthenticator
) -> tuple[SipMessage, SipMessage]:
    """Through the challenge to the 200: the first REGISTER, and the one accepted."""
    (first,) = sent(registration.start(0.0))
    (again,) = sent(registration.response(answer(first, 401, registrar.challenges(10.0)), 20.0))
    verdict = registrar.verify("REGISTER", again.get("authorization"), 30.0)
    assert verdict.ok, verdict
    contact = f"<{SETTINGS.contact}>;expires=120"
    actions = registration.response(answer(again, 200, [("Contact", contact)]), 40.0)
    assert changes(actions) == ["registered"]
    return first, again


def test_a_challenged_register_is_answered_and_the_binding_refreshed_before_it_lapses() -> None:
    registrar = DigestAuthenticator("pbx.example", {"alice": "s3cret"}, algorithms=("SHA-256",))
    registration = Registration(SETTINGS)
    first, accepted = registered(registration, registrar)
    assert (first.method, first.uri) == ("REGISTER", "sip:127.0.0.1:5080")
    assert first.get("to") == "<sip:alice@pbx.example>" and first.get("expires") == "600"
    assert first.get("contact") == "<sip:alice@127.0.0.1:5060>"
    assert accepted.call_id == first.call_id and accepted.cseq[0] == first.cseq[0] + 1
    assert registration.state == "registered"
    # 120 s granted (the Contact's expires wins over what was asked): refreshed at 88 s, the
    # 32 s a REGISTER may take before the binding lapses (a fifth left would be 96 s).
    assert registration.next_deadline_ms() == pytest.approx(40.0 + 88_000)
    assert registration.tick(40.0 + 87_000) == []
    (refresh,) = sent(registration.tick(40.0 + 88_000))
    assert refresh.method == "REGISTER" and refresh.call_id == first.call_id


def test_refused_credentials_fail_and_the_next_tries_back_off() -> None:
    registrar = DigestAuthenticator("pbx.example", {"alice": "another"})
    registration = Registration(SETTINGS)
    (first,) = sent(registration.start(0.0))
    (again,) = sent(registration.response(answer(first, 401, registrar.challenges(0.0)), 10.0))
    assert not registrar.verify("REGISTER", again.get("authorization"), 20.0).ok
    actions = registration.response(answer(again, 401, registrar.challenges(20.0)), 30.0)
    assert changes(actions) == ["failed"] and not sent(actions)
    (failed,) = [a for a in actions if isinstance(a, RegistrationChanged)]
    assert "refused the credentials" in failed.detail and "30 s" in failed.detail
    assert registration.next_deadline_ms() == 30.0 + BACKOFF_BASE_MS
    (retry,) = sent(registration.tick(30.0 + BACKOFF_BASE_MS))
    actions = registration.response(answer(retry, 403), 30.0 + BACKOFF_BASE_MS + 10)
    assert changes(actions) == ["failed"]
    assert registration.next_deadline_ms() == 30.0 + 3 * BACKOFF_BASE_MS + 10  # doubled


def test_a_silent_registrar_gets_retransmissions_then_a_failure() -> None:
    registration = Registration(SETTINGS)
    assert sent(registration.start(0.0))
    times = []
    while (deadline := registration.next_deadline_ms()) is not None and deadline < TIMEOUT_MS:
        if sent(registration.tick(deadline)):
            times.append(deadline)
    assert times[:3] == [T1_MS, 3 * T1_MS, 7 * T1_MS]  # timer E doubling
    actions = registration.tick(TIMEOUT_MS)
    assert changes(actions) == ["failed"] and registration.state == "failed"


def test_interval_too_brief_asks_again_for_the_minimum() -> None:
    registration = Registration(SETTINGS)
    (first,) = sent(registration.start(0.0))
    (again,) = sent(registration.response(answer(first, 423, [("Min-Expires", "1800")]), 5.0))
    assert again.get("expires") == "1800"


def test_stopping_removes_the_binding() -> None:
    registrar = DigestAuthenticator("pbx.example", {"alice": "s3cret"})
    registration = Registration(SETTINGS)
    registered(registration, registrar)
    (removal,) = sent(actions := registration.stop(50.0))
    assert changes(actions) == ["unregistering"] and removal.get("expires") == "0"
    assert changes(registration.response(answer(removal, 200), 60.0)) == ["unregistered"]
    assert registration.next_deadline_ms() is None  # no refresh after it


def test_a_stray_or_late_response_changes_nothing() -> None:
    registration = Registration(SETTINGS)
    (first,) = sent(registration.start(0.0))
    other = parse_message(build_response(first, 200).replace(b"CSeq: 1", b"CSeq: 9"))
    assert registration.response(other, 5.0) == []
    assert registration.response(answer(first, 100), 5.0) == []
    assert registration.state == "registering"


# ---- against a real registrar: sipp ---------------------------------------------------------


async def test_the_server_registers_takes_the_call_sent_to_its_binding_and_unregisters(
    tmp_path: Path,
) -> None:
    """sipp as the registrar (tests/fixtures/sipp/registrar.xml): it challenges, checks the
    digest against alice's password, grants 120 s, sends a call to the contact; the default
    agent answers it as any call; draining removes the binding."""
    registrar_port = free_udp_port()
    xml = scenario("registrar", tmp_path, user="alice", password="reg-s3cret", call_ms="2000")
    registrar = SippCallee(tmp_path, xml, port=registrar_port, timeout_s=40)
    await registrar.start()
    entry = {
        "registrar": f"127.0.0.1:{registrar_port}",
        "user": "alice",
        "password_secret": "reg_password",
        "name": "pbx",
    }
    config = default_config_with(
        tmp_path / "server", voice=QUICK_VOICE, sip={"registrations": [entry]}
    )
    try:
        async for server in serving(config, sip=True, secrets={"reg_password": "reg-s3cret"}):
            gateway = server.sip
            assert gateway is not None
            async with asyncio.timeout(20):
                while not server.pipelines:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # a condition wait: until the registrar's call
            (pipeline,) = server.pipelines.values()
            assert gateway.registrations.states["pbx"]["state"] == "registered"
            assert gateway.registrations.states["pbx"]["expires_s"] == 120
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"http://127.0.0.1:{server.port}/healthz")).json()
                metrics = (await http.get(f"http://127.0.0.1:{server.port}/metrics")).text
            assert health["sip_registrations"]["pbx"]["state"] == "registered"
            assert 'voice_agent_sip_registered{registration="pbx"} 1.0' in metrics
            await asyncio.wait_for(pipeline.finished.wait(), 20)
            call = await ended_call(server, pipeline.session.call_id)
            assert call["agent"] == "booking" and call["state"]["called"] == "alice"
            assert call["end_reason"] == "caller hung up"
            gateway.drain()
            async with asyncio.timeout(10):
                while gateway.registrations.states["pbx"]["state"] != "unregistered":  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # a condition wait: until the registrar's 200
            result = await registrar.result()
    finally:
        await registrar.stop()
    assert result.ok, result.stderr + result.messages
    registers = [m for m in received(result) if m.method == "REGISTER"]
    assert [m.get("expires") for m in registers] == ["600", "600", "0"]
    assert registers[0].get("authorization") is None
    assert 'username="alice"' in (registers[1].get("authorization") or "")
