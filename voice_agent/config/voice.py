"""An agent's voice settings: how its intents are matched, its VAD, STT and TTS engines, when the
caller's turn ends, what an interruption is, hold audio."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from voice_agent.config.base import Strict, checked_model
from voice_agent.errors import VoiceAgentError


class NluSettings(Strict):
    """How a flow agent's intents are matched (voice_agent.brains.flows.semantic)."""

    # meaning: a sentence encoder's similarity blended with the wording; lexical: wording alone.
    matcher: Literal["meaning", "lexical"] = "meaning"
    # "all-MiniLM-L6-v2" (installed by scripts/_env.sh) or a sentence-transformers BERT folder.
    model: str = Field(default="all-MiniLM-L6-v2", validate_default=True)
    # Intents scoring below it match nothing; None: 0.5 by meaning, flow.match_threshold lexical.
    threshold: float | None = Field(default=None, ge=0, le=1)

    @field_validator("model")
    @classmethod
    def _model_exists(cls, model: str, info: ValidationInfo) -> str:
        if info.data.get("matcher") != "meaning":
            return model
        from voice_agent.engines.embedding.base import BUNDLED_NAME
        from voice_agent.engines.embedding.minilm import resolve_model

        return checked_model(model, {BUNDLED_NAME}, resolve_model, info)


ContextOnTransfer = Literal["all", "none"] | Annotated[int, Field(ge=0)]


class VadSettings(Strict):
    provider: Literal["webrtcvad", "silero"] = "webrtcvad"
    aggressiveness: int = Field(default=2, ge=0, le=3)  # webrtcvad
    threshold: float = Field(default=0.5, gt=0, lt=1)  # silero


class SttSettings(Strict):
    provider: Literal["whisper", "pocketsphinx", "openai"] = "pocketsphinx"
    language_model: Literal["domain", "full"] = "domain"
    phrases: list[str] = Field(default_factory=list)
    # whisper: "tiny.en" (bundled) or the folder of a CTranslate2 conversion; openai: its name.
    model: str | None = Field(default=None, validate_default=True)
    base_url: str | None = None
    api_key: str | None = None
    # Recognition runs in this many worker processes (pocketsphinx's decoder holds the GIL, and
    # Whisper's fills a core, so in threads they would stall every call's audio); None: one per
    # CPU core; 0 (pocketsphinx only): in-process threads.
    processes: int | None = Field(default=None, ge=0)
    # whisper: CTranslate2's weights type, beam width, threads per process, initial prompt.
    compute_type: Literal["int8", "int8_float32", "float32", "default"] = "int8"
    beam_size: int = Field(default=1, ge=1, le=10)
    threads: int = Field(default=1, ge=1, le=64)
    prompt: str | None = None

    @field_validator("model")
    @classmethod
    def _whisper_model_exists(cls, model: str | None, info: ValidationInfo) -> str | None:
        # At load, so a wrong path shows before a call starts, naming this key.
        if info.data.get("provider") != "whisper":
            return model
        from voice_agent.engines.stt.whisper import BUNDLED_MODEL, resolve_model

        base_dir = (info.context or {}).get("base_dir")
        if model and model != BUNDLED_MODEL and base_dir is not None:
            model = str(Path(base_dir) / Path(model).expanduser())
        try:
            resolve_model(model)
        except VoiceAgentError as e:
            raise ValueError(str(e)) from None
        return model

    @model_validator(mode="after")
    def _whisper_needs_processes(self) -> SttSettings:
        if self.provider == "whisper" and self.processes == 0:
            raise ValueError("whisper decodes in worker processes: processes must be 1 or more")
        return self


class TtsSettings(Strict):
    provider: Literal["espeak", "piper", "openai"] = "espeak"
    voice: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    speed: float = Field(default=1.0, gt=0.2, lt=4)


class TurnSettings(Strict):
    min_speech_ms: int = Field(default=100, ge=20)
    end_of_turn_silence_ms: int = Field(default=600, ge=100)
    pre_roll_ms: int = Field(default=300, ge=0)
    # Speech frames this many dB below the utterance's loudest end the turn like silence;
    # null: the VAD alone decides.
    quiet_db: float | None = Field(default=35.0, gt=0)
    # Speech that begins this soon after the end of a turn, while the agent's answer has not
    # been heard to the end, is the rest of that turn: joined to it, and the answer cut.
    continuation_window_ms: int = Field(default=1500, ge=0, le=5000)
    # What ends a turn: "silence", end_of_turn_silence_ms of it every time; "smart", an
    # acoustic end-of-turn model (`model`) and the words so far, between min_silence_ms and
    # max_silence_ms (core/end_of_turn.py; docs/config.md).
    detector: Literal["silence", "smart"] = "silence"
    model: str = Field(default="smart-turn-v3.2", validate_default=True)
    min_silence_ms: int = Field(default=200, ge=60, le=2000)
    max_silence_ms: int = Field(default=2500, ge=300, le=10000)
    unsure_silence_ms: int = Field(default=1600, ge=60, le=10000)
    finished_threshold: float = Field(default=0.5, gt=0, lt=1)

    @field_validator("model")
    @classmethod
    def _turn_model_exists(cls, model: str, info: ValidationInfo) -> str:
        if info.data.get("detector") != "smart":
            return model
        from voice_agent.engines.turn.smart_turn import BUNDLED, resolve_model

        return checked_model(model, BUNDLED, resolve_model, info)

    @model_validator(mode="after")
    def _silences_in_order(self) -> TurnSettings:
        if not self.min_silence_ms <= self.unsure_silence_ms <= self.max_silence_ms:
            raise ValueError(
                "min_silence_ms <= unsure_silence_ms <= max_silence_ms must hold, not "
                f"{self.min_silence_ms}, {self.unsure_silence_ms}, {self.max_silence_ms}"
            )
        return self


class InterruptionSettings(Strict):
    min_interruption_ms: int = Field(default=400, ge=20)
    min_interruption_words: int = Field(default=0, ge=0)
    false_interruption_timeout_ms: int = Field(default=1500, ge=100)
    backchannels: list[str] = Field(
        default_factory=lambda: [
            "uh-huh",
            "uh huh",
            "mm-hmm",
            "mhm",
            "yeah",
            "yep",
            "okay",
            "ok",
            "right",
        ]
    )
    resume_after_false_interruption: bool = True
    backchannel_max_ms: int = Field(default=1000, ge=0)


class VoiceSettings(Strict):
    """Engines and turn-taking for voice calls; an agent may replace any section."""

    vad: VadSettings = VadSettings()
    stt: SttSettings = SttSettings()
    tts: TtsSettings = TtsSettings()
    turn: TurnSettings = TurnSettings()
    interruption: InterruptionSettings = InterruptionSettings()


class HoldSettings(Strict):
    """What the caller hears while the agent works on a turn longer than `after_s` (a slow
    function or tool) before its answer: `audio` (a mono 16-bit WAV, looped), or silence."""

    @field_validator("audio")
    @classmethod
    def _audio_readable(cls, audio: str | None, info: ValidationInfo) -> str | None:
        if audio is None:
            return None
        base_dir = (info.context or {}).get("base_dir")
        path = Path(base_dir) / Path(audio).expanduser() if base_dir is not None else Path(audio)
        from voice_agent.audio.wav import read_wav

        try:
            read_wav(path)  # at load: a wrong file shows before a call, naming this key
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        return str(path)

    audio: str | None = None
    after_s: float = Field(default=2.0, gt=0, le=30)
