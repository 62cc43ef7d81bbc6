"""request_info: the client's request id is checked, long session ids pin under a bounded key."""

from __future__ import annotations

import pytest

from vlmserve.gateway.request_info import (
    MAX_CLIENT_REQUEST_ID_CHARS,
    MAX_SESSION_KEY_CHARS,
    BadRequestHeader,
    client_request_id,
    session_key,
)
from vlmserve.http1.headers import Headers


def headers(**values: str) -> Headers:
    return Headers({name.replace("_", "-").lower(): value for name, value in values.items()})


def test_a_plain_client_id_is_kept_and_openais_header_wins() -> None:
    assert client_request_id(headers(X_Request_ID="order-17")) == "order-17"
    assert client_request_id(headers(X_Request_ID="a", X_Client_Request_ID="b")) == "b"
    assert client_request_id(headers()) is None and client_request_id(headers(X_Request_ID="")) is None


@pytest.mark.parametrize("value", ["x" * (MAX_CLIENT_REQUEST_ID_CHARS + 1), "two words", "caf\u00e9", "a\tb"])
def test_a_bad_client_id_is_refused_naming_the_header(value: str) -> None:
    with pytest.raises(BadRequestHeader, match="X-Request-ID must be 1 to 128 printable ASCII"):
        client_request_id(headers(X_Request_ID=value))


def test_long_session_ids_pin_under_a_digest_of_bounded_length() -> None:
    short = "conversation-1"
    assert session_key(short) == short and session_key(None) is None and session_key("") is None
    long_id = "s" * 60_000
    key = session_key(long_id)
    assert key is not None and len(key) <= MAX_SESSION_KEY_CHARS and key == session_key("s" * 60_000)
    assert key != session_key("s" * 59_999) and session_key("\udcff" * 100) is not None  # lone surrogates hash too
