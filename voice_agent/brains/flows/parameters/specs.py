"""What a flow's parameters and entities are: their types, specs and what extraction finds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from voice_agent.errors import ConfigError

ParamType = Literal[
    "number", "integer", "digits", "phone", "date", "time", "datetime", "enum", "yes_no", "name",
    "text",
]  # fmt: skip
PARAM_TYPES: frozenset[str] = frozenset(get_args(ParamType))

MIN_PHONE_DIGITS = 7
MAX_PHONE_DIGITS = 15
# A fuzzy enum hit needs both scores: Jaro-Winkler forgives a garbled ending ("terras" for
# "terrace"), the Indel ratio keeps "indoor" from becoming "outdoor" or "terrible" "terrace".
ENUM_FUZZY_JARO_WINKLER = 0.9
ENUM_FUZZY_RATIO = 75.0
# Synonyms shorter than this are matched exactly only: short words fuzz into everything.
ENUM_FUZZY_MIN_CHARS = 5


@dataclass(frozen=True)
class EntitySpec:
    """An enum type: canonical value -> synonyms (the canonical value itself always matches)."""

    name: str
    values: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class ParameterSpec:
    """One parameter an intent wants: its name, type and, for "enum", the entity it draws on."""

    name: str
    type: ParamType
    entity: str | None = None

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ConfigError(
                f"unknown parameter type {self.type!r} (expected one of {sorted(PARAM_TYPES)})",
                key=self.name,
            )
        if self.type == "enum" and not self.entity:
            raise ConfigError("an enum parameter needs an entity", key=self.name)


@dataclass(frozen=True)
class Extracted:
    """A value found in an utterance and its character span in the normalised text."""

    value: Any
    start: int
    end: int


@dataclass(frozen=True)
class Annotation:
    """A normalised utterance and the recognised spans in it, as (kind, start, end) character
    spans; kinds are "phone", "when", "@<entity>", "name", "yes", "no" and "number"."""

    text: str
    spans: tuple[tuple[str, int, int], ...]
