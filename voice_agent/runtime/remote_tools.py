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
from urllib.parse import quote, urlsplit

import httpx

from voice_agent.errors import ConfigError, ToolError
from voice_agent.runtime.openapi_spec import (
    BODY_KEY,
    SECRET_RE,
    Body,
    Param,
    Spec,
    check_headers,
    is_header_safe,
    url_problem,
)

__all__ = ["BODY_KEY", "RemoteAction", "RemoteTool", "load_remote_tool"]

_BODY_SNIPPET_CHARS = 200
# What httpx accepts as a query value (its parameter type is an invariant list).
QueryValue = str | int | float | bool | None


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

            value = SECRET_RE.sub(fill, template)
            if missing:
                raise ToolError(
                    f"{label}: header {header!r} refers to secret {missing[0]!r}, "
                    "which is no longer available"
                )
            if not is_header_safe(value):
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
    _params: tuple[Param, ...] = field(repr=False, compare=False)
    _body: Body | None = field(repr=False, compare=False)
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
    ) -> tuple[str, list[tuple[str, QueryValue]], dict[str, str]]:
        path = self.path
        query: list[tuple[str, QueryValue]] = []
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
                if not is_header_safe(text):
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
    checked_headers = check_headers(dict(headers or {}), resolve_secret, fail)

    spec = Spec(spec_path, lambda message: fail("openapi", f"{spec_path}: {message}"))
    if base_url is not None:
        problem = url_problem(base_url)
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


def _origin(url: str) -> str:
    parts = urlsplit(url)
    # userinfo in a URL is a credential: keep it out of messages.
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}"


# --- calling -----------------------------------------------------------------------------------


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


def _join_simple(param: Param, value: Any) -> str:
    """The `simple` style (path and header parameters): comma-separated lists and objects."""
    if isinstance(value, Mapping):
        if param.explode:
            return ",".join(f"{key}={_scalar(item)}" for key, item in value.items())
        return ",".join(f"{key},{_scalar(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ",".join(_scalar(item) for item in value)
    return _scalar(value)


def _encode_query(param: Param, value: Any) -> list[tuple[str, QueryValue]]:
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
