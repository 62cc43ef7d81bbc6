"""The Ray runner's pure parts, without Ray: address rules, the concurrency split, the rows that
travel through Ray Data, the sender actor's code (against an in-process server), and the driver's
exactly-once collector (a batch delivered twice is written once)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from vlmserve.batch.lines import MalformedLine
from vlmserve.batch.output import BatchOutcome, Result, ResultFile
from vlmserve.batch.ray_engine import DEFAULT_MAX_TOKENS, engine_row, result_row
from vlmserve.batch.ray_runner import RayOptions, _Collector, _feed, host_port, per_actor_concurrency, resolve_address
from vlmserve.batch.ray_sender import RESULT_COLUMNS, RaySender, request_row
from vlmserve.batch.runner import BatchOptions
from vlmserve.batch.scan import PriorResults, scan_output
from vlmserve.batch.send import RetryPolicy
from vlmserve.errors import UserError


@pytest.mark.parametrize(
    "flag, env, expected",
    [
        ("10.0.0.5:6379", {"RAY_ADDRESS": "elsewhere:1"}, "10.0.0.5:6379"),
        (None, {"RAY_ADDRESS": "head:6379"}, "head:6379"),
        (None, {}, "local"),
        (None, {"RAY_ADDRESS": ""}, "local"),
    ],
)
def test_address_flag_then_env_then_a_local_instance(flag, env, expected) -> None:
    assert resolve_address(flag, env) == expected


@pytest.mark.parametrize(
    "address, expected",
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("ray://head.example:10001", ("head.example", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("local", None),
        ("auto", None),
    ],
)
def test_host_port(address, expected) -> None:
    assert host_port(address) == expected


@pytest.mark.hostile("Ray runner: a --ray-address with no port, no host, a port out of range or not a number: one line")
@pytest.mark.parametrize("address", ["head", "head:", ":6379", "head:99999", "head:port", "ray://"])
def test_bad_addresses_are_one_line(address) -> None:
    with pytest.raises(UserError, match="give HOST:PORT of the Ray head"):
        host_port(address)


@pytest.mark.parametrize("concurrency, workers, share", [(32, 2, 16), (33, 2, 17), (1, 4, 1), (16, 16, 1)])
def test_each_actor_gets_its_share_rounded_up(concurrency, workers, share) -> None:
    assert per_actor_concurrency(concurrency, workers) == share


def test_request_row_keeps_the_body_as_json_text() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "é"}]}]}
    row = request_row("a", "/v1/chat/completions", body)
    assert set(row) == {"custom_id", "url", "body"} and json.loads(row["body"]) == body


def _batch(rows: list[dict]) -> dict[str, np.ndarray]:
    return {column: np.array([row[column] for row in rows], dtype=object) for column in RESULT_COLUMNS}


def _row(custom_id: str, *, no_answer: str = "") -> dict:
    result = Result.answered(custom_id, 200, "r", {"usage": {"prompt_tokens": 2, "completion_tokens": 3}})
    return {
        "custom_id": custom_id,
        "line": b"" if no_answer else result.line,
        "cause": "",
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "retries": 1,
        "no_answer": no_answer,
    }


def _collector(tmp_path: Path, concurrency: int = 4) -> tuple[_Collector, ResultFile, BatchOutcome]:
    outcome = BatchOutcome(entries=10, answered_before=0)
    file = ResultFile(tmp_path / "out.jsonl", outcome)
    options = BatchOptions(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "http://x", concurrency=concurrency)
    return _Collector(options, RayOptions(workers=2), outcome, file), file, outcome


@pytest.mark.hostile("Ray runner: Ray delivers a batch twice (its actor died and the batch was retried): each id written once")
def test_a_result_delivered_twice_is_written_once(tmp_path: Path) -> None:
    """Ray retries a batch whose actor died; the driver still writes each custom_id once."""
    collector, file, outcome = _collector(tmp_path)
    assert collector.take(_batch([_row("a"), _row("b")])) is None
    assert collector.take(_batch([_row("b"), _row("c")])) is None
    file.close()
    ids = [json.loads(line)["custom_id"] for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert ids == ["a", "b", "c"] and collector.duplicates == 1
    assert (outcome.answered_now, outcome.succeeded, outcome.retries, outcome.completion_tokens) == (3, 3, 3, 9)


@pytest.mark.hostile(
    "Ray runner: the endpoint stops answering; no line for an unanswered request, a long streak stops the job with its cause"
)
def test_no_answer_is_not_written_and_a_long_streak_stops_the_job(tmp_path: Path) -> None:
    collector, file, outcome = _collector(tmp_path, concurrency=2)  # streak limit 2 x 2
    assert collector.take(_batch([_row("a", no_answer="ClientConnectorError"), _row("b")])) is None
    reason = collector.take(_batch([_row(f"x{i}", no_answer="ClientConnectorError") for i in range(4)]))
    file.close()
    assert reason is not None and "the endpoint stopped answering (ClientConnectorError)" in reason
    assert outcome.no_answer == 5 and outcome.answered_now == 1
    assert scan_output(tmp_path / "out.jsonl").lines == 1


@pytest.mark.hostile("Ray runner: a line that is not JSON becomes an error record naming its line; the rest is sent")
def test_feed_writes_malformed_lines_and_chunks_the_rest(tmp_path: Path) -> None:
    input_path = tmp_path / "in.jsonl"
    lines = ["{oops"] + [
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}})
        for i in range(1201)
    ]
    input_path.write_text("\n".join(lines) + "\n")
    outcome = BatchOutcome(entries=1202, answered_before=0)
    file = ResultFile(tmp_path / "out.jsonl", outcome)
    chunks: list[list[dict]] = []

    def put(rows: list[dict]) -> int:
        chunks.append(rows)
        return len(chunks)

    refs = _feed(BatchOptions(input_path, tmp_path / "out.jsonl", "http://x"), PriorResults(), file, put)
    file.close()
    assert refs == [1, 2, 3] and [len(chunk) for chunk in chunks] == [500, 500, 201]
    assert outcome.failed_by_cause == {"malformed_line": 1}
    record = json.loads((tmp_path / "out.jsonl").read_bytes())
    assert record["error"]["line"] == 1 and record["custom_id"] is None


def test_result_file_counts_only_what_it_wrote(tmp_path: Path) -> None:
    outcome = BatchOutcome(entries=2, answered_before=0)
    file = ResultFile(tmp_path / "out.jsonl", outcome)
    assert file.write(Result.malformed(MalformedLine(3, "x", "line 3: 'url' must be one of …")))
    file.close()
    assert outcome.answered_now == 1 and outcome.failed_by_cause == {"malformed_line": 1} and not file.failed


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    """An in-process server: 200 with usage for most prompts, 400 for 'bad', 503 once for 'flaky'."""
    seen: dict[str, int] = {}

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["prompt"]
        seen[prompt] = seen.get(prompt, 0) + 1
        if prompt == "bad":
            return web.json_response({"error": {"message": "no"}}, status=400)
        if prompt == "flaky" and seen[prompt] == 1:
            return web.json_response({"error": {"message": "busy"}}, status=503, headers={"Retry-After": "0"})
        assert request.headers.get("X-Priority") == "batch"
        return web.json_response({"id": f"cmpl-{prompt}", "usage": {"prompt_tokens": 5, "completion_tokens": 7}})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_sender_builds_the_builtin_runners_lines(endpoint: str) -> None:
    sender = RaySender(
        endpoint,
        {"X-Priority": "batch"},
        concurrency=2,
        request_timeout_s=10,
        retry=RetryPolicy(max_retries=2, base_delay_s=0.01),
    )
    rows = [
        request_row(cid, "/v1/completions", {"prompt": prompt}) for cid, prompt in (("a", "ok"), ("b", "bad"), ("c", "flaky"))
    ]
    batch = {key: np.array([row[key] for row in rows], dtype=object) for key in ("custom_id", "url", "body")}
    out = await sender(batch)
    await sender.session.close()
    assert set(out) == set(RESULT_COLUMNS) and out["custom_id"] == ["a", "b", "c"]
    assert out["cause"] == ["", "http_400", ""] and out["retries"] == [0, 0, 1] and out["no_answer"] == ["", "", ""]
    first = json.loads(out["line"][0])
    assert set(first) == {"id", "custom_id", "response", "error"} and first["response"]["request_id"] == "cmpl-ok"
    assert out["completion_tokens"] == [7, 0, 7]


@pytest.mark.hostile("Ray sender: an endpoint that refuses connections yields no answer, never a made-up result line")
async def test_sender_reports_no_answer_instead_of_a_line() -> None:
    sender = RaySender("http://127.0.0.1:9", {}, concurrency=1, request_timeout_s=2, retry=RetryPolicy(max_retries=0))
    out = await sender(
        {
            "custom_id": np.array(["a"], dtype=object),
            "url": np.array(["/v1/completions"], dtype=object),
            "body": np.array(['{"prompt": "x"}'], dtype=object),
        }
    )
    await sender.session.close()
    assert out["line"] == [b""] and out["no_answer"][0]


def test_engine_row_carries_sampling_and_hides_the_model_name() -> None:
    row = engine_row(
        request_row(
            "a",
            "/v1/chat/completions",
            {"model": "m", "max_completion_tokens": 9, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]},
        )
    )
    assert row["sampling_params"] == {"max_tokens": 9, "temperature": 0.0, "top_p": 1.0}
    assert "model" not in row and row["request_model"] == "m"  # a `model` column would name a LoRA adapter
    assert (
        engine_row(request_row("b", "/v1/chat/completions", {"messages": []}))["sampling_params"]["max_tokens"]
        == DEFAULT_MAX_TOKENS
    )


def test_engine_answer_becomes_the_same_result_row_as_an_http_answer() -> None:
    out = result_row(
        {
            "custom_id": "a",
            "request_model": "m",
            "generated_text": "ok",
            "num_input_tokens": 5,
            "num_generated_tokens": 4,
            "sampling_params": {"max_tokens": 4},
            "__inference_error__": "",
        }
    )
    assert set(out) == set(RESULT_COLUMNS) and out["cause"] == "" and out["completion_tokens"] == 4
    record = json.loads(out["line"])
    assert set(record) == {"id", "custom_id", "response", "error"}
    body = record["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    failed = result_row({"custom_id": "b", "__inference_error__": "prompt too long"})
    assert failed["cause"] == "http_400" and "prompt too long" in failed["line"].decode()
