"""What one request carries beyond its prompt when feature workloads are on, and how it goes on the wire.

A `RequestFeatures` is decided once per request, before the load starts (`assign.assign_features`),
and travels with the turn to the worker that sends it: the body fields it adds, and the names a
check needs afterwards (the response schema, the offered tools) copied onto the request's record.
Fields the user set with `--extra-body` win over what a feature would add.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.bench.features.catalogue import response_format, tool_definition
from vlmserve.json_types import JSONObject
from vlmserve.results.records import RequestRecord

FEATURE_NAMES: tuple[str, ...] = ("tools", "structured", "thinking")
"""The feature workloads, in the order they are reported."""

TOOL_CHOICES: tuple[str, ...] = ("named", "required", "auto")

FIXED_ANSWER_FEATURES = frozenset({"tools", "structured"})
"""Features whose answer ends when its JSON is complete: `ignore_eos` is not sent with them (it would
ask for tokens past the end of the JSON; the sim engine refuses the pair, vLLM pads the answer)."""


@dataclass(frozen=True)
class RequestFeatures:
    """The features of one request: which, and with which schema or tools."""

    names: tuple[str, ...]
    response_schema: str | None = None
    offered_tools: tuple[str, ...] = ()
    tool_choice: str | None = None
    named_tool: str | None = None

    @property
    def keeps_answer(self) -> bool:
        """The answer text must come back from the worker (it is checked against a schema)."""
        return "structured" in self.names

    def body_fields(self) -> JSONObject:
        """The request body fields these features add."""
        fields: JSONObject = {}
        if self.response_schema is not None:
            fields["response_format"] = response_format(self.response_schema)
        if self.offered_tools:
            fields["tools"] = [tool_definition(name) for name in self.offered_tools]
            if self.tool_choice == "named":
                fields["tool_choice"] = {"type": "function", "function": {"name": self.named_tool}}
            else:
                fields["tool_choice"] = self.tool_choice
        return fields

    def apply(self, body: JSONObject, user_fields: JSONObject) -> None:
        """Add the feature fields to `body` in place; a field in `user_fields` (--extra-body) is left as the user set it."""
        for key, value in self.body_fields().items():
            if key not in user_fields:
                body[key] = value
        if "thinking" in self.names:
            given = body.get("chat_template_kwargs")
            kwargs: JSONObject = dict(given) if isinstance(given, dict) else {}
            kwargs.setdefault("enable_thinking", True)
            body["chat_template_kwargs"] = kwargs
        if FIXED_ANSWER_FEATURES.intersection(self.names) and "ignore_eos" not in user_fields:
            body.pop("ignore_eos", None)

    def mark(self, record: RequestRecord) -> None:
        """Copy what a later check needs onto the request's record."""
        record.features = list(self.names)
        record.response_schema = self.response_schema
        record.offered_tools = list(self.offered_tools) or None
        record.tool_choice = self.tool_choice
        record.named_tool = self.named_tool
