"""The frontend stage (API servers + multimodal processor cache), alone and on the virtual clock."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.sched.frontend import PROCESSED_BYTES_PER_PIXEL, Frontend, FrontendConfig, ImageItem, MMProcessorCache
from vlmserve.sched.parametric_cost import get_profile
from vlmserve.sched.scheduler import SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import simulate

MEGAPIXEL = 1_000_000


def _image(digest: int, pixels: int = MEGAPIXEL, tokens: int = 256) -> ImageItem:
    return ImageItem(digest=digest, pixels=pixels, tokens=tokens)


def _image_request(request_id: str, at: float, digest: int, prompt: int = 300) -> SimRequest:
    return SimRequest(request_id, [hash((request_id, i)) % 100_000 for i in range(prompt)], 4, arrival_s=at,
                      image_tokens=256, images=1, image_items=(_image(digest),))


def test_preprocessing_is_priced_by_pixels() -> None:
    config = FrontendConfig(preprocess_ms_per_image=2.0, preprocess_ms_per_megapixel=20.0)
    assert config.image_preprocess_s(MEGAPIXEL) == pytest.approx(0.022)
    assert config.image_preprocess_s(4 * MEGAPIXEL) == pytest.approx(0.082)


def test_n_api_servers_preprocess_n_requests_at_once() -> None:
    """M/G/N: with 2 servers the third simultaneous request waits for the first one to free."""
    frontend = Frontend(FrontendConfig(api_server_count=2, preprocess_ms_per_image=100.0,
                                       preprocess_ms_per_megapixel=0.0, mm_processor_cache_gb=0))
    passes = [frontend.admit(0.0, [_image(digest)]) for digest in range(3)]
    assert [p.start_s for p in passes] == [0.0, 0.0, pytest.approx(0.1)]
    assert [p.ready_s for p in passes] == [pytest.approx(0.1), pytest.approx(0.1), pytest.approx(0.2)]
    assert passes[2].wait_s == pytest.approx(0.1)
    text = frontend.admit(0.0, [])
    assert text.start_s == pytest.approx(0.1) and text.preprocess_s == 0.0  # a text request waits its turn


def test_repeated_image_skips_preprocessing() -> None:
    frontend = Frontend(FrontendConfig(preprocess_ms_per_image=50.0))
    first = frontend.admit(0.0, [_image(7)])
    repeat = frontend.admit(1.0, [_image(7)])
    assert first.preprocess_s > 0.05 and first.cache_hits == 0
    assert repeat.preprocess_s == 0.0 and repeat.cache_hits == 1 and repeat.cached_image_tokens == 256
    assert (frontend.cache.queries, frontend.cache.hits) == (2, 1)


def test_cache_is_lru_by_bytes() -> None:
    item_bytes = MEGAPIXEL * PROCESSED_BYTES_PER_PIXEL
    cache = MMProcessorCache(capacity_bytes=2 * item_bytes)
    assert not cache.lookup(_image(1)) and not cache.lookup(_image(2))
    assert cache.lookup(_image(1))  # 1 is now the most recently used
    assert not cache.lookup(_image(3))  # evicts 2
    assert cache.lookup(_image(1)) and not cache.lookup(_image(2))
    assert not cache.lookup(_image(9, pixels=10 * MEGAPIXEL))  # larger than the cache: served uncached
    assert len(cache) == 2


def test_disabled_cache_counts_nothing() -> None:
    frontend = Frontend(FrontendConfig(mm_processor_cache_gb=0))
    frontend.admit(0.0, [_image(1)])
    second = frontend.admit(1.0, [_image(1)])
    assert second.cache_hits == 0 and frontend.cache.queries == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (FrontendConfig(api_server_count=0), "--api-server-count must be at least 1 (frontend processes), got 0"),
        (FrontendConfig(api_server_count=-2), "--api-server-count must be at least 1 (frontend processes), got -2"),
        (FrontendConfig(preprocess_ms_per_image=-1.0), "--preprocess-ms-per-image must be a finite number of at least 0, got -1.0"),
        (FrontendConfig(preprocess_ms_per_megapixel=float("nan")), "--preprocess-ms-per-megapixel must be a finite number"),
        (FrontendConfig(preprocess_ms_per_megapixel=-0.5), "--preprocess-ms-per-megapixel must be a finite number of at least 0"),
        (FrontendConfig(mm_processor_cache_gb=-4), "--mm-processor-cache-gb must be a finite number of at least 0, got -4"),
        (FrontendConfig(api_server_count=10**9), "--api-server-count must be at most 1024, got 1000000000"),
        (FrontendConfig(preprocess_ms_per_image=1e300), "--preprocess-ms-per-image must be at most 3600000 (an hour), got 1e+300"),
    ],
)
def test_bad_frontend_settings_are_one_line_user_errors(config: FrontendConfig, message: str) -> None:
    with pytest.raises(UserError) as caught:
        config.validate()
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_zero_costs_mean_no_preprocessing_time() -> None:
    """Zero is a valid setting (the stage is free), not an error."""
    config = FrontendConfig(preprocess_ms_per_image=0.0, preprocess_ms_per_megapixel=0.0)
    config.validate()
    assert Frontend(config).admit(3.0, [_image(1)]).ready_s == 3.0


# -- on the virtual clock ------------------------------------------------------------------------

COSTLY = FrontendConfig(preprocess_ms_per_image=40.0, preprocess_ms_per_megapixel=0.0)


def test_repeated_image_ttft_is_lower_by_preprocessing_and_encoder_time() -> None:
    """Same prompt shape, far apart in time: the repeat saves its preprocessing and its encoder work."""
    profile = get_profile("h100-8b")
    fresh, repeat = simulate([_image_request("fresh", 0.0, digest=1), _image_request("repeat", 10.0, digest=1)],
                             SchedulerConfig(), profile, frontend=COSTLY)
    assert fresh.preprocess_s == pytest.approx(0.040) and repeat.preprocess_s == 0.0
    assert repeat.mm_cache_hits == 1
    encoder_s = 256 * profile.per_image_token_s
    assert fresh.ttft_s - repeat.ttft_s == pytest.approx(0.040 + encoder_s, rel=1e-6)
    # the engine's queue time excludes the frontend; TTFT includes it
    assert fresh.queue_time_s == pytest.approx(0.0) and fresh.frontend_s == pytest.approx(0.040)


def test_frontend_saturation_raises_ttft_while_the_scheduler_queue_stays_short() -> None:
    """Image requests at 40 ms each, one API server: 20/s is ρ=0.8, 40/s is ρ=1.6 (overloaded)."""

    def run(rate: float) -> tuple[float, float]:
        requests = [_image_request(f"r{i}", i / rate, digest=i, prompt=64) for i in range(200)]
        timings = simulate(requests, SchedulerConfig(), get_profile("h100-8b"), frontend=COSTLY)
        ttft = sorted(t.ttft_s or 0.0 for t in timings)[int(0.95 * len(timings))]
        queue = max(t.queue_time_s or 0.0 for t in timings)
        return ttft, queue

    light_ttft, light_queue = run(10.0)
    heavy_ttft, heavy_queue = run(40.0)
    assert heavy_ttft > 10 * light_ttft  # requests pile up in front of the API server
    assert heavy_queue < 0.05 and light_queue < 0.05  # the GPU keeps up: the scheduler barely queues


def test_more_api_servers_drain_the_frontend_queue() -> None:
    requests = [_image_request(f"r{i}", i / 40.0, digest=i, prompt=64) for i in range(200)]
    one = simulate(requests, SchedulerConfig(), get_profile("h100-8b"), frontend=COSTLY)
    requests = [_image_request(f"r{i}", i / 40.0, digest=i, prompt=64) for i in range(200)]
    four = simulate(requests, SchedulerConfig(), get_profile("h100-8b"),
                    frontend=FrontendConfig(api_server_count=4, preprocess_ms_per_image=40.0, preprocess_ms_per_megapixel=0.0))
    assert max(t.frontend_wait_s for t in four) == 0.0
    assert max(t.frontend_wait_s for t in one) > 1.0
