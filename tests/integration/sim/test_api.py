"""The sim engine's OpenAI surface, against a real engine subprocess: shapes, options, errors."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "sim-test-model"
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def engine() -> Iterator[SimHandle]:
    with start_sim_engine(
        model=MODEL, ttft_ms=5, itl_ms=1, seed=11, max_model_len=MAX_MODEL_LEN, num_kv_blocks=256,
        output_len="fixed:7", image_budgets=[70, 140, 280, 560, 1120],
    ) as handle:  # fmt: skip
        yield handle


def _chat(engine: SimHandle, **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "Describe the radiograph."}], **body}
    return httpx.post(f"{engine.base_url}/v1/chat/completions", json=payload, timeout=30)


def _sse_events(response: httpx.Response) -> list[Any]:
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _png_data_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _assert_openai_error(response: httpx.Response, status: int, err_type: str, fragment: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["type"] == err_type and error["code"] == status
    assert fragment in error["message"], error["message"]


# -- successful requests ---------------------------------------------------------------------------
def test_chat_completion_shape_and_usage(engine: SimHandle) -> None:
    body = _chat(engine, max_tokens=5).json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5 and usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_streaming_chat_sends_role_content_finish_usage_done(engine: SimHandle) -> None:
    response = _chat(engine, max_tokens=6, ignore_eos=True, stream=True, stream_options={"include_usage": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 6
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)


def test_completions_streaming_and_not(engine: SimHandle) -> None:
    plain = httpx.post(f"{engine.base_url}/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 3}).json()
    assert plain["object"] == "text_completion" and plain["usage"]["completion_tokens"] == 3
    streamed = httpx.post(
        f"{engine.base_url}/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 4, "stream": True}
    )
    events = _sse_events(streamed)
    assert events[-1] == "[DONE]" and len(events) == 5
    assert "".join(event["choices"][0]["text"] for event in events[:-1])


def test_output_length_distribution_min_tokens_and_ignore_eos(engine: SimHandle) -> None:
    natural = _chat(engine).json()  # engine draws fixed:7
    assert natural["usage"]["completion_tokens"] == 7 and natural["choices"][0]["finish_reason"] == "stop"
    assert _chat(engine, min_tokens=12).json()["usage"]["completion_tokens"] == 12
    forced = _chat(engine, max_tokens=20, ignore_eos=True).json()
    assert forced["usage"]["completion_tokens"] == 20 and forced["choices"][0]["finish_reason"] == "length"


def test_stop_string_cuts_the_answer_after_min_tokens(engine: SimHandle) -> None:
    body = _chat(engine, max_tokens=1000, ignore_eos=True, stop=["."], seed=3).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "."
    assert "." not in choice["message"]["content"]  # the stop string itself is not returned
    assert body["usage"]["completion_tokens"] < 1000
    late = _chat(engine, max_tokens=1000, ignore_eos=True, min_tokens=100, stop=["."], seed=3).json()
    assert late["choices"][0]["finish_reason"] == "stop" and not late["choices"][0]["message"]["content"].endswith(".")
    assert 100 <= late["usage"]["completion_tokens"] < 1000  # stops are not checked before min_tokens


def test_same_seed_same_answer(engine: SimHandle) -> None:
    first = _chat(engine, max_tokens=30, ignore_eos=True, seed=42).json()["choices"][0]["message"]["content"]
    second = _chat(engine, max_tokens=30, ignore_eos=True, seed=42).json()["choices"][0]["message"]["content"]
    other = _chat(engine, max_tokens=30, ignore_eos=True, seed=43).json()["choices"][0]["message"]["content"]
    assert first == second != other


def test_temperature_zero_answer_is_a_function_of_the_prompt_and_its_images(engine: SimHandle) -> None:
    def answer(messages: list[dict[str, Any]] | None = None, **body: Any) -> str:
        extra = {"messages": messages} if messages else {}
        response = _chat(engine, max_tokens=30, ignore_eos=True, temperature=0, **extra, **body)
        return response.json()["choices"][0]["message"]["content"]

    def with_image(colour: tuple[int, int, int]) -> list[dict[str, Any]]:
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        return [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What colour is this?"}],
            }
        ]

    first = answer()
    _chat(engine, max_tokens=3)  # other requests in between do not change a greedy answer
    assert answer() == first
    assert answer(messages=[{"role": "user", "content": "Another question."}]) != first
    red, blue = answer(with_image((200, 10, 10))), answer(with_image((10, 10, 200)))
    assert red == answer(with_image((200, 10, 10))) and red != blue
    # without temperature 0 (vLLM's default sampling) answers still vary request to request
    sampled = [_chat(engine, max_tokens=30, ignore_eos=True).json()["choices"][0]["message"]["content"] for _ in range(2)]
    assert sampled[0] != sampled[1]
    _assert_openai_error(
        _chat(engine, temperature="cold"), 400, "BadRequestError", "'temperature' must be a number >= 0, got 'cold'"
    )
    _assert_openai_error(_chat(engine, temperature=-1), 400, "BadRequestError", "'temperature' must be a number >= 0, got -1")


def test_images_count_as_vision_tokens_and_budgets_are_selectable(engine: SimHandle) -> None:
    text_only = _chat(engine, max_tokens=1).json()["usage"]["prompt_tokens"]
    parts = [{"type": "text", "text": "Describe the radiograph."}, {"type": "image_url", "image_url": {"url": _png_data_url()}}]
    messages = [{"role": "user", "content": parts}]
    default = _chat(engine, messages=messages, max_tokens=1).json()["usage"]["prompt_tokens"]
    assert default - text_only == 256
    small = _chat(engine, messages=messages, max_tokens=1, mm_processor_kwargs={"max_soft_tokens": 70}).json()
    assert small["usage"]["prompt_tokens"] - text_only == 70
    _assert_openai_error(
        _chat(engine, messages=messages, max_tokens=1, mm_processor_kwargs={"max_soft_tokens": 100}),
        400, "BadRequestError", "max_soft_tokens=100 is not supported; choose one of 70, 140, 280, 560, 1120",
    )  # fmt: skip


def test_models_version_tokenize_and_health(engine: SimHandle) -> None:
    models = httpx.get(f"{engine.base_url}/v1/models").json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert httpx.get(f"{engine.base_url}/health").status_code == 200
    assert httpx.get(f"{engine.base_url}/version").json()["version"].startswith("sim-")
    messages = [{"role": "user", "content": "Describe the radiograph."}]
    counted = httpx.post(f"{engine.base_url}/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert counted["count"] == _chat(engine, max_tokens=1).json()["usage"]["prompt_tokens"]
    again = httpx.post(f"{engine.base_url}/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert again["tokens"] == counted["tokens"]  # deterministic token ids


def test_metrics_use_vllm_names_types_and_labels(engine: SimHandle) -> None:
    _chat(engine, max_tokens=3)
    text = engine.metrics_text()
    types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
    }
    for name, kind in types.items():
        # prometheus_client (which vLLM uses too) names a counter's TYPE line with or without _total
        assert f"# TYPE {name} {kind}" in text or f"# TYPE {name}_total {kind}" in text, name
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}}' in text
    assert f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}}' in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001"' in text
    assert "_created" not in text


# -- errors ------------------------------------------------------------------------------------------
def test_malformed_json_is_a_400(engine: SimHandle) -> None:
    response = httpx.post(
        f"{engine.base_url}/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    _assert_openai_error(response, 400, "BadRequestError", "not valid JSON")


def test_missing_messages_and_prompt_are_400s(engine: SimHandle) -> None:
    response = httpx.post(f"{engine.base_url}/v1/chat/completions", json={"model": MODEL})
    _assert_openai_error(response, 400, "BadRequestError", "'messages' is required")
    response = httpx.post(f"{engine.base_url}/v1/completions", json={"model": MODEL})
    _assert_openai_error(response, 400, "BadRequestError", "'prompt' is required")
    response = httpx.post(f"{engine.base_url}/v1/chat/completions", json=[1, 2])
    _assert_openai_error(response, 400, "BadRequestError", "must be a JSON object")


def test_bad_field_types_are_400s(engine: SimHandle) -> None:
    _assert_openai_error(_chat(engine, max_tokens="many"), 400, "BadRequestError", "'max_tokens' must be an integer")
    _assert_openai_error(
        _chat(engine, messages=[{"content": "hi"}]), 400, "BadRequestError", "messages[0] must be an object with a string 'role'"
    )
    _assert_openai_error(
        _chat(engine, stream_options={"include_usage": True}), 400, "BadRequestError", "only be defined when `stream=True`"
    )


def test_unknown_model_is_a_404_with_vllms_wording(engine: SimHandle) -> None:
    _assert_openai_error(_chat(engine, model="gpt-9"), 404, "NotFoundError", "The model `gpt-9` does not exist.")


def test_too_long_prompt_is_refused_as_vllm_refuses_it(engine: SimHandle) -> None:
    long_text = " ".join(["word"] * (MAX_MODEL_LEN + 10))
    response = _chat(engine, messages=[{"role": "user", "content": long_text}])
    _assert_openai_error(
        response,
        400,
        "BadRequestError",
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains",
    )
    response = _chat(engine, max_tokens=MAX_MODEL_LEN + 1)
    _assert_openai_error(
        response, 400, "BadRequestError", f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than max_model_len={MAX_MODEL_LEN}"
    )


def test_prompt_plus_max_tokens_over_the_limit_is_clamped_like_vllm(engine: SimHandle) -> None:
    text = " ".join(["word"] * (MAX_MODEL_LEN - 100))
    body = _chat(engine, messages=[{"role": "user", "content": text}], max_tokens=500, ignore_eos=True).json()
    assert body["usage"]["total_tokens"] == MAX_MODEL_LEN and body["choices"][0]["finish_reason"] == "length"


def test_non_image_in_an_image_part_is_a_400(engine: SimHandle) -> None:
    not_an_image = "data:image/png;base64," + base64.b64encode(b"this is plain text, not a PNG").decode()
    parts = [{"type": "image_url", "image_url": {"url": not_an_image}}]
    response = _chat(engine, messages=[{"role": "user", "content": parts}])
    _assert_openai_error(response, 400, "BadRequestError", "does not hold a readable image")
    parts = [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]
    _assert_openai_error(
        _chat(engine, messages=[{"role": "user", "content": parts}]), 400, "BadRequestError", "http(s) URL or a base64 data URL"
    )
    parts = [{"type": "audio", "audio": {}}]
    _assert_openai_error(
        _chat(engine, messages=[{"role": "user", "content": parts}]), 400, "BadRequestError", "unsupported type 'audio'"
    )


def test_client_disconnect_aborts_the_request(engine: SimHandle) -> None:
    import time

    aborted_before = _abort_count(engine)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{engine.base_url}/v1/chat/completions", json=body, timeout=10) as response:
        for line in response.iter_lines():
            if '"content":" ' in line.replace('"content": "', '"content":"'):
                break  # read one token, then hang up
    deadline = time.monotonic() + 10
    while _abort_count(engine) < aborted_before + 1:
        assert time.monotonic() < deadline, "the engine never noticed the client leaving"
        time.sleep(0.05)
    assert httpx.get(f"{engine.base_url}/debug/state").json()["num_running"] == 0


def _abort_count(engine: SimHandle) -> float:
    prefix = f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}} '
    for line in engine.metrics_text().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def test_engine_still_serves_after_errors(engine: SimHandle) -> None:
    assert _chat(engine, max_tokens=2).status_code == 200


def test_engine_runs_in_process_in_a_thread() -> None:
    from vlmserve.engines.sim.options import SimEngineConfig
    from vlmserve.engines.sim.server import SimEngineThread

    with SimEngineThread(SimEngineConfig(model="in-process", port=0, ttft_ms=1, itl_ms=1)) as engine:
        assert engine.port and httpx.get(f"{engine.base_url}/health").status_code == 200
        body = {"model": "in-process", "prompt": "hi", "max_tokens": 3}
        assert httpx.post(f"{engine.base_url}/v1/completions", json=body).json()["usage"]["completion_tokens"] == 3


def test_reject_over_context_refuses_prompt_plus_max_tokens_like_earlier_vllm() -> None:
    from vlmserve.engines.sim.options import SimEngineConfig
    from vlmserve.engines.sim.server import SimEngineThread

    config = SimEngineConfig(
        model=MODEL, port=0, ttft_ms=1, itl_ms=1, max_model_len=256, num_kv_blocks=64, reject_over_context=True
    )
    with SimEngineThread(config) as strict:
        body = {"model": MODEL, "messages": [{"role": "user", "content": " ".join(["word"] * 100)}], "max_tokens": 200}
        response = httpx.post(f"{strict.base_url}/v1/chat/completions", json=body)
        _assert_openai_error(
            response, 400, "BadRequestError", "This model's maximum context length is 256 tokens. However, you requested"
        )
        assert "in the messages, 200 in the completion" in response.json()["error"]["message"]
