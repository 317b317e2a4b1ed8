"""Remote tools declared by an OpenAPI 3 document: every operationId becomes a callable action.

Inputs use the Dialogflow form: parameters as top-level keys, the JSON body under "requestBody".
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, unquote, urlsplit

import httpx
import yaml

from voice_agent.errors import ConfigError, ToolError

__all__ = ["BODY_KEY", "RemoteAction", "RemoteTool", "load_remote_tool"]

BODY_KEY = "requestBody"

_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_SECRET_RE = re.compile(r"\{\{\s*secret\s*:\s*([^{}]*?)\s*\}\}")
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_PATH_TEMPLATE_RE = re.compile(r"\{([^{}/]+)\}")
# OpenAPI says header parameters with these names are ignored: the client owns them.
_RESERVED_HEADER_PARAMS = frozenset({"accept", "content-type", "authorization"})
_BODY_SNIPPET_CHARS = 200
# What httpx accepts as a query value (its parameter type is an invariant list).
_QueryValue = str | int | float | bool | None
_FORM_MEDIA_TYPE = "application/x-www-form-urlencoded"
_DEFAULT_STYLE = {"path": "simple", "header": "simple", "query": "form", "cookie": "form"}


@dataclass(frozen=True)
class _Param:
    """How one OpenAPI parameter travels in the request."""

    name: str
    location: str  # path, query, header or cookie
    required: bool
    style: str
    explode: bool
    as_json: bool  # declared with `content` instead of `schema`: the value is sent as JSON text


@dataclass(frozen=True)
class _Body:
    media_type: str
    required: bool

    @property
    def is_form(self) -> bool:
        return self.media_type == _FORM_MEDIA_TYPE


class _Runtime:
    """What every action of one tool shares: the HTTP client, base URL, and configured headers."""

    def __init__(
        self,
        tool: str,
        base_url: str,
        headers: Mapping[str, str],
        timeout_s: float,
        resolve_secret: Callable[[str], str | None],
        client: httpx.AsyncClient,
        owns_client: bool,
    ) -> None:
        self.tool = tool
        self.base_url = base_url
        self.header_templates = dict(headers)
        self.timeout = httpx.Timeout(timeout_s)
        self.timeout_s = timeout_s
        self.resolve_secret = resolve_secret
        self.client = client
        self.owns_client = owns_client
        self.closed = False
        self.origin = _origin(base_url)

    def expand_headers(self, label: str) -> tuple[dict[str, str], list[str]]:
        """The configured headers with secrets filled in, and every sensitive string to scrub."""
        expanded: dict[str, str] = {}
        sensitive: list[str] = []
        for header, template in self.header_templates.items():
            missing: list[str] = []

            def fill(match: re.Match[str], missing: list[str] = missing) -> str:
                value = self.resolve_secret(match.group(1))
                if value is None:
                    missing.append(match.group(1))
                    return ""
                sensitive.append(value)
                return value

            value = _SECRET_RE.sub(fill, template)
            if missing:
                raise ToolError(
                    f"{label}: header {header!r} refers to secret {missing[0]!r}, "
                    "which is no longer available"
                )
            if not _is_header_safe(value):
                raise ToolError(
                    f"{label}: header {header!r} would hold characters not allowed in an HTTP "
                    "header (check the secrets it uses)"
                )
            expanded[header] = value
            if value != template:
                sensitive.append(value)
        return expanded, sensitive


@dataclass(frozen=True)
class RemoteAction:
    """One operation of a remote tool, shown to the LLM as a function tool."""

    tool: str
    name: str
    description: str
    parameters: dict[str, Any]
    method: str = field(repr=False)
    path: str = field(repr=False)
    _params: tuple[_Param, ...] = field(repr=False, compare=False)
    _body: _Body | None = field(repr=False, compare=False)
    _runtime: _Runtime = field(repr=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.tool}.{self.name}"

    async def call(self, inputs: Mapping[str, Any]) -> Any:
        """Send the request; answer the parsed JSON result (None when the body is empty)."""
        label = self.label
        runtime = self._runtime
        if runtime.closed:
            raise ToolError(f"{label}: the tool has been closed")
        if not isinstance(inputs, Mapping):
            raise ToolError(f"{label}: inputs must be a mapping, not {type(inputs).__name__}")
        self._check_inputs(inputs)

        url, params, param_headers = self._encode_parameters(inputs)
        headers = httpx.Headers({"Accept": "application/json"})
        for key, value in param_headers.items():
            headers[key] = value
        configured, sensitive = runtime.expand_headers(label)
        # Configured headers come last so the LLM can never override the operator's auth.
        for key, value in configured.items():
            headers[key] = value

        content: bytes | None = None
        data: dict[str, Any] | None = None
        body = inputs.get(BODY_KEY)
        if self._body is not None and body is not None:
            if self._body.is_form:
                if not isinstance(body, Mapping):
                    raise ToolError(f"{label}: {BODY_KEY} must be an object of form fields")
                data = {str(key): _form_value(value) for key, value in body.items()}
            else:
                try:
                    content = json.dumps(body).encode("utf-8")
                except (TypeError, ValueError) as exc:
                    raise ToolError(
                        f"{label}: {BODY_KEY} is not JSON serializable: {exc}"
                    ) from None
                headers["Content-Type"] = self._body.media_type

        try:
            response = await runtime.client.request(
                self.method.upper(),
                url,
                params=params,
                headers=headers,
                content=content,
                data=data,
                timeout=runtime.timeout,
            )
        except httpx.TimeoutException:
            raise ToolError(
                f"{label}: timed out: {runtime.origin} did not answer within {runtime.timeout_s:g}s"
            ) from None
        except httpx.ConnectError as exc:
            reason = _scrub(str(exc), sensitive) or type(exc).__name__
            raise ToolError(f"{label}: could not connect to {runtime.origin}: {reason}") from None
        except httpx.HTTPError as exc:
            # Other httpx texts (protocol errors) may quote request headers: name the class only.
            raise ToolError(
                f"{label}: the request to {runtime.origin} failed ({type(exc).__name__})"
            ) from None
        return _interpret(label, runtime.origin, response, sensitive)

    def _check_inputs(self, inputs: Mapping[str, Any]) -> None:
        known = self.parameters.get("properties", {})
        unknown = sorted(str(key) for key in inputs if key not in known)
        if unknown:
            accepted = ", ".join(known) or "none"
            raise ToolError(
                f"{self.label}: unknown input(s) {', '.join(map(repr, unknown))} "
                f"(accepted: {accepted})"
            )
        for required in self.parameters.get("required", []):
            if inputs.get(required) is None:
                raise ToolError(f"{self.label}: missing required input {required!r}")

    def _encode_parameters(
        self, inputs: Mapping[str, Any]
    ) -> tuple[str, list[tuple[str, _QueryValue]], dict[str, str]]:
        path = self.path
        query: list[tuple[str, _QueryValue]] = []
        headers: dict[str, str] = {}
        cookies: list[str] = []
        for param in self._params:
            value = inputs.get(param.name)
            if value is None:
                continue
            if param.as_json:
                value = json.dumps(value)
            if param.location == "path":
                text = quote(_join_simple(param, value), safe="")
                path = path.replace("{" + param.name + "}", text)
            elif param.location == "query":
                query.extend(_encode_query(param, value))
            elif param.location == "header":
                text = _join_simple(param, value)
                if not _is_header_safe(text):
                    raise ToolError(
                        f"{self.label}: input {param.name!r} holds characters not allowed "
                        "in an HTTP header"
                    )
                headers[param.name] = text
            else:
                text = _join_simple(param, value)
                cookies.append(f"{param.name}={quote(text, safe='')}")
        if cookies:
            headers["Cookie"] = "; ".join(cookies)
        return self._runtime.base_url + path, query, headers


class RemoteTool:
    """A named set of remote actions sharing one HTTP client (connections are reused)."""

    def __init__(self, name: str, actions: dict[str, RemoteAction], runtime: _Runtime) -> None:
        self.name = name
        self.actions = actions
        self._runtime = runtime

    @property
    def base_url(self) -> str:
        return self._runtime.base_url

    async def aclose(self) -> None:
        """Close the HTTP client, unless it was handed in by the caller."""
        if self._runtime.closed:
            return
        self._runtime.closed = True
        if self._runtime.owns_client:
            await self._runtime.client.aclose()

    async def __aenter__(self) -> RemoteTool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"RemoteTool({self.name!r}, actions={sorted(self.actions)})"


def load_remote_tool(
    name: str,
    spec_path: Path,
    *,
    base_url: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
    resolve_secret: Callable[[str], str | None],
    config_file: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> RemoteTool:
    """Read an OpenAPI 3 document and build one action per operation.

    A relative spec_path is taken relative to the directory of config_file (when given).
    Every problem raises ConfigError located at `tools.<name>.<field>` in config_file.
    """
    spec_path = Path(spec_path)
    if not spec_path.is_absolute() and config_file is not None:
        spec_path = Path(config_file).parent / spec_path
    error_file = config_file if config_file is not None else str(spec_path)
    prefix = f"tools.{name}"

    def fail(key: str, message: str) -> NoReturn:
        raise ConfigError(message, file=error_file, key=f"{prefix}.{key}" if key else prefix)

    if not name.isidentifier() or keyword.iskeyword(name):
        fail("", f"tool name {name!r} is not a valid Python identifier")
    if not timeout_s > 0:
        fail("timeout_s", f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
    checked_headers = _check_headers(dict(headers or {}), resolve_secret, fail)

    spec = _Spec(spec_path, lambda message: fail("openapi", f"{spec_path}: {message}"))
    if base_url is not None:
        problem = _url_problem(base_url)
        if problem:
            fail("base_url", f"base_url {base_url!r} {problem}")
        root = base_url.rstrip("/")
    else:
        root = spec.server_url(
            lambda message: fail("openapi", f"{spec_path}: {message}; set tools.{name}.base_url")
        )

    if client is None:
        client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), follow_redirects=False)
        owns_client = True
    else:
        owns_client = False
    runtime = _Runtime(name, root, checked_headers, timeout_s, resolve_secret, client, owns_client)
    actions = {
        op.operation_id: RemoteAction(
            tool=name,
            name=op.operation_id,
            description=op.description,
            parameters=op.schema,
            method=op.method,
            path=op.path,
            _params=op.params,
            _body=op.body,
            _runtime=runtime,
        )
        for op in spec.operations()
    }
    return RemoteTool(name, actions, runtime)


# --- loading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Operation:
    operation_id: str
    method: str
    path: str
    description: str
    schema: dict[str, Any]
    params: tuple[_Param, ...]
    body: _Body | None


class _Spec:
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
        problem = _url_problem(url)
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
                if not isinstance(name, str) or location not in _DEFAULT_STYLE:
                    self._fail(f"{where}: parameter {name!r} needs a name and 'in' (path, ...)")
                if location == "header" and name.lower() in _RESERVED_HEADER_PARAMS:
                    continue
                # An operation's parameter overrides the path item's one of the same name and place.
                declared[(name, location)] = param

        properties: dict[str, Any] = {}
        required: list[str] = []
        params: list[_Param] = []
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
            style = param.get("style") or _DEFAULT_STYLE[location]
            explode = param.get("explode", style == "form")
            params.append(_Param(name, location, is_required, str(style), bool(explode), as_json))

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

    def _request_body(self, raw: Any, where: str) -> tuple[_Body, dict[str, Any]]:
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
        return _Body(sent_as, bool(body.get("required"))), schema


def _check_headers(
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
        for match in _SECRET_RE.finditer(template):
            secret = match.group(1)
            if not secret:
                fail(key, f"header {header!r} has an empty {{{{secret:...}}}} reference")
            if resolve_secret(secret) is None:
                fail(key, f"header {header!r} refers to secret {secret!r}, which does not exist")
        if not _is_header_safe(_SECRET_RE.sub("", template)):
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


def _url_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "is not an absolute http(s) URL"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    return None


def _origin(url: str) -> str:
    parts = urlsplit(url)
    # userinfo in a URL is a credential: keep it out of messages.
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}"


# --- calling -----------------------------------------------------------------------------------


def _is_header_safe(value: str) -> bool:
    return value.isascii() and not any(ch in value for ch in "\r\n\0")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def _form_value(value: Any) -> str | list[str]:
    if isinstance(value, list | tuple):
        return [_scalar(item) for item in value]
    return _scalar(value)


def _join_simple(param: _Param, value: Any) -> str:
    """The `simple` style (path and header parameters): comma-separated lists and objects."""
    if isinstance(value, Mapping):
        if param.explode:
            return ",".join(f"{key}={_scalar(item)}" for key, item in value.items())
        return ",".join(f"{key},{_scalar(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ",".join(_scalar(item) for item in value)
    return _scalar(value)


def _encode_query(param: _Param, value: Any) -> list[tuple[str, _QueryValue]]:
    name = param.name
    if isinstance(value, Mapping):
        if param.style == "deepObject":
            return [(f"{name}[{key}]", _scalar(item)) for key, item in value.items()]
        if param.explode:
            return [(str(key), _scalar(item)) for key, item in value.items()]
        return [(name, ",".join(f"{key},{_scalar(item)}" for key, item in value.items()))]
    if isinstance(value, list | tuple):
        if param.explode:
            return [(name, _scalar(item)) for item in value]
        separator = {"spaceDelimited": " ", "pipeDelimited": "|"}.get(param.style, ",")
        return [(name, separator.join(_scalar(item) for item in value))]
    return [(name, _scalar(value))]


def _scrub(text: str, sensitive: list[str]) -> str:
    for value in sorted(sensitive, key=len, reverse=True):
        if value:
            text = text.replace(value, "***")
    return text


def _snippet(response: httpx.Response, sensitive: list[str]) -> str:
    text = response.content[: _BODY_SNIPPET_CHARS * 4].decode("utf-8", errors="replace")
    text = _scrub(" ".join(text.split()), sensitive)
    if len(text) > _BODY_SNIPPET_CHARS:
        text = text[:_BODY_SNIPPET_CHARS].rstrip() + "…"
    return text or "(empty body)"


def _interpret(label: str, origin: str, response: httpx.Response, sensitive: list[str]) -> Any:
    status = response.status_code
    if not 200 <= status < 300:
        reason = f" {response.reason_phrase}" if response.reason_phrase else ""
        raise ToolError(
            f"{label}: {origin} answered HTTP {status}{reason}: {_snippet(response, sensitive)}",
            status=status,
        )
    if status == 204 or not response.content.strip():
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        raise ToolError(
            f"{label}: {origin} answered invalid JSON (HTTP {status}): "
            f"{_snippet(response, sensitive)}",
            status=status,
        ) from None
