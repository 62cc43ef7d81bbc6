"""vLLM launch plans (argv, env, devices) and the real embedded engine answering text and images."""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from tests.helpers.paths import REPO_ROOT
from vlmserve.deploy.readiness import (
    ExpectedConfig,
    StaleReplica,
    config_mismatches,
    image_message,
    read_served_config,
    tiny_png_data_url,
)
from vlmserve.engines import vllm as vllm_engine
from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec


def cpu_spec(**changes: object) -> DeploymentSpec:
    base = {"model": "embedded", "replicas": 2, "port": 9000, "kv_cache_space_gb": 1.5}
    return DeploymentSpec.model_validate({**base, **changes})


def test_argv_runs_the_module_not_the_console_script() -> None:
    spec = cpu_spec(engine_args={"max_model_len": 2048, "enable_prefix_caching": False, "extra_args": ["--enforce-eager"]})
    argv = vllm_engine.engine_argv(spec, "/models/tiny", 9001, "cpu")
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(argv)
    assert "--model /models/tiny" in joined and "--port 9001" in joined and "--served-model-name embedded" in joined
    assert "--max-model-len 2048" in joined and "--no-enable-prefix-caching" in argv
    assert argv[-1] == "--enforce-eager"  # the extra arg, passed last
    assert "--enforce-eager" in vllm_engine.engine_argv(cpu_spec(), "/m", 9001, "cpu")  # embedded: eager by default
    compiled = cpu_spec(engine_args={"enforce_eager": False})
    assert "--enforce-eager" not in vllm_engine.engine_argv(compiled, "/m", 9001, "cpu")


def test_cpu_replicas_get_own_cores_and_kv_space_not_gpu_utilization() -> None:
    spec = cpu_spec(engine_args={"gpu_memory_utilization": 0.9, "limit_mm_per_prompt": {"image": 2}})
    launches = vllm_engine.plan_launches(spec, "/models/tiny", "cpu")
    assert [launch.port for launch in launches] == [9001, 9002]
    for launch in launches:
        assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # whole GB, rounded up from 1.5
        assert "--gpu-memory-utilization" not in launch.argv
        assert json.loads(launch.argv[launch.argv.index("--limit-mm-per-prompt") + 1]) == {"image": 2}
    assert any("gpu_memory_utilization" in note for note in launches[0].notes)
    assert vllm_engine.cpu_bind_groups(2, None, cpus=[0, 1]) == ["0", "1"]
    assert vllm_engine.cpu_bind_groups(2, None, cpus=[0, 1, 2, 3, 4, 5, 6, 7]) == ["0-3", "4-7"]
    assert vllm_engine.cpu_bind_groups(3, 1, cpus=[0, 1]) == ["0", "1", "0"]


def test_gpu_replicas_get_tensor_parallel_groups() -> None:
    assert vllm_engine.gpu_groups(2, 2, available=4) == ["0,1", "2,3"]
    with pytest.raises(UserError) as caught:
        vllm_engine.gpu_groups(2, 2, available=2)
    assert "need 4 GPUs but 2 are visible" in caught.value.message
    spec = cpu_spec(
        model="google/gemma-4-31B-it", replicas=1, engine_args={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9}
    )
    argv = vllm_engine.engine_argv(spec, spec.model, 9001, "gpu")
    assert "--tensor-parallel-size" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert argv[argv.index("--served-model-name") + 1] == "google/gemma-4-31B-it"
    assert "--enforce-eager" not in argv  # real models keep vLLM's compiled default


def test_device_detection_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert vllm_engine.detect_device_kind("auto") == "cpu"
    assert vllm_engine.detect_device_kind("gpu") == "gpu"


def test_print_plan_cli(
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through `main` in this process: the plan checks the flags against vLLM's own parser, and a
    second process would import vLLM again (6 s of a suite run) to prove nothing more; `vlmserve up`
    as a process is run by tests/e2e/test_supervisor.py."""
    from vlmserve.cli.app import main

    monkeypatch.setenv("VLMSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "400")
    capsys.readouterr()
    try:
        main(["up", "--replicas", "2", "--port", "18050", "--max-model-len", "1024", "--print-plan"])
        code = 0
    except SystemExit as exited:
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "VLLM_CPU_OMP_THREADS_BIND=" in out and "--port 18052" in out
    assert "vllm.entrypoints.openai.api_server" in out


# ---- the real engine (one per session, shared) ---------------------------------------


@pytest.mark.engine
def test_real_engine_answers_text_and_image(embedded_engine) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=embedded_engine.base_url, timeout=120, trust_env=False) as client:
        text = client.post(
            "/v1/chat/completions",
            json={"model": embedded_engine.model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8},
        )
        assert text.status_code == 200, text.text
        text_usage = text.json()["usage"]
        assert text_usage["completion_tokens"] >= 1
        image = client.post(
            "/v1/chat/completions",
            json={
                "model": embedded_engine.model,
                "messages": [image_message("Hello there", tiny_png_data_url())],
                "max_tokens": 8,
            },
        )
        assert image.status_code == 200, image.text
        image_usage = image.json()["usage"]
        # the image adds its tiles' tokens (2x2 tiles + global view, 4 tokens each, plus markers)
        assert image_usage["prompt_tokens"] - text_usage["prompt_tokens"] >= 20
        metrics = client.get("/metrics").text
        assert "vllm:prompt_tokens" in metrics


@pytest.mark.engine
def test_real_engine_streams_with_usage(embedded_engine) -> None:  # type: ignore[no-untyped-def]
    from vlmserve.demo.run import stream_chat

    answer = stream_chat(
        embedded_engine.base_url, embedded_engine.model, [image_message("What is it?", tiny_png_data_url(seed=3))], 8, "image"
    )
    assert answer.completion_tokens == 8 and answer.prompt_tokens and answer.prompt_tokens > 20
    assert answer.time_to_first_token_s is not None and answer.time_to_first_token_s <= answer.end_to_end_s
    assert answer.answer


@pytest.mark.engine
def test_served_configuration_is_verified(embedded_engine) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=embedded_engine.base_url, timeout=30, trust_env=False) as client:
        served = read_served_config(client, embedded_engine.model)
        assert served.root == embedded_engine.model_path
        assert served.max_model_len == embedded_engine.max_model_len
        assert served.engine_version
        assert served.cache_config.get("block_size")
        asked_right = ExpectedConfig(
            embedded_engine.model, root=embedded_engine.model_path, max_model_len=embedded_engine.max_model_len
        )
        assert config_mismatches(served, asked_right) == []
        stale = ExpectedConfig(embedded_engine.model, root="/other/model", max_model_len=4096,
                               cache_config={"enable_prefix_caching": str(not served.cache_config.get("enable_prefix_caching") == "True")})  # fmt: skip
        problems = config_mismatches(served, stale)
        assert any(problem.startswith("max_model_len: asked 4096, serving 2048") for problem in problems)
        assert any(problem.startswith("model path: asked '/other/model'") for problem in problems)
        assert any(problem.startswith("enable_prefix_caching") for problem in problems)
        with pytest.raises(StaleReplica) as caught:
            read_served_config(client, "some-other-model")
        assert "lists model(s) embedded, not 'some-other-model'" in str(caught.value)


@pytest.mark.parametrize("name", ["deploy-embedded.yaml", "deploy-gpu-gemma.yaml"])
def test_example_specs_are_valid(name: str) -> None:

    from vlmserve.spec import load_deployment_spec

    spec = load_deployment_spec(REPO_ROOT / "examples" / name)
    kind = "gpu" if spec.devices == "gpu" else "cpu"
    argv = vllm_engine.engine_argv(spec, spec.model, spec.replica_ports()[0], kind)
    assert argv[argv.index("--model") + 1] == spec.model
    if kind == "gpu":
        assert vllm_engine.gpu_groups(spec.replicas, spec.engine_args.tensor_parallel_size, available=4) == ["0,1", "2,3"]


@pytest.mark.engine
@pytest.mark.hostile("SSRF straight at a replica: real vLLM started by up refuses a loopback image URL and fetches nothing")
def test_real_engine_fetches_no_media_from_unlisted_hosts(embedded_engine) -> None:  # type: ignore[no-untyped-def]
    """The gateway refuses remote media, and the engine behind it must too: `up` passes vLLM
    `--allowed-media-domains` (a name that never resolves when none are listed)."""
    import http.server
    import threading

    fetched: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            fetched.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.png"
        with httpx.Client(base_url=embedded_engine.base_url, timeout=120, trust_env=False) as client:
            answer = client.post(
                "/v1/chat/completions",
                json={"model": embedded_engine.model, "messages": [image_message("What is it?", url)], "max_tokens": 4},
            )
    finally:
        server.shutdown()
    assert answer.status_code == 400, answer.text
    assert "allowed" in answer.json()["error"]["message"].lower(), answer.text
    assert fetched == []
