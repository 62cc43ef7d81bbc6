"""Every injected fault behaves as its name says, seen from a client of a real engine process."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.helpers.sim import start_sim_engine

MODEL = "fault-model"


def _chat_body(**extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, **extra}


def _content_tokens_streamed(lines: list[str]) -> int:
    count = 0
    for line in lines:
        if line.startswith("data: {"):
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                count += 1
    return count


def test_error_rate_injects_the_chosen_5xx_codes_deterministically() -> None:
    def codes_for_seed(seed: int) -> list[int]:
        with start_sim_engine(model=MODEL, ttft_ms=1, itl_ms=1, error_rate=0.5, error_codes=[500, 503], seed=seed) as engine:
            responses = [httpx.post(f"{engine.base_url}/v1/chat/completions", json=_chat_body()) for _ in range(16)]
            for response in responses:
                if response.status_code != 200:
                    error = response.json()["error"]
                    assert error["code"] == response.status_code and "injected fault" in error["message"]
                    expected_type = {500: "InternalServerError", 503: "ServiceUnavailableError"}[response.status_code]
                    assert error["type"] == expected_type
            assert httpx.get(f"{engine.base_url}/health").status_code == 200  # health is not an API request
            return [response.status_code for response in responses]

    codes = codes_for_seed(1)
    assert set(codes) == {200, 500, 503}
    assert codes == codes_for_seed(1)  # same seed, same faults


def test_crash_after_n_requests_exits_the_process() -> None:
    with start_sim_engine(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=2) as engine:
        for _ in range(2):
            assert httpx.post(f"{engine.base_url}/v1/chat/completions", json=_chat_body()).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"{engine.base_url}/v1/chat/completions", json=_chat_body(), timeout=5)
        assert engine.process.wait(timeout=5) == 3
        assert "injected crash after 2 requests" in engine.log()


def test_slow_start_answers_503_until_ready() -> None:
    # 3 s of start-up: the two 503 checks below fit in it on a loaded machine
    with start_sim_engine(model=MODEL, ttft_ms=1, itl_ms=1, startup_delay=3.0, wait_for_health=False) as engine:
        health = httpx.get(f"{engine.base_url}/health")
        assert health.status_code == 503 and health.json()["error"]["type"] == "ServiceUnavailableError"
        assert httpx.post(f"{engine.base_url}/v1/chat/completions", json=_chat_body()).status_code == 503
        deadline = time.monotonic() + 10
        while httpx.get(f"{engine.base_url}/health").status_code != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.1)
        assert httpx.post(f"{engine.base_url}/v1/chat/completions", json=_chat_body()).status_code == 200


def test_stall_pauses_the_stream_then_resumes() -> None:
    """The engine holds the stream for stall_s, then finishes it.

    Checked by a bound load cannot break: 10 tokens at 2 ms take ~25 ms, so a stream that ends
    no sooner than stall_s after it started was held that long (a slow machine only adds time;
    the earlier check on the largest gap between two chunks at this client could shrink when
    the chunks before the stall were themselves delayed).
    """
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=2, stall_after_tokens=3, stall_s=1.0) as engine:
        lines: list[str] = []
        body = _chat_body(stream=True, max_tokens=10, ignore_eos=True)
        started = time.monotonic()
        with httpx.stream("POST", f"{engine.base_url}/v1/chat/completions", json=body, timeout=10) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                    if _content_tokens_streamed(lines) == 3:
                        third_token_s = time.monotonic()
        finished = time.monotonic()
        assert lines[-1] == "data: [DONE]" and _content_tokens_streamed(lines) == 10
        assert finished - started >= 1.0  # the whole stall lies between the request and [DONE]
        assert third_token_s - started < finished - started  # tokens came before it, the rest after


def test_stall_forever_leaves_the_client_waiting() -> None:
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=2, stall_after_tokens=2) as engine:
        lines: list[str] = []
        body = _chat_body(stream=True, max_tokens=10, ignore_eos=True)
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream(
                "POST", f"{engine.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=1.0)
            ) as response:
                for line in response.iter_lines():
                    if line:
                        lines.append(line)
        assert _content_tokens_streamed(lines) == 2
        assert httpx.get(f"{engine.base_url}/health").status_code == 200


def test_dropped_connection_cuts_the_stream_mid_way() -> None:
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=2, drop_after_tokens=4) as engine:
        lines: list[str] = []
        body = _chat_body(stream=True, max_tokens=10, ignore_eos=True)
        with pytest.raises(httpx.HTTPError):
            with httpx.stream("POST", f"{engine.base_url}/v1/chat/completions", json=body, timeout=10) as response:
                for line in response.iter_lines():
                    if line:
                        lines.append(line)
        assert _content_tokens_streamed(lines) == 4 and "data: [DONE]" not in lines
        # Non-streaming requests are not affected, and the engine keeps serving.
        assert httpx.post(f"{engine.base_url}/v1/chat/completions", json=_chat_body()).status_code == 200
        metrics = engine.metrics_text()
        assert f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}} 1.0' in metrics


def test_poison_marker_fails_only_requests_that_carry_it() -> None:
    with start_sim_engine(model=MODEL, ttft_ms=1, itl_ms=1, poison_marker="XPOISONX") as engine:
        url = f"{engine.base_url}/v1/chat/completions"
        poisoned = httpx.post(url, json=_chat_body(messages=[{"role": "user", "content": "a XPOISONX b"}]))
        assert poisoned.status_code == 500 and "poisoned request" in poisoned.json()["error"]["message"]
        assert httpx.post(url, json=_chat_body()).status_code == 200


def test_swap_answer_fault_gives_a_concurrent_request_another_ones_answer() -> None:
    """Alone each request gets its own temperature-0 answer; in flight together, the later one gets the
    earlier one's (the fault `vlmserve consistency` must catch)."""
    import asyncio

    def body(question: str) -> dict:
        return _chat_body(messages=[{"role": "user", "content": question}], max_tokens=20, ignore_eos=True, temperature=0)

    with start_sim_engine(model=MODEL, ttft_ms=1, itl_ms=50, swap_answer_rate=1.0) as engine:
        url = f"{engine.base_url}/v1/chat/completions"

        def answer(response: httpx.Response) -> str:
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["message"]["content"]

        first_alone, second_alone = (answer(httpx.post(url, json=body(q))) for q in ("first?", "second?"))
        assert first_alone != second_alone

        async def together() -> str:
            """The second is sent only once the first has streamed a chunk, so the engine holds
            the first in flight when the second arrives however slow this machine is."""
            async with httpx.AsyncClient(timeout=30) as client:
                async with client.stream("POST", url, json={**body("first?"), "stream": True}) as first:
                    assert first.status_code == 200
                    chunks = first.aiter_lines()
                    while not (await anext(chunks)).startswith("data: "):
                        pass
                    second = await client.post(url, json=body("second?"))
                    async for _ in chunks:  # the first runs to its end
                        pass
                return answer(second)

        assert asyncio.run(together()) == first_alone  # the later one got the earlier one's answer
        assert answer(httpx.post(url, json=body("second?"))) == second_alone  # alone again: its own answer
