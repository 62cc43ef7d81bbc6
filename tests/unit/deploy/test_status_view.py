"""What `vlmserve status` shows for a deployment that no longer runs: no live-looking URL."""

from __future__ import annotations

from rich.console import Console

from vlmserve.cli.up import status_table
from vlmserve.deploy.state import DeploymentState, MemberRecord


def _render(state: DeploymentState) -> str:
    console = Console(width=200, record=True)
    console.print(status_table([state]))
    return console.export_text()


def test_a_stopped_deployment_says_stopped_not_a_live_url() -> None:
    state = DeploymentState(
        name="clinic",
        model="tiny",
        endpoint="http://127.0.0.1:8080",
        replicas=[MemberRecord(role="replica", port=9001, state="stopped")],
        gateway=MemberRecord(role="gateway", port=8080, state="stopped (supervisor gone)"),
    )
    text = _render(state)
    assert "stopped (last served at http://127.0.0.1:8080)" in text
    assert " at http://" not in text.split("\n")[0].replace("last served at", "")


def test_a_running_deployment_shows_where_clients_go() -> None:
    state = DeploymentState(
        name="clinic",
        model="tiny",
        endpoint="http://127.0.0.1:8080",
        replicas=[
            MemberRecord(role="replica", port=9001, state="ready"),
            MemberRecord(role="replica", index=1, port=9002, state="stopped"),
        ],
    )
    assert "tiny at http://127.0.0.1:8080" in _render(state)


def test_a_stopped_deployment_without_a_recorded_endpoint_says_stopped() -> None:
    state = DeploymentState(name="old", model="tiny", replicas=[MemberRecord(role="replica", port=9001, state="stopped")])
    assert "tiny stopped" in _render(state)
