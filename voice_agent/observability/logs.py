"""Logging: one JSON object per line for log collectors, a compact line on a terminal.

Every record carries the call it belongs to (`call_id`, from `extra=` or from the context the
call's tasks run in) and has every known secret value replaced by `[secret:NAME]` before it is
written, whichever way the value got in: the format arguments, an `extra`, an exception's
message or a stack. Redaction happens twice on purpose: a record factory redacts the message and
exception as each record is made, so any handler (even one a library adds) sees them redacted;
the handler's filter redacts the extras, and the formatter redacts its final line as a backstop.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO, Any, TextIO

from voice_agent.runtime.secrets import Redactor

FORMAT_ENV = "VOICE_AGENT_LOG_FORMAT"  # "json" or "text": overrides the TTY guess

# Environment variables holding credentials that never pass through the secret store.
SECRET_ENV_NAMES = ("VOICE_AGENT_TOKEN", "VOICE_AGENT_SECRET_KEY", "OPENAI_API_KEY")
# Other variables whose names say they hold a credential. Short values are left alone: a
# four-character "secret" would be replaced all over every log line.
_SECRET_ENV_NAME = re.compile(r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.I)
_MIN_ENV_SECRET = 8

current_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "voice_agent_call_id", default=None
)

# Attributes this module puts on records; the prefix keeps them out of the extras.
_PREFIX = "_voice_agent_"
_CALL_ATTR = _PREFIX + "call_id"
_CORE_DONE = _PREFIX + "core_redacted"
_EXTRAS_DONE = _PREFIX + "extras_redacted"
_HANDLER_MARK = _PREFIX + "handler"
_FACTORY_MARK = _PREFIX + "factory"
_STANDARD_ATTRS = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", (), None).__dict__,
        "message",
        "asctime",
        "taskName",  # Python 3.12+
        "call_id",  # written as its own field
    }
)
_MAX_DEPTH = 6  # of nested extras; deeper is stringified


# ---- the call id -----------------------------------------------------------------------------


@contextmanager
def bind_call_id(call_id: str | None) -> Iterator[None]:
    """Records logged inside the block (and by tasks created inside it) carry `call_id`."""
    token = current_call_id.set(call_id)
    try:
        yield
    finally:
        current_call_id.reset(token)


def set_call_id(call_id: str | None) -> contextvars.Token[str | None]:
    """Set the call id for the rest of the current task (and tasks it creates from now on)."""
    return current_call_id.set(call_id)


def call_context(call_id: str | None) -> contextvars.Context:
    """A copy of the current context with the call id set: pass it as `context=` to
    `loop.create_task` / `call_at` when the code scheduling the work runs in another context
    (an aiortc callback, for instance)."""
    context = contextvars.copy_context()
    context.run(current_call_id.set, call_id)
    return context


def record_call_id(record: logging.LogRecord) -> str | None:
    """`extra={"call_id": ...}` first, then the context the record was made in."""
    explicit = record.__dict__.get("call_id")
    if explicit:
        return str(explicit)
    captured = record.__dict__.get(_CALL_ATTR)
    if captured:
        return str(captured)
    return current_call_id.get()


# ---- the secrets logging knows ---------------------------------------------------------------


def secrets_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Credentials in the environment, labelled `$NAME`."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name, value in environ.items():
        if not value:
            continue
        if name in SECRET_ENV_NAMES or (
            _SECRET_ENV_NAME.search(name) and len(value) >= _MIN_ENV_SECRET
        ):
            found[f"${name}"] = value
    return found


class LogRedaction:
    """The secret values no log line may show. Values are only ever added: a secret the server
    stopped using (rotated, another server's in the same process) can still be in a message."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._redactor = Redactor({})
        self._lock = threading.Lock()

    def add_secrets(self, secrets: Mapping[str, str]) -> None:
        with self._lock:
            values = dict(self._values)
            for name in secrets:
                value = secrets[name]
                if not isinstance(value, str) or not value:
                    continue
                # Same name, new value: keep the old one under a second label.
                key = name
                while key in values and values[key] != value:
                    key += "'"
                values[key] = value
            if values != self._values:
                self._values = values
                self._redactor = Redactor(values)  # swapped whole: readers need no lock

    def clear(self) -> None:
        """Forget every value (tests only)."""
        with self._lock:
            self._values = {}
            self._redactor = Redactor({})

    def text(self, s: str) -> str:
        return self._redactor.text(s)

    def value(self, obj: Any) -> Any:
        """Redacted and made JSON-safe: str, numbers, None, and lists and dicts of them."""
        return _scrub(obj, self._redactor, 0)

    def __len__(self) -> int:
        return len(self._values)


redaction = LogRedaction()


def add_log_secrets(secrets: Mapping[str, str]) -> None:
    """Call wherever secrets are loaded: from then on, no log line shows their values."""
    redaction.add_secrets(secrets)


def _safe_str(obj: object) -> str:
    try:
        return str(obj)
    except Exception:
        return f"<unprintable {type(obj).__name__}>"


def _safe_repr(obj: object) -> str:
    try:
        return repr(obj)
    except Exception:
        return f"<unprintable {type(obj).__name__}>"


def _scrub(obj: Any, redactor: Redactor, depth: int) -> Any:
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, str):
        return redactor.text(obj)
    if depth < _MAX_DEPTH:
        if isinstance(obj, Mapping):
            return {
                redactor.text(_safe_str(key)): _scrub(value, redactor, depth + 1)
                for key, value in obj.items()
            }
        if isinstance(obj, list | tuple | set | frozenset):
            return [_scrub(item, redactor, depth + 1) for item in obj]
    # Anything else would be str()-ed by the formatter: do it now, so the text is redacted.
    return redactor.text(_safe_str(obj))


# ---- redacting records -----------------------------------------------------------------------

_EXCEPTION_FORMATTER = logging.Formatter()


def _redact_core(record: logging.LogRecord, redaction: LogRedaction) -> None:
    """Message (formatted with its arguments, which may assemble a value), exception, stack."""
    if record.__dict__.get(_CORE_DONE):
        return  # redacting twice could rewrite a label that contains a secret value
    try:
        message = record.getMessage()
    except Exception as exc:
        # Formatting fails again in every handler, and logging's error report would print
        # the raw arguments: keep them, redacted, in the message instead.
        message = (
            f"{_safe_str(record.msg)} (log arguments did not format: "
            f"{type(exc).__name__}: {_safe_repr(record.args)})"
        )
    record.msg = redaction.text(message)
    record.args = ()
    if record.exc_info and not record.exc_text:
        try:
            record.exc_text = _EXCEPTION_FORMATTER.formatException(record.exc_info)
        except Exception:
            record.exc_text = "<the exception could not be formatted>"
    if record.exc_text:
        # Formatters print this cached text instead of formatting exc_info again.
        record.exc_text = redaction.text(record.exc_text)
    if record.stack_info:
        record.stack_info = redaction.text(record.stack_info)
    record.__dict__[_CORE_DONE] = True


def _extra_keys(record: logging.LogRecord) -> list[str]:
    return [
        key for key in record.__dict__ if key not in _STANDARD_ATTRS and not key.startswith(_PREFIX)
    ]


def _withhold(record: logging.LogRecord, what: str) -> None:
    record.msg = f"<a log record from {record.name} was withheld: {what}>"
    record.args = ()
    record.exc_info = None
    record.exc_text = None
    record.stack_info = None
    for key in _extra_keys(record):
        del record.__dict__[key]
    record.__dict__[_CORE_DONE] = record.__dict__[_EXTRAS_DONE] = True


class RedactingFilter(logging.Filter):
    """For handlers: redacts message, exception, stack and every extra; never drops a record
    and never raises (a record that cannot be redacted is withheld, not written raw)."""

    def __init__(self, redaction: LogRedaction = redaction) -> None:
        super().__init__()
        self._redaction = redaction

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if _CALL_ATTR not in record.__dict__:
                # Handlers run in the logging code's context: this is the caller's call.
                record.__dict__[_CALL_ATTR] = current_call_id.get()
            _redact_core(record, self._redaction)
            if not record.__dict__.get(_EXTRAS_DONE):
                for key in _extra_keys(record):
                    record.__dict__[key] = self._redaction.value(record.__dict__[key])
                explicit = record.__dict__.get("call_id")
                if explicit is not None:
                    record.__dict__["call_id"] = self._redaction.value(_safe_str(explicit))
                record.__dict__[_EXTRAS_DONE] = True
        except Exception as exc:
            _withhold(record, f"redaction failed ({type(exc).__name__})")
        return True


def install_record_factory(redaction: LogRedaction = redaction) -> None:
    """Make every record redacted (message, exception) and tagged with its call as it is
    created, before any handler sees it. Installing twice is a no-op."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, _FACTORY_MARK, False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            # Not `call_id`: `extra={"call_id": ...}` must stay allowed, and logging refuses an
            # extra that would overwrite an attribute the record already has.
            record.__dict__[_CALL_ATTR] = current_call_id.get()
            _redact_core(record, redaction)
        except Exception:
            pass  # the handler's filter tries again, and withholds the record if it must
        return record

    setattr(factory, _FACTORY_MARK, True)
    logging.setLogRecordFactory(factory)


# ---- formatters ------------------------------------------------------------------------------


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", "call_id"?, ...extras, "exc"?, "stack"?}`."""

    def __init__(self, redaction: LogRedaction = redaction) -> None:
        super().__init__()
        self._redaction = redaction

    def format(self, record: logging.LogRecord) -> str:
        try:
            line = json.dumps(self._entry(record), ensure_ascii=False, default=_safe_str)
        except Exception as exc:
            line = json.dumps(
                {
                    "ts": _iso(record.created),
                    "level": "ERROR",
                    "logger": __name__,
                    "message": f"a log record from {record.name} could not be formatted: "
                    f"{type(exc).__name__}",
                }
            )
        # The backstop: whatever reached the line, e.g. from a handler without the filter.
        return self._redaction.text(line)

    def _entry(self, record: logging.LogRecord) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        call_id = record_call_id(record)
        if call_id is not None:
            entry["call_id"] = call_id
        for key in _extra_keys(record):
            entry.setdefault(key, record.__dict__[key])
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return entry


def _text_value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in '="' for c in value):
        return value
    return json.dumps(value, ensure_ascii=False, default=_safe_str)


class TextFormatter(logging.Formatter):
    """`12:00:00.123 INFO  voice_agent.call [call_id] message key=value`, for a terminal."""

    def __init__(self, redaction: LogRedaction = redaction) -> None:
        super().__init__()
        self._redaction = redaction

    def format(self, record: logging.LogRecord) -> str:
        try:
            line = self._line(record)
        except Exception as exc:
            line = f"<a log record from {record.name} could not be formatted: {type(exc).__name__}>"
        return self._redaction.text(line)

    def _line(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        parts = [f"{when}.{int(record.msecs):03d}", f"{record.levelname:<5}", record.name]
        call_id = record_call_id(record)
        if call_id is not None:
            parts.append(f"[{call_id}]")
        parts.append(record.getMessage())
        parts.extend(f"{key}={_text_value(record.__dict__[key])}" for key in _extra_keys(record))
        line = " ".join(parts)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + record.stack_info
        return line


# ---- setup -----------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever sys.stderr is at the time, like logging's last-resort handler, so a
    replaced stderr (a test's capture, a daemon's redirect) is followed, never a stale one."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def wants_json(stream: IO[str] | None = None) -> bool:
    """$VOICE_AGENT_LOG_FORMAT if set, else JSON unless the stream is a terminal."""
    forced = os.environ.get(FORMAT_ENV, "").strip().lower()
    if forced in ("json", "text"):
        return forced == "json"
    stream = stream if stream is not None else sys.stderr
    try:
        return not stream.isatty()
    except Exception:
        return True


def configure_logging(
    *,
    json_mode: bool | None = None,
    level: int | str = logging.INFO,
    secrets: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
    force: bool = False,
) -> logging.Handler | None:
    """Set up the root logger: JSON lines or terminal text, call ids, secret redaction.

    Redaction (the record factory, the secrets of `secrets` and of the environment) is always
    installed. The handler follows `logging.basicConfig`: when the root logger already has
    handlers that this function did not add (a test runner's), they are kept and no handler is
    added, unless `force`. Calling it again replaces the handler it added before. Returns the
    handler added, or None.
    """
    redaction.add_secrets(secrets_from_env())
    if secrets is not None:
        redaction.add_secrets(secrets)
    install_record_factory(redaction)
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]
    foreign = [h for h in root.handlers if h not in ours]
    if foreign and not force:
        return None
    for old in ours + (foreign if force else []):
        root.removeHandler(old)
        if old in ours:
            old.close()
    handler: logging.Handler = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    use_json = json_mode if json_mode is not None else wants_json(stream)
    handler.setFormatter(JsonFormatter(redaction) if use_json else TextFormatter(redaction))
    handler.addFilter(RedactingFilter(redaction))
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
