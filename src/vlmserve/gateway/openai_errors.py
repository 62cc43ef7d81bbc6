"""Errors in the OpenAI format, as HTTP responses and as a final SSE event of a broken stream."""

from __future__ import annotations

import json
import math

from vlmserve.http1.messages import Response

CLIENT_REQUEST_ID_HEADER = "X-Client-Request-ID"
"""Where a response echoes the client's own request id; X-Request-ID is the gateway's (request_info.py)."""

ERROR_TYPES = {
    **dict.fromkeys((400, 405, 413, 417, 431, 505), "invalid_request_error"),
    **dict.fromkeys((408, 504), "timeout_error"),
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "api_error"), "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    *,
    retry_after_s: float | None = None,
    request_id: str | None = None,
    client_request_id: str | None = None,
) -> Response:
    headers: dict[str, str] = {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    if request_id is not None:
        headers["X-Request-ID"] = request_id
    if client_request_id is not None:
        headers[CLIENT_REQUEST_ID_HEADER] = client_request_id
    return Response.json(error_body(status, message, code), status=status, headers=headers)


class Refusal(Exception):
    """A request the gateway answers with an error of its own (`answer`); `reason` labels the
    shed-requests metric (the code unless given)."""

    def __init__(self, status: int, message: str, code: str, retry_after_s: float | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.reason = reason or code

    def answer(self, request_id: str | None = None, client_request_id: str | None = None) -> Response:
        return error_response(
            self.status,
            self.message,
            self.code,
            retry_after_s=self.retry_after_s,
            request_id=request_id,
            client_request_id=client_request_id,
        )


def sse_error_event(status: int, message: str, code: str | None = None) -> bytes:
    """The last event of a stream the gateway had to cut: clients see why, then EOF."""
    return b"data: " + json.dumps(error_body(status, message, code)).encode() + b"\n\n"
