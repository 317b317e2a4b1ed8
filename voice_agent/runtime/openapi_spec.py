"""An OpenAPI 3 document read for remote tools (voice_agent.runtime.remote_tools): its server URL,
its operations with their parameters and request bodies, $refs resolved, every problem named by
its key."""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

import yaml

BODY_KEY = "requestBody"
_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
SECRET_RE = re.compile(r"\{\{\s*secret\s*:\s*([^{}]*?)\s*\}\}")
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_PATH_TEMPLATE_RE = re.compile(r"\{([^{}/]+)\}")
# OpenAPI says header parameters with these names are ignored: the client owns them.
_RESERVED_HEADER_PARAMS = frozenset({"accept", "content-type", "authorization"})
_FORM_MEDIA_TYPE = "application/x-www-form-urlencoded"
DEFAULT_STYLE = {"path": "simple", "header": "simple", "query": "form", "cookie": "form"}


@dataclass(frozen=True)
class Param:
    """How one OpenAPI parameter travels in the request."""

    name: str
    location: str  # path, query, header or cookie
    required: bool
    style: str
    explode: bool
    as_json: bool  # declared with `content` instead of `schema`: the value is sent as JSON text


@dataclass(frozen=True)
class Body:
    media_type: str
    required: bool

    @property
    def is_form(self) -> bool:
        return self.media_type == _FORM_MEDIA_TYPE


@dataclass(frozen=True)
class _Operation:
    operation_id: str
    method: str
    path: str
    description: str
    schema: dict[str, Any]
    params: tuple[Param, ...]
    body: Body | None


class Spec:
    """A parsed OpenAPI document with local $ref resolution; every problem goes to `fail`."""

    def __init__(self, path: Path, fail: Callable[[str], NoReturn]) -> None:
        self._fail = fail
        self.doc = self._read(path)
        version = self.doc.get("openapi")
        if not isinstance(version, str) or not version.startswith("3."):
            found = f"{version!r}" if version is not None else "no 'openapi' field"
            fail(f"not an OpenAPI 3 document ({found}; Swagger 2.0 is not supported)")
        paths = self.doc.get("paths")
        if not isinstance(paths, dict) or not paths:
            fail("the document declares no paths")
        self.paths: dict[Any, Any] = paths

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._fail("file not found")
        except (OSError, UnicodeDecodeError) as exc:
            self._fail(f"cannot read the file: {exc}")
        try:
            if path.suffix.lower() == ".json":
                doc = json.loads(text)
            else:
                doc = yaml.safe_load(text)
        except json.JSONDecodeError as exc:
            self._fail(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "cannot parse"
            self._fail(f"invalid YAML{where}: {problem}")
        if not isinstance(doc, dict):
            self._fail("the document is not a mapping")
        return doc

    def server_url(self, fail: Callable[[str], NoReturn]) -> str:
        servers = self.doc.get("servers")
        if not isinstance(servers, list) or not servers or not isinstance(servers[0], dict):
            fail("the document has no servers[0].url")
        server = servers[0]
        url = server.get("url")
        if not isinstance(url, str) or not url:
            fail("the document has no servers[0].url")
        variables = server.get("variables") or {}

        def fill(match: re.Match[str]) -> str:
            variable = variables.get(match.group(1)) if isinstance(variables, dict) else None
            if not isinstance(variable, dict) or "default" not in variable:
                fail(f"servers[0].url variable {match.group(1)!r} has no default")
            return str(variable["default"])

        url = re.sub(r"\{([^{}]+)\}", fill, url)
        problem = url_problem(url)
        if problem:
            fail(f"servers[0].url {url!r} {problem}")
        return url.rstrip("/")

    # $ref resolution

    def deref(self, node: Any, where: str, stack: tuple[str, ...] = ()) -> Any:
        """A copy of node with every local $ref replaced by what it points to."""
        if isinstance(node, list):
            return [self.deref(item, where, stack) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" not in node:
            return {key: self.deref(value, where, stack) for key, value in node.items()}
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            self._fail(f"{where}: $ref {ref!r} is not a local reference ('#/...')")
        siblings = {key: self.deref(v, where, stack) for key, v in node.items() if key != "$ref"}
        if ref in stack:
            if ref.startswith("#/components/schemas/"):
                # A recursive schema (a tree) cannot be inlined: below the first level, accept any
                # value rather than refuse a valid document.
                return siblings
            self._fail(f"{where}: $ref {ref!r} refers back to itself")
        resolved = self.deref(self._pointer(ref, where), where, (*stack, ref))
        if siblings and isinstance(resolved, dict):
            # OpenAPI 3.1 lets a $ref carry siblings (description, ...) that refine the target.
            resolved = {**resolved, **siblings}
        return resolved

    def _pointer(self, ref: str, where: str) -> Any:
        node: Any = self.doc
        for raw in ref[2:].split("/"):
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                self._fail(f"{where}: $ref {ref!r} points to nothing in the document")
        return node

    # operations

    def operations(self) -> list[_Operation]:
        found: dict[str, str] = {}
        operations: list[_Operation] = []
        for path, raw_item in self.paths.items():
            if not isinstance(path, str) or not path.startswith("/"):
                self._fail(f"path {path!r} must start with '/'")
            item = (
                self.deref(raw_item, path)
                if isinstance(raw_item, dict) and "$ref" in raw_item
                else raw_item
            )
            if not isinstance(item, dict):
                self._fail(f"path {path}: the path item is not a mapping")
            shared = item.get("parameters") or []
            for method in _HTTP_METHODS:
                operation = item.get(method)
                if operation is None:
                    continue
                where = f"{method.upper()} {path}"
                if not isinstance(operation, dict):
                    self._fail(f"{where}: the operation is not a mapping")
                operation_id = operation.get("operationId")
                if not isinstance(operation_id, str):
                    self._fail(f"{where}: the operation has no operationId")
                if not operation_id.isidentifier() or keyword.iskeyword(operation_id):
                    self._fail(
                        f"{where}: operationId {operation_id!r} is not a valid Python identifier"
                    )
                if operation_id in found:
                    self._fail(
                        f"{where}: operationId {operation_id!r} is already used by "
                        f"{found[operation_id]}"
                    )
                found[operation_id] = where
                operations.append(
                    self._operation(operation_id, method, path, shared, operation, where)
                )
        if not operations:
            self._fail("the document declares no operations")
        return operations

    def _operation(
        self,
        operation_id: str,
        method: str,
        path: str,
        shared: Any,
        operation: dict[str, Any],
        where: str,
    ) -> _Operation:
        declared: dict[tuple[str, str], dict[str, Any]] = {}
        for source in (shared, operation.get("parameters") or []):
            if not isinstance(source, list):
                self._fail(f"{where}: parameters must be a list")
            for raw in source:
                param = self.deref(raw, where)
                if not isinstance(param, dict):
                    self._fail(f"{where}: a parameter is not a mapping")
                name, location = param.get("name"), param.get("in")
                if not isinstance(name, str) or location not in DEFAULT_STYLE:
                    self._fail(f"{where}: parameter {name!r} needs a name and 'in' (path, ...)")
                if location == "header" and name.lower() in _RESERVED_HEADER_PARAMS:
                    continue
                # An operation's parameter overrides the path item's one of the same name and place.
                declared[(name, location)] = param

        properties: dict[str, Any] = {}
        required: list[str] = []
        params: list[Param] = []
        for (name, location), param in declared.items():
            if name == BODY_KEY or name in properties:
                self._fail(
                    f"{where}: parameter {name!r} ({location}) clashes with another input "
                    "of the same name"
                )
            is_required = location == "path" or bool(param.get("required"))
            properties[name], as_json = self._parameter_schema(param)
            if is_required:
                required.append(name)
            style = param.get("style") or DEFAULT_STYLE[location]
            explode = param.get("explode", style == "form")
            params.append(Param(name, location, is_required, str(style), bool(explode), as_json))

        templated = set(_PATH_TEMPLATE_RE.findall(path))
        path_params = {p.name for p in params if p.location == "path"}
        for missing in sorted(templated - path_params):
            self._fail(f"{where}: path parameter {{{missing}}} is not declared")

        body = None
        raw_body = operation.get("requestBody")
        if raw_body is not None:
            body, body_schema = self._request_body(raw_body, where)
            properties[BODY_KEY] = body_schema
            if body.required:
                required.append(BODY_KEY)

        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        return _Operation(
            operation_id=operation_id,
            method=method,
            path=path,
            description=_describe(operation, where),
            schema=schema,
            params=tuple(params),
            body=body,
        )

    def _parameter_schema(self, param: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        as_json = False
        declared = param.get("schema")
        if declared is None and isinstance(param.get("content"), dict) and param["content"]:
            media = next(iter(param["content"].values()))
            declared = media.get("schema") if isinstance(media, dict) else None
            as_json = True
        schema = dict(declared) if isinstance(declared, dict) else {}
        if param.get("description") and "description" not in schema:
            schema["description"] = param["description"]
        return schema, as_json

    def _request_body(self, raw: Any, where: str) -> tuple[Body, dict[str, Any]]:
        body = self.deref(raw, where)
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, dict) or not content:
            self._fail(f"{where}: requestBody has no content")
        media_type = _pick_media_type(content)
        if media_type is None:
            self._fail(
                f"{where}: requestBody media types {sorted(content)} are not supported "
                f"(JSON or {_FORM_MEDIA_TYPE})"
            )
        media = content[media_type]
        declared = media.get("schema") if isinstance(media, dict) else None
        schema = dict(declared) if isinstance(declared, dict) else {}
        if body.get("description") and "description" not in schema:
            schema["description"] = body["description"]
        sent_as = "application/json" if media_type in ("*/*", "application/*") else media_type
        return Body(sent_as, bool(body.get("required"))), schema


def check_headers(
    headers: dict[str, str],
    resolve_secret: Callable[[str], str | None],
    fail: Callable[[str, str], NoReturn],
) -> dict[str, str]:
    for header, template in headers.items():
        key = f"headers.{header}"
        if not isinstance(header, str) or not _HEADER_NAME_RE.match(header):
            fail("headers", f"{header!r} is not a valid HTTP header name")
        if not isinstance(template, str):
            fail(key, f"header {header!r} must be a string")
        for match in SECRET_RE.finditer(template):
            secret = match.group(1)
            if not secret:
                fail(key, f"header {header!r} has an empty {{{{secret:...}}}} reference")
            if resolve_secret(secret) is None:
                fail(key, f"header {header!r} refers to secret {secret!r}, which does not exist")
        if not is_header_safe(SECRET_RE.sub("", template)):
            fail(key, f"header {header!r} holds characters not allowed in an HTTP header")
    return headers


def _pick_media_type(content: dict[str, Any]) -> str | None:
    types = [str(media_type) for media_type in content]
    lowered = {media_type.split(";")[0].strip().lower(): media_type for media_type in types}
    if "application/json" in lowered:
        return lowered["application/json"]
    for plain, original in lowered.items():
        if plain.endswith("+json"):
            return original
    for plain in (_FORM_MEDIA_TYPE, "*/*", "application/*"):
        if plain in lowered:
            return lowered[plain]
    return None


def _describe(operation: dict[str, Any], where: str) -> str:
    summary = str(operation.get("summary") or "").strip()
    description = str(operation.get("description") or "").strip()
    if summary and description and description != summary:
        return f"{summary}\n\n{description}"
    return summary or description or where


def url_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "is not an absolute http(s) URL"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    return None


def is_header_safe(value: str) -> bool:
    return value.isascii() and not any(ch in value for ch in "\r\n\0")
