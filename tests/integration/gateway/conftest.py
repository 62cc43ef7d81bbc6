"""The `relay` fixture: the scripted relay tests (test_relay.py, test_native_relay.py) run on both relays."""

from __future__ import annotations

import pytest

from vlmserve.gateway.native_pump import native_available


@pytest.fixture(params=["native", "python"])
def relay(request: pytest.FixtureRequest) -> str:
    """Who moves a stream's bytes after its first token (--relay): each test that takes it runs both."""
    if request.param == "native" and not native_available():
        pytest.skip("the native relay is not built in this install (test_native_relay.py says why)")
    return request.param


def pumped(gw: object) -> int:
    """Streams the gateway's native pump carried so far (0 without one)."""
    pump = gw.gateway.pump  # type: ignore[attr-defined]
    return 0 if pump is None else pump.started
