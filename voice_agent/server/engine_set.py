"""The engines of a server's agents, built from the config: one STT and one TTS per distinct
setting (agents that agree share them), an acoustic turn model per model file, a VAD made per
call. Built before the first call (`start`), warmed up, closed at shutdown."""

from __future__ import annotations

from typing import Any

from voice_agent.agents.registry import AgentRegistry
from voice_agent.brains.flows.flow import FlowBrain
from voice_agent.config import SttSettings, TtsSettings, VadSettings
from voice_agent.engines.stt import SttConfig, make_stt
from voice_agent.engines.tts import TtsConfig, make_tts
from voice_agent.engines.turn import TurnModel, load_turn_model
from voice_agent.engines.vad import VadConfig, make_vad
from voice_agent.pipeline.driver import Engines
from voice_agent.runtime.agent import CompiledAgent


class EngineSet:
    def __init__(self, registry: AgentRegistry) -> None:
        self.registry = registry
        self._by_agent: dict[str, Engines] = {}
        self._stt: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._turn_models: dict[str, TurnModel] = {}  # by model path: one session each
        self._tts: dict[str, Any] = {}

    async def start(self) -> None:
        """Every agent's engines built, and each STT warmed up."""
        for agent in self.registry.agents.values():
            self.engines(agent)
        # A first decoder costs up to half a second with the full model: pay it before calls.
        for stt in self._stt.values():
            warm_up = getattr(stt, "warm_up", None)
            if warm_up is not None:
                await warm_up(1)

    async def aclose(self) -> None:
        for engine in {*self._tts.values(), *self._stt.values()}:
            await engine.aclose()

    def _phrases(self, agent: CompiledAgent) -> tuple[str, ...]:
        """What callers are expected to say, for the STT's domain language model.

        A flow agent's intents; for a playbook, every flow's intents in the config (same
        domain, by the config's design). Backchannels are left out: with them the small LM
        recognised the booking lines worse (measured on the fixtures).
        """
        flows = [a.brain for a in self.registry.agents.values() if isinstance(a.brain, FlowBrain)]
        if isinstance(agent.brain, FlowBrain):
            flows = [agent.brain]
        phrases = [
            phrase for flow in flows for intent in flow.matcher.intents for phrase in intent.phrases
        ]
        return tuple(dict.fromkeys(phrases))

    def engines(self, agent: CompiledAgent) -> Engines:
        """Built once per agent; agents with the same settings share STT and TTS engines."""
        if agent.name in self._by_agent:
            return self._by_agent[agent.name]
        voice = agent.config.voice(self.registry.loaded.config.voice)
        stt_settings: SttSettings = voice.stt
        # Only pocketsphinx's domain model is built from the intents' phrases: other engines
        # with the same settings are one pool (Whisper: a model per worker process) for all.
        domain = stt_settings.provider == "pocketsphinx" and stt_settings.language_model == "domain"
        phrases = self._phrases(agent) if domain else ()
        stt_key = (stt_settings.model_dump_json(), phrases)
        if stt_key not in self._stt:
            self._stt[stt_key] = make_stt(
                SttConfig(
                    provider=stt_settings.provider,
                    language_model=stt_settings.language_model,
                    phrases=tuple(stt_settings.phrases),
                    model=stt_settings.model,
                    base_url=stt_settings.base_url,
                    api_key=stt_settings.api_key,
                    processes=stt_settings.processes,
                    compute_type=stt_settings.compute_type,
                    beam_size=stt_settings.beam_size,
                    threads=stt_settings.threads,
                    prompt=stt_settings.prompt,
                ),
                phrases=phrases,
            )
        tts_settings: TtsSettings = voice.tts
        tts_key = tts_settings.model_dump_json()
        if tts_key not in self._tts:
            self._tts[tts_key] = make_tts(
                TtsConfig(
                    provider=tts_settings.provider,
                    voice=tts_settings.voice,
                    model=tts_settings.model,
                    base_url=tts_settings.base_url,
                    api_key=tts_settings.api_key,
                    speed=tts_settings.speed,
                )
            )
        vad_settings: VadSettings = voice.vad
        vad_config = VadConfig(
            provider=vad_settings.provider,
            aggressiveness=vad_settings.aggressiveness,
            threshold=vad_settings.threshold,
        )
        turn_model: TurnModel | None = None
        if voice.turn.detector == "smart":
            if voice.turn.model not in self._turn_models:
                self._turn_models[voice.turn.model] = load_turn_model(voice.turn.model)
            turn_model = self._turn_models[voice.turn.model]
        engines = Engines(
            make_vad=lambda sample_rate: make_vad(vad_config, sample_rate),
            stt=self._stt[stt_key],
            tts=self._tts[tts_key],
            turn_model=turn_model,
        )
        self._by_agent[agent.name] = engines
        return engines
