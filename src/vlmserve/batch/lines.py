"""The OpenAI Batch line formats: parse an input line, build an output line.

Input:  {"custom_id", "method": "POST", "url": "/v1/chat/completions"|"/v1/completions"|"/v1/embeddings", "body"}
Output: {"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error": {...} | null}

A line that cannot be sent is not fatal: it becomes an output line whose error has code
`malformed_line` and the input line number (`error.line`), so a rerun recognises it as
answered even when it had no usable custom_id.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MALFORMED = "malformed_line"


@dataclass(frozen=True)
class BatchRequest:
    """One sendable input line."""

    line_no: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class MalformedLine:
    """An input line that cannot be sent, and why."""

    line_no: int
    custom_id: str | None
    reason: str


def parse_line(raw: bytes, line_no: int) -> BatchRequest | MalformedLine | None:
    """Parse one input line; None for a blank line (skipped, not an error)."""
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError as err:
        return MalformedLine(line_no, None, f"line {line_no}: not valid JSON ({err})")
    if not isinstance(data, dict):
        return MalformedLine(line_no, None, f"line {line_no}: expected a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return MalformedLine(line_no, None, f"line {line_no}: 'custom_id' must be a non-empty string")
    problem = _request_problem(data)
    if problem:
        return MalformedLine(line_no, custom_id, f"line {line_no}: {problem}")
    return BatchRequest(line_no, custom_id, data["url"], data["body"])


def _request_problem(data: dict[str, Any]) -> str | None:
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


def _result_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def response_line(custom_id: str, status_code: int, request_id: str | None, body: Any) -> bytes:
    """An answered request (any HTTP status the server gave, after retries)."""
    return _encode({"id": _result_id(), "custom_id": custom_id,
                    "response": {"status_code": status_code, "request_id": request_id, "body": body},
                    "error": None})


def error_line(custom_id: str | None, code: str, message: str, line_no: int | None = None) -> bytes:
    """A request that got no HTTP answer (connection failure) or could not be sent (malformed)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if line_no is not None:
        error["line"] = line_no
    return _encode({"id": _result_id(), "custom_id": custom_id, "response": None, "error": error})


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def failure_cause(record: dict[str, Any]) -> str | None:
    """None for a success, else a short cause ('http_429', 'connection_error', 'malformed_line')."""
    error = record.get("error")
    if error:
        return str(error.get("code") or "error")
    response = record.get("response") or {}
    status = response.get("status_code")
    if not isinstance(status, int):
        return "no_response"
    return None if status < 400 else f"http_{status}"


def usage_tokens(record: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of an answered output line."""
    response = record.get("response") or {}
    return body_usage_tokens(response.get("body"))


def body_usage_tokens(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens from a response body's usage block; (0, 0) when absent."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    return (prompt if isinstance(prompt, int) else 0, completion if isinstance(completion, int) else 0)
