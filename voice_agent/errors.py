"""The exception hierarchy: every error says what was wrong and where."""

from __future__ import annotations


class VoiceAgentError(Exception):
    """Base of every error voice_agent raises on purpose."""


class ConfigError(VoiceAgentError):
    """A configuration problem found at load time, located by file and key."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        self.message = message
        self.file = file
        self.key = key
        where = ": ".join(part for part in (file, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class ExpressionError(VoiceAgentError):
    """An expression that does not parse, or fails to evaluate (type error, unknown variable)."""

    def __init__(self, message: str, *, source: str | None = None, position: int | None = None):
        self.message = message
        self.source = source
        self.position = position
        text = message
        if source is not None:
            text = f"{message} in expression {source!r}"
            if position is not None:
                text += f" at column {position + 1}"
        super().__init__(text)


class ToolError(VoiceAgentError):
    """A tool call failed: remote HTTP error, timeout, bad arguments. Code blocks may catch it."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.message = message
        self.status = status
        super().__init__(message)


class SecretError(VoiceAgentError):
    """The secret store cannot be read or written (wrong key, corrupt file)."""


class LlmError(VoiceAgentError):
    """The LLM provider failed and retries within the turn's deadline are spent."""
