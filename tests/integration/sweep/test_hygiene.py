"""Deployment hygiene against a real sim engine: a warm endpoint serving something else is refused."""

from __future__ import annotations

import pytest

from tests.helpers.sim import start_sim_engine
from vlmserve.deploy.processes import free_port
from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec
from vlmserve.sweep.hygiene import check_ports_free, verify_serving, with_free_ports


def test_endpoint_serving_another_model_or_length_is_refused() -> None:
    with start_sim_engine(model="previous", max_model_len=1024, ttft_ms=1, itl_ms=1) as engine:
        assert verify_serving(engine.base_url, "previous", 1024)["id"] == "previous"
        with pytest.raises(UserError) as caught:
            verify_serving(engine.base_url, "wanted")
        assert caught.value.message == (
            f"endpoint {engine.base_url} serves previous, not 'wanted' (a previous deployment still running?)"
        )
        with pytest.raises(UserError, match="with max_model_len 1024, not 4096 .still serving a previous"):
            verify_serving(engine.base_url, "previous", 4096)


def test_unreachable_endpoint_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError) as caught:
        verify_serving(url, "m")
    assert caught.value.message.startswith(f"endpoint {url} is unreachable (ConnectError")
    assert caught.value.message.endswith("check the URL and that the server is running")


def test_free_ports_unless_pinned() -> None:
    chosen = with_free_ports(DeploymentSpec(engine="sim", replicas=3))
    assert chosen.replica_ports() == [chosen.port + 1, chosen.port + 2, chosen.port + 3]
    check_ports_free(chosen)
    pinned = DeploymentSpec(engine="sim", port=18123)
    assert with_free_ports(pinned).port == 18123
