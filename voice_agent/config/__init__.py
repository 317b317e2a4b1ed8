"""The YAML configuration schema (pydantic) and its loader, whose errors name the file and key.

Here the whole config (`Config`), its cross-references checked and its loading; its parts in
agent.py (agents, tools, flows), voice.py (engines, turn-taking, hold audio), server.py,
telephony.py (SIP, AudioSocket, the carriers' APIs) and base.py (what they stand on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from voice_agent.config.agent import AgentConfig, FlowConfig, HandlerConfig, LlmConfig, RouteConfig
from voice_agent.config.base import MAX_UPDATES_PER_TOOL, Strict, split_host_port
from voice_agent.config.server import ServerSettings, WebRtcSettings
from voice_agent.config.telephony import (
    AudioSocketSettings,
    CarrierApis,
    SipListener,
    SipSettings,
    SipTls,
    sip_listeners,
)
from voice_agent.config.voice import (
    ContextOnTransfer,
    HoldSettings,
    InterruptionSettings,
    NluSettings,
    SttSettings,
    TtsSettings,
    TurnSettings,
    VadSettings,
    VoiceSettings,
)
from voice_agent.errors import ConfigError

__all__ = [
    "MAX_UPDATES_PER_TOOL",
    "AgentConfig",
    "AudioSocketSettings",
    "CarrierApis",
    "Config",
    "ConfigError",
    "ContextOnTransfer",
    "FlowConfig",
    "HandlerConfig",
    "HoldSettings",
    "InterruptionSettings",
    "LlmConfig",
    "LoadedConfig",
    "NluSettings",
    "RouteConfig",
    "ServerSettings",
    "SipListener",
    "SipSettings",
    "SipTls",
    "SttSettings",
    "TtsSettings",
    "TurnSettings",
    "VadSettings",
    "VoiceSettings",
    "WebRtcSettings",
    "load_config",
    "parse_config",
    "read_yaml",
    "sip_listeners",
    "split_host_port",
]


class Config(Strict):
    default_agent: str
    agents: dict[str, AgentConfig]
    voice: VoiceSettings = VoiceSettings()
    webrtc: WebRtcSettings = WebRtcSettings()
    server: ServerSettings = ServerSettings()
    sip: SipSettings = SipSettings()
    audiosocket: AudioSocketSettings = AudioSocketSettings()
    carriers: CarrierApis = CarrierApis()


def _check_references(config: Config, file: str) -> None:
    """Cross-references between agents, checked after the schema so errors can name the key."""
    if config.default_agent not in config.agents:
        raise ConfigError(
            f"default_agent {config.default_agent!r} is not one of the agents "
            f"{sorted(config.agents)}",
            file=file,
            key="default_agent",
        )
    for key, route in config.audiosocket.routes.items():
        if route.agent is not None and route.agent not in config.agents:
            raise ConfigError(
                f"audiosocket route {key} names agent {route.agent!r}, which is not an agent",
                file=file,
                key=f"audiosocket.routes.{key}.agent",
            )
    for number, agent_name in config.sip.numbers.items():
        if agent_name not in config.agents:
            raise ConfigError(
                f"sip number {number} names agent {agent_name!r}, which is not an agent",
                file=file,
                key=f"sip.numbers.{number}",
            )
    for name, agent in config.agents.items():
        for index, target in enumerate(agent.transitions):
            if target not in config.agents:
                raise ConfigError(
                    f"agent {name!r} lists transition {target!r}, which is not an agent",
                    file=file,
                    key=f"agents.{name}.transitions[{index}]",
                )


class LoadedConfig:
    """A validated config plus where it came from, so relative paths resolve against its file."""

    def __init__(self, config: Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.base_dir = path.parent

    def resolve(self, relative: str) -> Path:
        return (self.base_dir / relative).resolve()


def _input_path(loc: tuple[int | str, ...], data: Any) -> tuple[int | str, ...]:
    """The part of pydantic's location that exists in the YAML (it adds union and type tags)."""
    path: list[int | str] = []
    node = data
    for item in loc:
        if isinstance(node, dict) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            node = node[item]
        elif isinstance(node, dict) and isinstance(item, str) and not path[-1:] == [item]:
            # A missing or unknown key: name it, then stop.
            if "[" not in item and "-" not in item and "'" not in item:
                path.append(item)
            break
        else:
            break
        path.append(item)
    return tuple(path)


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif parts:
            parts.append(f".{item}")
        else:
            parts.append(str(item))
    return "".join(parts)


def _first_error(exc: ValidationError, file: str, data: Any) -> ConfigError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = _input_path(first["loc"], data)
    # Branches of a union each report an error at the same place: say them as one.
    same_place = [e for e in errors if _input_path(e["loc"], data) == loc]
    messages: list[str] = []
    for error in same_place:
        if error["type"] == "extra_forbidden":
            text = "unknown key"
        elif error["type"] == "missing":
            text = "required key is missing"
        elif error["type"] == "value_error" and "error" in error.get("ctx", {}):
            text = str(error["ctx"]["error"])
        else:
            text = str(error["msg"])
        if text not in messages:
            messages.append(text)
    message = " or ".join(messages)
    others = len(errors) - len(same_place)
    more = f" (and {others} more problem(s))" if others else ""
    return ConfigError(message + more, file=file, key=_location(loc) or None)


def parse_config(data: Any, file: str) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping with 'agents'", file=file)
    try:
        # Relative paths inside the config (a Whisper model folder) are the config file's.
        config = Config.model_validate(data, context={"base_dir": Path(file).parent})
    except ValidationError as exc:
        raise _first_error(exc, file, data) from None
    _check_references(config, file)
    return config


def read_yaml(path: Path, *, what: str = "config") -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file: {exc.strerror}", file=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML{where}: {problem}", file=str(path)) from None


def load_config(path: str | Path) -> LoadedConfig:
    """Read and validate a config file; raises ConfigError naming the file and key."""
    path = Path(path).resolve()
    return LoadedConfig(parse_config(read_yaml(path), str(path)), path)
