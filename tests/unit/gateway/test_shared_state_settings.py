"""`--state` settings: what is accepted, and that a password never shows in what is logged."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.gateway.shared_state import check_state_settings, error_kind, parse_state_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://:s3cret@cache.internal:6380/2", "rediss://:***@cache.internal:6380/2"),
        ("redis://admin:s3cret@cache", "redis://admin:***@cache"),
        ("redis://:s3cret@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
    ],
)
def test_accepted_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert parse_state_url(url).redacted == shown


def test_a_refused_url_does_not_echo_its_password() -> None:
    with pytest.raises(UserError) as refused:
        parse_state_url("http://:s3cret@cache:6379/0")
    assert "s3cret" not in str(refused.value) and "http://:***@cache:6379/0" in str(refused.value)


def test_no_state_needs_only_a_sane_mode_and_timeout() -> None:
    check_state_settings(None, "open", 0.25)
    with pytest.raises(UserError, match="--state-unavailable 'Open'"):
        check_state_settings(None, "Open", 0.25)
    with pytest.raises(UserError, match="at most 30 seconds"):
        check_state_settings(None, "closed", 31)


def test_error_kinds_name_who_failed() -> None:
    from redis import exceptions

    assert error_kind(exceptions.AuthenticationError("WRONGPASS")) == "auth"
    assert error_kind(exceptions.TimeoutError("Timeout reading from socket")) == "timeout"
    assert error_kind(TimeoutError()) == "timeout"
    assert error_kind(exceptions.ConnectionError("Connection refused")) == "connection"
    assert error_kind(ConnectionResetError()) == "connection"
    assert error_kind(exceptions.ResponseError("OOM command not allowed")) == "response"
