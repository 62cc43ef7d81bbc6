"""The embedded model's LoRA adapters on the real vLLM CPU engine: `up`'s checks pass, and each adapter answers
differently from the base model and from every other adapter at temperature 0."""

from __future__ import annotations

import asyncio
import json
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.helpers.browser import find_chromium, visit_page
from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway
from vlmserve.demo.run import demo_spec
from vlmserve.deploy.readiness import image_message, tiny_png_data_url
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.engines.embedded_adapters import adapter_name, ensure_adapter
from vlmserve.engines.lora import lora_argv
from vlmserve.engines.vllm import RUNTIME_LORA_ENV
from vlmserve.spec import DeploymentSpec
from vlmserve.vllm_flags import VLLM_LORA_RANKS, installed_vllm_flags

ADAPTERS = 8
"""More adapters than slots (max_loras 2): vLLM swaps them in and out of the batch's slots."""


REPLICAS = 2


def lora_spec() -> DeploymentSpec:
    """Two replicas, one core each, behind no supervisor gateway (the tests start their own, with keys), with
    runtime adapter loading on as `up` turns it on behind its gateway."""
    base = demo_spec(name="test-lora", replicas=REPLICAS, max_model_len=1024).model_dump()
    return DeploymentSpec.model_validate(
        {
            **base,
            "gateway": False,
            "cpu_threads_per_replica": 1,
            "env": {RUNTIME_LORA_ENV: "1"},
            "lora_modules": {adapter_name(index): f"embedded:{index}" for index in range(ADAPTERS)},
            "max_loras": 2,
            "max_cpu_loras": ADAPTERS + 2,
        }
    )


@pytest.fixture(scope="module")
def lora_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], list[typing.Any], str]]:
    """Two real replicas serving the embedded model and its eight adapters, started (and checked) by the supervisor:
    (their URLs, what each serves, the model directory)."""
    with Supervisor(lora_spec(), state_dir=tmp_path_factory.mktemp("lora")) as supervisor:
        yield (
            [replica.plan.url for replica in supervisor.replicas],
            [r.served for r in supervisor.replicas],
            supervisor.model_path,
        )


@pytest.fixture(scope="module")
def lora_replica(lora_replicas: tuple[list[str], list[typing.Any], str]) -> tuple[str, typing.Any]:
    """The first of them."""
    return lora_replicas[0][0], lora_replicas[1][0]


def answer(base_url: str, model: str, content: typing.Any = "Describe the picture, please.") -> str:
    reply = httpx.post(
        f"{base_url}/v1/chat/completions",
        timeout=120,
        trust_env=False,
        json={
            "model": model,
            "messages": [{"role": "user", "content": content} if isinstance(content, str) else content],
            "max_tokens": 8,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


@pytest.mark.engine
def test_every_adapter_is_listed_checked_and_changes_the_answer(lora_replica: tuple[str, typing.Any]) -> None:
    base_url, served = lora_replica
    names = [adapter_name(index) for index in range(ADAPTERS)]
    assert sorted(served.adapters) == sorted(names)  # readiness read them from /v1/models (and 1-token checked each)
    answers = {model: answer(base_url, model) for model in ["embedded", *names]}
    assert len(set(answers.values())) == ADAPTERS + 1, answers  # nine models, nine different answers
    assert answer(base_url, names[3]) == answers[names[3]]  # temperature 0: the same answer again, after swaps
    image = image_message("What is in this image?", tiny_png_data_url())
    assert answer(base_url, names[0], image) != answer(base_url, "embedded", image)  # adapters apply with images too


@pytest.mark.engine
def test_vlmserves_lora_ranks_are_the_installed_vllms() -> None:
    from vllm.config.lora import MaxLoRARanks

    assert tuple(typing.get_args(MaxLoRARanks)) == VLLM_LORA_RANKS
    flags = installed_vllm_flags()
    assert flags is not None
    spec = DeploymentSpec.model_validate({"lora_modules": {"a": "/a"}, "max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4})
    for option in (item for item in lora_argv(spec) if item.startswith("--")):  # every flag up passes is vLLM's
        assert flags[option[2:].replace("-", "_")].name == option


KEYS = """tenants:
  - name: clinic
    keys: [sk-clinic]
    adapters: [tiny-lora-0]
    base_model: false
  - name: ops
    keys: [sk-ops]
"""


@pytest.mark.engine
@pytest.mark.hostile(
    "gateway on the real engine: a key limited to adapter A gets 403 for adapter B and the base model, "
    "404 naming its own models for an unknown one"
)
async def test_gateway_limits_a_key_to_its_adapter_and_answers_as_the_replica(
    lora_replicas: tuple[list[str], list[typing.Any], str], tmp_path: Path
) -> None:
    urls = lora_replicas[0]
    base_url = urls[0]
    names = [adapter_name(index) for index in range(ADAPTERS)]
    direct = {model: answer(base_url, model) for model in names}  # before the gateway shares this event loop
    assert {model: answer(urls[1], model) for model in names} == direct  # the replicas answer alike
    keys, audit = tmp_path / "keys.yaml", tmp_path / "audit.jsonl"
    keys.write_text(KEYS)
    clinic, ops = {"Authorization": "Bearer sk-clinic"}, {"Authorization": "Bearer sk-ops"}

    def body(model: str) -> dict[str, typing.Any]:
        return chat_body("Describe the picture, please.", stream=False, model=model, temperature=0.0)

    async with (
        running_gateway(urls, keys_file=keys, audit_log=audit, policy="adapter-affinity") as gateway,
        aiohttp.ClientSession() as session,
    ):
        for model in names:  # at temperature 0, through the gateway = the replica's own answer
            through = await post_chat(session, gateway.base_url, body(model), ops)
            assert through.status == 200 and through.body["choices"][0]["message"]["content"] == direct[model], model
        mine = await post_chat(session, gateway.base_url, body(names[0]), clinic)
        assert mine.status == 200 and mine.body["choices"][0]["message"]["content"] == direct[names[0]]
        for model, what in ((names[1], f"adapter '{names[1]}'"), ("embedded", "the base model 'embedded'")):
            other = await post_chat(session, gateway.base_url, body(model), clinic)
            assert other.status == 403 and other.body["error"]["code"] == "model_not_allowed"
            assert other.body["error"]["message"] == f"tenant 'clinic' may not use {what}: it may use {names[0]}"
        unknown = await post_chat(session, gateway.base_url, body("tiny-lora-99"), clinic)
        assert unknown.status == 404 and unknown.body["error"]["message"].endswith(f"choose one of {names[0]}")
        unknown = await post_chat(session, gateway.base_url, body("tiny-lora-99"), ops)
        assert unknown.status == 404 and all(name in unknown.body["error"]["message"] for name in [*names, "embedded"])
        async with session.get(f"{gateway.base_url}/v1/models", headers=clinic) as listed:
            assert [entry["id"] for entry in (await listed.json())["data"]] == [names[0]]
        async with session.get(f"{gateway.base_url}/metrics") as scraped:
            metrics = await scraped.text()
    assert f'vlmserve_gateway_adapter_requests_total{{adapter="{names[0]}",status="200"}} 2.0' in metrics
    assert f'vlmserve_gateway_adapter_requests_total{{adapter="{names[1]}",status="403"}} 1.0' in metrics
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["adapter"] for line in lines if line["tenant"] == "clinic"] == [names[0], names[1], None, None]


@pytest.mark.engine
def test_bench_spreads_a_zipf_mix_over_the_adapters_and_reports_each(
    lora_replica: tuple[str, typing.Any], cli: typing.Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, artifacts_dir: Path
) -> None:
    base_url, _ = lora_replica
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))  # the run is stored there, for `vlmserve report`
    out = tmp_path / "lora.json"
    done = cli(
        "bench",
        "--base-url",
        base_url,
        "--model",
        "embedded",
        "--no-progress",
        "--label",
        "lora-zipf",
        "--lora-adapters",
        f"embedded:{ADAPTERS}",
        "--lora-popularity",
        "zipf",
        "--lora-skew",
        "1.2",
        "--concurrency",
        4,
        "--num-requests",
        48,
        "--input-len",
        32,
        "--output-len",
        8,
        "--json-out",
        out,
    )
    assert done.code == 0, done.err
    summary = json.loads(out.read_text())
    by_adapter = summary["by_adapter"]
    assert sum(block["requests"] for block in by_adapter.values()) == 48 and len(by_adapter) >= 4
    top = next(iter(by_adapter))
    assert top == adapter_name(0) and by_adapter[top]["share"] > 0.25  # Zipf: the first listed is the most popular
    for block in by_adapter.values():
        assert block["failed"] == 0 and block["ttft_ms"]["p50"] > 0 and block["first_use_ttft_ms"] > 0
    assert any(block["first_use_penalty_ms"] is not None for block in by_adapter.values())
    assert "per LoRA adapter" in done.out and "first-use penalty" in done.out
    if find_chromium() is None:
        pytest.skip("chromium not installed: the HTML report's table is not checked")
    page = tmp_path / "report.html"
    assert cli("report", summary["meta"]["run_id"], "--html", page).code == 0
    visit = visit_page(
        page,
        ready_js="document.readyState === 'complete'",
        checks_js={
            "rows": "[...document.querySelectorAll('tr')].filter(r => r.textContent.includes('tiny-lora-')).length",
            "title": "[...document.querySelectorAll('table caption, h2, h3, th')].map(e => e.textContent).join('|')",
            "top": f"[...document.querySelectorAll('tr')].some(r => r.textContent.includes('{top}'))",
        },
        screenshot=artifacts_dir / "report-lora-adapters.png",
    )
    assert visit.console_errors == [], visit.console_errors
    assert visit.checks["rows"] == len(by_adapter) and visit.checks["top"] is True
    assert "first-use penalty ms" in visit.checks["title"]


@pytest.mark.engine
async def test_an_adapter_loaded_through_the_gateway_during_a_bench_fails_no_request_and_answers_everywhere(
    lora_replicas: tuple[list[str], list[typing.Any], str], tmp_path: Path
) -> None:
    urls, _, model_path = lora_replicas
    new_name, new_path = adapter_name(ADAPTERS + 1), ensure_adapter(ADAPTERS + 1)
    keys, out = tmp_path / "keys.yaml", tmp_path / "bench.json"
    keys.write_text("tenants:\n  - name: ops\n    keys: [sk-ops]\n    admin: true\n")
    admin = {"Authorization": "Bearer sk-ops"}
    async with running_gateway(urls, keys_file=keys, policy="adapter-affinity") as gateway, aiohttp.ClientSession() as session:
        bench = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vlmserve",
            "bench",
            "--base-url",
            gateway.base_url,
            "--model",
            "embedded",
            "--api-key",
            "sk-ops",
            "--lora-adapters",
            f"embedded:{ADAPTERS}",
            "--lora-popularity",
            "zipf",
            "--concurrency",
            "4",
            "--num-requests",
            "40",
            "--input-len",
            "32",
            "--output-len",
            "16",
            "--tokenizer",
            model_path,
            "--no-store",
            "--no-progress",
            "--json-out",
            str(out),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        deadline = asyncio.get_running_loop().time() + 120
        while gateway.gateway.requests_in_progress < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        in_flight = gateway.gateway.requests_in_progress
        status, loaded = await admin_post(
            session, f"{gateway.base_url}/admin/lora/load", {"lora_name": new_name, "lora_path": str(new_path)}, admin
        )
        assert status == 200 and sorted(loaded["replicas"].values()) == ["ok"] * REPLICAS, loaded
        assert in_flight >= 2  # the bench was under way when the adapter was loaded
        _, err = await bench.communicate()
        assert bench.returncode == 0, err.decode()[-2000:]
        summary = json.loads(out.read_text())
        assert summary["requests"]["failed"] == 0 and summary["requests"]["completed"] == 40
        through = await post_chat(
            session,
            gateway.base_url,
            chat_body("Describe the picture, please.", stream=False, model=new_name, temperature=0.0),
            admin,
        )
        assert through.status == 200
        new_answer = through.body["choices"][0]["message"]["content"]
        direct = await asyncio.gather(*(asyncio.to_thread(answer, url, new_name) for url in urls))
        assert direct == [new_answer] * REPLICAS  # every replica serves it, and gives the gateway's answer
        assert new_answer != await asyncio.to_thread(answer, urls[0], adapter_name(0))
        status, _ = await admin_post(session, f"{gateway.base_url}/admin/lora/unload", {"lora_name": new_name}, admin)
        assert status == 200
        gone = await post_chat(session, gateway.base_url, chat_body("x", stream=False, model=new_name), admin)
        assert gone.status == 404 and new_name not in gone.body["error"]["message"].split("choose one of")[1]


async def admin_post(session: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> tuple[int, dict]:
    async with session.post(url, json=body, headers=headers) as reply:
        return reply.status, await reply.json()
