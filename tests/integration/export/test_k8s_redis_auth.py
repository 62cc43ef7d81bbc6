"""The exported Redis, run as its container would run it: a real redis-server with the manifest's args (the
password expanded as Kubernetes expands it) refuses a client without the password, answers the
manifest's own probe command, and lets in the gateways' --state URL from their environment."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.procs import free_port, stop_process
from tests.helpers.redis_server import REDIS_SERVER
from vlmserve.export.k8s import K8sOptions, render_manifests
from vlmserve.gateway.shared_state import STATE_ENV, parse_state_url
from vlmserve.observe.alerts import AlertSettings
from vlmserve.spec import DeploymentSpec

PASSWORD = "3c" * 24  # what `openssl rand -hex 24` puts in the Secret


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in a container's args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda match: env.get(match.group(1), match.group(0)), value)


def test_exported_redis_needs_the_password_the_gateways_carry(tmp_path: Path) -> None:
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    import redis

    spec = DeploymentSpec.model_validate({"name": "radiology", "engine": "sim", "model": "m"})
    manifests = render_manifests(spec, K8sOptions(namespace="vision"), AlertSettings())
    container = manifests["redis-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    secret_env = {"REDIS_PASSWORD": PASSWORD, "REDISCLI_AUTH": PASSWORD}  # both from the Secret's key
    assert {e["name"] for e in container["env"]} == set(secret_env)
    port = free_port()
    argv = [
        REDIS_SERVER,
        *(expand(arg, secret_env) for arg in container["args"]),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
    ]  # the pod's network, here
    assert container["command"] == ["redis-server"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        cli, *command = container["readinessProbe"]["exec"]["command"]
        probe = [cli, "-p", str(port), *command]
        deadline = time.monotonic() + 10
        while True:  # the manifest's readiness probe, with the container's environment
            done = subprocess.run(probe, env={**os.environ, **secret_env}, capture_output=True, text=True, timeout=5)
            if done.stdout.strip() == "PONG" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert done.stdout.strip() == "PONG", done.stdout + done.stderr
        with pytest.raises(redis.exceptions.AuthenticationError):  # a pod without the password
            redis.Redis(host="127.0.0.1", port=port, socket_timeout=2).ping()
        gateway = manifests["gateway-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
        state = next(e["value"] for e in gateway["env"] if e["name"] == STATE_ENV)
        url = parse_state_url(expand(state, secret_env)).url.replace("radiology-redis.vision.svc:6379", f"127.0.0.1:{port}")
        assert redis.Redis.from_url(url, socket_timeout=2).ping() is True
    finally:
        stop_process(process, timeout_s=5.0)
