"""The embedded model's LoRA adapters on the real vLLM CPU engine: `up`'s checks pass, and each adapter answers
differently from the base model and from every other adapter at temperature 0."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import httpx
import pytest

from vlmserve.deploy.readiness import image_message, tiny_png_data_url
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.demo.run import demo_spec
from vlmserve.engines.embedded_adapters import adapter_name
from vlmserve.spec import DeploymentSpec
from vlmserve.vllm_flags import VLLM_LORA_RANKS

ADAPTERS = 8
"""More adapters than slots (max_loras 2): vLLM swaps them in and out of the batch's slots."""


def lora_spec(replicas: int = 1) -> DeploymentSpec:
    base = demo_spec(name="test-lora", replicas=replicas, max_model_len=1024).model_dump()
    return DeploymentSpec.model_validate({
        **base, "lora_modules": {adapter_name(index): f"embedded:{index}" for index in range(ADAPTERS)},
        "max_loras": 2, "max_cpu_loras": ADAPTERS,
    })


@pytest.fixture(scope="module")
def lora_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, typing.Any]]:
    """One real replica serving the embedded model and its eight adapters, started (and checked) by the supervisor."""
    with Supervisor(lora_spec(), state_dir=tmp_path_factory.mktemp("lora")) as supervisor:
        replica = supervisor.replicas[0]
        yield replica.plan.url, replica.served


def answer(base_url: str, model: str, content: typing.Any = "Describe the picture, please.") -> str:
    reply = httpx.post(f"{base_url}/v1/chat/completions", timeout=120, trust_env=False, json={
        "model": model, "messages": [{"role": "user", "content": content} if isinstance(content, str) else content],
        "max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
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

