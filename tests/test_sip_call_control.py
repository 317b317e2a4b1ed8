"""Call control on SIP calls with sipp as the far end: the agent's transfer as a REFER that the
far end takes (202, a NOTIFY of the target's 200, our BYE) or declines (603: the agent says so
and the call goes on)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from tests.support.baresip import Baresip, write_line
from tests.support.configs import QUICK_VOICE, default_config_with, serving
from tests.support.live_calls import CallAudit, new_pipeline
from tests.support.sipp import run_sipp, scenario, write_rtp_pcap
from tests.test_sip_calls import (
    GREETING_MS,
    audit,
    last_call,
    messages,
    needs_root,
    received,
    spoken_ulaw,
    target,
)
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

DESK = "sip:frontdesk@192.0.2.10"
SORRY = "Sorry, nobody can take your call right now. I can book, change or cancel a table."


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent, whose talk_to_human route hands the caller to the front desk."""
    path = default_config_with(tmp_path_factory.mktemp("sip-control"), voice=QUICK_VOICE)
    data = yaml.safe_load(path.read_text())
    agent = data["agents"]["booking"]
    agent["destinations"] = {"front_desk": DESK}
    for route in agent["flow"]["routes"]:
        if route.get("intent") == "talk_to_human":
            route["say"] = "Putting you through to the front desk."
            route["transfer_call"] = "front_desk"
        if route.get("intent") == "opening_hours":
            route["send_dtmf"] = "12#"  # as if the hours came from an IVR behind us
    agent["flow"].setdefault("events", {})["transfer_failed"] = {"say": SORRY}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    async for voice_server in serving(path, sip=True):
        yield voice_server


async def asks_for_a_person(folder: Path) -> Path:
    pcap = folder / "person.pcap"
    line = await asyncio.to_thread(spoken_ulaw, "Can I speak to a person?")
    write_rtp_pcap(pcap, line, payload_type=0, lead_in_ms=500)
    return pcap


@needs_root
async def test_a_transfer_the_far_end_takes_is_a_refer_then_our_bye(
    server: VoiceServer, tmp_path: Path
) -> None:
    xml = scenario(
        "refer_accept", tmp_path,
        before_ms=str(GREETING_MS - 500), speech=str(await asks_for_a_person(tmp_path)),
        refer_timeout_ms="15000",
    )  # fmt: skip
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    refer = next(m for m in received(result) if m.method == "REFER")
    assert refer.get("refer-to") == f"<{DESK}>"
    call = await last_call(server)
    # The line played whole before the REFER went: it is committed as said.
    assert messages(call, "assistant")[-1] == "Putting you through to the front desk."
    assert call["end_reason"] == "transferred to front_desk"
    assert call["outcome"] == "transferred"
    (asked,) = audit(call, "transfer_call")
    assert asked["target"] == DESK and audit(call, "transferred")


@needs_root
async def test_a_declined_transfer_is_said_and_the_call_goes_on(
    server: VoiceServer, tmp_path: Path
) -> None:
    xml = scenario(
        "refer_decline", tmp_path,
        before_ms=str(GREETING_MS - 500), speech=str(await asks_for_a_person(tmp_path)),
        refer_timeout_ms="15000", after_ms="5000",
    )  # fmt: skip
    result = await run_sipp(target(server), tmp_path, scenario_file=xml)
    assert result.ok, result.stderr + result.messages
    call = await last_call(server)
    assert messages(call, "assistant")[-2:] == ["Putting you through to the front desk.", SORRY]
    (error,) = [e for e in audit(call, "error") if e["where"] == "transfer_call"]
    assert "603" in error["message"]
    assert call["end_reason"] == "caller hung up"


async def test_keys_the_agent_sends_reach_the_phone_as_rfc_4733_events(
    server: VoiceServer, tmp_path: Path
) -> None:
    """baresip asks for the opening hours; the route's send_dtmf presses 1, 2, # on its line,
    and baresip reports each key it received (telephone-event was negotiated)."""
    line = await asyncio.to_thread(spoken_ulaw, "When are you open?")
    wav = write_line(tmp_path / "hours.wav", ulaw_decode(line))
    phone = Baresip(tmp_path)
    await phone.start()
    try:
        known = set(server.pipelines)
        await phone.dial(f"sip:booking@{target(server)}")
        await phone.wait_event("CALL_ESTABLISHED")
        said = CallAudit(await new_pipeline(server, known))
        await said.until("agent_utterance")  # the greeting, heard out
        await phone.say(wav)
        keys = await phone.wait_event("CALL_DTMF_START", count=3)
        # The keys went out ahead of the hours line, which waited and then played whole.
        await said.until("agent_utterance")
        await phone.hang_up()
        await phone.wait_event("CALL_CLOSED")
    finally:
        await phone.close()
    assert [k.get("param") for k in keys] == ["1", "2", "#"]
    call = await last_call(server)
    assert [e["digits"] for e in audit(call, "dtmf_sent")] == ["12#"]
    assert "open every day" in (messages(call, "assistant")[-1] or "")
