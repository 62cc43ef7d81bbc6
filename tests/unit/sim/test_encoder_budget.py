"""vLLM's encoder budget and encoder cache in the shared scheduler model.

Each case is a small schedule worked out by hand from vLLM V1's rules
(`Scheduler._try_schedule_encoder_inputs`, `EncoderCacheManager`): images are encoded in the step
whose prefill chunk reaches them, a chunk stops before an image the step cannot encode, and an
image's cache entry is dropped once the prefill has consumed its placeholders.
"""

from __future__ import annotations

import pytest

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.options import SimEngineConfig
from vlmserve.engines.sim.protocol import ImageValidator, parse_generation_request
from vlmserve.errors import UserError
from vlmserve.sched.encoder_cache_manager import EncoderCacheManager, EncoderInput
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.sched.parametric_cost import ParametricStepCost
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest, StepResult
from vlmserve.sched.step_cost import StepContents
from vlmserve.sched.virtual_clock import Send, run_virtual_clock

COST = ParametricStepCost(
    fixed_s=0.001, per_prefill_token_s=1e-6, per_decode_seq_s=1e-5, per_kv_token_s=0.0, per_image_token_s=1e-5
)
RED_PIXEL_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def _config(**limits: int | bool) -> SchedulerConfig:
    return SchedulerConfig(max_num_seqs=16, num_kv_blocks=1024, block_size=16, max_model_len=4096, **limits)  # type: ignore[arg-type]


def _request(
    request_id: str, prompt_len: int, images: tuple[tuple[int, int], ...], output: int = 2, digests: tuple[int, ...] = ()
) -> SimRequest:
    base = 1_000_000 * (1 + sum(map(ord, request_id)))
    return SimRequest(
        request_id,
        list(range(base, base + prompt_len)),
        output,
        images=len(images),
        image_tokens=sum(length for _offset, length in images),
        mm_positions=images,
        image_items=tuple((digest, 1) for digest in digests),
    )


def _steps(scheduler: Scheduler, count: int) -> list[StepResult]:
    results, now = [], 0.0
    while scheduler.has_work() and len(results) < count:
        result = scheduler.step(now)
        results.append(result)
        now = result.end_s
    return results


def _images(result: StepResult) -> tuple[int, int]:
    return result.contents.images, result.contents.image_tokens


def test_an_image_larger_than_the_budget_left_waits_for_the_next_step() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=2000, max_num_encoder_input_tokens=600), COST)
    scheduler.add_request(_request("a", 500, ((0, 400),)))
    scheduler.add_request(_request("b", 500, ((0, 400),)))
    first, second = _steps(scheduler, 2)
    assert _images(first) == (1, 400)  # 200 of the 600 left: b's 400-token image does not fit
    assert [request_id for request_id, _ in first.first_scheduled] == ["a"]
    assert first.num_waiting == 1 and first.contents.prefill_tokens == 500
    assert _images(second) == (1, 400)
    assert [request_id for request_id, _ in second.first_scheduled] == ["b"]


def test_a_chunk_stops_before_an_image_the_budget_cannot_take() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=2000, max_num_encoder_input_tokens=300), COST)
    scheduler.add_request(_request("a", 750, ((100, 300), (400, 300))))
    first, second = _steps(scheduler, 2)
    assert _images(first) == (1, 300)
    assert first.contents.prefill_tokens == 400 and first.tokens == []  # text, image 1, then stop at 400
    assert _images(second) == (1, 300)
    assert second.contents.prefill_tokens == 350 and second.tokens == [("a", 1)]


def test_a_chunk_stops_before_an_image_the_cache_cannot_hold_and_the_cache_frees_after_consumption() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=2000, encoder_cache_size=300), COST)
    scheduler.add_request(_request("a", 750, ((100, 300), (400, 300))))
    cache = scheduler.encoder_cache_manager
    first = scheduler.step(0.0)
    assert _images(first) == (1, 300) and first.contents.prefill_tokens == 400
    assert cache.num_used_slots == 0 and cache.num_free_slots == 0  # consumed: freeable, not yet evicted
    second = scheduler.step(first.end_s)
    assert _images(second) == (1, 300) and second.contents.prefill_tokens == 350
    assert cache.num_used_slots == 0 and list(cache.freeable.values()) == [300]  # image 1 evicted for image 2


def test_an_image_split_across_chunks_stays_cached_until_the_chunk_passes_its_end() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=250), COST)
    scheduler.add_request(_request("a", 450, ((100, 300),)))
    cache = scheduler.encoder_cache_manager
    first = scheduler.step(0.0)
    assert _images(first) == (1, 300) and cache.num_used_slots == 300  # chunk [0, 250) is inside the image
    second = scheduler.step(first.end_s)
    assert _images(second) == (0, 0)  # [250, 450) reads the cached output: no second encode
    assert cache.num_used_slots == 0


def test_abort_and_preemption_release_the_requests_entries() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=250), COST)
    scheduler.add_request(_request("a", 450, ((100, 300),)))
    scheduler.step(0.0)
    assert scheduler.encoder_cache_manager.num_used_slots == 300
    scheduler.abort_request("a")
    assert scheduler.encoder_cache_manager.num_used_slots == 0
    tight = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=250, num_kv_blocks=30, block_size=16, max_model_len=480), COST
    )
    tight.add_request(_request("x", 120, ((0, 100),), output=300))
    tight.add_request(_request("y", 120, ((0, 100),), output=300))
    results = _steps(tight, 1000)
    assert not tight.has_work()
    preempted = [request_id for result in results for request_id in result.preempted]
    assert preempted, "the KV cache is sized so that one request must be preempted"
    at = next(index for index, result in enumerate(results) if result.preempted)
    assert results[at].num_waiting == 1
    # y's output was consumed long before; x holds nothing either: no reference survives the preemption
    assert not any(holders for holders in tight.encoder_cache_manager.cached.values())
    # y recomputes, but its image tokens come back from the prefix cache: the encoder does not run again
    assert sum(result.contents.images for result in results) == 2
    assert tight.encoder_cache_manager.num_used_slots == 0


def test_with_a_large_budget_every_image_is_encoded_in_the_first_step_that_reaches_it() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=8192), COST)
    for index in range(4):
        scheduler.add_request(_request(f"r{index}", 900, ((0, 300), (300, 300))))
    first = scheduler.step(0.0)
    assert _images(first) == (8, 2400)  # the old rule: all images of every admitted request at once
    assert all(result.contents.images == 0 for result in _steps(scheduler, 3))


def test_step_contents_of_a_known_schedule_match_a_hand_computation() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=512, max_num_encoder_input_tokens=256), COST)
    scheduler.add_request(_request("a", 400, ((0, 200),)))
    scheduler.add_request(_request("b", 300, ((50, 200),)))
    contents = [result.contents for result in _steps(scheduler, 3)]
    assert contents == [
        # a: image (200 of 256) + 400 tokens; b: 112 tokens of budget left, but its image needs 200 of
        # the 56 encoder tokens left, so its chunk stops before it at 50.
        StepContents(prefill_tokens=450, prefill_seqs=2, decode_seqs=0, kv_tokens_read=450, image_tokens=200, images=1),
        # a decodes (context 401); b encodes its image and prefills [50, 300).
        StepContents(prefill_tokens=250, prefill_seqs=1, decode_seqs=1, kv_tokens_read=701, image_tokens=200, images=1),
        # a finished; b decodes.
        StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, kv_tokens_read=301, image_tokens=0, images=0),
    ]
    assert not scheduler.has_work()


def test_without_chunked_mm_input_a_chunk_never_ends_inside_an_image() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=350, disable_chunked_mm_input=True), COST)
    scheduler.add_request(_request("a", 450, ((100, 300),)))
    first, second = _steps(scheduler, 2)
    assert first.contents.prefill_tokens == 100 and _images(first) == (0, 0)
    assert second.contents.prefill_tokens == 350 and _images(second) == (1, 300)
    refusing = Scheduler(_config(max_num_batched_tokens=256, disable_chunked_mm_input=True), COST)
    with pytest.raises(ValueError, match="larger than max_num_batched_tokens"):
        refusing.add_request(_request("big", 450, ((100, 300),)))


def test_an_image_larger_than_the_budget_and_cache_raises_them_as_vllm_does_at_start_up() -> None:
    scheduler = Scheduler(_config(max_num_batched_tokens=256, max_num_encoder_input_tokens=100, encoder_cache_size=100), COST)
    scheduler.add_request(_request("a", 450, ((0, 300),)))
    results = _steps(scheduler, 10)
    assert not scheduler.has_work()  # no deadlock on an image bigger than both limits
    assert _images(results[0]) == (1, 300) and results[0].contents.prefill_tokens == 256
    assert sum(result.contents.images for result in results) == 1


def test_a_repeated_image_is_encoded_once_whether_the_frontend_or_the_encoder_cache_holds_it() -> None:
    def run(mm_cache_items: int) -> list[StepContents]:
        contents: list[StepContents] = []

        class Recording(Scheduler):
            def step(self, now_s: float) -> StepResult:
                result = super().step(now_s)
                contents.append(result.contents)
                return result

        core = Recording(_config(max_num_batched_tokens=4096), COST)
        requests = [_request(name, 600, ((0, 500),), digests=(77,)) for name in ("p", "q")]
        run_virtual_clock(
            [core],
            [Send(0.0, index, request) for index, request in enumerate(requests)],
            frontend=FrontendConfig(mm_cache_items=mm_cache_items),
        )
        return contents

    with_frontend_cache = run(1024)  # q's image hits the multimodal cache: it never reaches the encoder
    encoder_cache_only = run(0)  # both reach the scheduler; q shares p's encoder cache entry in the same step
    for contents in (with_frontend_cache, encoder_cache_only):
        assert sum(step.images for step in contents) == 1
        assert sum(step.image_tokens for step in contents) == 500
        assert contents[0].prefill_tokens == 1200  # the placeholders of both are still prefilled


def test_the_cache_manager_evicts_the_oldest_freeable_entry_first() -> None:
    cache = EncoderCacheManager(300)
    first, second, third = (EncoderInput(0, 100, name) for name in ("one", "two", "three"))
    for item in (first, second, third):
        assert cache.can_allocate(item, 1000, 0)
        cache.allocate("r", item)
    cache.free_encoder_input("r", second)
    cache.free_encoder_input("r", first)
    assert not cache.can_allocate(EncoderInput(0, 250, "big"), 1000, 0)  # only 200 reclaimable
    assert cache.can_allocate(EncoderInput(0, 100, "four"), 1000, 0)
    assert "two" not in cache.cached and "one" in cache.cached  # freed first, evicted first
    assert cache.num_free_slots == 100  # "four" was only checked, not allocated
    assert cache.check_and_update_cache("s", first) and cache.num_freeable_slots == 100  # "one" is held again


def test_the_sim_engine_records_where_each_image_sits_in_the_prompt() -> None:
    config = SimEngineConfig(image_tokens=64)
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at this"},
                    {"type": "image_url", "image_url": {"url": RED_PIXEL_PNG}},
                    {"type": "text", "text": "and this"},
                    {"type": "image_url", "image_url": {"url": RED_PIXEL_PNG}},
                ],
            }
        ]
    }
    parsed = parse_generation_request(body, "chat", config, ImageValidator())
    assert len(parsed.image_positions) == 2 and parsed.image_tokens == 128
    digest = parsed.image_items[0][0]
    for offset, length in parsed.image_positions:
        assert parsed.prompt_token_ids[offset : offset + length] == tokenizer.image_token_ids(digest, 64)
    assert parsed.image_positions[0][0] > 0  # the text before the image comes first


@pytest.mark.hostile("a zero or negative encoder budget or encoder cache size")
@pytest.mark.parametrize("field", ["max_num_encoder_input_tokens", "encoder_cache_size"])
def test_a_zero_encoder_budget_or_cache_is_refused_in_one_line(field: str) -> None:
    flag = "--" + field.replace("_", "-")
    with pytest.raises(UserError, match=f"^{flag} must be at least 1"):
        SimEngineConfig(**{field: 0}).validate()  # type: ignore[arg-type]


def test_placeholder_ranges_outside_the_prompt_are_refused() -> None:
    """Ranges come from the engine's own parser; a bad one is a bug, caught before it can hang a step."""
    scheduler = Scheduler(_config(max_num_batched_tokens=512), COST)
    with pytest.raises(ValueError, match="must be in order"):
        scheduler.add_request(_request("a", 100, ((50, 100),)))
    with pytest.raises(ValueError, match="must be in order"):
        scheduler.add_request(_request("b", 400, ((0, 100), (50, 100))))
