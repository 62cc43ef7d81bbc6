"""The rehearsal cost model: its optimum is the one point with factor 1, by construction."""

from __future__ import annotations

import itertools

import pytest

from vlmserve.engines.sim.options import SimEngineConfig, build_engine_core
from vlmserve.engines.sim.rehearsal import MAX_FACTOR, RehearsalOptimum
from vlmserve.errors import UserError
from vlmserve.sched.step_cost import StepContents

OPTIMUM = "max_num_seqs=16,max-num-batched-tokens=1024,api_server_count=2"


def test_the_optimum_alone_has_factor_one_over_a_24_point_grid() -> None:
    optimum = RehearsalOptimum.parse(OPTIMUM)
    factors = {
        point: optimum.factor(dict(zip(("max_num_seqs", "max_num_batched_tokens", "api_server_count"), point)))
        for point in itertools.product((4, 8, 16, 64), (512, 1024, 4096), (1, 2))
    }
    assert len(factors) == 24
    assert [point for point, factor in factors.items() if factor == 1.0] == [(16, 1024, 2)]
    assert min(factor for point, factor in factors.items() if point != (16, 1024, 2)) == 2.0
    assert factors[(8, 1024, 2)] == 2.0 and factors[(4, 1024, 2)] == 4.0 and factors[(16, 512, 1)] == 4.0
    assert max(factors.values()) == MAX_FACTOR, "far points are capped"


def test_the_engine_core_steps_slower_by_the_factor() -> None:
    base = SimEngineConfig(profile="a10g-8b", max_num_seqs=32, max_num_batched_tokens=1024, api_server_count=2)
    tuned = SimEngineConfig(
        profile="a10g-8b", max_num_seqs=32, max_num_batched_tokens=1024, api_server_count=2, rehearsal_optimum=OPTIMUM
    )
    tuned.validate()
    step = StepContents(prefill_tokens=128, prefill_seqs=1, decode_seqs=4, kv_tokens_read=600)
    plain = build_engine_core(base).cost.step_time_s(step)  # type: ignore[attr-defined]
    slowed = build_engine_core(tuned).cost.step_time_s(step)  # type: ignore[attr-defined]
    assert slowed == pytest.approx(2.0 * plain)  # max_num_seqs one doubling from 16


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "max_num_seqs",
            "--rehearsal-optimum 'max_num_seqs': write NAME=VALUE with NAME one of max_num_seqs, "
            "max_num_batched_tokens, api_server_count",
        ),
        ("kv_cache_dtype=fp8", "--rehearsal-optimum 'kv_cache_dtype=fp8': write NAME=VALUE"),
        ("max_num_seqs=0", "--rehearsal-optimum 'max_num_seqs=0': the value must be a positive number"),
        ("max_num_seqs=nan", "--rehearsal-optimum 'max_num_seqs=nan': the value must be a positive number"),
        (",", "--rehearsal-optimum: name at least one setting, e.g. max_num_seqs=32"),
    ],
)
@pytest.mark.hostile("engine sim --rehearsal-optimum: an unknown setting, a non-positive or NaN value is one line")
def test_bad_optimum_is_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as raised:
        RehearsalOptimum.parse(text)
    assert raised.value.message.startswith(message)


def test_constant_mode_refuses_a_rehearsal() -> None:
    with pytest.raises(UserError, match="constant mode .* has none; use --profile"):
        SimEngineConfig(ttft_ms=5, rehearsal_optimum="max_num_seqs=8").validate()
