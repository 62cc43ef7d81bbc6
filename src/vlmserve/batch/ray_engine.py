"""`vlmserve batch --runner ray --ray-engine MODEL`: no endpoint; Ray starts the vLLM engines.

Ray Data's LLM processor (`ray.data.llm.vLLMEngineProcessorConfig`) starts `--ray-workers`
vLLM engines on the cluster and streams the rows through them; this module only translates:
a chat line's body into the engine stage's row (messages + sampling params) and the engine's
answer back into the same output row the HTTP sender makes (`ray_sender.RESULT_COLUMNS`), so
the driver (`ray_runner`) writes, counts and resumes exactly as for an endpoint.

Only /v1/chat/completions lines can go to an engine this way; other lines get an error record
(`unsupported_url`), written by the driver. The answer body is chat.completion-shaped and
built here, not by an OpenAI server: `finish_reason` is inferred ("length" when the engine
produced max_tokens tokens, else "stop"). A row the engine fails on (a prompt longer than the
model allows) becomes a 400 answer with the engine's message, and the job goes on.

What works on a CPU-only machine (vLLM's CPU build), found by trying: one engine per
placement bundle of {CPU: 1}, gpu_memory_utilization 0.05 (the CPU backend sizes its KV cache
from VLLM_CPU_KVCACHE_SPACE instead) and log_engine_metrics off (docs/batch.md).
"""

from __future__ import annotations

import json
import time
import uuid
from types import ModuleType
from typing import Any

from vlmserve.batch.output import Result
from vlmserve.json_types import JSONObject

ENGINE_URL = "/v1/chat/completions"
UNSUPPORTED = "unsupported_url"
DEFAULT_MAX_TOKENS = 256
"""OpenAI's default is 'until the model stops'; vLLM's SamplingParams default is 16. A batch line
without max_tokens gets this, said in docs/batch.md."""


def engine_row(row: dict[str, Any]) -> dict[str, Any]:
    """A request row (custom_id, url, body as JSON text) -> what the engine stage reads.

    Every row carries the same sampling keys, so a block of rows has one schema."""
    body = json.loads(row["body"])
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    sampling = {
        "max_tokens": int(max_tokens),
        "temperature": float(body.get("temperature", 1.0)),
        "top_p": float(body.get("top_p", 1.0)),
    }
    # the line's model goes under another name: a `model` column names a LoRA adapter to Ray's engine stage
    return {
        "custom_id": row["custom_id"],
        "request_model": str(body.get("model") or ""),
        "messages": body["messages"],
        "sampling_params": sampling,
    }


def result_row(row: dict[str, Any]) -> dict[str, Any]:
    """The engine's answer -> the driver's result row (the same columns as the HTTP sender's)."""
    custom_id = str(row["custom_id"])
    error = row.get("__inference_error__") or ""
    if error:
        result = Result.answered(custom_id, 400, None, {"error": {"message": str(error)[:2000], "type": "engine_error"}})
    else:
        prompt, completion = int(row.get("num_input_tokens") or 0), int(row.get("num_generated_tokens") or 0)
        max_tokens = int((row.get("sampling_params") or {}).get("max_tokens") or 0)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        body = {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": row.get("request_model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": row.get("generated_text") or ""},
                    "finish_reason": "length" if max_tokens and completion >= max_tokens else "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
        result = Result.answered(custom_id, 200, request_id, body)
    return {
        "custom_id": custom_id,
        "line": result.line,
        "cause": result.cause or "",
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "retries": 0,
        "no_answer": "",
    }


def engine_processor(ray: ModuleType, model: str, workers: int, engine_kwargs: JSONObject, batch_size: int) -> Any:
    """Ray Data's vLLM processor: `workers` engines, each on one GPU where the cluster has GPUs,
    else on one CPU bundle with the settings vLLM's CPU build needs."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    on_gpu = float(ray.cluster_resources().get("GPU", 0)) > 0
    kwargs: JSONObject = {} if on_gpu else {"gpu_memory_utilization": 0.05}
    config = vLLMEngineProcessorConfig(
        model_source=model,
        engine_kwargs={**kwargs, **engine_kwargs},
        concurrency=workers,
        batch_size=batch_size,
        log_engine_metrics=False,
        should_continue_on_error=True,
        **({} if on_gpu else {"placement_group_config": {"bundles": [{"CPU": 1}]}}),
    )
    processor = build_processor(config, preprocess=engine_row)

    def run(dataset: Any) -> Any:
        # not as the processor's postprocess: rows the engine failed on bypass that one
        return processor(dataset).map(result_row)

    return run
