"""One command line per engine: `vlmserve up` and `export k8s` pass the same flags for the same spec."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vlmserve.deploy.plan import replica_plans
from vlmserve.engines.launcher import make_launcher
from vlmserve.engines.sim.launcher import SimLauncher
from vlmserve.engines.vllm import VllmLauncher, gpu_count
from vlmserve.export.k8s import K8sOptions, render_manifests
from vlmserve.observe.alerts import AlertSettings
from vlmserve.spec import DeploymentSpec

HOST, PORT = "<host>", "<port>"


def normalised(arguments: list[str]) -> list[str]:
    """The flags with the listening address replaced: the one thing that rightly differs
    (loopback and a per-replica port here, the pod's network and container port there)."""
    out = list(arguments)
    for flag, placeholder in (("--host", HOST), ("--port", PORT)):
        out[out.index(flag) + 1] = placeholder
    return out


def supervisor_argv(spec: DeploymentSpec, tmp_path: Path) -> list[str]:
    """Replica 0's argv exactly as the supervisor plans it."""
    plans, _ = replica_plans(make_launcher(spec), tmp_path / "logs")
    return plans[0].argv


def k8s_container(spec: DeploymentSpec) -> dict:
    manifests = render_manifests(spec, K8sOptions(), AlertSettings())
    return manifests["engine-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]


def vllm_spec(devices: str) -> DeploymentSpec:
    """Two CPU replicas, or one GPU replica (so one GPU is enough to plan it)."""
    return DeploymentSpec.model_validate({
        "name": "same", "model": "org/some-vlm", "replicas": 2 if devices == "cpu" else 1, "port": 9000,
        "devices": devices,
        "engine_args": {"max_model_len": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 2048,
                        "enable_prefix_caching": False, "kv_cache_dtype": "fp8", "async_scheduling": True,
                        "gpu_memory_utilization": 0.85, "served_model_name": "vision",
                        "limit_mm_per_prompt": {"image": 2}, "extra_args": ["--seed", "7"]},
        "allowed_media_domains": ["images.example.com"],
    })  # fmt: skip


def sim_spec() -> DeploymentSpec:
    return DeploymentSpec.model_validate({
        "name": "same", "engine": "sim", "model": "sim-model", "replicas": 2, "port": 9000,
        "engine_args": {"max_model_len": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 2048,
                        "served_model_name": "vision"},
        "sim": {"profile": "h100-8b", "extra_args": ["--image-tokens", "64"]},
    })  # fmt: skip


@pytest.mark.parametrize("devices", ["cpu", "gpu"])
def test_vllm_export_and_supervisor_pass_the_same_flags(devices: str, tmp_path: Path) -> None:
    spec = vllm_spec(devices)
    if devices == "gpu" and gpu_count() < spec.replicas:
        pytest.skip("planning a GPU replica here needs a GPU")
    argv = supervisor_argv(spec, tmp_path)
    container = k8s_container(spec)
    module = "vllm.entrypoints.openai.api_server"
    assert argv[:3] == [sys.executable, "-m", module]  # this machine's interpreter ...
    assert container["command"] == ["vllm", "serve"]  # ... the image's (vLLM's documented command)
    assert normalised(argv[3:]) == normalised(container["args"])
    # the flags k8s used to drop are there, and clients' name is the served name
    for flag in ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--served-model-name"):
        assert flag in container["args"]
    assert container["args"][container["args"].index("--served-model-name") + 1] == "vision"


def test_sim_export_and_supervisor_pass_the_same_flags(tmp_path: Path) -> None:
    spec = sim_spec()
    argv = supervisor_argv(spec, tmp_path)
    container = k8s_container(spec)
    assert argv[:3] == [sys.executable, "-m", "vlmserve"]
    assert container["command"] == ["vlmserve"]  # the image's console script
    assert normalised(argv[3:]) == normalised(container["args"])
    args = container["args"]
    assert args[:2] == ["engine", "sim"]
    assert args[args.index("--model") + 1] == "vision"  # the served name, as the supervisor passes it
    for flag, value in (("--max-model-len", "4096"), ("--max-num-seqs", "16"), ("--max-num-batched-tokens", "2048")):
        assert args[args.index(flag) + 1] == value
    assert args[-2:] == ["--image-tokens", "64"]


def test_sim_replicas_differ_only_in_port_and_seed(tmp_path: Path) -> None:
    plans, notes = replica_plans(make_launcher(sim_spec()), tmp_path)
    first, second = (plan.argv for plan in plans)
    assert [plan.port for plan in plans] == [9001, 9002] and notes == []
    assert first[first.index("--seed") + 1] == "0" and second[second.index("--seed") + 1] == "1"
    assert normalised(first[: first.index("--seed")]) == normalised(second[: second.index("--seed")])


def test_launchers_say_what_a_ready_replica_must_serve_and_what_memory_it_takes() -> None:
    sim = make_launcher(sim_spec())
    assert isinstance(sim, SimLauncher) and sim.device_kind == "sim"
    expected = sim.expected()
    assert (expected.served_model_name, expected.max_model_len, expected.expects_images) == ("vision", 4096, None)
    assert sim.host_memory_needed_gb() == pytest.approx(0.6)
    vllm = make_launcher(vllm_spec("cpu"), model_path="/models/vlm", device_kind="cpu")
    assert isinstance(vllm, VllmLauncher)
    expected = vllm.expected()
    assert expected.root == "/models/vlm" and expected.served_model_name == "vision"
    assert expected.cache_config == {"enable_prefix_caching": "False", "cache_dtype": "fp8"}
    assert vllm.host_memory_needed_gb() > 2 * 2.5  # engine overhead and KV cache, per replica


def test_an_engine_exporting_traces_over_http_gets_the_otlp_http_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmserve import vllm_flags
    from vlmserve.engines.vllm import plan_launches, tracing_env

    # vLLM's own parser is not loaded in the unit tier (importing vLLM starts processes)
    flag = vllm_flags.VllmFlag("--otlp-traces-endpoint", boolean=False, multiple=False)
    monkeypatch.setattr(vllm_flags, "installed_vllm_flags", lambda: {"otlp_traces_endpoint": flag})

    url = "http://127.0.0.1:4318/v1/traces"
    by_key = DeploymentSpec(name="t", model="embedded", engine_args={"otlp_traces_endpoint": url})
    by_flag = DeploymentSpec(name="t", model="embedded", engine_args={"extra_args": ["--otlp-traces-endpoint", url]})
    wanted = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    assert tracing_env(by_key) == wanted and tracing_env(by_flag) == wanted
    launch = plan_launches(by_key, "/models/x", "cpu")[0]
    assert launch.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert launch.argv[launch.argv.index("--otlp-traces-endpoint") + 1] == url
    # a gRPC collector (no scheme) keeps vLLM's default protocol; the spec's env wins
    assert tracing_env(DeploymentSpec(name="t", model="embedded", engine_args={"otlp_traces_endpoint": "otel:4317"})) == {}
    own = DeploymentSpec(
        name="t", model="embedded", engine_args={"otlp_traces_endpoint": url}, env={"OTEL_BSP_SCHEDULE_DELAY": "1000"}
    )
    assert plan_launches(own, "/models/x", "cpu")[0].env["OTEL_BSP_SCHEDULE_DELAY"] == "1000"
