"""`vlmserve batch --runner ray --ray-engine MODEL`: Ray Data starts a real vLLM engine (CPU build)
for the embedded tiny VLM on a local Ray instance; no endpoint at all.

About a minute, most of it the engine starting inside Ray. The output is checked as for the
HTTP runners: every line answered exactly once, malformed and unsupported lines recorded, a
rerun of the finished job sends nothing (and starts no Ray).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter

import pytest

pytest.importorskip("ray.data.llm", reason="the ray extra is not installed (pip install 'vlmserve[ray]')")
pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup-env)")

from vlmserve.engines.embedded import ensure_tiny_model  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_ray_started_engine_answers_chat_lines_once(tmp_path, vlmserve_cmd) -> None:
    model = str(ensure_tiny_model())
    lines = [
        json.dumps(
            {
                "custom_id": f"r{index}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "embedded",
                    "max_tokens": 6,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"Summarise report {index}."}],
                },
            }
        )
        for index in range(20)
    ]
    lines.insert(3, "{not json")
    lines.insert(
        7,
        json.dumps(
            {"custom_id": "plain", "method": "POST", "url": "/v1/completions", "body": {"model": "embedded", "prompt": "hi"}}
        ),
    )
    input_path, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    input_path.write_text("\n".join(lines) + "\n")
    argv = [
        *vlmserve_cmd,
        "batch",
        str(input_path),
        "--output",
        str(output),
        "--no-progress",
        "--runner",
        "ray",
        "--ray-engine",
        model,
        "--ray-workers",
        "1",
        "--concurrency",
        "8",
        "--ray-engine-kwargs",
        json.dumps({"max_model_len": 2048, "enforce_eager": True}),
    ]
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=420, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    records = [json.loads(line) for line in output.read_bytes().splitlines()]
    assert done.stderr.strip().splitlines()[-1].startswith("error: 2 lines failed"), (done.stderr[-2000:], records[:3])
    assert len(records) == 22
    answered = [record for record in records if record["error"] is None]
    assert Counter(record["custom_id"] for record in answered) == Counter(f"r{index}" for index in range(20))
    for record in answered:
        body = record["response"]["body"]
        assert record["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["usage"]["prompt_tokens"] > 0 and 0 < body["usage"]["completion_tokens"] <= 6
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
    errors = {record["error"]["code"]: record for record in records if record["error"] is not None}
    assert set(errors) == {"malformed_line", "unsupported_url"}
    assert errors["unsupported_url"]["custom_id"] == "plain" and errors["unsupported_url"]["error"]["line"] == 8
    started = time.monotonic()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 1 and "resuming: 22 of 22" in again.stderr
    assert time.monotonic() - started < 30 and len(output.read_bytes().splitlines()) == 22
