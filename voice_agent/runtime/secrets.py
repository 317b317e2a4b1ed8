"""The encrypted secret store, the read-only `Secrets` view handed to user functions, and the
`Redactor` that keeps secret values out of text, tool results and log records."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from voice_agent.errors import SecretError

SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

KEY_ENV = "VOICE_AGENT_SECRET_KEY"
DATA_DIR_ENV = "VOICE_AGENT_DATA_DIR"
STORE_FILE = "secrets.enc"
KEY_FILE = "secrets.key"
_FORMAT_VERSION = 1
_GENERATE_HINT = (
    'generate one with: python -c "from cryptography.fernet import Fernet; '
    'print(Fernet.generate_key().decode())"'
)


def validate_name(name: str) -> str:
    """Return `name` if it is a valid secret name, else raise SecretError naming it."""
    if not isinstance(name, str) or SECRET_NAME.fullmatch(name) is None:
        raise SecretError(
            f"invalid secret name {name!r}: use letters, digits and underscores, "
            "not starting with a digit"
        )
    return name


class SecretStore:
    """An encrypted file of name -> value (Fernet from `cryptography`)."""

    def __init__(self, path: Path, *, key: bytes | None = None) -> None:
        self.path = Path(path)
        self.key_path = self.path.parent / KEY_FILE
        self._explicit_key = key
        self._fernet: Fernet | None = None

    @classmethod
    def in_data_dir(cls, data_dir: Path | None = None) -> SecretStore:
        """The store at `data_dir/secrets.enc`; default dir: $VOICE_AGENT_DATA_DIR, else ./data."""
        if data_dir is None:
            data_dir = Path(os.environ.get(DATA_DIR_ENV) or "data")
        return cls(Path(data_dir) / STORE_FILE)

    def __repr__(self) -> str:
        return f"SecretStore({str(self.path)!r})"

    # -- public operations -------------------------------------------------------------------

    def set(self, name: str, value: str) -> None:
        validate_name(name)
        if not isinstance(value, str):
            raise SecretError(f"the value of secret {name!r} must be a string")
        if value == "":
            raise SecretError(f"refusing to store an empty value for secret {name!r}")
        values = self._read()
        values[name] = value
        self._write(values)

    def delete(self, name: str) -> bool:
        """Remove `name`; False if there was no such secret."""
        validate_name(name)
        values = self._read()
        if name not in values:
            return False
        del values[name]
        self._write(values)
        return True

    def names(self) -> list[str]:
        return sorted(self._read())

    def load(self) -> Secrets:
        """Decrypt everything once; the runtime calls this at start."""
        return Secrets(self._read())

    # -- key handling ------------------------------------------------------------------------

    def _get_fernet(self, *, create: bool) -> Fernet:
        if self._fernet is not None:
            return self._fernet
        if self._explicit_key is not None:
            self._fernet = _make_fernet(self._explicit_key, "the key passed to SecretStore")
        elif os.environ.get(KEY_ENV):
            self._fernet = _make_fernet(os.environ[KEY_ENV], f"${KEY_ENV}")
        else:
            self._fernet = _make_fernet(self._key_from_file(create=create), str(self.key_path))
        return self._fernet

    def _key_from_file(self, *, create: bool) -> bytes:
        try:
            return self.key_path.read_bytes().strip()
        except FileNotFoundError:
            if not create:
                # A fresh key could never open the existing store: say so instead of a
                # misleading "wrong key" later.
                raise SecretError(
                    f"{self.path} exists but its key file {self.key_path} is missing: "
                    f"restore the key file or set ${KEY_ENV} to the key the store was written with"
                ) from None
        except OSError as exc:
            raise SecretError(f"cannot read key file {self.key_path}: {exc.strerror}") from None
        return self._create_key_file()

    def _create_key_file(self) -> bytes:
        key = Fernet.generate_key()
        self.key_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_EXCL with mode 0600 from the start: the key is never readable by others,
            # not even between create and chmod.
            fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            # Another process created it between our read and open: use theirs.
            return self.key_path.read_bytes().strip()
        except OSError as exc:
            raise SecretError(f"cannot create key file {self.key_path}: {exc.strerror}") from None
        try:
            os.fchmod(fd, 0o600)  # umask may have removed bits; make the mode exact
            os.write(fd, key + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        return key

    # -- file I/O ----------------------------------------------------------------------------

    def _read(self) -> dict[str, str]:
        try:
            token = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SecretError(f"cannot read secret store {self.path}: {exc.strerror}") from None
        fernet = self._get_fernet(create=False)
        try:
            plain = fernet.decrypt(token)
        except InvalidToken:
            raise SecretError(
                f"cannot decrypt secret store {self.path}: the key is wrong or the file is "
                f"corrupt; use the key it was written with (${KEY_ENV} or {self.key_path}), "
                "or move the file away and set the secrets again"
            ) from None
        # `from None` throughout: a JSON error would carry the decrypted text as its .doc.
        try:
            data = json.loads(plain.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            data = None
        values = data.get("secrets") if isinstance(data, dict) else None
        if not (
            isinstance(values, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in values.items())
        ):
            raise SecretError(
                f"secret store {self.path} decrypts but its content is not a secret table; "
                "move the file away and set the secrets again"
            )
        return dict(values)

    def _write(self, values: Mapping[str, str]) -> None:
        fernet = self._get_fernet(create=True)
        payload = json.dumps({"version": _FORMAT_VERSION, "secrets": dict(values)}).encode()
        token = fernet.encrypt(payload)
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # mkstemp creates the file 0600 in the same folder, so os.replace is atomic and
            # the store is never half-written or briefly readable by others.
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{self.path.name}.", suffix=".tmp")
        except OSError as exc:
            raise SecretError(f"cannot write secret store {self.path}: {exc.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o600)
                out.write(token)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise SecretError(f"cannot write secret store {self.path}: {exc.strerror}") from None
        _fsync_dir(folder)


def _make_fernet(key: bytes | str, source: str) -> Fernet:
    try:
        return Fernet(key.encode() if isinstance(key, str) else key)
    except (ValueError, TypeError):
        # Never echo the key itself, only where it came from.
        raise SecretError(
            f"{source} is not a valid Fernet key (32 url-safe base64-encoded bytes); "
            + _GENERATE_HINT
        ) from None


def _fsync_dir(folder: Path) -> None:
    # Makes the rename durable across a crash; some filesystems cannot open a directory.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Secrets(Mapping[str, str]):
    """Read-only view of the secrets handed to user functions; its repr shows names only."""

    __slots__ = ("_values",)
    _values: dict[str, str]

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        object.__setattr__(self, "_values", dict(values or {}))

    def __getitem__(self, name: str) -> str:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(
                f"no secret named {name!r}; set it with: voice-agent secrets set {name}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError("Secrets is read-only")

    def __delattr__(self, name: str) -> None:
        raise TypeError("Secrets is read-only")

    def __repr__(self) -> str:
        return f"Secrets(names={sorted(self._values)!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        # Pickling would carry the values out of the process (e.g. into a task queue or a
        # cache file); copying within the process is harmless and handled below.
        raise TypeError("Secrets cannot be pickled")

    def __copy__(self) -> Secrets:
        return self  # immutable, so a copy may be the same object

    def __deepcopy__(self, memo: dict[int, Any]) -> Secrets:
        return self


class Redactor:
    """Replaces every secret value by `[secret:NAME]` in strings, nested data and log records."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        forms: dict[str, str] = {}
        # Sorted by name so that two secrets sharing a value get a stable label.
        for name in sorted(secrets):
            value = secrets[name]
            if not value:
                continue
            for form in (
                value,
                json.dumps(value)[1:-1],
                json.dumps(value, ensure_ascii=False)[1:-1],
            ):
                forms.setdefault(form, name)
        self._labels = forms
        self._pattern: re.Pattern[str] | None = None
        if forms:
            # Longest first so that, at a given position, a value containing another wins.
            alternatives = sorted(forms, key=len, reverse=True)
            body = "|".join(re.escape(form) for form in alternatives)
            # A lookahead finds a match at every position, overlapping ones included, so
            # two values that overlap without one containing the other are both caught.
            self._pattern = re.compile(f"(?=({body}))")
        self._marker = f"_voice_agent_redacted_{id(self)}"

    def text(self, s: str) -> str:
        """`s` with every occurrence of a secret value replaced by `[secret:NAME]`."""
        if self._pattern is None or not s:
            return s
        parts: list[str] = []
        kept_to = 0  # s[:kept_to] has been copied or covered by a label
        for match in self._pattern.finditer(s):
            start = match.start()
            end = start + len(match.group(1))
            if end <= kept_to:
                continue  # wholly inside a value already replaced
            if start >= kept_to:
                parts.append(s[kept_to:start])
            parts.append(f"[secret:{self._labels[match.group(1)]}]")
            kept_to = end
        if not parts:
            return s
        parts.append(s[kept_to:])
        return "".join(parts)

    def value(self, obj: Any) -> Any:
        """Redact recursively through str, dict (keys and values), list and tuple."""
        if self._pattern is None:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.value(k): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.value(item) for item in obj]
        if isinstance(obj, tuple):
            items = [self.value(item) for item in obj]
            if hasattr(obj, "_fields"):  # a namedtuple keeps its type
                return type(obj)(*items)
            return tuple(items)
        return obj

    def logging_filter(self) -> logging.Filter:
        """A filter that redacts each record's message, arguments, traceback and stack.

        Attach it to handlers rather than loggers: a logger's filters do not see records
        propagated from its children."""
        return _RedactingFilter(self)

    def _redact_record(self, record: logging.LogRecord) -> None:
        if self._pattern is None or getattr(record, self._marker, False):
            return
        try:
            # Format first: a value could be assembled from msg and args together.
            message = record.getMessage()
        except Exception:
            record.msg = self.value(record.msg if isinstance(record.msg, str) else str(record.msg))
            record.args = self.value(record.args)
        else:
            record.msg = self.text(message)
            record.args = ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.text(record.exc_text)
        if record.stack_info:
            record.stack_info = self.text(record.stack_info)
        # The same record reaches every handler; redacting twice could rewrite a label.
        setattr(record, self._marker, True)


class _RedactingFilter(logging.Filter):
    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self._redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        self._redactor._redact_record(record)
        return True
