"""The shape of parsed JSON, for values whose keys the code does not know in advance.

Where the code knows a document's keys it declares a model or a TypedDict; `JSONValue` is for
what is only parsed and passed on (a tool's raw file, a request's `extra_body`, a load spec as
another tool wrote it). A reader narrows it with `isinstance` before use, so a wrong guess about
a file's shape is a checked branch, not an attribute error deep in a report.

mypy reads the plain recursive alias; at run time the alias is a `TypeAliasType`, the form
pydantic can validate as a field type (a plain recursive alias makes it recurse forever).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, Union

if TYPE_CHECKING:
    JSONValue: TypeAlias = Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]]
    JSONObject: TypeAlias = dict[str, JSONValue]
else:
    from typing_extensions import TypeAliasType

    JSONValue = TypeAliasType("JSONValue", Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]])
    JSONObject = TypeAliasType("JSONObject", dict[str, JSONValue])
