"""Is a replica ready, and is it serving what was asked for?

"Ready" is stronger than /health: the model must be listed, a 1-token generation must
succeed, and for a VLM a 1-token generation *with an image* must succeed (the vision
path loads lazily and fails on its own). Then the replica's own description of itself
(/v1/models, /version, the `vllm:cache_config_info` metric) is compared with the spec,
so a stale engine still holding the port with an older configuration is refused rather
than benchmarked by mistake.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from vlmserve import vllm_names
from vlmserve.engines.launcher import ExpectedConfig  # what a replica must serve: the launcher says
from vlmserve.json_types import JSONObject

READY_POLL_S = 0.2
"""Between readiness polls: a sim replica is up in about a second, so a longer pause is mostly waiting
(a poll of a replica still starting is one refused connection or one /health call)."""
CHECK_TIMEOUT_S = 120.0
"""Per-request timeout for the readiness generations (the first one compiles kernels)."""


class NotReadyYet(Exception):
    """A transient state: keep polling."""


class ReadinessAborted(Exception):
    """The process died or the supervisor is stopping: stop waiting."""


@dataclass
class ServedConfig:
    """What a replica says it serves."""

    model_id: str
    root: str | None = None
    max_model_len: int | None = None
    engine_version: str | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    adapters: tuple[str, ...] = ()
    """LoRA adapters /v1/models lists (entries with a parent model)."""

    def as_dict(self) -> JSONObject:
        return {
            "model_id": self.model_id,
            "root": self.root,
            "max_model_len": self.max_model_len,
            "engine_version": self.engine_version,
            "kv_blocks": self.cache_config.get("num_gpu_blocks") or self.cache_config.get("num_cpu_blocks"),
            "block_size": self.cache_config.get("block_size"),
            "adapters": list(self.adapters),
        }


def tiny_png_data_url(width: int = 64, height: int = 64, seed: int = 0) -> str:
    """A small deterministic PNG as a data URL: a gradient with a coloured square."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height))
    pixels = image.load()
    assert pixels is not None
    for x in range(width):
        for y in range(height):
            pixels[x, y] = ((x * 4 + seed * 37) % 256, (y * 4) % 256, ((x + y) * 2) % 256)
    ImageDraw.Draw(image).rectangle((width // 4, height // 4, width * 3 // 4, height * 3 // 4), fill=((seed * 71) % 256, 200, 40))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_message(text: str, data_url: str) -> JSONObject:
    """An OpenAI chat message with one image and a text part."""
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}}, {"type": "text", "text": text}]}


def wait_until_ready(
    base_url: str, expected: ExpectedConfig, *, timeout_s: float, keep_waiting: Callable[[], bool]
) -> ServedConfig:
    """Poll until the replica passes every readiness check, then return what it serves.

    `keep_waiting()` is asked between polls; when it says no (process died, stopping),
    ReadinessAborted is raised. TimeoutError when timeout_s passes first.
    """
    deadline = time.monotonic() + timeout_s
    last_problem = "no answer yet"
    with httpx.Client(base_url=base_url, timeout=CHECK_TIMEOUT_S, trust_env=False) as client:
        while True:
            if not keep_waiting():
                raise ReadinessAborted(last_problem)
            try:
                return check_ready(client, expected)
            except NotReadyYet as problem:
                last_problem = str(problem)
            except httpx.TransportError as problem:
                last_problem = f"{type(problem).__name__}: {problem}"
            if time.monotonic() >= deadline:
                raise TimeoutError(last_problem)
            time.sleep(READY_POLL_S)


def check_ready(client: httpx.Client, expected: ExpectedConfig) -> ServedConfig:
    """One pass of the readiness checks; NotReadyYet names the first one that failed."""
    health = client.get("/health", timeout=5)
    if health.status_code != 200:
        raise NotReadyYet(f"/health answered {health.status_code}")
    served = read_served_config(client, expected.served_model_name, expected.adapters)
    _one_token(client, expected.served_model_name, [{"role": "user", "content": "Hello"}], "text")
    for adapter in expected.adapters:  # each adapter loads (and can fail) on its own first request
        _one_token(client, adapter, [{"role": "user", "content": "Hello"}], f"text with adapter '{adapter}'")
    if expected.expects_images is not False:
        message = image_message("What is in this image?", tiny_png_data_url())
        _one_token(client, expected.served_model_name, [message], "image", text_only_ok=expected.expects_images is None)
    return served


def _one_token(client: httpx.Client, model: str, messages: list[JSONObject], what: str, text_only_ok: bool = False) -> None:
    reply = client.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 1, "temperature": 0.0})
    if reply.status_code == 400 and text_only_ok:
        return  # a text-only model refuses images; that is its configuration, not a fault
    if reply.status_code != 200:
        raise NotReadyYet(f"1-token {what} generation answered {reply.status_code}: {reply.text[:200]}")
    usage = reply.json().get("usage") or {}
    if not usage.get("completion_tokens"):
        raise NotReadyYet(f"1-token {what} generation returned no tokens")


def read_served_config(client: httpx.Client, served_model_name: str, adapters: tuple[str, ...] = ()) -> ServedConfig:
    """Read /v1/models (which must list the model and every adapter), /version and the cache_config_info metric."""
    models = client.get("/v1/models", timeout=10)
    if models.status_code != 200:
        raise NotReadyYet(f"/v1/models answered {models.status_code}")
    entries = models.json().get("data") or []
    entry = next((item for item in entries if item.get("id") == served_model_name), None)
    if entry is None:
        listed = ", ".join(str(item.get("id")) for item in entries) or "nothing"
        raise StaleReplica(f"it lists model(s) {listed}, not '{served_model_name}'")
    missing = sorted(set(adapters) - {str(item.get("id")) for item in entries})
    if missing:
        raise StaleReplica(f"it does not list adapter(s) {', '.join(missing)} in /v1/models")
    served = ServedConfig(
        model_id=entry["id"],
        root=entry.get("root"),
        max_model_len=entry.get("max_model_len"),
        adapters=tuple(sorted(str(item.get("id")) for item in entries if item.get("parent"))),
    )
    version = client.get("/version", timeout=10)
    if version.status_code == 200:
        served.engine_version = version.json().get("version")
    metrics = client.get("/metrics", timeout=10)
    if metrics.status_code == 200:
        served.cache_config = cache_config_labels(metrics.text)
    return served


class StaleReplica(Exception):
    """The endpoint answers, but with a configuration other than the one asked for."""


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    """Labels of vLLM's `vllm:cache_config_info` gauge (block size, KV dtype, prefix caching...)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name in (vllm_names.CACHE_CONFIG_INFO, vllm_names.underscored(vllm_names.CACHE_CONFIG_INFO)):
                for sample in family.samples:
                    return dict(sample.labels)
    except ValueError:
        return {}
    return {}


def config_mismatches(served: ServedConfig, expected: ExpectedConfig) -> list[str]:
    """Each way the replica differs from the spec, as 'what: asked X, serving Y'."""
    problems = []
    if served.model_id != expected.served_model_name:
        problems.append(f"model: asked {expected.served_model_name!r}, serving {served.model_id!r}")
    if expected.root is not None and served.root is not None and served.root != expected.root:
        problems.append(f"model path: asked {expected.root!r}, serving {served.root!r}")
    if expected.max_model_len is not None and served.max_model_len != expected.max_model_len:
        problems.append(f"max_model_len: asked {expected.max_model_len}, serving {served.max_model_len}")
    for label, wanted in expected.cache_config.items():
        have = served.cache_config.get(label)
        if have is not None and have != wanted:
            problems.append(f"{label}: asked {wanted}, serving {have}")
    return problems
