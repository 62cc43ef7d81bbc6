"""`vlmserve up` holds the trust boundary: hung replicas are restarted, orphans are never
forgotten, and a deployment is open to other machines only when the spec says so.

The end-to-end cases run real `vlmserve up --engine sim` processes (no engine is mocked);
the command lines `up` builds for vLLM and the gateway are checked as plans.
"""

from __future__ import annotations

import json
import os
import select
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pydantic
import pytest
import yaml

from tests.e2e.test_supervisor import (
    all_ready,
    assert_one_line_error,
    cli_env,
    living,
    read_state,
    run_up,
    sim_available,
    spawn_up,
    wait_for,
)
from tests.e2e.test_supervisor import home as home  # noqa: F401  (fixture)
from tests.e2e.test_supervisor import up_process as up_process  # noqa: F401  (fixture)
from tests.helpers.paths import REPO_ROOT
from tests.helpers.procs import free_ports
from tests.helpers.tls import self_signed_certificate
from vlmserve.cli.up import build_spec
from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec

# What this suite checks is imported inside each test, so that every case is collected
# (and fails on what it checks) on code that lacks it.

needs_sim = pytest.mark.skipif(not sim_available(), reason="`vlmserve engine sim` is not registered")


def write_spec(path: Path, **fields: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(fields))
    return path


def ready_with_gateway(home: Path, name: str, replicas: int):  # type: ignore[no-untyped-def]
    state = all_ready(home, name, replicas)
    if state and state["gateway"] is not None and state["gateway"]["state"] == "ready":
        return state
    return None


def gateway_requests_finished(endpoint: str) -> float:
    """Requests the gateway has finished so far, from its own /metrics."""
    reply = httpx.get(f"{endpoint}/metrics", timeout=10, trust_env=False)
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in reply.text.splitlines() if line.startswith("vlmserve_gateway_requests_total{")
    )


def stop_up(proc: subprocess.Popen[str], *, once_printed: str | None = None) -> str:
    """SIGTERM `up` and return everything it printed. With `once_printed`, only after that text is
    out: `up` marks a deployment ready in its state file a moment before it prints its serving
    line, so a test that saw the state ready and stopped at once could stop it before the line."""
    seen = read_until(proc, once_printed, timeout_s=60) if once_printed is not None else ""
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, seen + output
    return seen + output


def read_until(proc: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    """What `proc` printed up to `text`, read from its stdout's descriptor (nothing is left in the
    text wrapper's buffer, so a later communicate() returns exactly the rest)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"`up` did not print {text!r} within {timeout_s:g} s:\n{seen.decode(errors='replace')}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"`up` exited without printing {text!r}:\n{seen.decode(errors='replace')}")
        seen += chunk
    return seen.decode(errors="replace")


# ---- the plans: what `up` passes to vLLM and to the gateway (no processes) --------------


def test_vllm_replicas_fetch_media_only_from_listed_hosts() -> None:
    from vlmserve.engines.vllm import NO_REMOTE_MEDIA_DOMAIN, engine_argv

    listed = DeploymentSpec(allowed_media_domains=["images.example.com", "cdn.example.org"])
    argv = engine_argv(listed, "/models/m", 8001, "cpu")
    at = argv.index("--allowed-media-domains")
    assert argv[at + 1 : at + 3] == ["images.example.com", "cdn.example.org"]
    # nothing listed: vLLM would read an empty list as "any host", so it gets a name that never resolves
    argv = engine_argv(DeploymentSpec(), "/models/m", 8001, "cpu")
    assert argv[argv.index("--allowed-media-domains") + 1] == NO_REMOTE_MEDIA_DOMAIN
    with pytest.raises(ValueError, match="not a host name"):
        DeploymentSpec(allowed_media_domains=["https://images.example.com/"])


def test_replicas_listen_on_loopback_behind_the_gateway() -> None:
    from vlmserve.engines.vllm import engine_argv

    exposed = DeploymentSpec(host="0.0.0.0", keys_file="/k.yaml")
    argv = engine_argv(exposed, "/models/m", 8001, "cpu")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # the gateway's keys cannot be walked around
    direct = engine_argv(DeploymentSpec(host="0.0.0.0", gateway=False, open=True), "/models/m", 8001, "cpu")
    assert direct[direct.index("--host") + 1] == "0.0.0.0"


def test_gateway_gets_keys_audit_tls_and_media_allowlist() -> None:
    from vlmserve.deploy.front_door import gateway_argv

    spec = DeploymentSpec(
        host="0.0.0.0", port=9000, keys_file="/etc/vlm/keys.yaml", audit_log="/var/log/vlm/audit.jsonl",
        ssl_certfile="/etc/vlm/cert.pem", ssl_keyfile="/etc/vlm/key.pem",
        allowed_media_domains=["images.example.com"],
    )  # fmt: skip
    argv = gateway_argv(spec, ["http://127.0.0.1:9001"])
    pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert pairs["--replica"] == "http://127.0.0.1:9001"
    assert pairs["--host"] == "0.0.0.0" and pairs["--port"] == "9000"
    assert pairs["--keys-file"] == "/etc/vlm/keys.yaml"
    assert pairs["--audit-log"] == "/var/log/vlm/audit.jsonl"
    assert pairs["--ssl-certfile"] == "/etc/vlm/cert.pem" and pairs["--ssl-keyfile"] == "/etc/vlm/key.pem"
    assert pairs["--allowed-media-domains"] == "images.example.com"
    plain = gateway_argv(DeploymentSpec(), ["http://127.0.0.1:8001"])
    assert not {"--keys-file", "--audit-log", "--ssl-certfile", "--allowed-media-domains"} & set(plain)


def test_gateway_gets_the_image_limits_and_the_models_directory(tmp_path: Path) -> None:
    from vlmserve.deploy.front_door import gateway_argv

    (tmp_path / "config.json").write_text("{}")
    spec = DeploymentSpec(max_image_pixels=4_000_000, max_images_per_request=4, image_downscale_max_side=1024)
    argv = gateway_argv(spec, ["http://127.0.0.1:9001"], str(tmp_path))
    pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert pairs["--max-image-pixels"] == "4000000" and pairs["--max-images-per-request"] == "4"
    assert pairs["--image-downscale-max-side"] == "1024" and pairs["--model-config-dir"] == str(tmp_path)
    # a served name that is not a local directory (a hub id, the sim engine) leaves the estimate to the fallback
    plain = gateway_argv(DeploymentSpec(), ["http://127.0.0.1:9001"], "org/some-model")
    assert "--model-config-dir" not in plain and "--max-image-pixels" not in plain
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 16"):
        DeploymentSpec(image_downscale_max_side=8)


def test_the_spec_can_name_a_discovery_source_for_the_gateway(tmp_path: Path) -> None:
    from vlmserve.deploy.front_door import check_gateway_files, gateway_argv

    spec = DeploymentSpec(gateway_discover="dns:engines.vision.svc.cluster.local:8000")
    argv = gateway_argv(spec, ["http://127.0.0.1:9001"])
    assert argv[argv.index("--discover") + 1] == "dns:engines.vision.svc.cluster.local:8000"
    assert "--discover" not in gateway_argv(DeploymentSpec(), ["http://127.0.0.1:9001"])
    with pytest.raises(UserError, match="--discover 'dns:engines': write dns:NAME:PORT"):
        check_gateway_files(DeploymentSpec(gateway_discover="dns:engines"))


def test_replicas_behind_a_gateway_trust_per_request_processor_kwargs() -> None:
    from vlmserve.engines.vllm import engine_argv

    behind = engine_argv(DeploymentSpec(), "/models/m", 8001, "cpu")
    assert "--trust-request-mm-kwargs" in behind  # the gateway polices them (media/preflight.py)
    alone = engine_argv(DeploymentSpec(gateway=False), "/models/m", 8001, "cpu")
    assert "--trust-request-mm-kwargs" not in alone


def test_spec_paths_are_read_next_to_the_spec_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_file = write_spec(tmp_path / "deploy" / "spec.yaml", keys_file="keys.yaml", audit_log="logs/audit.jsonl",
                           ssl_certfile="/abs/cert.pem", ssl_keyfile="tls/key.pem")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    spec = build_spec(spec_file, {}, {})
    assert spec.keys_file == str(tmp_path / "deploy" / "keys.yaml")
    assert spec.audit_log == str(tmp_path / "deploy" / "logs" / "audit.jsonl")
    assert spec.ssl_certfile == "/abs/cert.pem" and spec.ssl_keyfile == str(tmp_path / "deploy" / "tls" / "key.pem")
    flagged = build_spec(spec_file, {"keys_file": Path("other.yaml")}, {})  # a flag: from the current directory
    assert flagged.keys_file == str(tmp_path / "other.yaml")
    with pytest.raises(UserError, match="give both ssl_certfile and ssl_keyfile"):
        build_spec(write_spec(tmp_path / "half.yaml", ssl_certfile="c.pem"), {}, {})


@pytest.mark.hostile("a deployment on a non-loopback address with no keys is refused unless open: true")
def test_trust_boundary_rules() -> None:
    from vlmserve.deploy.front_door import check_trust_boundary

    check_trust_boundary(DeploymentSpec(), gateway_runs=True)  # loopback: fine
    check_trust_boundary(DeploymentSpec(host="0.0.0.0", keys_file="/k.yaml"), gateway_runs=True)
    check_trust_boundary(DeploymentSpec(host="0.0.0.0", open=True), gateway_runs=True)
    with pytest.raises(UserError, match="has no keys_file; set keys_file .* open: true"):
        check_trust_boundary(DeploymentSpec(host="0.0.0.0"), gateway_runs=True)
    with pytest.raises(UserError, match="without the gateway, nothing asks for keys"):
        check_trust_boundary(DeploymentSpec(host="10.1.2.3", gateway=False), gateway_runs=False)
    with pytest.raises(UserError, match="keys_file needs the gateway"):
        check_trust_boundary(DeploymentSpec(gateway=False, keys_file="/k.yaml"), gateway_runs=False)


def test_default_detection_time_is_documented() -> None:
    from vlmserve.spec import LivenessOptions

    default = LivenessOptions()
    assert default.detection_s == 15.0
    assert "within 15 s" in (REPO_ROOT / "docs" / "up.md").read_text()


# ---- end to end: real `vlmserve up --engine sim` -------------------------------------


@needs_sim
@pytest.mark.slow
@pytest.mark.hostile("one replica stops answering (SIGSTOP) under a 500-request bench: restarted, every request ends")
def test_hung_replica_is_restarted_and_every_request_ends(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
    record_property: Callable[[str, object], None],
) -> None:
    name = "hung"
    liveness = {"interval_s": 0.5, "timeout_s": 1.0, "failures": 2, "probe_timeout_s": 1.0}
    spec = write_spec(tmp_path / "hung.yaml", name=name, engine="sim", model="sim-model", replicas=2,
                      port=free_ports(3), sim={"ttft_ms": 20, "itl_ms": 10}, liveness=liveness)  # fmt: skip
    proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))
    state = wait_for(lambda: ready_with_gateway(home, name, 2), 180, "sim replicas and gateway ready", proc)
    victim = state["replicas"][1]
    summary_file, records_file = tmp_path / "bench.json", tmp_path / "records.parquet"
    bench = subprocess.Popen(
        [*vlmserve_cmd, "bench", "--base-url", state["endpoint"], "--model", "sim-model", "--concurrency", "32",
         "--num-requests", "500", "--input-len", "32", "--output-len", "32", "--json-out", str(summary_file),
         "--records-out", str(records_file), "--label", "hung-replica"],
        env=cli_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # the stop lands mid-run, on requests in flight (not on the bench's set-up calls)
        wait_for(lambda: gateway_requests_finished(state["endpoint"]) >= 32, 120, "the bench to be under way", proc)
        os.killpg(victim["pid"], signal.SIGSTOP)
        stopped_at = time.monotonic()

        def killed() -> dict | None:  # type: ignore[type-arg]
            now = read_state(home, name)
            return (
                now if now and now["replicas"][1]["restarts"] >= 1 or (now and now["replicas"][1]["state"] != "ready") else None
            )

        wait_for(killed, 120, "the hung replica to be killed", proc)
        took_s = time.monotonic() - stopped_at
        from vlmserve.spec import LivenessOptions

        detection_s = LivenessOptions(**liveness).detection_s  # 3.5 s
        state = wait_for(
            lambda: (s := all_ready(home, name, 2)) and s["replicas"][1]["restarts"] == 1 and s,
            120,
            "the hung replica to be ready again",
            proc,
        )
        # the documented bound, plus the monitor's 0.5 s poll and scheduling on a shared machine
        assert took_s <= detection_s + 5.0, f"hung replica killed after {took_s:.1f} s (bound {detection_s} s)"
        replica = state["replicas"][1]
        assert replica["pid"] != victim["pid"] and replica["last_exit_code"] == -signal.SIGKILL
        assert replica["last_restart_reason"].startswith("hung: no answer to /health in 1 s ×2"), replica
        assert state["replicas"][0]["restarts"] == 0  # the healthy one is left alone
        bench_output, _ = bench.communicate(timeout=400)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=30)
    assert bench.returncode == 0, bench_output
    summary = json.loads(summary_file.read_text())
    assert summary["requests"]["total"] == 500, summary["requests"]
    rows = pq.read_table(records_file).to_pylist()
    unclear = [row for row in rows if not row["ok"] and not (row["error_message"] or row["error_kind"])]
    record_property("requests_sent", 500)
    record_property("requests_lost", 500 - len(rows) + len(unclear))
    assert len(rows) == 500
    assert unclear == [], unclear[:3]
    status = subprocess.run([*vlmserve_cmd, "status", name], capture_output=True, text=True, timeout=60, env=cli_env(home))
    assert status.returncode == 0 and "hung: no answer" in status.stdout, status.stdout
    events = (home / "deployments" / name / "supervisor.log").read_text()
    assert f"replica 1 (pid {victim['pid']}) is hung: no answer to /health" in events
    stop_up(proc)


@needs_sim
@pytest.mark.hostile("the supervisor is SIGKILLed: a second up with the same name refuses; status and down see the orphans")
def test_orphans_of_a_killed_supervisor_block_a_second_up(
    vlmserve_cmd: list[str],
    home: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    name = "orphans"
    proc = spawn_up(vlmserve_cmd, home, up_process, "--name", name, "--engine", "sim", "--model", "m",
                    "--port", str(free_ports(2)))  # fmt: skip
    state = wait_for(lambda: ready_with_gateway(home, name, 1), 120, "sim replica and gateway ready", proc)
    orphan_pids = [state["replicas"][0]["pid"], state["gateway"]["pid"]]
    state_file = home / "deployments" / name / "state.json"
    try:
        proc.kill()
        proc.wait(timeout=30)
        assert living(orphan_pids) == orphan_pids
        before = state_file.read_bytes()

        second = spawn_up(vlmserve_cmd, home, up_process, "--name", name, "--engine", "sim", "--model", "m",
                          "--port", str(free_ports(2)))  # fmt: skip
        output, _ = second.communicate(timeout=60)
        assert second.returncode == 2, output
        assert "Traceback" not in output
        [error] = [line for line in output.splitlines() if line.startswith("error: ")]
        for pid in orphan_pids:
            assert f"pid {pid}" in error, error
        assert "replica 0" in error and "gateway" in error and f"`vlmserve down {name}`" in error, error
        assert state_file.read_bytes() == before  # never silently overwritten

        status = subprocess.run([*vlmserve_cmd, "status", name, "--json"], capture_output=True, text=True,
                                timeout=60, env=cli_env(home))  # fmt: skip
        [listed] = json.loads(status.stdout)
        members = listed["replicas"] + [listed["gateway"]]
        assert [m["pid"] for m in members] == orphan_pids
        assert all(m["state"].startswith("orphaned") for m in members), members

        down = subprocess.run([*vlmserve_cmd, "down", name], capture_output=True, text=True, timeout=120, env=cli_env(home))
        assert down.returncode == 0 and "2 leftover process group(s) cleaned up" in down.stdout, down.stdout + down.stderr
        assert living(orphan_pids) == []
    finally:
        for pid in living(orphan_pids):
            os.killpg(pid, signal.SIGKILL)


@needs_sim
@pytest.mark.hostile("up on 0.0.0.0 without keys refuses; open: true serves and says it is open")
def test_non_loopback_without_keys_needs_open(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    port = free_ports(2)
    refused = spawn_up(vlmserve_cmd, home, up_process, "--name", "exposed", "--engine", "sim", "--host", "0.0.0.0",
                       "--port", str(port))  # fmt: skip
    output, _ = refused.communicate(timeout=60)
    assert refused.returncode == 2, output
    [error] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "host 0.0.0.0 is reachable from other machines but the gateway has no keys_file" in error
    assert "open: true" in error and "--open" in error
    assert "starting replica" not in output  # refused before anything started

    spec = write_spec(tmp_path / "open.yaml", name="exposed", engine="sim", model="m", host="0.0.0.0", port=port,
                      open=True)  # fmt: skip
    proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))
    state = wait_for(lambda: ready_with_gateway(home, "exposed", 1), 120, "open deployment ready", proc)
    assert state["open"] is True
    assert state["replicas"][0]["url"].startswith("http://127.0.0.1:")  # only the gateway faces the network
    output = stop_up(proc, once_printed="open: no API keys, anyone who can reach it")
    assert "open: no API keys, anyone who can reach it" in output, output


@needs_sim
@pytest.mark.hostile("a spec with keys_file and TLS: HTTPS only, 401 without a key, audit_log records requests")
def test_keys_file_and_tls_in_the_spec_make_the_gateway_ask_for_keys_over_https(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    deploy = tmp_path / "deploy"
    write_spec(deploy / "keys.yaml", tenants=[{"name": "clinic", "keys": ["sk-clinic-1"]}])
    cert, _ = self_signed_certificate(deploy)
    spec = write_spec(deploy / "spec.yaml", name="keyed", engine="sim", model="m", host="0.0.0.0",
                      port=free_ports(2), keys_file="keys.yaml", audit_log="audit.jsonl",
                      ssl_certfile="gw.crt", ssl_keyfile="gw.key")  # fmt: skip
    proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))  # run from another directory on purpose
    state = wait_for(lambda: ready_with_gateway(home, "keyed", 1), 120, "keyed deployment ready", proc)
    assert state["open"] is False
    gateway = f"https://127.0.0.1:{state['gateway']['port']}"
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    trust = {"verify": ssl.create_default_context(cafile=str(cert)), "timeout": 60, "trust_env": False}
    with pytest.raises(httpx.TransportError):
        httpx.post(gateway.replace("https://", "http://") + "/v1/chat/completions", json=body, timeout=10, trust_env=False)
    anonymous = httpx.post(f"{gateway}/v1/chat/completions", json=body, **trust)
    assert anonymous.status_code == 401, anonymous.text
    keyed = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-clinic-1"},
                       **trust)  # fmt: skip
    assert keyed.status_code == 200, keyed.text
    output = stop_up(proc, once_printed="API keys required")
    assert f"API keys required ({deploy / 'keys.yaml'})" in output, output
    assert (deploy / "audit.jsonl").read_text().count("\n") >= 2  # next to the spec, one line per request


def test_up_refuses_missing_keys_file(vlmserve_cmd: list[str], home: Path, tmp_path: Path) -> None:  # noqa: F811
    spec = write_spec(tmp_path / "spec.yaml", engine="sim", model="m", port=free_ports(2), keys_file="nope.yaml")
    done = run_up(vlmserve_cmd, home, "-f", str(spec))
    assert_one_line_error(done, f"keys_file {tmp_path / 'nope.yaml'} does not exist")


def test_the_spec_can_run_the_gateway_as_several_workers() -> None:
    from vlmserve.deploy.front_door import gateway_argv

    argv = gateway_argv(DeploymentSpec(gateway_workers=4), ["http://127.0.0.1:9001"])
    assert argv[argv.index("--workers") + 1] == "4"
    assert "--workers" not in gateway_argv(DeploymentSpec(), ["http://127.0.0.1:9001"])
    for bad in (0, 65):
        with pytest.raises(pydantic.ValidationError, match="gateway_workers"):
            DeploymentSpec(gateway_workers=bad)
