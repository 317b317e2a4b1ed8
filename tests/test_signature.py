"""Tests for voice_agent.runtime.signature: tool schemas from functions and argument binding."""

from __future__ import annotations

import enum
import importlib.util
import socket
import sys
import textwrap
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from voice_agent.errors import ConfigError, ToolError
from voice_agent.runtime import signature
from voice_agent.runtime.signature import FunctionSpec, bind_arguments, describe_function

# --- types an operator might use -------------------------------------------------------------


class Seating(enum.Enum):
    INDOOR = "indoor"
    TERRACE = "terrace"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Guest(BaseModel):
    """One person in the booking."""

    name: str
    age: int | None = Field(default=None, description="Age in years, if known.")


class Node(BaseModel):
    label: str
    children: list[Node] = []


class Address(typing.TypedDict, total=False):
    """A postal address."""

    street: str
    city: typing.Required[str]


# --- operator-style agent functions ----------------------------------------------------------


def what_is_my_name() -> str:
    """Tell the caller the name we have on file."""
    return "Ada"


def update_phone(new_phone: str) -> None:
    """Change the phone number on the caller's account.

    Use this only after the caller has confirmed the new number.

    Args:
        new_phone: The new number, digits only.

    Returns:
        Nothing.
    """


def book_table(party_size: int, when: str, seating: Literal["indoor", "terrace"] = "indoor") -> str:
    """Book a table.

    Args:
        party_size: How many people.
        when: Date and time, as the caller said it.
        seating: Where to sit.
    """
    return "booked"


def choose_seating(seating: Seating, priority: Priority = Priority.LOW) -> str:
    """Pick where to seat the party."""
    return seating.value


def collections_tool(
    tags: list[str],
    scores: dict[str, float],
    note: str | None = None,
    limit: Optional[int] = 10,  # noqa: UP045 - Optional is what this test is about
    flags: list[bool] | None = None,
) -> None:
    """Exercise containers."""


def register_guests(guests: list[Guest], lead: Guest | None = None) -> int:
    """Register guests."""
    return len(guests)


def numpy_style(city: str, days: int = 3) -> str:
    """Forecast the weather.

    Looks the city up in the forecast service.

    Parameters
    ----------
    city : str
        City name.
    days : int, optional
        How many days ahead.

    Returns
    -------
    str
        The forecast.
    """
    return ""


def rest_style(city: str, days: int = 3) -> str:
    """Forecast the weather.

    :param city: City name.
    :param days: How many days ahead.
    :returns: The forecast.
    """
    return ""


async def lookup_order(order_id: str) -> str:
    """Find an order."""
    return order_id


def no_docstring(x: int) -> int:
    return x


def walk_schemas(node: Any) -> Iterator[dict[str, Any]]:
    """Yield every schema object in a JSON schema, skipping data such as defaults and enums."""
    if not isinstance(node, dict):
        return
    yield node
    for key, value in node.items():
        if key in ("properties", "$defs") and isinstance(value, dict):
            for sub in value.values():
                yield from walk_schemas(sub)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            for sub in value:
                yield from walk_schemas(sub)
        elif key in ("items", "additionalProperties"):
            yield from walk_schemas(value)


# --- schemas ---------------------------------------------------------------------------------


def test_function_without_parameters() -> None:
    spec = describe_function(what_is_my_name)
    assert spec == FunctionSpec(
        name="what_is_my_name",
        description="Tell the caller the name we have on file.",
        parameters={
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
        },
        is_async=False,
    )
    assert spec.tool_schema() == {
        "type": "function",
        "function": {
            "name": "what_is_my_name",
            "description": "Tell the caller the name we have on file.",
            "parameters": {
                "type": "object",
                "properties": {},
                "required": [],
                "additionalProperties": False,
            },
        },
    }


def test_google_docstring() -> None:
    assert describe_function(update_phone).tool_schema() == {
        "type": "function",
        "function": {
            "name": "update_phone",
            "description": (
                "Change the phone number on the caller's account.\n\n"
                "Use this only after the caller has confirmed the new number."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "new_phone": {"type": "string", "description": "The new number, digits only."}
                },
                "required": ["new_phone"],
                "additionalProperties": False,
            },
        },
    }


def test_literal_with_default() -> None:
    spec = describe_function(book_table)
    assert spec.description == "Book a table."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "party_size": {"type": "integer", "description": "How many people."},
            "when": {"type": "string", "description": "Date and time, as the caller said it."},
            "seating": {
                "type": "string",
                "enum": ["indoor", "terrace"],
                "default": "indoor",
                "description": "Where to sit.",
            },
        },
        "required": ["party_size", "when"],
        "additionalProperties": False,
    }


def test_enums_are_inlined_with_their_values() -> None:
    spec = describe_function(choose_seating)
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "seating": {"type": "string", "enum": ["indoor", "terrace"]},
            "priority": {"type": "integer", "enum": [1, 2], "default": 1},
        },
        "required": ["seating"],
        "additionalProperties": False,
    }


def test_containers_and_optional() -> None:
    spec = describe_function(collections_tool)
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "object", "additionalProperties": {"type": "number"}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 10},
            "flags": {
                "anyOf": [{"type": "array", "items": {"type": "boolean"}}, {"type": "null"}],
                "default": None,
            },
        },
        "required": ["tags", "scores"],
        "additionalProperties": False,
    }


def test_pydantic_model_is_inlined_without_titles() -> None:
    spec = describe_function(register_guests)
    guest = {
        "type": "object",
        "description": "One person in the booking.",
        "properties": {
            "name": {"type": "string"},
            "age": {
                "anyOf": [{"type": "integer"}, {"type": "null"}],
                "default": None,
                "description": "Age in years, if known.",
            },
        },
        "required": ["name"],
    }
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "guests": {"type": "array", "items": guest},
            "lead": {"anyOf": [guest, {"type": "null"}], "default": None},
        },
        "required": ["guests"],
        "additionalProperties": False,
    }
    assert all("title" not in node for node in walk_schemas(spec.parameters))
    assert "$ref" not in str(spec.parameters)


def test_docstring_describes_a_model_parameter() -> None:
    def seat(lead: Guest) -> None:
        """Seat the party.

        Args:
            lead: Who made the booking.
        """

    lead = describe_function(seat).parameters["properties"]["lead"]
    assert lead["description"] == "Who made the booking."
    assert lead["required"] == ["name"]


def test_recursive_model_keeps_its_definition() -> None:
    def plan(tree: Node) -> None:
        """Plan a tree."""

    params = describe_function(plan).parameters
    node = params["$defs"]["Node"]
    assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert params["properties"]["tree"]["properties"]["label"] == {"type": "string"}
    assert all("title" not in schema for schema in walk_schemas(params))


def test_typing_typeddict_is_supported() -> None:
    def ship(to: Address) -> None:
        """Ship a parcel."""

    params = describe_function(ship).parameters
    address = params["properties"]["to"]
    assert address["description"] == "A postal address."
    assert address["properties"] == {"street": {"type": "string"}, "city": {"type": "string"}}
    assert address["required"] == ["city"]
    assert bind_arguments(ship, {"to": {"city": "Lyon"}}) == {"to": {"city": "Lyon"}}
    with pytest.raises(ToolError, match=r"'to\.city': Field required"):
        bind_arguments(ship, {"to": {"street": "Rue X"}})

    def ship_many(to: list[Address] | None = None, by: dict[str, Address] | None = None) -> None:
        pass

    params = describe_function(ship_many).parameters
    assert params["properties"]["to"]["anyOf"][0]["items"]["required"] == ["city"]
    bound = bind_arguments(ship_many, {"to": [{"city": "Oslo"}], "by": {"x": {"city": "Rome"}}})
    assert bound == {"to": [{"city": "Oslo"}], "by": {"x": {"city": "Rome"}}}


@pytest.mark.parametrize("fn", [numpy_style, rest_style])
def test_numpy_and_rest_docstrings(fn: Any) -> None:
    spec = describe_function(fn)
    assert spec.description.startswith("Forecast the weather.")
    assert "Parameters" not in spec.description
    assert ":param" not in spec.description
    assert "Returns" not in spec.description
    assert spec.parameters["properties"] == {
        "city": {"type": "string", "description": "City name."},
        "days": {"type": "integer", "default": 3, "description": "How many days ahead."},
    }
    assert spec.parameters["required"] == ["city"]


def test_numpy_long_description_is_kept() -> None:
    assert describe_function(numpy_style).description == (
        "Forecast the weather.\n\nLooks the city up in the forecast service."
    )


def test_no_docstring_gives_empty_description() -> None:
    spec = describe_function(no_docstring)
    assert spec.description == ""
    assert spec.parameters["properties"] == {"x": {"type": "integer"}}


def test_async_function() -> None:
    assert describe_function(lookup_order).is_async is True
    assert describe_function(book_table).is_async is False


def test_async_callable_object() -> None:
    class Lookup:
        async def __call__(self, order_id: str) -> str:
            return order_id

    assert describe_function(Lookup(), name="lookup", file="agent.py").is_async is True


def test_name_override_and_explicit_field_description() -> None:
    def tip(amount: Annotated[float, Field(description="From the Field.", ge=0)]) -> None:
        """Leave a tip.

        Args:
            amount: From the docstring.
        """

    spec = describe_function(tip, name="leave_tip")
    assert spec.name == "leave_tip"
    assert spec.parameters["properties"]["amount"] == {
        "type": "number",
        "minimum": 0,
        "description": "From the Field.",
    }


def test_parameter_names_that_clash_with_pydantic_or_schema_keywords() -> None:
    def odd(title: str, json: int, model_config: bool = False, copy: str = "x") -> None:
        """Odd names.

        Args:
            title: A title.
        """

    spec = describe_function(odd)
    assert list(spec.parameters["properties"]) == ["title", "json", "model_config", "copy"]
    assert spec.parameters["properties"]["title"] == {"type": "string", "description": "A title."}
    assert bind_arguments(odd, {"title": "t", "json": "2"}) == {
        "title": "t",
        "json": 2,
        "model_config": False,
        "copy": "x",
    }


def test_tool_schema_is_a_copy() -> None:
    spec = describe_function(book_table)
    spec.tool_schema()["function"]["parameters"]["properties"].clear()
    assert "party_size" in spec.tool_schema()["function"]["parameters"]["properties"]
    spec.parameters["properties"].clear()
    assert "party_size" in describe_function(book_table).parameters["properties"]


FUTURE_MODULE = '''
from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Topping(BaseModel):
    name: str
    extra: bool = False


def order_pizza(size: Size, toppings: list[Topping], crust: Literal["thin", "thick"] = "thin",
                note: str | None = None) -> Receipt:
    """Order a pizza.

    Args:
        size: Pizza size.
    """
    return None


def broken(when: Unknown) -> None:
    """Cannot resolve its hint."""
'''


@pytest.fixture
def future_module(tmp_path: Path) -> Iterator[Any]:
    path = tmp_path / "pizza_agent.py"
    path.write_text(textwrap.dedent(FUTURE_MODULE))
    spec = importlib.util.spec_from_file_location("pizza_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pizza_agent"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["pizza_agent"]


def test_string_annotations_are_resolved(future_module: Any) -> None:
    # The return annotation "Receipt" is undefined: it is never needed, so it does no harm.
    spec = describe_function(future_module.order_pizza)
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "size": {"type": "string", "enum": ["small", "large"], "description": "Pizza size."},
            "toppings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "extra": {"type": "boolean", "default": False},
                    },
                    "required": ["name"],
                },
            },
            "crust": {"type": "string", "enum": ["thin", "thick"], "default": "thin"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["size", "toppings"],
        "additionalProperties": False,
    }
    bound = bind_arguments(
        future_module.order_pizza, {"size": "large", "toppings": [{"name": "basil"}]}
    )
    assert bound["size"] is future_module.Size.LARGE
    assert bound["toppings"] == [future_module.Topping(name="basil")]
    assert bound["crust"] == "thin"


def test_unresolvable_annotation(future_module: Any) -> None:
    file = future_module.__file__
    with pytest.raises(ConfigError) as info:
        describe_function(future_module.broken, file=file)
    err = info.value
    assert err.file == file
    assert err.key == "broken"
    assert str(err).startswith(f"{file}: broken: ")
    assert "'Unknown'" in err.message
    assert "'when'" in err.message


def test_file_defaults_to_the_defining_module(future_module: Any) -> None:
    with pytest.raises(ConfigError) as info:
        describe_function(future_module.broken)
    assert info.value.file == future_module.__file__


# --- unsupported signatures ------------------------------------------------------------------


def star_args(*names: str) -> None:
    pass


def star_kwargs(city: str, **extra: str) -> None:
    pass


def positional_only(city: str, /) -> None:
    pass


def no_hint(city) -> None:  # type: ignore[no-untyped-def]
    pass


def socket_param(conn: socket.socket) -> None:
    pass


def private_param(_secret: str) -> None:
    pass


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        (star_args, "*names is not supported"),
        (star_kwargs, "**extra is not supported"),
        (positional_only, "parameter 'city' is positional-only"),
        (no_hint, "parameter 'city' has no type hint"),
        (socket_param, "parameter 'conn' has type socket.socket, which cannot be described"),
        (private_param, "parameter '_secret' starts with '_'"),
    ],
)
def test_unsupported_signatures(fn: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        describe_function(fn, file="agents/restaurant.py")
    err = info.value
    assert err.file == "agents/restaurant.py"
    assert err.key == fn.__name__
    assert fragment in err.message
    assert str(err) == f"agents/restaurant.py: {fn.__name__}: {err.message}"


def test_unsupported_type_nested_in_a_container() -> None:
    def many(conns: list[socket.socket]) -> None:
        pass

    with pytest.raises(ConfigError, match=r"parameter 'conns' has type list\[socket\.socket\]"):
        describe_function(many, file="a.py")


def test_invalid_tool_name() -> None:
    with pytest.raises(ConfigError, match="tool name 'book table' must be") as info:
        describe_function(book_table, name="book table", file="a.py")
    assert info.value.key == "book table"


def test_bind_arguments_reports_config_errors_too() -> None:
    with pytest.raises(ConfigError, match=r"\*names"):
        bind_arguments(star_args, {})


# --- binding arguments -----------------------------------------------------------------------


def test_bind_coerces_and_fills_defaults() -> None:
    assert bind_arguments(book_table, {"party_size": "3", "when": "tonight at 8"}) == {
        "party_size": 3,
        "when": "tonight at 8",
        "seating": "indoor",
    }


def test_bind_numbers_for_strings() -> None:
    # LLMs often send phone numbers as JSON numbers.
    assert bind_arguments(update_phone, {"new_phone": 5551234}) == {"new_phone": "5551234"}


def test_bind_enum_and_models() -> None:
    assert bind_arguments(choose_seating, {"seating": "terrace", "priority": "2"}) == {
        "seating": Seating.TERRACE,
        "priority": Priority.HIGH,
    }
    bound = bind_arguments(
        register_guests, {"guests": [{"name": "Ada", "age": "36"}], "lead": {"name": "Bob"}}
    )
    assert bound == {"guests": [Guest(name="Ada", age=36)], "lead": Guest(name="Bob")}
    assert isinstance(bound["lead"], Guest)


def test_bind_containers() -> None:
    bound = bind_arguments(collections_tool, {"tags": ["a"], "scores": {"x": "1.5"}, "limit": None})
    assert bound == {
        "tags": ["a"],
        "scores": {"x": 1.5},
        "note": None,
        "limit": None,
        "flags": None,
    }


def test_mutable_defaults_are_not_shared() -> None:
    def remember(items: list[str] = []) -> None:  # noqa: B006 - the point of the test
        pass

    first = bind_arguments(remember, {})
    first["items"].append("x")
    assert bind_arguments(remember, {}) == {"items": []}


def test_bind_missing_argument() -> None:
    with pytest.raises(ToolError) as info:
        bind_arguments(book_table, {"when": "tonight"})
    assert info.value.message == "Invalid arguments: missing required argument 'party_size'"


def test_bind_several_missing_arguments() -> None:
    with pytest.raises(ToolError, match="missing required arguments 'party_size', 'when'"):
        bind_arguments(book_table, {})


def test_bind_unknown_argument() -> None:
    with pytest.raises(ToolError) as info:
        bind_arguments(book_table, {"party_size": 2, "when": "now", "table": 4})
    assert info.value.message == (
        "Invalid arguments: unknown argument 'table' "
        "(expected only 'party_size', 'when', 'seating')"
    )


def test_bind_unknown_argument_to_a_function_without_parameters() -> None:
    with pytest.raises(ToolError, match=r"unknown argument 'name' \(it takes no arguments\)"):
        bind_arguments(what_is_my_name, {"name": "x"})


def test_bind_wrong_types() -> None:
    with pytest.raises(ToolError) as info:
        bind_arguments(book_table, {"party_size": "four", "when": "now", "seating": "patio"})
    assert info.value.message == (
        "Invalid arguments: argument 'party_size': Input should be a valid integer, "
        "unable to parse string as an integer (got 'four'); "
        "argument 'seating': Input should be 'indoor' or 'terrace' (got 'patio')"
    )


def test_bind_enum_error_names_the_values() -> None:
    with pytest.raises(ToolError, match=r"argument 'seating': Input should be 'indoor' or"):
        bind_arguments(choose_seating, {"seating": "garden"})


def test_bind_nested_error_paths() -> None:
    with pytest.raises(ToolError) as info:
        bind_arguments(register_guests, {"guests": [{"name": "Ada"}, {"age": "old"}]})
    message = info.value.message
    assert "argument 'guests[1].name': Field required" in message
    assert "argument 'guests[1].age': Input should be a valid integer" in message
    assert "(got 'old')" in message


def test_bind_union_error_has_no_pydantic_tags() -> None:
    def pick(value: int | list[int]) -> None:
        pass

    with pytest.raises(ToolError) as info:
        bind_arguments(pick, {"value": "abc"})
    assert info.value.message == (
        "Invalid arguments: argument 'value': Input should be a valid integer, unable to parse "
        "string as an integer or Input should be a valid list (got 'abc')"
    )


def test_bind_long_inputs_are_shortened() -> None:
    with pytest.raises(ToolError) as info:
        bind_arguments(book_table, {"party_size": "x" * 500, "when": "now"})
    assert len(info.value.message) < 200
    assert "...)" in info.value.message


def test_bind_rejects_non_object_arguments() -> None:
    with pytest.raises(ToolError, match="expected a JSON object"):
        bind_arguments(book_table, ["3", "now"])  # type: ignore[arg-type]


def test_bind_result_calls_the_function() -> None:
    assert book_table(**bind_arguments(book_table, {"party_size": 2, "when": "now"})) == "booked"


def test_validator_is_built_once_per_function(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh(city: str) -> str:
        return city

    calls = 0
    real = signature.create_model

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(signature, "create_model", counting)
    describe_function(fresh)
    for _ in range(3):
        bind_arguments(fresh, {"city": "Oslo"})
    assert calls == 1


class Reservations:
    def cancel(self, booking_id: int) -> str:
        """Cancel a booking."""
        return f"cancelled {booking_id}"


def test_bound_method() -> None:
    desk = Reservations()
    spec = describe_function(desk.cancel)
    assert spec.parameters["properties"] == {"booking_id": {"type": "integer"}}
    assert bind_arguments(desk.cancel, {"booking_id": "7"}) == {"booking_id": 7}
    assert bind_arguments(Reservations().cancel, {"booking_id": 8}) == {"booking_id": 8}
    # The unbound function takes an unannotated `self`: the bound method's entry must not hide it.
    with pytest.raises(ConfigError, match="parameter 'self' has no type hint"):
        describe_function(Reservations.cancel, file="a.py")
