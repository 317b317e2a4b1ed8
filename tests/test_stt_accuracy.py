"""How well each recogniser understands speech the project did not write: real recordings of
people (tests/support/speech_eval.py) and off-script booking lines, over the browser path
(16 kHz) and the phone path (8 kHz mu-law). Word error rates go to the run's measurements;
the default engine's are held to the targets.

Only the `report` split is scored here; settings were chosen on the `tune` split.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.conftest import report
from tests.support import speech_eval
from voice_agent.engines.stt import ProcessPoolStt, Stt, SttConfig, build_domain_lm, make_stt
from voice_agent.engines.stt.scoring import ErrorCount

REAL_LINES = 50  # of the report split, spread over the speakers
DEFAULT_ENGINE = "whisper tiny.en"
TARGET_PHONE = 0.15  # real speech and the natural-voiced off-script lines, phone path
TARGET_REAL = 0.20  # real human speech, either path
# eSpeak's formant voices are rules, not recordings: every recogniser here hears them worse
# than any person (docs/performance.md). They are reported, and kept out of the target.
NATURAL_VOICES = ("joe",)

pytestmark = pytest.mark.asyncio(loop_scope="module")


# Every run measures the default engine (and holds it to the targets) and the low-CPU option;
# the comparisons that decided against the other two (docs/performance.md) run with
# STT_ACCURACY_ALL=1, to keep the suite inside its time.
ENGINES = ["whisper tiny.en", "pocketsphinx domain"]
if os.environ.get("STT_ACCURACY_ALL") == "1":
    ENGINES += ["whisper tiny.en, intents as prompt", "pocketsphinx full"]


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=ENGINES)
async def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, Stt]]:
    # Never a silent skip: scripts/test installs the recordings.
    missing = speech_eval.missing_packages()
    assert not missing, f"Debian packages {', '.join(missing)} are missing: run scripts/test"
    name: str = request.param
    stt: Stt
    if name == "pocketsphinx domain":
        lm = build_domain_lm(
            speech_eval.default_agent_phrases(), cache_dir=tmp_path_factory.mktemp("lm")
        )
        stt = ProcessPoolStt(lm, processes=2)
    elif name == "pocketsphinx full":
        stt = ProcessPoolStt(None, processes=2)
    else:
        phrases = tuple(speech_eval.default_agent_phrases()) if "prompt" in name else ()
        stt = make_stt(SttConfig(provider="whisper", processes=2, phrases=phrases))
    yield name, stt
    await stt.aclose()


@pytest.fixture(scope="module")
def evaluation_set() -> dict[str, list[speech_eval.Utterance]]:
    return {
        "real": speech_eval.sample(speech_eval.real_speech(), "report", REAL_LINES),
        "offscript": speech_eval.sample(speech_eval.offscript_lines(), "report"),
    }


@pytest.mark.parametrize("route", ["phone", "browser"])
async def test_word_error_rate_on_unseen_speech(
    engine: tuple[str, Stt],
    route: speech_eval.Route,
    evaluation_set: dict[str, list[speech_eval.Utterance]],
) -> None:
    name, stt = engine
    real = await speech_eval.word_errors(stt, evaluation_set["real"], route)
    offscript = await speech_eval.word_errors(stt, evaluation_set["offscript"], route)
    whole = _sum(real["all"], offscript["all"])
    natural = _sum(real["all"], *(offscript[f"speaker:{voice}"] for voice in NATURAL_VOICES))
    voices = ", ".join(
        f"{voice} {offscript[f'speaker:{voice}'].rate:.2f}"
        for voice in ("joe", "espeak", "espeakf")
    )
    report(
        f"STT WER {name:34} {route:7}: all {whole.rate:.3f} ({whole.words} words), "
        f"real {real['all'].rate:.3f} ({real['all'].utterances} lines), "
        f"off-script {offscript['all'].rate:.3f} ({voices}), "
        f"real + joe {natural.rate:.3f}"
    )
    if name == DEFAULT_ENGINE:
        assert real["all"].rate <= TARGET_REAL
        if route == "phone":
            assert natural.rate <= TARGET_PHONE


def _sum(*counts: ErrorCount) -> ErrorCount:
    return ErrorCount(
        sum(c.errors for c in counts),
        sum(c.words for c in counts),
        sum(c.utterances for c in counts),
    )
