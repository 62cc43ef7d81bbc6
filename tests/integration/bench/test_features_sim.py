"""`vlmserve bench --features tools,structured,thinking` against a real sim engine, through the CLI.

The sim engine answers schema-valid JSON and valid tool calls when the answer fits max_tokens, and
cuts them (finish_reason length) when not, so both a perfect and a broken rate can be produced on
purpose. Every run's rates are recomputed from its records file by an independent check
(tests/helpers/feature_recount.py). The SDK-level checks of the sim's features (logprobs, n=2,
a 400 for what it cannot honour) are in tests/integration/sim/test_features.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.helpers.feature_recount import recount
from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "sim-feature-bench"


@pytest.fixture(scope="module")
def engine() -> Iterator[SimHandle]:
    # reasoning is drawn from the output-length distribution: 6 tokens, so answers fit after it
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=1, seed=2, output_len="fixed:6") as handle:
        yield handle


@pytest.fixture(scope="module")
def paced_engine() -> Iterator[SimHandle]:
    """The same reasoning (6 tokens) at 25 ms a token: the answer starts 150 ms after the reasoning,
    a gap a client on a loaded machine does not merge into one read (at 1 ms a token it did)."""
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=25, seed=2, output_len="fixed:6") as handle:
        yield handle


def bench(cli: Any, engine: SimHandle, tmp_path: Path, *extra: object, output_len: int = 96) -> tuple[Any, dict[str, Any], Path]:
    """Run the bench; returns the CLI result, the JSON summary and the records file."""
    summary_path, records_path = tmp_path / "run.json", tmp_path / "run.parquet"
    done = cli(
        "bench",
        "--base-url",
        engine.base_url,
        "--model",
        MODEL,
        "--no-progress",
        "--concurrency",
        4,
        "--input-len",
        24,
        "--output-len",
        output_len,
        "--json-out",
        summary_path,
        "--records-out",
        records_path,
        *extra,
    )
    assert "Traceback" not in done.err, done.err
    assert done.code == 0, done.err
    return done, json.loads(summary_path.read_text()), records_path


def agrees_with_recount(features: dict[str, Any], records_path: Path) -> None:
    counts = recount(records_path)
    assert (counts.structured, counts.schema_valid) == (features["structured_requests"], features["schema_valid"])
    assert (counts.tools_judged, counts.tools_valid) == (features["tool_calls_judged"], features["tool_calls_valid"])


def test_structured_alone(cli, engine: SimHandle, tmp_path: Path) -> None:
    done, summary, records = bench(cli, engine, tmp_path, "--num-requests", 12, "--features", "structured")
    features = summary["features"]
    assert features["requested"] == ["structured"]
    assert features["structured_requests"] == 12 and features["schema_valid_rate"] == 1.0
    assert features["tool_requests"] == 0 and features["tool_call_valid_rate"] is None
    assert features["thinking_requests"] == 0 and features["time_to_first_answer_ms"]["count"] == 12
    agrees_with_recount(features, records)
    assert "schema-valid rate: 100.0% (12 of 12 structured answers)" in done.out
    assert "sent without ignore_eos" in done.err  # the sim would refuse ignore_eos with a JSON answer


@pytest.mark.parametrize("tool_choice", ["named", "required", "auto"])
def test_tools_alone(cli, engine: SimHandle, tmp_path: Path, tool_choice: str) -> None:
    done, summary, records = bench(
        cli, engine, tmp_path, "--num-requests", 12, "--features", "tools", "--tool-choice", tool_choice
    )
    features = summary["features"]
    assert features["tool_requests"] == 12 and features["tool_choices"] == [tool_choice]
    assert features["tool_call_valid_rate"] == 1.0
    if tool_choice == "auto":  # the sim calls a tool for a seeded half: the rest are not judged
        assert 0 < features["answered_without_tool_call"] < 12
        assert features["tool_calls_judged"] == 12 - features["answered_without_tool_call"]
    else:
        assert features["tool_calls_judged"] == 12 and features["answered_without_tool_call"] == 0
    assert summary["tokens"]["tool_calls_total"] == features["tool_calls_judged"]
    agrees_with_recount(features, records)
    assert "valid tool-call rate: 100.0%" in done.out and f"tool_choice {tool_choice}" in done.out


def test_thinking_alone(cli, paced_engine: SimHandle, tmp_path: Path) -> None:
    # 12 tokens at 25 ms: 0.3 s a request, three rounds of 4 users
    done, summary, records = bench(cli, paced_engine, tmp_path, "--num-requests", 10, "--features", "thinking", output_len=12)
    features = summary["features"]
    assert features["thinking_requests"] == features["requests_with_reasoning"] == 10
    assert features["reasoning_tokens"]["p50"] == 6  # the engine's fixed reasoning length
    assert features["answer_tokens"]["p50"] == 12 - 6  # ignore_eos stays on: the answer fills max_tokens
    first_reasoning, first_answer = features["time_to_first_reasoning_ms"], features["time_to_first_answer_ms"]
    assert first_reasoning["count"] == first_answer["count"] == 10
    # Six reasoning tokens come first, in every stream: its first reasoning chunk is never read after its
    # first answer chunk (the same read, so the same time, only if a client stall held both back).
    table = pq.read_table(records, columns=["first_reasoning_at_s", "first_answer_at_s"]).to_pylist()
    gaps_ms = sorted(round(1000 * (row["first_answer_at_s"] - row["first_reasoning_at_s"]), 1) for row in table)
    print(f"first reasoning p50 {first_reasoning['p50']} ms, first answer p50 {first_answer['p50']} ms, gaps {gaps_ms} ms")
    assert all(row["first_reasoning_at_s"] <= row["first_answer_at_s"] for row in table), table
    # ... and the bench's figures show the 150 ms between them: a stall would have to hold back most
    # of the ten streams' reasoning to close it.
    assert first_reasoning["p50"] < first_answer["p50"], (first_reasoning, first_answer)
    # TTFT counts the first token of either kind: here the reasoning's
    assert summary["ttft_ms"]["p50"] == pytest.approx(first_reasoning["p50"], rel=0.05)
    assert summary["tokens"]["reasoning_total"] == 60
    assert "thinking (10 of 10 requests reasoned)" in done.out and "first answer token (ms)" in done.out


def test_all_three_with_images(cli, engine: SimHandle, tmp_path: Path) -> None:
    _, summary, records = bench(
        cli, engine, tmp_path, "--num-requests", 16, "--dataset", "images", "--features", "tools,structured,thinking"
    )
    features = summary["features"]
    assert features["requested"] == ["structured", "thinking", "tools"]
    # a forced tool call and a response format cannot share an answer: each request carries one of them
    assert features["structured_requests"] + features["tool_requests"] == 16
    assert features["structured_requests"] > 0 and features["tool_requests"] > 0
    assert features["thinking_requests"] == 16
    assert features["schema_valid_rate"] == features["tool_call_valid_rate"] == 1.0
    assert set(summary["by_type"]) == {"image"} and summary["tokens"]["images_total"] == 16
    agrees_with_recount(features, records)


def test_structured_and_thinking_with_the_mixed_workload_and_the_report(cli, engine: SimHandle, tmp_path: Path) -> None:
    _, summary, records = bench(
        cli,
        engine,
        tmp_path,
        "--num-requests",
        16,
        "--dataset",
        "mixed",
        "--mix",
        "random:0.5,images:0.5",
        "--features",
        "structured,thinking",
    )
    features = summary["features"]
    assert set(summary["by_type"]) == {"text", "image"}
    assert features["structured_requests"] == features["thinking_requests"] == 16
    assert features["schema_valid_rate"] == 1.0 and features["requests_with_reasoning"] == 16
    agrees_with_recount(features, records)
    run_id = summary["meta"]["run_id"]
    html_path, md_path = tmp_path / "report.html", tmp_path / "report.md"
    done = cli("report", run_id, "--html", html_path, "--md", md_path)
    assert done.code == 0, done.err
    page = html_path.read_text()
    assert "Feature workloads: valid answers and reasoning" in page
    assert "100.0% (16/16)" in page and "structured, thinking" in page
    assert "100.0% (16/16)" in md_path.read_text()


def test_rate_slos_pass_and_fail(cli, engine: SimHandle, tmp_path: Path) -> None:
    # 96 tokens: every answer fits; both objectives met
    done, summary, _ = bench(
        cli,
        engine,
        tmp_path,
        "--num-requests",
        8,
        "--features",
        "tools,structured",
        "--slo",
        "schema_valid>=0.99,tool_call_valid>=95%,ttft_p95=5s",
    )
    checks = summary["features"]["slo"]
    assert checks["schema_valid"] == {"bound": 0.99, "measured": 1.0, "met": True}
    assert checks["tool_call_valid"]["met"] is True and summary["features"]["slo_met"] is True
    assert summary["meta"]["slo_rates"] == {"schema_valid": 0.99, "tool_call_valid": 0.95}
    assert "feature SLOs met: schema_valid 100.0% ≥ 99.0%: met" in done.out
    # 8 tokens cannot hold the JSON: every answer is cut at max_tokens, so the rate is 0 and the SLO missed
    cut_dir = tmp_path / "cut"
    cut_dir.mkdir()
    done = cli(
        "bench",
        "--base-url",
        engine.base_url,
        "--model",
        MODEL,
        "--no-progress",
        "--concurrency",
        2,
        "--num-requests",
        6,
        "--output-len",
        8,
        "--features",
        "structured",
        "--slo",
        "schema_valid>=0.99",
        "--json-out",
        cut_dir / "run.json",
        "--records-out",
        cut_dir / "run.parquet",
    )
    assert done.code == 0, done.err
    features = json.loads((cut_dir / "run.json").read_text())["features"]
    assert features["schema_valid_rate"] == 0.0 and features["slo_met"] is False
    assert features["invalid_reasons"] == {"structured: cut at max_tokens": 6}
    assert "feature SLOs MISSED: schema_valid 0.0% < 99.0%: missed" in done.out
    assert "invalid answers: 6 structured: cut at max_tokens" in done.out
    agrees_with_recount(features, cut_dir / "run.parquet")


@pytest.mark.hostile(
    "bench: unknown --features, a rate --slo without its feature or misspelt, a bad --tool-choice, "
    "--features with --api completions: one line, exit 2"
)
@pytest.mark.parametrize(("flags", "expected"), [
    (["--features", "tools,vision"],
     "error: --features: unknown feature 'vision'; use any of tools, structured, thinking (comma-separated)"),
    (["--features", "structured", "--slo", "schema_valid>=0.99,tool_call_valid>=0.9"],
     "error: --slo tool_call_valid>=...: judges --features tools answers; add tools to --features"),
    (["--features", "tools", "--slo", "valid_rate>=0.9"],
     "error: --slo: unknown rate objective 'valid_rate'; use schema_valid, tool_call_valid "
     "(latency objectives are written ttft_p95=500ms)"),
    (["--features", "tools", "--slo", "tool_call_valid=0.9"],
     "error: --slo: 'tool_call_valid=0.9': a rate objective is a lower bound; write tool_call_valid>=0.9"),
    (["--features", "structured", "--tool-choice", "auto"],
     "error: --tool-choice applies to --features tools; add tools to --features"),
    (["--features", "tools", "--tool-choice", "sometimes"], "error: --tool-choice 'sometimes': use one of named, required, auto"),
    (["--features", "thinking", "--api", "completions"],
     "error: --features needs --api chat: tools, response_format and chat_template_kwargs are chat-completions fields"),
])  # fmt: skip
def test_bad_feature_inputs_are_one_line(cli, engine: SimHandle, flags: list[str], expected: str) -> None:
    done = cli(
        "bench", "--base-url", engine.base_url, "--model", MODEL, "--no-progress", "--concurrency", 1, "--num-requests", 1, *flags
    )
    assert done.code == 2
    assert done.error_line == expected
    assert "Traceback" not in done.err


@pytest.mark.hostile("rate objectives given to slo-search or plan, where no answer is judged: one line, exit 2")
@pytest.mark.parametrize("argv", [
    ["slo-search", "--rate-range", "1:2", "--duration", "1s"],
    ["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--input-len", 100, "--output-len", 10, "--concurrency", 2],
])  # fmt: skip
def test_rate_objectives_are_refused_where_no_answer_is_judged(cli, engine: SimHandle, argv: list[Any]) -> None:
    target = ["--base-url", engine.base_url, "--model", MODEL] if argv[0] == "slo-search" else []
    done = cli(*argv, *target, "--slo", "ttft_p95=1s,schema_valid>=0.9")
    assert done.code == 2 and "Traceback" not in done.err
    verb = "vlmserve slo-search" if argv[0] == "slo-search" else "vlmserve plan"
    assert done.error_line == (
        f"error: --slo schema_valid>=: rate objectives judge real answers (vlmserve bench "
        f"--features); {verb} takes latency objectives only"
    )
