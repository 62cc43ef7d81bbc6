"""Run a vlmserve batch file (OpenAI Batch JSONL) on a Ray cluster with Ray Data's LLM API.

This is an example to adapt, not part of vlmserve: use it when one machine (or one
`vlmserve up` deployment) is not enough and a Ray cluster is at hand. See docs/batch.md.

Two ways to run it:

  # 1. Ray starts vLLM engines on the cluster's GPUs (data-parallel replicas, one per GPU group)
  python examples/ray_batch.py engine input.jsonl out/ --model Qwen/Qwen2.5-VL-7B-Instruct \
      --replicas 8 --tensor-parallel-size 1

  # 2. Ray sends the lines to an OpenAI-compatible endpoint you already run (e.g. the gateway)
  python examples/ray_batch.py http input.jsonl out/ --url http://gateway:8000/v1/chat/completions

Needs `pip install "ray[data,llm]>=2.49"` (and vLLM on the workers for mode 1).
Input lines are the same as for `vlmserve batch`: {"custom_id", "method", "url", "body"};
only /v1/chat/completions lines are handled here. Output: JSONL files under out/ with
{"custom_id", "response": {"status_code", "body"}, "error"} per line (Ray writes several files,
one per block, in no particular order).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "stop", "seed", "presence_penalty", "frequency_penalty")


def to_engine_row(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI Batch line -> what the vLLM engine stage reads (messages + sampling_params)."""
    body = row["body"]
    sampling = {key: body[key] for key in SAMPLING_KEYS if key in body}
    return {"custom_id": row["custom_id"], "messages": body["messages"], "sampling_params": sampling}


def from_engine_row(row: dict[str, Any]) -> dict[str, Any]:
    """Engine output row -> an OpenAI Batch output line (the body is chat.completion-shaped)."""
    body = {"object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": row["generated_text"]},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": int(row.get("num_input_tokens") or 0),
                      "completion_tokens": int(row.get("num_generated_tokens") or 0)}}
    return {"custom_id": row["custom_id"], "response": {"status_code": 200, "body": json.dumps(body)},
            "error": None}


def to_http_row(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI Batch line -> the HTTP stage's payload (the body is sent as is)."""
    return {"custom_id": row["custom_id"], "payload": row["body"]}


def from_http_row(row: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": row["custom_id"], "response": {"status_code": 200, "body": json.dumps(row["http_response"])},
            "error": None}


def main() -> None:
    import ray
    from ray.data.llm import HttpRequestProcessorConfig, build_llm_processor, vLLMEngineProcessorConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["engine", "http"])
    parser.add_argument("input", help="OpenAI Batch JSONL (local path or s3://...)")
    parser.add_argument("output", help="folder for the result JSONL files")
    parser.add_argument("--model", help="engine mode: model id or path")
    parser.add_argument("--replicas", type=int, default=1, help="engine mode: vLLM engines to start")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--url", help="http mode: full URL of /v1/chat/completions")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--qps", type=float, default=None, help="http mode: requests per second cap")
    args = parser.parse_args()

    ray.init()
    lines = ray.data.read_json(args.input, lines=True)
    lines = lines.filter(lambda row: row.get("url") == "/v1/chat/completions")
    if args.mode == "engine":
        if not args.model:
            parser.error("engine mode needs --model")
        config = vLLMEngineProcessorConfig(
            model_source=args.model,
            engine_kwargs={"tensor_parallel_size": args.tensor_parallel_size, "max_model_len": args.max_model_len,
                           "enable_prefix_caching": True, "limit_mm_per_prompt": {"image": 4}},
            concurrency=args.replicas,
            batch_size=32,
            has_image=True,  # image_url parts in messages are fetched and passed to the engine
        )
        processor = build_llm_processor(config, preprocess=to_engine_row, postprocess=from_engine_row)
    else:
        if not args.url:
            parser.error("http mode needs --url")
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        headers["X-Priority"] = "batch"  # the vlmserve gateway's batch class
        config = HttpRequestProcessorConfig(url=args.url, headers=headers, qps=args.qps, concurrency=4)
        processor = build_llm_processor(config, preprocess=to_http_row, postprocess=from_http_row)
    processor(lines).write_json(args.output)


if __name__ == "__main__":
    main()
