"""The built-in tool schemas and response JSON schemas the feature workloads send.

Small on purpose and shaped like the products vlmserve is for (a dental clinic reading
radiographs, a tutoring app): every schema is closed (`additionalProperties: false`), bounds
its strings and arrays, and uses only keywords structured-output engines honour (types, enums,
numeric bounds, lengths), so a valid answer is short and an engine can constrain decoding to it.
Records name the schema they were sent with; these dicts are the one copy a check reads.
"""

from __future__ import annotations

from vlmserve.json_types import JSONObject

TOOLS: dict[str, JSONObject] = {
    "record_finding": {
        "description": "Record one finding on a dental radiograph.",
        "parameters": {
            "type": "object",
            "properties": {
                "tooth": {"type": "integer", "minimum": 1, "maximum": 32},
                "finding": {"enum": ["caries", "abscess", "bone_loss", "restoration", "none"]},
                "severity": {"enum": ["mild", "moderate", "severe"]},
            },
            "required": ["tooth", "finding", "severity"],
            "additionalProperties": False,
        },
    },
    "schedule_visit": {
        "description": "Book the patient's next visit.",
        "parameters": {
            "type": "object",
            "properties": {
                "days_from_now": {"type": "integer", "minimum": 0, "maximum": 60},
                "reason": {"enum": ["checkup", "filling", "extraction", "cleaning"]},
                "urgent": {"type": "boolean"},
            },
            "required": ["days_from_now", "reason", "urgent"],
            "additionalProperties": False,
        },
    },
    "check_answer": {
        "description": "Check a student's numeric answer to a homework question.",
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "integer", "minimum": 1, "maximum": 50}, "answer": {"type": "number"}},
            "required": ["question", "answer"],
            "additionalProperties": False,
        },
    },
    "lookup_term": {
        "description": "Look up a term in the course glossary.",
        "parameters": {
            "type": "object",
            "properties": {
                "term": {"type": "string", "minLength": 1, "maxLength": 24},
                "level": {"enum": ["primary", "secondary", "university"]},
            },
            "required": ["term", "level"],
            "additionalProperties": False,
        },
    },
}
"""Tool name → description and parameters (a JSON Schema object)."""

RESPONSE_SCHEMAS: dict[str, JSONObject] = {
    "radiograph_finding": {
        "type": "object",
        "properties": {
            "tooth": {"type": "integer", "minimum": 1, "maximum": 32},
            "finding": {"enum": ["caries", "abscess", "bone_loss", "restoration", "none"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "followup": {"type": "boolean"},
        },
        "required": ["tooth", "finding", "confidence", "followup"],
        "additionalProperties": False,
    },
    "homework_answer": {
        "type": "object",
        "properties": {
            "question": {"type": "integer", "minimum": 1, "maximum": 50},
            "answer": {"type": "string", "minLength": 1, "maxLength": 32},
            "correct": {"type": "boolean"},
        },
        "required": ["question", "answer", "correct"],
        "additionalProperties": False,
    },
    "image_labels": {
        "type": "object",
        "properties": {
            "labels": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {"enum": ["tooth", "filling", "crown", "implant", "text", "diagram"]},
            },
            "count": {"type": "integer", "minimum": 0, "maximum": 20},
        },
        "required": ["labels", "count"],
        "additionalProperties": False,
    },
}
"""Response schema name → JSON Schema (sent as response_format json_schema, strict)."""

OFFERED_TOOLS_PER_REQUEST = 2
"""How many catalogue tools each tools request offers (the named one among them)."""


def tool_definition(name: str) -> JSONObject:
    """The OpenAI `tools` entry for one catalogue tool, marked `strict` (arguments must follow the schema).

    Without `strict`, vLLM (0.32) constrains only the call's envelope (the tool name), not its arguments,
    unless the server runs with `--tool-strict-level parameter`; products that rely on the arguments set it.
    """
    tool = TOOLS[name]
    return {
        "type": "function",
        "function": {"name": name, "description": tool["description"], "parameters": tool["parameters"], "strict": True},
    }


def response_format(name: str) -> JSONObject:
    """The OpenAI `response_format` asking for one catalogue schema."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": RESPONSE_SCHEMAS[name], "strict": True}}
