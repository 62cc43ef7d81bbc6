"""Minimal valid values for a JSON Schema, for the sim engine's tool calls and structured output.

A real engine constrains decoding to the schema (vLLM's structured outputs); the sim engine
has no model, so it writes the smallest deterministic instance it can derive: required
properties (and the optional ones, up to maxProperties), the first enum or const value,
numbers at their lower bound, strings of filler letters at their minimum length, arrays of
minItems elements. Equal schemas give equal values, so answers are reproducible.

The keywords it cannot honour (`pattern`, `not`, `if`/`then`, `patternProperties`,
`dependentSchemas`, remote `$ref`s) and schemas that are malformed or unsatisfiable (an
unknown type, minimum above maximum, an empty enum) raise SchemaError: the engine answers
400 rather than produce JSON that would not validate. No third-party validator at run time:
the checks here are the ones needed to guarantee the generated value is valid.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vlmserve.json_types import JSONObject, JSONValue

MAX_DEPTH = 32
"""Deepest nesting (including $ref hops) followed; deeper is a recursive schema → 400."""

_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_UNSUPPORTED = ("pattern", "not", "if", "then", "else", "patternProperties", "dependentSchemas", "dependencies",
                "contains", "uniqueItems", "propertyNames", "unevaluatedProperties")  # fmt: skip
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "a@example.com",
    "uri": "https://example.com",
    "url": "https://example.com",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "ipv4": "127.0.0.1",
    "hostname": "example.com",
}
_FILLER = "abcdefghij"


class SchemaError(ValueError):
    """The schema is malformed, unsatisfiable, or uses a keyword the sim engine cannot honour."""


def minimal_value(schema: JSONValue) -> JSONValue:
    """The smallest deterministic instance of `schema`; raises SchemaError if there is none we can make."""
    return _Generator(schema).value(schema, "#", 0)


class _Generator:
    """Walks one schema (kept as the root `$ref`s resolve against), building its minimal instance."""

    def __init__(self, root: JSONValue) -> None:
        self.root = root

    def value(self, schema: JSONValue, where: str, depth: int) -> JSONValue:
        """The minimal instance of the sub-schema at `where`: keywords that pick a value first, then its type."""
        if depth > MAX_DEPTH:
            raise SchemaError(f"the schema at {where} nests deeper than {MAX_DEPTH} levels (a recursive $ref?)")
        if schema is True or schema == {}:
            return None if depth else {}
        if schema is False:
            raise SchemaError(f"the schema at {where} is `false`: no value satisfies it")
        if not isinstance(schema, dict):
            raise SchemaError(f"the schema at {where} must be an object or a boolean, got {type(schema).__name__}")
        _refuse_unsupported(schema, where)
        for keyword, rule in _KEYWORD_RULES:  # the first one present decides
            if keyword in schema:
                return rule(self, schema, where, depth)
        return _TYPE_RULES[self._type(schema, where)](self, schema, where, depth)

    def _ref(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        """`$ref`: the value of the local schema it points at (a hop counts as a level)."""
        ref = schema["$ref"]
        return self.value(self._resolve(ref, where), str(ref), depth + 1)

    def _const(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        """`const`: the one value allowed."""
        return schema["const"]

    def _enum(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        """`enum`: its first value."""
        enum = schema["enum"]
        if not isinstance(enum, list) or not enum:
            raise SchemaError(f"'enum' at {where} must be a non-empty list")
        return enum[0]

    def _any_of(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        """`anyOf`: the first option's value (it satisfies the union)."""
        return self._first_option(schema, "anyOf", where, depth)

    def _one_of(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        """`oneOf` with one option only: with several, its value might match more than one."""
        return self._first_option(schema, "oneOf", where, depth)

    def _first_option(self, schema: JSONObject, keyword: str, where: str, depth: int) -> JSONValue:
        """The value of the first schema listed under `keyword` (anyOf or oneOf), the list checked."""
        options = schema[keyword]
        if not isinstance(options, list) or not options:
            raise SchemaError(f"'{keyword}' at {where} must be a non-empty list of schemas")
        if keyword == "oneOf" and len(options) > 1:
            raise SchemaError(f"'oneOf' with several schemas at {where} is not supported by the sim engine")
        return self.value(options[0], f"{where}/{keyword}/0", depth + 1)

    def _all_of(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        """`allOf` with exactly one schema (intersecting several is not modelled)."""
        parts = schema["allOf"]
        if not isinstance(parts, list) or len(parts) != 1:
            raise SchemaError(f"'allOf' at {where} is supported with exactly one schema")
        return self.value(parts[0], f"{where}/allOf/0", depth + 1)

    # The type rules share the keyword rules' signature so `_TYPE_RULES` can dispatch on the type name.
    def _string_value(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        return _string(schema, where)

    def _integer_value(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        return _number(schema, where, integer=True)

    def _number_value(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        return _number(schema, where, integer=False)

    def _boolean_value(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        return False

    def _null_value(self, schema: JSONObject, where: str, depth: int) -> JSONValue:
        return None

    def _type(self, schema: JSONObject, where: str) -> str:
        declared = schema.get("type")
        if declared is None:
            if "properties" in schema or "required" in schema:
                return "object"
            if "items" in schema:
                return "array"
            return (
                "null"
                if not schema.keys()
                - {"description", "title", "default", "examples", "$schema", "$defs", "definitions", "additionalProperties"}
                else "object"
            )
        names = declared if isinstance(declared, list) else [declared]
        if not names or any(name not in _TYPES for name in names):
            raise SchemaError(f"'type' at {where} must be one of {', '.join(_TYPES)} (or a list of them), got {declared!r}")
        return str(names[0])

    def _resolve(self, ref: JSONValue, where: str) -> JSONValue:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"'$ref' at {where} must be a local reference ('#/$defs/...'), got {ref!r}")
        node: JSONValue = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaError(f"'$ref' {ref!r} at {where} points at nothing in the schema")
            node = node[part]
        return node

    def _object(self, schema: JSONObject, where: str, depth: int) -> JSONObject:
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise SchemaError(f"'properties' at {where} must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise SchemaError(f"'required' at {where} must be a list of property names")
        additional = schema.get("additionalProperties", True)
        max_properties = _count(schema, "maxProperties", where)
        min_properties = _count(schema, "minProperties", where) or 0
        names = [name for name in dict.fromkeys(required) if isinstance(name, str)]  # all are (checked above)
        if max_properties is not None and len(names) > max_properties:
            raise SchemaError(f"the schema at {where} requires {len(names)} properties but allows at most {max_properties}")
        optional = [name for name in properties if name not in names]
        names += optional[: max(0, min_properties - len(names))]
        result: JSONObject = {}
        for name in names:
            if name in properties:
                sub = properties[name]
            elif additional is False:
                raise SchemaError(f"property '{name}' at {where} is required but not allowed (additionalProperties: false)")
            else:
                sub = additional if isinstance(additional, dict) else {"type": "string"}
            result[name] = self.value(sub, f"{where}/properties/{name}", depth + 1)
        if len(result) < min_properties:
            raise SchemaError(f"the schema at {where} needs {min_properties} properties; the sim engine cannot invent them")
        return result

    def _array(self, schema: JSONObject, where: str, depth: int) -> list[JSONValue]:
        min_items = _count(schema, "minItems", where) or 0
        max_items = _count(schema, "maxItems", where)
        if max_items is not None and min_items > max_items:
            raise SchemaError(f"minItems={min_items} is above maxItems={max_items} at {where}")
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise SchemaError(f"'prefixItems' at {where} must be a list of schemas")
        items = schema.get("items", {})
        result = [self.value(sub, f"{where}/prefixItems/{i}", depth + 1) for i, sub in enumerate(prefix[:min_items])]
        for _ in range(len(result), min_items):
            result.append(self.value(items, f"{where}/items", depth + 1) if items != {} else "")
        return result


_Rule = Callable[[_Generator, JSONObject, str, int], JSONValue]
"""How one keyword or type turns a sub-schema into its value."""

_KEYWORD_RULES: tuple[tuple[str, _Rule], ...] = (
    ("$ref", _Generator._ref),
    ("const", _Generator._const),
    ("enum", _Generator._enum),
    ("anyOf", _Generator._any_of),
    ("oneOf", _Generator._one_of),
    ("allOf", _Generator._all_of),
)
"""Keywords that decide the value before the type does, in the order they are looked for."""

_TYPE_RULES: dict[str, _Rule] = {
    "object": _Generator._object,
    "array": _Generator._array,
    "string": _Generator._string_value,
    "integer": _Generator._integer_value,
    "number": _Generator._number_value,
    "boolean": _Generator._boolean_value,
    "null": _Generator._null_value,
}
"""The value of each JSON type (one entry per name in _TYPES)."""


def _refuse_unsupported(schema: JSONObject, where: str) -> None:
    """A keyword we cannot honour is a 400: ignoring it could produce JSON that does not validate."""
    for keyword in _UNSUPPORTED:
        if keyword in schema:
            raise SchemaError(f"the schema at {where} uses '{keyword}', which the sim engine cannot honour")


def _count(schema: JSONObject, name: str, where: str) -> int | None:
    value = schema.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"'{name}' at {where} must be a non-negative integer")
    return value


def _string(schema: JSONObject, where: str) -> str:
    low = _count(schema, "minLength", where) or 0
    high = _count(schema, "maxLength", where)
    if high is not None and low > high:
        raise SchemaError(f"minLength={low} is above maxLength={high} at {where}")
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        text = _FORMATS[fmt]
        if len(text) >= low and (high is None or len(text) <= high):
            return text
    length = max(low, min(3, high if high is not None else 3))
    return (_FILLER * (length // len(_FILLER) + 1))[:length]


def _number(schema: JSONObject, where: str, integer: bool) -> int | float:
    bounds: dict[str, float] = {}
    for name in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        value = schema.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SchemaError(f"'{name}' at {where} must be a number")
        bounds[name] = value
    step = bounds.get("multipleOf")
    if step is not None and step <= 0:
        raise SchemaError(f"'multipleOf' at {where} must be positive")
    if integer:
        step = step if step is not None else 1
    low = bounds.get("minimum")
    if "exclusiveMinimum" in bounds:
        low = bounds["exclusiveMinimum"] if low is None else max(low, bounds["exclusiveMinimum"])
    high = bounds.get("maximum")
    if "exclusiveMaximum" in bounds:
        high = bounds["exclusiveMaximum"] if high is None else min(high, bounds["exclusiveMaximum"])
    start = low if low is not None else (min(0, high) if high is not None else 0)
    if step is not None:
        candidate: float = math.ceil(start / step) * step
        if "exclusiveMinimum" in bounds and candidate <= bounds["exclusiveMinimum"]:
            candidate += step
        candidate = round(candidate, 12)
    else:
        candidate = start
        if "exclusiveMinimum" in bounds and candidate <= bounds["exclusiveMinimum"]:
            gap = (high - candidate) if high is not None else 2.0
            candidate = candidate + min(1.0, gap / 2)
    if high is not None and (candidate > high or ("exclusiveMaximum" in bounds and candidate >= bounds["exclusiveMaximum"])):
        raise SchemaError(f"no {'integer' if integer else 'number'} satisfies the bounds at {where}")
    if integer or (isinstance(candidate, float) and candidate.is_integer() and step is not None and float(step).is_integer()):
        return int(candidate)
    return candidate
