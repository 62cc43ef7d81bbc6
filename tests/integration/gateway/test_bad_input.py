"""Every bad input gets an OpenAI-format error with the right status, and the gateway keeps serving."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway
from tests.helpers.sim import SimHandle, free_port


def assert_openai_error(result, status: int, code: str, words: str) -> None:
    assert result.status == status, result.body
    error = result.body["error"]
    assert error["code"] == code and words in error["message"], error
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]


async def test_bad_inputs_get_openai_errors(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "tenants:\n"
        "  - name: clinic\n    keys: [sk-clinic]\n"
        "  - name: tight\n    keys: [sk-tight]\n    requests_per_s: 1\n    burst_requests: 1\n"
    )
    audit = tmp_path / "audit.jsonl"
    async with (
        running_gateway(constant_engines[:1], keys_file=keys, max_body_bytes=20_000, audit_log=audit) as gw,
        aiohttp.ClientSession() as session,
    ):
        url = gw.base_url
        ok = {"Authorization": "Bearer sk-clinic"}
        assert_openai_error(await post_chat(session, url, chat_body("hi")), 401, "missing_api_key", "missing API key")
        assert_openai_error(
            await post_chat(session, url, chat_body("hi"), {"Authorization": "Bearer sk-wrong"}),
            401,
            "invalid_api_key",
            "invalid API key",
        )
        assert_openai_error(
            await post_chat(session, url, b'{"model": "sim-model", "messages": [', ok), 400, "invalid_json", "not valid JSON"
        )
        assert_openai_error(await post_chat(session, url, b"[1, 2]", ok), 400, "invalid_json", "JSON object")
        assert_openai_error(
            await post_chat(session, url, {**chat_body("hi"), "model": 7}, ok), 400, "invalid_model", "must be a string"
        )
        assert_openai_error(
            await post_chat(session, url, {**chat_body("hi"), "model": "gpt-9"}, ok),
            404,
            "model_not_found",
            "'gpt-9' is not served here",
        )
        assert_openai_error(await post_chat(session, url, chat_body("x" * 30_000), ok), 413, "body_too_large", "limit")
        assert_openai_error(
            await post_chat(session, url, chat_body("hi"), {**ok, "X-Priority": "urgent"}), 400, "invalid_priority", "X-Priority"
        )
        # Over the rate limit: 429 with Retry-After.
        tight = {"Authorization": "Bearer sk-tight"}
        first = await post_chat(session, url, chat_body("hi"), tight)
        second = await post_chat(session, url, chat_body("hi"), tight)
        assert first.status == 200 and first.done
        assert_openai_error(second, 429, "rate_limit_exceeded", "rate limit exceeded")
        assert int(second.headers["Retry-After"]) >= 1
        # The engine's own 400s pass through unchanged (its message, its status); a max_tokens that
        # is no whole number from 1 to 2**31-1 is the gateway's own 400, before any budget arithmetic.
        engine_error = await post_chat(session, url, {**chat_body("hi"), "max_tokens": 100_000}, ok)
        assert engine_error.status == 400 and "max_model_len" in json.dumps(engine_error.body)
        assert_openai_error(
            await post_chat(session, url, {**chat_body("hi"), "max_tokens": -3}, ok),
            400,
            "invalid_max_tokens",
            "'max_tokens' must be a whole number",
        )
        # After all that, the gateway still serves.
        good = await post_chat(session, url, chat_body("still there?", max_tokens=4), ok)
        assert good.status == 200 and good.done and good.completion_tokens == 4
        async with session.get(url + "/health") as health:
            assert health.status == 200
        async with session.get(url + "/metrics") as metrics:
            text = await metrics.text()
    assert 'vlmserve_gateway_requests_total{replica="none",status="401",tenant="anonymous"} 2.0' in text
    assert 'vlmserve_gateway_shed_requests_total{reason="rate_limited",tenant="tight"} 1.0' in text
    assert not [line for line in text.splitlines() if line.startswith("vllm:")]
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["status"] for r in records].count("200") == 2
    assert all("content" not in r for r in records)  # no prompt text unless --log-content
    assert all(
        set(r)
        >= {
            "id",
            "tenant",
            "replica",
            "status",
            "retries",
            "received_at",
            "ttft_ms",
            "e2e_ms",
            "prompt_tokens",
            "completion_tokens",
        }
        for r in records
    )


async def test_no_healthy_replica_is_503(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with running_gateway([dead], health_interval_s=0.2) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("anyone?"))
        assert_openai_error(result, 503, "no_healthy_replica", "no healthy replica")
        assert result.headers.get("Retry-After") == "1"
        async with session.get(gw.base_url + "/health") as health:
            assert health.status == 503 and (await health.json())["status"] == "no healthy replica"
        async with session.get(gw.base_url + "/v1/models") as models:
            assert models.status == 503


async def test_log_content_switch_puts_the_prompt_in_the_audit_log(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with running_gateway(constant_engines[:1], audit_log=audit, log_content=True) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("the patient's radiograph", stream=False))
        assert result.status == 200
    record = json.loads(audit.read_text().splitlines()[0])
    assert record["content"][0]["content"] == "the patient's radiograph"
    assert record["completion_tokens"] == 8 and record["model"] == MODEL
