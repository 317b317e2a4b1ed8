"""What an agent's turn yields and what a step of it did: the vocabulary the session, its brains
(flows, playbooks) and the voice pipeline share.

A turn is an async generator of `AgentEvent`s: speech as it comes (for TTS at once), the end of
a reply, the end of the call, and the call control the agent asked for (`CallTransfer`,
`SendDigits`, from runtime/call_control.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from voice_agent.runtime.call_control import CallTransfer, SendDigits


@dataclass(frozen=True)
class AgentSpeech:
    """A piece of agent speech, in order; the voice side sends it to TTS as it comes."""

    reply_id: int
    text: str


@dataclass(frozen=True)
class AgentSpeechEnd:
    """The reply is complete; until commit_reply() it is provisional in the context."""

    reply_id: int
    text: str


@dataclass(frozen=True)
class AgentAudio:
    """A piece of a reply an engine voiced itself (a speech-to-speech model): `audio` in the
    format `encoding`/`sample_rate` names, with the new part of its transcript; no TTS."""

    reply_id: int
    audio: bytes
    encoding: str  # as voice_agent.audio.codec names them: "pcm16", "mulaw", "alaw"
    sample_rate: int
    text: str = ""


@dataclass(frozen=True)
class AgentAudioEnd:
    """The voiced reply is complete; committed, like any reply, once heard or cut."""

    reply_id: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    reason: str


AgentEvent = (
    AgentSpeech | AgentSpeechEnd | AgentAudio | AgentAudioEnd | CallEnd | CallTransfer | SendDigits
)


@dataclass(frozen=True)
class CallerAudio:
    """The caller's turn as the voice pipeline heard it (PCM16 at `sample_rate`), for an
    engine that listens to the caller itself; `carrier` is the call's own audio format
    (encoding, rate), which such an engine may speak to save converting."""

    pcm: bytes
    sample_rate: int
    carrier: tuple[str, int]


@dataclass
class StepOutcome:
    """What happened while triggers, overrides and actions ran; the brain reads it to go on."""

    responded: bool = False
    overridden: bool = False
    transferred: bool = False
    call_ended: bool = False

    @property
    def ends_turn(self) -> bool:
        return self.call_ended or (self.responded and not self.overridden)


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    content: str  # the tool message the LLM reads (redacted JSON)
    value: Any = None
    error: str | None = None  # redacted, for a caller that wants to say what went wrong


def result_json(value: Any) -> str:
    """An action's value as the tool message's JSON: an object as it is, anything else under
    "result"."""
    payload = value if isinstance(value, dict) else {"result": value}
    return json.dumps(payload, ensure_ascii=False, default=str)
