"""`vlmserve consistency` against real sim engines: it passes on a correct engine, and fails (exit 1,
naming the requests that changed) on one whose concurrent requests get each other's answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL
from tests.helpers.sim import SimHandle, free_port, start_sim_engine

SMALL = ["--concurrency", 8, "--output-len", 16]


@pytest.fixture(scope="module")
def swapping_sim() -> Iterator[SimHandle]:
    """A sim engine with the answer-swapping fault on every request that has company."""
    with start_sim_engine(model=SIM_MODEL, ttft_ms=20, itl_ms=2, seed=1, swap_answer_rate=1.0) as handle:
        yield handle


def _check(cli, handle: SimHandle, tmp_path: Path, *flags: object):
    result_file = tmp_path / "consistency.json"
    done = cli("consistency", "--base-url", handle.base_url, "--model", SIM_MODEL, "--result-file", result_file, *SMALL, *flags)
    data = json.loads(result_file.read_text()) if result_file.exists() else None
    return done, data


def test_passes_on_a_correct_engine_text_and_images(sim, cli, tmp_path: Path) -> None:
    done, data = _check(cli, sim, tmp_path, "--num-requests", 12, "--num-image-requests", 6)
    assert done.code == 0, done.out + done.err
    assert "PASS" in done.out and "(simulated engine)" in done.out
    assert data["passed"] is True and data["simulated"] is True and data["problems"] == []
    assert data["checked"] == data["compared"] == data["identical"] == 18
    assert data["identical_fraction"] == 1.0 and data["differing"] == [] and data["image_swaps"] == []
    assert data["units"] == ["token"]  # the sim returns logprobs: compared token by token
    assert data["in_flight_at_send"]["min"] >= 1  # every checked request really ran with company
    assert data["image_cases"] == 6 and data["image_distinct_alone_answers"] == 6
    assert data["max_logprob_delta_identical"] == 0.0


def test_fails_on_swapped_answers_text(swapping_sim, cli, tmp_path: Path) -> None:
    done, data = _check(cli, swapping_sim, tmp_path, "--num-requests", 12, "--num-image-requests", 0)
    assert done.code == 1, done.out + done.err
    assert "FAIL: identical fraction" in done.out and "below --min-identical 1" in done.out
    assert data["passed"] is False and data["identical_fraction"] < 1.0
    differing = data["differing"]
    assert differing and len(differing) == data["compared"] - data["identical"]
    for entry in differing:
        assert entry["unit"] == "token" and entry["first_difference"] is not None
        assert entry["first_difference_char"] is not None and entry["alone_excerpt"] != entry["loaded_excerpt"]
    # the swapped answers are recognised as other checked requests' answers where they are
    assert any(entry["same_as"] for entry in differing)
    assert "requests whose answer changed under load" in done.out


def test_fails_on_swapped_answers_images(swapping_sim, cli, tmp_path: Path) -> None:
    done, data = _check(cli, swapping_sim, tmp_path, "--num-requests", 0, "--num-image-requests", 6)
    assert done.code == 1, done.out + done.err
    assert data["image_distinct_alone_answers"] == 6  # alone, each image gets its own answer
    assert data["image_swaps"], data
    swap = data["image_swaps"][0]
    assert swap["case_id"].startswith("image-") and swap["other_case_id"].startswith("image-")
    assert any("image swap(s)" in problem for problem in data["problems"])
    assert "image swap: under load" in done.out


def test_a_lower_threshold_accepts_differences_but_not_image_swaps(swapping_sim, cli, tmp_path: Path) -> None:
    done, data = _check(cli, swapping_sim, tmp_path, "--num-requests", 6, "--num-image-requests", 0, "--min-identical", 0)
    assert done.code == 0 and data["passed"] is True and data["identical_fraction"] < 1.0
    done, data = _check(cli, swapping_sim, tmp_path, "--num-requests", 0, "--num-image-requests", 6, "--min-identical", 0)
    assert done.code == 1 and data["problems"] and "image swap" in data["problems"][0]


def test_unreachable_url_is_one_line(cli) -> None:
    done = cli("consistency", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m")
    assert done.code == 2 and "cannot reach" in done.error_line and "--base-url" in done.error_line
    assert "Traceback" not in done.err


def test_wrong_model_is_one_line(sim, cli) -> None:
    done = cli("consistency", "--base-url", sim.base_url, "--model", "nope")
    assert done.code == 2 and done.error_line.startswith("error: model 'nope' is not served at")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--base-url", "localhost:8000"], "error: --base-url 'localhost:8000': give a URL like http://127.0.0.1:8000"),
        (["--concurrency", 1], "error: --concurrency 1: give at least 2 (the loaded run needs others in flight)"),
        (["--min-identical", 1.5], "error: --min-identical 1.5: give a fraction between 0 and 1"),
        (
            ["--num-requests", 0, "--num-image-requests", 0],
            "error: nothing to check: give --num-requests or --num-image-requests of at least 1",
        ),
        (["--num-image-requests", 1], "error: --num-image-requests 1 cannot show an image swap; give 0 or at least 2"),
        (["--num-requests", -1], "error: --num-requests and --num-image-requests must not be negative"),
        (["--output-len", 0], "error: --output-len 0: give at least 1 token"),
        (["--filler-per-request", -2], "error: --filler-per-request -2: must not be negative"),
        (["--timeout", 0], "error: --timeout 0: give seconds > 0"),
        (["--image-size", "big"], "error: --image-size 'big': write it like 64x64"),
        (["--result-file", "/no/such/dir/out.json"], "error: --result-file /no/such/dir/out.json: its directory does not exist"),
    ],
)
def test_bad_flags_are_one_line_errors(sim, cli, flags: list[object], message: str) -> None:
    args = ["consistency", "--base-url", sim.base_url, "--model", SIM_MODEL, *flags]
    if "--base-url" in flags[:1]:
        args = ["consistency", "--model", SIM_MODEL, *flags]
    done = cli(*args)
    assert done.code == 2 and done.error_line == message, done.err
    assert "Traceback" not in done.err


def _spec(tmp_path: Path, extra_args: list[str]) -> Path:
    spec = tmp_path / "deployment.yaml"
    spec.write_text(
        f"name: consistency-dep\nengine: sim\nmodel: sim-dep\nreplicas: 2\ngateway: true\n"
        f"sim: {{ttft_ms: 20, itl_ms: 2, extra_args: {json.dumps(extra_args)}}}\n"
    )
    return spec


def test_deployment_is_started_per_prefix_caching_variant_across_replicas(cli, tmp_path: Path) -> None:
    """Two sim replicas (seeded differently) behind the gateway: greedy answers agree across replicas,
    with prefix caching on and off, and every deployment is torn down."""
    out = tmp_path / "result.json"
    done = cli(
        "consistency",
        "--deployment",
        _spec(tmp_path, []),
        "--num-requests",
        6,
        "--num-image-requests",
        2,
        "--concurrency",
        4,
        "--output-len",
        8,
        "--result-file",
        out,
    )
    assert done.code == 0, done.out + done.err
    data = json.loads(out.read_text())
    assert data["passed"] is True
    assert [variant["variant"] for variant in data["variants"]] == [
        "prefix caching on, 2 replicas behind the gateway",
        "prefix caching off, 2 replicas behind the gateway",
    ]
    assert all(variant["identical_fraction"] == 1.0 and variant["compared"] == 8 for variant in data["variants"])
    assert "(prefix caching off, 2 replicas behind the gateway)" in done.out


def test_deployment_with_swapped_answers_fails(cli, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = cli(
        "consistency",
        "--deployment",
        _spec(tmp_path, ["--swap-answer-rate", "1"]),
        "--prefix-caching",
        "off",
        "--num-requests",
        6,
        "--num-image-requests",
        0,
        "--concurrency",
        4,
        "--output-len",
        8,
        "--result-file",
        out,
    )
    assert done.code == 1, done.out + done.err
    data = json.loads(out.read_text())
    assert data["passed"] is False and len(data["variants"]) == 1 and data["variants"][0]["differing"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: give --base-url URL (an endpoint) or --deployment SPEC.yaml (started for the check), not both"),
        (
            ["--base-url", "http://127.0.0.1:1", "--deployment", "x.yaml", "--model", "m"],
            "error: give --base-url URL (an endpoint) or --deployment SPEC.yaml (started for the check), not both",
        ),
        (
            ["--base-url", "http://127.0.0.1:1"],
            "error: --model is required with --base-url (the name in the endpoint's /v1/models)",
        ),
        (
            ["--base-url", "http://127.0.0.1:1", "--model", "m", "--prefix-caching", "off"],
            "error: --prefix-caching needs --deployment (an endpoint's engine is already configured)",
        ),
    ],
)
def test_endpoint_or_deployment_flags(cli, args: list[object], message: str) -> None:
    done = cli("consistency", *args)
    assert done.code == 2 and done.error_line == message, done.err


def test_bad_deployment_inputs_are_one_line(cli, tmp_path: Path) -> None:
    done = cli("consistency", "--deployment", _spec(tmp_path, []), "--prefix-caching", "sometimes")
    assert done.code == 2 and done.error_line == "error: --prefix-caching 'sometimes': use one of both, on, off"
    done = cli("consistency", "--deployment", tmp_path / "missing.yaml")
    assert done.code == 2 and "missing.yaml" in done.error_line and "Traceback" not in done.err
