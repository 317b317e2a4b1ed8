"""Tests for remote OpenAPI tools, against a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from multidict import CIMultiDict

from voice_agent.errors import ConfigError, ToolError
from voice_agent.runtime.remote_tools import RemoteTool, load_remote_tool

FIXTURES = Path(__file__).parent / "fixtures" / "openapi"
CONFIG_FILE = str(FIXTURES / "agent.yaml")
SECRET = "s3cr3t-weather-token-8f2a"
AUTH = {"Authorization": "Bearer {{secret:weather_key}}"}


@dataclass
class Received:
    method: str
    raw_path: str
    query: list[tuple[str, str]]
    headers: CIMultiDict[str]
    body: bytes
    peer: Any


@dataclass
class Api:
    url: str
    received: list[Received] = field(default_factory=list)


@pytest.fixture
def secrets() -> dict[str, str]:
    return {"weather_key": SECRET}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    release = asyncio.Event()
    state = Api(url="")

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        state.received.append(
            Received(
                method=request.method,
                raw_path=request.raw_path.split("?")[0],
                query=list(request.query.items()),
                headers=CIMultiDict(request.headers),
                body=await request.read(),
                peer=request.transport.get_extra_info("peername") if request.transport else None,
            )
        )
        response: web.StreamResponse = await handler(request)
        return response

    async def weather(request: web.Request) -> web.Response:
        return web.json_response(
            {"city": request.match_info["city"], "temp": 21.5, "units": request.query.get("units")}
        )

    async def no_content(request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def garbled(request: web.Request) -> web.Response:
        return web.Response(text="{'temp': 21", content_type="application/json")

    async def never(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"late": True})

    async def outage(request: web.Request) -> web.Response:
        # Echo the credentials the way a careless upstream might: they must not reach messages.
        echoed = request.headers.get("Authorization", "")
        text = f"upstream database failure (auth: {echoed}) " + "x" * 500
        return web.Response(status=500, text=text)

    async def offices(request: web.Request) -> web.Response:
        return web.json_response(
            [{"id": 12, "services": request.query.getall("service", [])}],
        )

    async def book(request: web.Request) -> web.Response:
        payload = await request.json()
        office = int(request.match_info["office_id"])
        return web.json_response(
            {"id": "A-1", "office": office, "date": payload["date"]}, status=201
        )

    app = web.Application(middlewares=[record])
    app.router.add_get("/weather/{city:.+}", weather)
    app.router.add_get("/alerts", no_content)
    app.router.add_get("/forecast", garbled)
    app.router.add_get("/radar", never)
    app.router.add_get("/outage", outage)
    app.router.add_get("/offices", offices)
    app.router.add_post("/offices/{office_id}/appointments", book)
    app.router.add_delete("/appointments/{appointment_id}", no_content)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    state.url = f"http://{host}:{port}"
    try:
        yield state
    finally:
        release.set()
        await runner.cleanup()


@pytest.fixture
async def weather(api: Api, secrets: dict[str, str]) -> AsyncIterator[RemoteTool]:
    tool = load_remote_tool(
        "weather_api",
        FIXTURES / "weather.yaml",
        base_url=api.url,
        headers=AUTH,
        resolve_secret=secrets.get,
        config_file=CONFIG_FILE,
    )
    yield tool
    await tool.aclose()


@pytest.fixture
async def dmv(api: Api, secrets: dict[str, str]) -> AsyncIterator[RemoteTool]:
    tool = load_remote_tool(
        "dmv",
        FIXTURES / "dmv.json",
        base_url=api.url + "/",
        headers=AUTH,
        resolve_secret=secrets.get,
        config_file=CONFIG_FILE,
    )
    yield tool
    await tool.aclose()


# --- schemas -----------------------------------------------------------------------------------


def test_every_operation_becomes_an_action(weather: RemoteTool) -> None:
    assert sorted(weather.actions) == [
        "get_forecast",
        "get_outage",
        "get_radar",
        "get_weather",
        "list_alerts",
    ]
    action = weather.actions["get_weather"]
    assert (action.tool, action.name) == ("weather_api", "get_weather")
    assert action.description == (
        "Current weather for a city\n\nTemperature and conditions right now."
    )
    assert weather.actions["list_alerts"].description == "Weather alerts; none today."


def test_parameters_schema_lists_path_query_and_header_inputs(weather: RemoteTool) -> None:
    schema = weather.actions["get_weather"].parameters
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    # The Authorization header parameter is ignored, as OpenAPI requires.
    assert list(schema["properties"]) == ["city", "units", "days", "X-Request-Id"]
    assert schema["properties"]["city"] == {"type": "string", "description": "City name"}
    assert schema["properties"]["units"]["enum"] == ["metric", "imperial"]
    assert schema["properties"]["units"]["description"] == "Unit system"
    assert schema["required"] == ["city"]
    assert weather.actions["list_alerts"].parameters["properties"] == {}


def test_request_body_schema_is_resolved_under_request_body(dmv: RemoteTool) -> None:
    schema = dmv.actions["create_appointment"].parameters
    assert list(schema["properties"]) == ["office_id", "requestBody"]
    assert schema["required"] == ["office_id", "requestBody"]
    body = schema["properties"]["requestBody"]
    assert body["description"] == "The appointment to book"
    assert body["required"] == ["date", "person"]
    person = body["properties"]["person"]
    assert person["properties"]["name"] == {"type": "string"}
    # The recursive reference is cut after one level instead of looping forever.
    assert person["properties"]["guardian"] == {"description": "Who signs for a minor"}
    assert "$ref" not in json.dumps(schema)
    limit = dmv.actions["list_offices"].parameters["properties"]["limit"]
    assert limit == {"type": "integer", "maximum": 50}


# --- calls -------------------------------------------------------------------------------------


async def test_get_sends_path_query_header_and_secret(weather: RemoteTool, api: Api) -> None:
    result = await weather.actions["get_weather"].call(
        {"city": "São Paulo/SP", "units": "metric", "days": 3, "X-Request-Id": "r-1"}
    )
    assert result == {"city": "São Paulo/SP", "temp": 21.5, "units": "metric"}
    [seen] = api.received
    assert seen.method == "GET"
    assert seen.raw_path == "/weather/S%C3%A3o%20Paulo%2FSP"
    assert seen.query == [("units", "metric"), ("days", "3")]
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"
    assert seen.headers["X-Request-Id"] == "r-1"
    assert seen.headers["Accept"] == "application/json"


async def test_optional_inputs_may_be_left_out(weather: RemoteTool, api: Api) -> None:
    await weather.actions["get_weather"].call({"city": "Paris", "units": None})
    assert api.received[0].query == []
    assert "X-Request-Id" not in api.received[0].headers


async def test_secret_is_read_at_request_time_and_connection_is_reused(
    weather: RemoteTool, api: Api, secrets: dict[str, str]
) -> None:
    action = weather.actions["get_weather"]
    await action.call({"city": "Paris"})
    secrets["weather_key"] = "rotated-token"
    await action.call({"city": "Lyon"})
    first, second = api.received
    assert first.headers["Authorization"] == f"Bearer {SECRET}"
    assert second.headers["Authorization"] == "Bearer rotated-token"
    assert first.peer == second.peer


async def test_post_sends_json_body_and_returns_parsed_json(dmv: RemoteTool, api: Api) -> None:
    body = {"date": "2025-03-14", "person": {"name": "Ada"}}
    result = await dmv.actions["create_appointment"].call({"requestBody": body, "office_id": 12})
    assert result == {"id": "A-1", "office": 12, "date": "2025-03-14"}
    [seen] = api.received
    assert (seen.method, seen.raw_path) == ("POST", "/offices/12/appointments")
    assert seen.headers["Content-Type"] == "application/json"
    assert json.loads(seen.body) == body
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"


async def test_array_query_parameter_repeats_the_key(dmv: RemoteTool, api: Api) -> None:
    result = await dmv.actions["list_offices"].call({"service": ["license", "plates"], "limit": 5})
    assert result == [{"id": 12, "services": ["license", "plates"]}]
    assert api.received[0].query == [("service", "license"), ("service", "plates"), ("limit", "5")]


async def test_no_content_returns_none(weather: RemoteTool, dmv: RemoteTool, api: Api) -> None:
    assert await weather.actions["list_alerts"].call({}) is None
    assert await dmv.actions["cancel_appointment"].call({"appointment_id": "A 1"}) is None
    assert [seen.raw_path for seen in api.received] == ["/alerts", "/appointments/A%201"]


async def test_missing_required_input(weather: RemoteTool, dmv: RemoteTool, api: Api) -> None:
    with pytest.raises(ToolError, match=r"weather_api\.get_weather: missing required input 'city'"):
        await weather.actions["get_weather"].call({"units": "metric"})
    with pytest.raises(ToolError, match=r"dmv\.create_appointment: missing required input 'reque"):
        await dmv.actions["create_appointment"].call({"office_id": 1})
    assert api.received == []


async def test_unknown_input_is_refused(weather: RemoteTool, api: Api) -> None:
    with pytest.raises(ToolError) as caught:
        await weather.actions["get_weather"].call({"city": "Paris", "country": "FR"})
    assert "'country'" in str(caught.value)
    assert "city, units, days, X-Request-Id" in str(caught.value)
    assert api.received == []


# --- failures ----------------------------------------------------------------------------------


async def test_server_error_reports_status_and_start_of_body(weather: RemoteTool) -> None:
    with pytest.raises(ToolError) as caught:
        await weather.actions["get_outage"].call({})
    error = caught.value
    assert error.status == 500
    assert "HTTP 500" in str(error)
    assert "upstream database failure" in str(error)
    assert str(error).endswith("…")
    assert len(str(error)) < 320
    # The server echoed the bearer token into its body: it is scrubbed.
    assert SECRET not in str(error)
    assert "auth: ***" in str(error)


async def test_invalid_json_is_a_tool_error(weather: RemoteTool) -> None:
    with pytest.raises(ToolError, match="answered invalid JSON") as caught:
        await weather.actions["get_forecast"].call({})
    assert caught.value.status == 200
    assert "{'temp': 21" in str(caught.value)
    assert SECRET not in str(caught.value)


async def test_timeout_is_a_tool_error(api: Api, secrets: dict[str, str]) -> None:
    tool = load_remote_tool(
        "weather_api",
        FIXTURES / "weather.yaml",
        base_url=api.url,
        headers=AUTH,
        timeout_s=0.2,
        resolve_secret=secrets.get,
    )
    try:
        with pytest.raises(ToolError, match=r"timed out: .* did not answer within 0\.2s") as caught:
            await tool.actions["get_radar"].call({})
    finally:
        await tool.aclose()
    assert caught.value.status is None
    assert SECRET not in str(caught.value)
    assert caught.value.__cause__ is None
    assert [seen.raw_path for seen in api.received] == ["/radar"]


async def test_connection_refused_is_a_tool_error(secrets: dict[str, str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more.
    tool = load_remote_tool(
        "weather_api",
        FIXTURES / "weather.yaml",
        base_url=f"http://127.0.0.1:{port}",
        headers=AUTH,
        resolve_secret=secrets.get,
    )
    try:
        with pytest.raises(ToolError, match=f"could not connect to http://127.0.0.1:{port}") as e:
            await tool.actions["list_alerts"].call({})
        assert SECRET not in str(e.value)
    finally:
        await tool.aclose()


async def test_secret_gone_at_request_time(
    weather: RemoteTool, api: Api, secrets: dict[str, str]
) -> None:
    del secrets["weather_key"]
    with pytest.raises(ToolError, match="secret 'weather_key', which is no longer available"):
        await weather.actions["list_alerts"].call({})
    assert api.received == []


async def test_secret_unfit_for_a_header_is_not_quoted(
    weather: RemoteTool, api: Api, secrets: dict[str, str]
) -> None:
    secrets["weather_key"] = "line1\r\nX-Evil: yes"
    with pytest.raises(ToolError, match="not allowed in an HTTP header") as caught:
        await weather.actions["list_alerts"].call({})
    assert "line1" not in str(caught.value)
    assert api.received == []


async def test_aclose_closes_own_client_only(api: Api) -> None:
    tool = load_remote_tool(
        "weather_api", FIXTURES / "weather.yaml", base_url=api.url, resolve_secret=lambda _: None
    )
    assert await tool.actions["list_alerts"].call({}) is None
    await tool.aclose()
    await tool.aclose()
    with pytest.raises(ToolError, match="closed"):
        await tool.actions["list_alerts"].call({})

    async with httpx.AsyncClient() as shared:
        borrowed = load_remote_tool(
            "weather_api",
            FIXTURES / "weather.yaml",
            base_url=api.url,
            resolve_secret=lambda _: None,
            client=shared,
        )
        await borrowed.aclose()
        assert not shared.is_closed
        assert (await shared.get(api.url + "/alerts")).status_code == 204


async def test_base_url_defaults_to_the_document_server(api: Api, tmp_path: Path) -> None:
    port = api.url.rsplit(":", 1)[1]
    document = {
        "openapi": "3.0.3",
        "info": {"title": "Alerts", "version": "1"},
        "servers": [{"url": "http://127.0.0.1:{port}/", "variables": {"port": {"default": port}}}],
        "paths": {
            "/alerts": {
                "get": {"operationId": "list_alerts", "responses": {"204": {"description": "ok"}}}
            }
        },
    }
    (tmp_path / "alerts.json").write_text(json.dumps(document))
    tool = load_remote_tool("alerts", tmp_path / "alerts.json", resolve_secret=lambda _: None)
    try:
        assert tool.base_url == api.url
        assert await tool.actions["list_alerts"].call({}) is None
        assert api.received[0].raw_path == "/alerts"
    finally:
        await tool.aclose()


def test_relative_spec_path_is_read_next_to_the_config_file() -> None:
    tool = load_remote_tool(
        "weather_api", Path("weather.yaml"), resolve_secret=lambda _: None, config_file=CONFIG_FILE
    )
    assert "get_weather" in tool.actions
    assert tool.base_url == "http://127.0.0.1:1"


# --- configuration errors ----------------------------------------------------------------------


def load(spec: str | Path, **options: Any) -> RemoteTool:
    path = spec if isinstance(spec, Path) else FIXTURES / spec
    settings: dict[str, Any] = {"resolve_secret": {"weather_key": SECRET}.get}
    settings.update(options)
    return load_remote_tool("weather_api", path, config_file=CONFIG_FILE, **settings)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("missing.yaml", "missing.yaml: file not found"),
        ("bad_operation_id.yaml", "GET /weather/{city}: operationId 'get-weather' is not a valid"),
        ("bad_ref.yaml", "GET /weather: $ref '#/components/parameters/Missing' points to nothing"),
        ("cyclic_ref.yaml", "GET /weather: $ref '#/components/parameters/A' refers back to itself"),
        ("no_paths.yaml", "the document declares no paths"),
        ("relative_server.yaml", "servers[0].url '/v1' is not an absolute http(s) URL"),
    ],
)
def test_bad_documents_name_the_config_file_and_key(spec: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(spec)
    error = caught.value
    assert error.file == CONFIG_FILE
    assert error.key == "tools.weather_api.openapi"
    assert expected in error.message
    assert str(error).startswith(f"{CONFIG_FILE}: tools.weather_api.openapi: {FIXTURES}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("openapi: 3.0.3\npaths: [unclosed\n", "invalid YAML at line 3"),
        ("swagger: '2.0'\npaths: {}\n", "not an OpenAPI 3 document"),
        ("- just\n- a list\n", "the document is not a mapping"),
    ],
)
def test_unreadable_documents(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as caught:
        load(write(tmp_path, "spec.yaml", text))
    assert caught.value.key == "tools.weather_api.openapi"


def test_invalid_json_document(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid JSON at line 1") as caught:
        load(write(tmp_path, "spec.json", '{"openapi": "3.0.3",'))
    assert caught.value.file == CONFIG_FILE


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        ({"operationId": "class"}, "operationId 'class' is not a valid Python identifier"),
        ({"summary": "no id"}, "GET /things: the operation has no operationId"),
        (
            {"operationId": "find", "parameters": [{"$ref": "other.yaml#/Thing"}]},
            "$ref 'other.yaml#/Thing' is not a local reference",
        ),
        (
            {
                "operationId": "upload",
                "requestBody": {"content": {"multipart/form-data": {"schema": {}}}},
            },
            "requestBody media types ['multipart/form-data'] are not supported",
        ),
        (
            {"operationId": "find", "parameters": [{"name": "requestBody", "in": "query"}]},
            "parameter 'requestBody' (query) clashes",
        ),
    ],
)
def test_bad_operations(tmp_path: Path, operation: dict[str, Any], expected: str) -> None:
    document = {
        "openapi": "3.0.3",
        "servers": [{"url": "http://127.0.0.1:1"}],
        "paths": {"/things": {"get": operation}},
    }
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path, "spec.json", json.dumps(document)))
    assert expected in caught.value.message
    assert caught.value.key == "tools.weather_api.openapi"


def test_duplicate_operation_ids(tmp_path: Path) -> None:
    operation = {"operationId": "find", "responses": {}}
    document = {
        "openapi": "3.0.3",
        "servers": [{"url": "http://127.0.0.1:1"}],
        "paths": {"/a": {"get": operation}, "/b": {"post": operation}},
    }
    with pytest.raises(ConfigError, match="POST /b: operationId 'find' is already used by GET /a"):
        load(write(tmp_path, "spec.json", json.dumps(document)))


def test_undeclared_path_parameter(tmp_path: Path) -> None:
    document = {
        "openapi": "3.0.3",
        "servers": [{"url": "http://127.0.0.1:1"}],
        "paths": {"/things/{id}": {"get": {"operationId": "get_thing"}}},
    }
    with pytest.raises(ConfigError, match=r"path parameter \{id\} is not declared"):
        load(write(tmp_path, "spec.json", json.dumps(document)))


def test_unknown_secret_in_a_header_names_header_and_secret_only() -> None:
    headers = {"X-Key": "{{secret:weather_key}}:{{ secret:wether_key }}"}
    with pytest.raises(ConfigError) as caught:
        load("weather.yaml", headers=headers)
    error = caught.value
    assert error.file == CONFIG_FILE
    assert error.key == "tools.weather_api.headers.X-Key"
    assert error.message == "header 'X-Key' refers to secret 'wether_key', which does not exist"
    assert SECRET not in str(error)


@pytest.mark.parametrize(
    ("options", "key", "expected"),
    [
        ({"base_url": "127.0.0.1:9000"}, "tools.weather_api.base_url", "not an absolute http"),
        ({"timeout_s": 0}, "tools.weather_api.timeout_s", "positive number of seconds"),
        ({"headers": {"Bad Header": "x"}}, "tools.weather_api.headers", "not a valid HTTP header"),
        (
            {"headers": {"X-Key": "a\nb"}},
            "tools.weather_api.headers.X-Key",
            "characters not allowed",
        ),
    ],
)
def test_bad_tool_settings(options: dict[str, Any], key: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as caught:
        load("weather.yaml", **options)
    assert caught.value.key == key
    assert caught.value.file == CONFIG_FILE


def test_errors_fall_back_to_the_spec_file_without_a_config_file() -> None:
    resolve: Callable[[str], str | None] = lambda _: None  # noqa: E731
    with pytest.raises(ConfigError) as caught:
        load_remote_tool("weather_api", FIXTURES / "bad_ref.yaml", resolve_secret=resolve)
    assert caught.value.file == str(FIXTURES / "bad_ref.yaml")
