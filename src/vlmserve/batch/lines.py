"""The OpenAI Batch input line: parse it into a request to send, or say why it cannot be sent.

Input:  {"custom_id", "method": "POST", "url": "/v1/chat/completions"|"/v1/completions"|"/v1/embeddings", "body"}

The output line (and the record of a malformed line) is built in `output.py`.

A line is malformed, and answered by an error record while the job goes on, when it is not
JSON, is over the batch-line bounds of `bounded_read` (bytes, nesting, values, integer
digits, non-finite numbers), or its custom_id is not valid Unicode (a lone surrogate escape
such as "\\ud800" cannot be written to the UTF-8 output, so the record names the line instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.bounded_read import BATCH_LINE, Refused, loads_json, too_long
from vlmserve.json_types import JSONObject

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MALFORMED = "malformed_line"


@dataclass(frozen=True)
class BatchRequest:
    """One sendable input line."""

    line_no: int
    custom_id: str
    url: str
    body: JSONObject


@dataclass(frozen=True)
class MalformedLine:
    """An input line that cannot be sent, and why."""

    line_no: int
    custom_id: str | None
    reason: str


def parse_line(raw: bytes | None, line_no: int) -> BatchRequest | MalformedLine | None:
    """Parse one input line (None: a line over the byte limit); None for a blank line (skipped, not an error)."""
    if raw is None:
        return MalformedLine(line_no, None, f"line {line_no}: {too_long(BATCH_LINE)}; send large images by URL")
    if not raw.strip():
        return None
    try:
        data = loads_json(raw, BATCH_LINE)
    except Refused as err:
        return MalformedLine(line_no, None, f"line {line_no}: {err}")
    except ValueError as err:
        return MalformedLine(line_no, None, f"line {line_no}: not valid JSON ({err})")
    if not isinstance(data, dict):
        return MalformedLine(line_no, None, f"line {line_no}: expected a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return MalformedLine(line_no, None, f"line {line_no}: 'custom_id' must be a non-empty string")
    try:
        custom_id.encode("utf-8")
    except UnicodeEncodeError:
        return MalformedLine(
            line_no,
            None,
            f"line {line_no}: 'custom_id' is not valid Unicode (it holds a lone "
            "surrogate escape such as \\ud800); use plain text ids",
        )
    problem = _request_problem(data)
    if problem:
        return MalformedLine(line_no, custom_id, f"line {line_no}: {problem}")
    return BatchRequest(line_no, custom_id, data["url"], data["body"])


def _request_problem(data: JSONObject) -> str | None:
    if data.get("method") != "POST":
        return "'method' must be \"POST\""
    if data.get("url") not in BATCH_URLS:
        return f"'url' must be one of {', '.join(BATCH_URLS)}"
    body = data.get("body")
    if not isinstance(body, dict):
        return "'body' must be a JSON object"
    if body.get("stream"):
        return "'body.stream' is not supported in a batch; remove it"
    return None
