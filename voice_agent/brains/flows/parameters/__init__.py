"""Typed parameter extraction from spoken or typed utterances for the flow brain's NLU:
numbers, digit strings, phone numbers, dates, times, enums, yes/no answers and names.

The package's modules, in the order each uses the ones before: specs.py (types and specs),
words.py (normalisation, word lists), analysis.py (an utterance's words and numbers, digit
strings), dates_times.py, values.py (enums, yes/no, names, quantities), extract.py (the API)."""

from __future__ import annotations

from voice_agent.brains.flows.parameters.extract import (
    annotate,
    extract_parameters,
    extract_spans,
    parse_date,
    parse_datetime,
    parse_digits,
    parse_enum,
    parse_integer,
    parse_name,
    parse_number,
    parse_phone,
    parse_time,
    parse_yes_no,
)
from voice_agent.brains.flows.parameters.specs import (
    PARAM_TYPES,
    Annotation,
    EntitySpec,
    Extracted,
    ParameterSpec,
    ParamType,
)
from voice_agent.brains.flows.parameters.words import normalise

__all__ = [
    "PARAM_TYPES",
    "Annotation",
    "EntitySpec",
    "Extracted",
    "ParamType",
    "ParameterSpec",
    "annotate",
    "extract_parameters",
    "extract_spans",
    "normalise",
    "parse_date",
    "parse_datetime",
    "parse_digits",
    "parse_enum",
    "parse_integer",
    "parse_name",
    "parse_number",
    "parse_phone",
    "parse_time",
    "parse_yes_no",
]
