"""--load-shape: shapes parse to the rates written, arrivals follow them, bad shapes are one line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vlmserve.bench.load import arrival_offsets
from vlmserve.bench.load_shapes import parse_load_shape
from vlmserve.cli.bench import build_load_spec, option_defaults
from vlmserve.errors import UserError


def test_steps_send_each_rate_for_its_time() -> None:
    shape = parse_load_shape("steps:2@30,20@60,2@40")
    assert shape.duration_s == 130 and shape.peak_rate == 20 and shape.expected_requests == 60 + 1200 + 80
    offsets = shape.arrival_offsets("constant", 1.0, random.Random(0))
    assert len(offsets) == 1340
    assert sum(1 for t in offsets if t < 30) == 60 and sum(1 for t in offsets if 30 <= t < 90) == 1200


def test_a_constant_shape_sends_what_rate_sends() -> None:
    shape = parse_load_shape("steps:4@10")
    assert shape.arrival_offsets("constant", 1.0, random.Random(0)) == pytest.approx(
        arrival_offsets("constant", 4.0, 1.0, random.Random(0), count=None, duration_s=10.0)
    )


def test_a_ramp_sends_more_as_the_rate_rises() -> None:
    shape = parse_load_shape("ramp:0-20@20")
    offsets = shape.arrival_offsets("poisson", 1.0, random.Random(3))
    first, second = sum(1 for t in offsets if t < 10), sum(1 for t in offsets if t >= 10)
    assert shape.expected_requests == pytest.approx(200)
    assert 150 <= len(offsets) <= 250 and second > 2 * first  # expected 50 and 150


def test_bursts_repeat_within_the_total() -> None:
    shape = parse_load_shape("burst:2,20@5/30@120")
    assert shape.duration_s == pytest.approx(120)
    assert [shape.rate_at(t) for t in (0, 26, 29.9, 30, 56)] == [2, 20, 20, 2, 20]


def test_a_trace_is_replayed_squeezed(tmp_path: Path) -> None:
    trace = tmp_path / "day.csv"
    trace.write_text("# a day in seconds\n0,2\n28800,20\n64800,2\n86400,0\n")
    shape = parse_load_shape(f"trace:{trace}@240")
    assert shape.duration_s == pytest.approx(240)
    assert shape.rate_at(100) == 20 and shape.rate_at(10) == 2 and shape.rate_at(200) == 2


def test_the_shape_sets_the_load_specs_rate_and_duration() -> None:
    load = build_load_spec(option_defaults({"load_shape": "steps:2@10,20@5"}))
    assert load.rate == 20 and load.duration_s == 15 and load.load_shape == "steps:2@10,20@5"


@pytest.mark.hostile("bench --load-shape with a malformed, empty or endless shape")
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("waves:3", "--load-shape 'waves:3': write steps:R@S"),
        ("steps:2", "--load-shape 'steps:2': step '2' has no @SECONDS"),
        ("steps:x@10", "--load-shape 'steps:x@10': rate 'x' is not a number"),
        ("steps:nan@10", "--load-shape 'steps:nan@10': rate 'nan' must be a finite number"),
        ("steps:0@10", "--load-shape 'steps:0@10': sends no request (every rate is 0)"),
        ("steps:2@-1", "--load-shape 'steps:2@-1': duration '-1' must be a finite number above 0"),
        ("steps:2@1e9", "--load-shape 'steps:2@1e9': duration '1e9' must be a finite number above 0"),
        ("steps:100000@600000", "--load-shape 'steps:100000@600000': sends about 60,000,000,000 requests, over the 5,000,000"),
        ("ramp:2@10", "--load-shape 'ramp:2@10': ramp '2@10': write FROM-TO@SECONDS"),
        ("burst:2,20@30/30@120", "--load-shape 'burst:2,20@30/30@120': a 30 s burst every 30 s never ends"),
        ("trace:/nonexistent/day.csv", "--load-shape 'trace:/nonexistent/day.csv': cannot read /nonexistent/day.csv"),
    ],
)
def test_bad_shapes_are_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_load_shape(text)
    assert caught.value.message.startswith(message), caught.value.message


@pytest.mark.hostile("a load-shape trace file with unordered times or a bad line")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("0,2\n10,5\n5,1\n", "line 3: time 5 is not after 10"),
        ("1,2\n10,5\n", "line 1: the first time must be 0"),
        ("0,2\n10\n", "line 2: write TIME,RATE"),
        ("0,2\n", "give at least two TIME,RATE lines"),
        ("".join(f"{t},1\n" for t in range(100_002)), "more than 100,000 TIME,RATE lines"),
    ],
)
def test_bad_trace_files_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(content)
    with pytest.raises(UserError, match=message):
        parse_load_shape(f"trace:{trace}")


@pytest.mark.hostile("bench --load-shape beside --rate or --duration")
def test_the_shape_excludes_rate_and_duration() -> None:
    with pytest.raises(UserError, match="--load-shape sets the rate and the duration itself; drop --rate, --duration"):
        build_load_spec(option_defaults({"load_shape": "steps:2@10", "rate": 5.0, "duration": "10s"}))
