"""`vlmserve up` passes the spec's `gateway_state` to the gateway it starts (through its
environment: the URL may hold a password), and refuses a bad one before any engine starts. The end-to-end case runs a real `vlmserve up --engine sim` and a real Redis."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pydantic
import pytest
import yaml

from tests.e2e.test_supervisor import assert_one_line_error, run_up, spawn_up, wait_for
from tests.e2e.test_supervisor import home as home  # noqa: F401  (fixture)
from tests.e2e.test_supervisor import up_process as up_process  # noqa: F401  (fixture)
from tests.helpers.procs import free_ports
from tests.helpers.redis_server import RedisServer
from tests.integration.test_up_trust_boundary import ready_with_gateway, stop_up
from vlmserve.deploy.front_door import gateway_argv, gateway_env, shown_gateway_env
from vlmserve.gateway.redis_buckets import bucket_keys
from vlmserve.spec import DeploymentSpec


def write_spec(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


def test_the_spec_fields_reach_the_gateway_and_the_password_stays_out_of_its_argv() -> None:
    url = "redis://:s3cret@cache.internal:6379/2"
    spec = DeploymentSpec(gateway_state=url, gateway_state_unavailable="closed")
    argv = gateway_argv(spec, ["http://127.0.0.1:9001"])
    assert argv[argv.index("--state-unavailable") + 1] == "closed"
    assert not any("s3cret" in arg for arg in argv)  # a command line is readable by every user (ps)
    assert gateway_env(spec, {"HOME": "/root"}) == {"HOME": "/root", "VLMSERVE_GATEWAY_STATE": url}
    assert shown_gateway_env(spec) == {"VLMSERVE_GATEWAY_STATE": "redis://:***@cache.internal:6379/2"}
    plain = DeploymentSpec()
    assert "--state-unavailable" not in gateway_argv(plain, ["http://127.0.0.1:9001"])  # per process by default
    # a state URL left in the shell's environment does not sneak in: the spec decides
    assert gateway_env(plain, {"VLMSERVE_GATEWAY_STATE": url, "HOME": "/root"}) == {"HOME": "/root"}
    with pytest.raises(pydantic.ValidationError, match="gateway_state_unavailable"):
        DeploymentSpec.model_validate({"gateway_state_unavailable": "sometimes"})


def test_print_plan_shows_the_state_without_its_password(
    vlmserve_cmd: list[str],
    home: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    spec = write_spec(
        tmp_path / "deploy.yaml",
        name="planned",
        engine="sim",
        model="sim-model",
        port=free_ports(2),
        gateway_state="redis://:s3cret@cache.internal:6379/0",
    )
    done = run_up(vlmserve_cmd, home, "-f", str(spec), "--print-plan", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "VLMSERVE_GATEWAY_STATE='redis://:***@cache.internal:6379/0'" in done.stdout
    assert "s3cret" not in done.stdout + done.stderr


@pytest.mark.hostile("a deployment spec with a malformed gateway_state: refused in one line before any engine starts")
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gateway_state": "http://cache:6379/0"}, "gateway_state: --state 'http://cache:6379/0': the scheme must be redis://"),
        ({"gateway_state": "redis://cache:6379/0", "gateway_state_unavailable": "maybe"}, "field 'gateway_state_unavailable'"),
    ],
)
def test_a_bad_gateway_state_is_refused_before_engines_start(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    fields: dict[str, str],
    message: str,  # noqa: F811
) -> None:
    spec = write_spec(tmp_path / "deploy.yaml", name="badstate", engine="sim", model="sim-model", port=free_ports(2), **fields)
    done = run_up(vlmserve_cmd, home, "-f", str(spec), timeout=120)
    assert_one_line_error(done, message)
    assert "starting replica" not in done.stdout
    assert not (home / "deployments" / "badstate" / "logs" / "replica-0.log").exists()


def test_up_starts_its_gateway_on_the_shared_state(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: clinic\n    keys: [sk-clinic]\n    requests_per_s: 5\n")
    name = "sharedstate"
    spec = write_spec(
        tmp_path / "deploy.yaml",
        name=name,
        engine="sim",
        model="sim-model",
        port=free_ports(2),
        keys_file=str(keys),
        gateway_state=redis_server.url,
        gateway_state_unavailable="closed",
    )
    proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))
    state = wait_for(lambda: ready_with_gateway(home, name, 1), 120, "sim replica and gateway ready", proc)
    endpoint = state["endpoint"]
    health = httpx.get(f"{endpoint}/health", timeout=10, trust_env=False).json()
    assert health["state"] == {"backend": redis_server.url, "available": True, "when_unavailable": "closed"}
    reply = httpx.post(
        f"{endpoint}/v1/chat/completions",
        timeout=30,
        trust_env=False,
        headers={"Authorization": "Bearer sk-clinic"},
        json={"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert reply.status_code == 200, reply.text
    assert redis_server.client().exists(bucket_keys("clinic")[0]) == 1
    stop_up(proc)
