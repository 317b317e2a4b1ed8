"""Whether the SIP trunk answers: the server's OPTIONS probe (voice_agent/sip/trunk_probe.py),
sans-I/O on a virtual clock, then against sipp playing a trunk that answers it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import httpx

from tests.support.configs import QUICK_VOICE, default_config_with, serving
from tests.support.sipp import SippCallee, free_udp_port, scenario
from tests.test_sip_calls import received
from voice_agent.sip.events import Send
from voice_agent.sip.message import SipMessage, build_response, parse_message
from voice_agent.sip.trunk_probe import ProbeSettings, TrunkProbe, TrunkReachability

PROBE = ProbeSettings(
    trunk=("127.0.0.1", 5080),
    trunk_uri="sip:127.0.0.1:5080",
    from_uri="sip:voice-agent@127.0.0.1",
    via_host="127.0.0.1:5060",
    interval_ms=30_000,
)


def sent(actions: Iterable[object]) -> list[SipMessage]:
    return [parse_message(a.data) for a in actions if isinstance(a, Send)]


def answer(request: SipMessage, status: int) -> SipMessage:
    return parse_message(build_response(request, status, to_tag="t1"))


def test_the_trunk_is_probed_with_options_and_its_silence_marks_it_unreachable() -> None:
    probe = TrunkProbe(PROBE)
    (ping,) = sent(probe.start(0.0))
    assert (ping.method, ping.uri) == ("OPTIONS", "sip:127.0.0.1:5080")
    # Any answer is one: a trunk that refuses OPTIONS with 405 is there.
    assert probe.response(answer(ping, 405), 50.0) == [
        TrunkReachability(True, "405 Method Not Allowed")
    ]
    assert probe.next_deadline_ms() == 30_000
    (again,) = sent(probe.tick(30_000))
    assert again.call_id == ping.call_id and again.cseq[0] == ping.cseq[0] + 1
    assert probe.response(answer(again, 200), 30_050) == []  # still reachable: nothing new
    assert sent(probe.tick(60_000))
    changes: list[object] = []
    while (deadline := probe.next_deadline_ms()) is not None and not changes:
        changes = [a for a in probe.tick(deadline) if isinstance(a, TrunkReachability)]
    assert changes == [TrunkReachability(False, "no answer to OPTIONS in 32 s")]
    assert probe.next_deadline_ms() == 90_000  # the next probe keeps the interval


def test_a_stray_answer_is_not_taken_for_the_trunks() -> None:
    probe = TrunkProbe(PROBE)
    (ping,) = sent(probe.start(0.0))
    late = parse_message(build_response(ping, 200).replace(b"CSeq: 1", b"CSeq: 7"))
    assert probe.response(late, 10.0) == [] and probe.reachable is None
    assert probe.response(answer(ping, 100), 10.0) == []


async def test_the_server_probes_its_trunk_and_says_it_answers(tmp_path: Path) -> None:
    port = free_udp_port()
    trunk = SippCallee(tmp_path, scenario("options_answerer", tmp_path), port=port, timeout_s=30)
    await trunk.start()
    sip = {"trunk": {"address": f"127.0.0.1:{port}", "options_interval_s": 1}}
    config = default_config_with(tmp_path / "server", voice=QUICK_VOICE, sip=sip)
    try:
        async for server in serving(config, sip=True):
            assert server.sip is not None
            result = await trunk.result()  # two probes answered, a second apart
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"http://127.0.0.1:{server.port}/healthz")).json()
                metrics = (await http.get(f"http://127.0.0.1:{server.port}/metrics")).text
    finally:
        await trunk.stop()
    assert result.ok, result.stderr + result.messages
    probes = [m for m in received(result) if m.method == "OPTIONS"]
    assert len(probes) == 2 and probes[0].call_id == probes[1].call_id
    assert health["sip_trunk"] == {"reachable": True, "detail": "200 OK"}
    assert "voice_agent_sip_trunk_reachable 1.0" in metrics
