"""Feature workloads on the real embedded vLLM engine (CPU build, tiny random-weight model), through the gateway.

The model's words are gibberish, but vLLM's structured outputs constrain it: a response_format
json_schema answer and a strict named tool call follow their schemas when they fit max_tokens,
and the JSON's free whitespace (the model is random) sometimes makes them not fit. So the test
asserts that the requests come back and that the bench's rates agree with an independent
recount of the same stored answers (tests/helpers/feature_recount.py), not a particular rate.
The rates go to artifacts/features-embedded.json (docs/metrics.md quotes such a run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers.feature_recount import recount
from tests.helpers.gateway_proc import start_gateway
from vlmserve.bench.features.catalogue import response_format, tool_definition

OUTPUT_LEN = 160
"""Room for a catalogue JSON answer with the random model's whitespace (measured: 70-180 tokens)."""
REQUESTS = 8


MESSAGES: list[Any] = [{"role": "user", "content": "What does the radiograph of tooth 14 show?"}]


def _chat(client: openai.OpenAI, model: str, **options: Any) -> Any:
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=OUTPUT_LEN, **options)


def _bench(cli: Any, base_url: str, model: str, feature: str, out: Path) -> tuple[dict[str, Any], Path]:
    summary_path, records_path = out / f"{feature}.json", out / f"{feature}.parquet"
    done = cli(
        "bench",
        "--base-url",
        base_url,
        "--model",
        model,
        "--no-progress",
        "--features",
        feature,
        "--concurrency",
        4,
        "--num-requests",
        REQUESTS,
        "--input-len",
        32,
        "--output-len",
        OUTPUT_LEN,
        "--json-out",
        summary_path,
        "--records-out",
        records_path,
    )
    print(done.out)
    assert "Traceback" not in done.err
    assert done.code == 0, done.err
    return json.loads(summary_path.read_text()), records_path


@pytest.mark.engine
def test_structured_and_tool_workloads_through_the_gateway(embedded_engine, cli, tmp_path: Path, artifacts_dir: Path) -> None:
    model = embedded_engine.model
    with start_gateway([embedded_engine.base_url], tmp_path) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        answer = _chat(client, model, response_format=response_format("radiograph_finding"))
        choice = answer.choices[0]
        assert choice.finish_reason in ("stop", "length")
        assert (choice.message.content or "").lstrip().startswith("{")  # constrained: JSON from the first token
        called = _chat(
            client,
            model,
            tools=[tool_definition("schedule_visit"), tool_definition("lookup_term")],
            tool_choice={"type": "function", "function": {"name": "schedule_visit"}},
        )
        message = called.choices[0].message
        # the OpenAI SDK's own tool example leaves tool_choice at auto: the recipe's parser makes it a 200
        auto = client.chat.completions.create(
            model=model, messages=MESSAGES, tools=[tool_definition("lookup_term")], max_tokens=8
        )
        assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
        # a complete call comes back as a tool call naming the tool; one cut at max_tokens as the parser's raw text
        assert (message.tool_calls and message.tool_calls[0].function.name == "schedule_visit") or (
            "schedule_visit" in (message.content or "") and called.choices[0].finish_reason == "length"
        )
        figures: dict[str, Any] = {
            "model": "embedded tiny Idefics3 (random weights), vLLM CPU build, through the gateway",
            "requests": REQUESTS,
            "output_len": OUTPUT_LEN,
        }
        for feature in ("structured", "tools"):
            summary, records_path = _bench(cli, gateway.base_url, model, feature, tmp_path)
            features = summary["features"]
            counts = recount(records_path)
            assert summary["requests"]["completed"] == REQUESTS, summary["requests"]
            if feature == "structured":
                assert (features["structured_requests"], features["schema_valid"]) == (counts.structured, counts.schema_valid)
                assert features["structured_requests"] == REQUESTS
            else:
                assert (features["tool_calls_judged"], features["tool_calls_valid"]) == (counts.tools_judged, counts.tools_valid)
                assert features["tool_requests"] == features["tool_calls_judged"] == REQUESTS
            figures[feature] = {
                key: features[key]
                for key in (
                    "schema_valid_rate",
                    "schema_valid",
                    "structured_requests",
                    "tool_call_valid_rate",
                    "tool_calls_valid",
                    "tool_calls_judged",
                    "invalid_reasons",
                )
            }
            figures[feature]["time_to_first_answer_ms_p50"] = features["time_to_first_answer_ms"]["p50"]
    (artifacts_dir / "features-embedded.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
