"""What every part of the config schema stands on: strict frozen models (an unknown key is an
error), the form of update_state's assignments, and the check of a model setting at load."""

from __future__ import annotations

from collections.abc import Callable, Container
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationInfo,
)

from voice_agent.errors import VoiceAgentError

MAX_UPDATES_PER_TOOL = 50

# `set:` values are expressions; YAML scalars (3, true, null) are accepted as constants.
Assignments = dict[str, str | bool | int | float | None]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def checked_model(
    model: str, bundled: Container[str], resolve: Callable[[str], object], info: ValidationInfo
) -> str:
    """A model setting checked at load, so a wrong path shows before a call starts, naming
    its key: a bundled name as it is, a folder relative to the config file."""
    base_dir = (info.context or {}).get("base_dir")
    if model not in bundled and base_dir is not None:
        model = str(Path(base_dir) / Path(model).expanduser())
    try:
        resolve(model)
    except VoiceAgentError as e:
        raise ValueError(str(e)) from None
    return model


def split_host_port(value: str) -> tuple[str, int]:
    """ "127.0.0.1:5060", "[::1]:5060" -> host and port; ValueError says what is wrong."""
    host, colon, port = value.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:5060)")
    return host, int(port)
