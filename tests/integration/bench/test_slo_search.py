"""`vlmserve slo-search` against a sim engine with a scheduler profile: the boundary it reports is real.

The engine (h100-qwen3vl-4b profile, one sequence at a time, 64 output tokens) serves about
3.4 requests/s; past that its queue grows. The test asserts structure, never timings: the
run at the highest level that held met the SLO, the run at the lowest level that missed did
not, the two are adjacent within the precision, and every probe is a stored run. The precision
is 50 %: five probes (1, 16, 4, 2, 2.8) of up to three 1.5 s repeats; a finer one proves the same
bisection with a sixth probe (4 s more).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.helpers.sim import SimHandle, start_sim_engine
from vlmserve.results import store

MODEL = "slo-sim"


@pytest.fixture(scope="module")
def profiled_sim() -> Iterator[SimHandle]:
    with start_sim_engine(model=MODEL, profile="h100-qwen3vl-4b", max_num_seqs=1, seed=1) as handle:
        yield handle


def search_args(handle: SimHandle, *extra: object) -> list[str]:
    return ["slo-search", "--base-url", handle.base_url, "--model", MODEL, "--no-progress", *map(str, extra)]


def test_search_finds_a_boundary_met_below_and_missed_above(profiled_sim, cli, tmp_path) -> None:
    out = tmp_path / "search.json"
    done = cli(
        *search_args(
            profiled_sim,
            "--slo",
            "ttft_p95=100ms",
            "--rate-range",
            "1:16",
            "--precision",
            "0.5",
            "--repeat",
            "3",
            "--duration",
            "1.5s",
            "--input-len",
            "64",
            "--output-len",
            "64",
            "--arrival",
            "constant",
            "--json-out",
            out,
        )
    )
    assert done.code == 0, done.err
    search = json.loads(out.read_text())
    assert search["status"] == "bounded"
    boundary = search["boundary"]
    held, missed = boundary["held"], boundary["missed"]
    assert 1 <= held < missed <= 16 and missed / held <= 1.5
    # the runs behind the boundary are in the history: below it the SLO held, above it it did not
    below = store.load_run(boundary["held_run_id"]).summary.to_dict()
    above = store.load_run(boundary["missed_run_id"]).summary.to_dict()
    assert below["meta"]["load_spec"]["rate"] == held and above["meta"]["load_spec"]["rate"] == missed
    assert sum(row["slo_met"] for row in below["repeats"]["runs"]) * 2 > len(below["repeats"]["runs"])
    assert sum(row["slo_met"] for row in above["repeats"]["runs"]) * 2 <= len(above["repeats"]["runs"])
    # every probe is a stored run with its own seed; levels held below the boundary and missed above it
    probes = search["probes"]
    assert len({probe["run_id"] for probe in probes}) == len(probes) >= 3
    assert all(probe["held"] == (probe["level"] <= held) for probe in probes)
    # the far end collapsed and was cut short instead of measured for the whole duration
    top = next(probe for probe in probes if probe["level"] == 16)
    assert top["stopped"] == "oversaturated"
    # the console says the same: a table of probes and the answer with its interval and runs
    assert "SLO search over rate" in done.out
    assert (
        f"highest rate meeting ttft_p95=100ms: {held:g} req/s (held at {held:g}, run {boundary['held_run_id']}; "
        f"missed at {missed:g}, run {boundary['missed_run_id']})" in done.out
    )


def test_search_says_when_the_range_is_too_high_or_too_low(profiled_sim, cli) -> None:
    done = cli(
        *search_args(
            profiled_sim,
            "--slo",
            "ttft_p95=1ms",
            "--rate-range",
            "1:2",
            "--repeat",
            "1",
            "--duration",
            "0.5s",
            "--input-len",
            "16",
            "--output-len",
            "4",
        )
    )
    assert done.code == 0, done.err
    assert "are missed even at rate 1 req/s" in done.out and "lower the range's low end" in done.out


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "error: give one of --rate-range LOW:HIGH (open loop) or --concurrency-range LOW:HIGH (closed loop)"),
        (
            ("--rate-range", "1:4", "--concurrency-range", "1:4"),
            "error: give one of --rate-range LOW:HIGH (open loop) or --concurrency-range LOW:HIGH (closed loop)",
        ),
        (("--rate-range", "fast"), "error: --rate-range 'fast': write it as LOW:HIGH, e.g. 1:64"),
        (("--rate-range", "8:2"), "error: --rate-range 8:2: give LOW:HIGH with 0 < LOW < HIGH, e.g. 1:64"),
        (("--concurrency-range", "1:2.5"), "error: --concurrency-range 1:2.5: concurrencies are whole users, e.g. 1:256"),
        (("--rate-range", "1:4", "--precision", "0"), "error: --precision 0: give a positive fraction, e.g. 0.1 for 10%"),
        (
            ("--rate-range", "1:4", "--max-probes", "1"),
            "error: --max-probes 1: the search needs at least 2 (both ends of the range)",
        ),
    ],
)
def test_bad_search_input_is_one_line(cli, extra, message) -> None:
    done = cli(
        "slo-search", "--base-url", "http://127.0.0.1:9", "--model", "m", "--slo", "ttft_p95=1s", "--num-requests", "4", *extra
    )
    assert done.code == 2 and done.error_line == message, done.err


def test_endpoint_and_objectives_are_required_clearly(cli) -> None:
    done = cli("slo-search", "--slo", "ttft_p95=1s", "--rate-range", "1:4", "--num-requests", "4")
    assert done.error_line == (
        "error: give --base-url URL (an endpoint) or --deployment SPEC.yaml (started for the search), not both"
    )
    done = cli(
        "slo-search", "--base-url", "http://127.0.0.1:9", "--slo", "ttft_p95=1s", "--rate-range", "1:4", "--num-requests", "4"
    )
    assert done.error_line == "error: --base-url needs --model NAME (as listed in /v1/models)"
    done = cli(
        "slo-search",
        "--base-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--slo",
        "",
        "--rate-range",
        "1:4",
        "--num-requests",
        "4",
    )
    assert done.error_line == "error: give --slo, e.g. --slo ttft_p95=500ms,tpot_p95=50ms: the search needs objectives"


def test_search_starts_a_deployment_once_and_tears_it_down(cli, tmp_path) -> None:
    spec = tmp_path / "deployment.yaml"
    spec.write_text(
        "name: slo-dep\nengine: sim\nmodel: sim-dep\ngateway: false\n"
        "sim: {profile: h100-qwen3vl-4b, extra_args: ['--max-num-seqs', '1']}\n"
    )
    out = tmp_path / "search.json"
    done = cli(
        "slo-search",
        "--deployment",
        spec,
        "--slo",
        "ttft_p95=100ms",
        "--concurrency-range",
        "1:4",
        "--repeat",
        "1",
        "--num-requests",
        "6",
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--no-progress",
        "--json-out",
        out,
    )
    assert done.code == 0, done.err
    search = json.loads(out.read_text())
    assert search["status"] == "bounded" and search["boundary"]["missed"] - search["boundary"]["held"] == 1
    runs = [store.load_run(probe["run_id"]).summary.to_dict()["meta"] for probe in search["probes"]]
    assert {meta["deployment"]["name"] for meta in runs} == {"slo-dep"}
    assert len({meta["target"] for meta in runs}) == 1  # started once, every probe against it
    from urllib.parse import urlparse

    from vlmserve.deploy.processes import port_is_free

    assert port_is_free("127.0.0.1", urlparse(runs[0]["target"]).port)  # torn down at the end
