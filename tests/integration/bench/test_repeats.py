"""--repeat N: N runs of one load with fresh seeds, 95 % intervals in the summary, compare says unchanged.

The two runs of the same load are minutes-apart sessions on a shared machine: their intervals may
sit a few percent apart (load drift), which compare's 5% minimum effect reads as "within 5%", not
as a change; tests/unit/report/test_compare_min_effect.py proves the rule on fixed figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL, bench_args
from tests.helpers.sim import SimHandle, start_sim_engine
from vlmserve.bench.repeats import confidence_interval, repeat_seed, t_quantile_975
from vlmserve.report.compare import COMPARED_METRICS


def test_t_interval_matches_the_textbook() -> None:
    interval = confidence_interval([10.0, 12.0, 14.0])  # mean 12, s 2, t(2) 4.303
    assert interval.mean == pytest.approx(12.0)
    assert interval.half_width == pytest.approx(4.303 * 2.0 / 3**0.5, rel=1e-6)
    assert confidence_interval([5.0]).low is None  # one value: no interval
    assert t_quantile_975(35) == t_quantile_975(30)  # between rows: the wider one
    assert repeat_seed(7, 0) == 7 and repeat_seed(7, 1) != repeat_seed(8, 0)


@pytest.fixture
def slow_sim() -> Iterator[SimHandle]:
    """A sim engine whose own latencies (TTFT 200 ms, ITL 100 ms) dwarf the few milliseconds a busy
    machine adds (the suite runs in parallel workers): the 20 ms / 2 ms engine of the other tests made a
    3 ms scheduling delay a 10 % change in TTFT p95, and compare called it one."""
    with start_sim_engine(model=SIM_MODEL, ttft_ms=200, itl_ms=100, seed=1) as handle:
        yield handle


def test_repeat_writes_intervals_and_compare_says_unchanged(slow_sim, cli, tmp_path) -> None:
    ids = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        done = cli(
            *bench_args(
                slow_sim,
                "--concurrency",
                2,
                "--num-requests",
                8,
                "--input-len",
                16,
                "--output-len",
                4,
                "--repeat",
                3,
                "--json-out",
                out,
                "--label",
                name,
            )
        )
        assert done.code == 0, done.err
        assert "mean and 95% CI over 3 repeats" in done.out
        summary = json.loads(out.read_text())
        repeats = summary["repeats"]
        assert repeats["count"] == 3 and len(set(repeats["seeds"])) == 3
        for path in (
            "throughput.requests_per_s",
            "throughput.output_tokens_per_s",
            "ttft_ms.p50",
            "ttft_ms.p95",
            "tpot_ms.p50",
            "tpot_ms.p95",
        ):
            interval = repeats["intervals"][path]
            assert interval["low"] <= interval["mean"] <= interval["high"] and len(interval["values"]) == 3
        assert summary["requests"]["total"] == 24  # one run id holds all three repeats' records
        ids.append(summary["meta"]["run_id"])
    done = cli("compare", *ids, "--fail-on-regression")
    assert done.code == 0, done.out
    assert "judged by 95% confidence intervals (3 vs 3 repeats), min effect 5%" in done.out
    rows = [line for line in done.out.splitlines() if line.startswith("│")]  # one per metric (the header is ┃)
    assert len(rows) == len(COMPARED_METRICS)
    assert all(row.rstrip(" │").endswith(("unchanged", "within 5%")) for row in rows), done.out
    assert "no regression beyond the 95% confidence intervals and the 5% minimum effect" in done.out


def test_single_run_is_labelled(sim, cli) -> None:
    done = cli(*bench_args(sim, "--concurrency", 1, "--num-requests", 2, "--input-len", 8, "--output-len", 2))
    assert done.code == 0, done.err
    assert "single run: no confidence interval" in done.out


def test_bad_repeat_is_one_line(sim, cli) -> None:
    done = cli(*bench_args(sim, "--concurrency", 1, "--num-requests", 2, "--repeat", 0))
    assert done.code == 2
    assert done.error_line.startswith("error: bench: --repeat") and "greater than or equal to 1" in done.error_line
