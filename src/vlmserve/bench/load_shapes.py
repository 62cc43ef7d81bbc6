"""Load that changes over time: `bench --load-shape`, an open loop whose rate follows a shape.

A shape is a rate (requests/s) as a function of time, piecewise linear, written as one of:

- `steps:2@30,20@60,2@40` — 2 req/s for 30 s, then 20 for 60 s, then 2 for 40 s;
- `ramp:2-20@60` — from 2 to 20 req/s, linearly, over 60 s (several ramps: `ramp:2-20@60,20-2@60`);
- `burst:2,20@5/30@120` — 2 req/s, with a 5 s burst at 20 req/s every 30 s, for 120 s;
- `trace:PATH` or `trace:PATH@SECONDS` — a replayed rate trace (below), squeezed into SECONDS if
  given: a day of traffic replayed in minutes keeps its rates and its shape, not its length.

A trace file has one `TIME,RATE` a line (seconds from the start, requests/s), `#` comments, the
times increasing from 0; the rate holds until the next line, and the last line's time is the
trace's end (its rate is not used). E.g. a day in hours: `0,2` `28800,20` `43200,12` `64800,2` `86400,0`.

Arrivals follow the rate by time rescaling: the shape's cumulative count Λ(t) is cut at the
points of a unit-rate process (evenly spaced for `--arrival constant`, exponential gaps for
poisson, gamma gaps of shape `--burstiness` for gamma), so a constant shape gives exactly the
arrivals `--rate` would.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from pathlib import Path

from vlmserve.bounded_read import CONFIG_FILE, Refused, read_bytes
from vlmserve.errors import UserError

FORMS = "steps:R@S,..., ramp:R1-R2@S,..., burst:BASE,PEAK@S/EVERY@TOTAL or trace:PATH[@SECONDS]"
MAX_RATE = 100_000.0
MAX_DURATION_S = 7 * 86400.0
MAX_REQUESTS = 5_000_000
"""The most requests a shape may send (each send offset is held in memory before the run)."""
MAX_TRACE_POINTS = 100_000
"""A week of traffic at one point a minute is 10,080: a trace file with more lines is refused."""


@dataclass(frozen=True)
class Segment:
    """The rate goes linearly from `rate_start` to `rate_end` between `start_s` and `end_s`."""

    start_s: float
    end_s: float
    rate_start: float
    rate_end: float

    def count(self, until_s: float) -> float:
        """Expected arrivals in [start_s, until_s] (until_s within the segment)."""
        span = until_s - self.start_s
        slope = (self.rate_end - self.rate_start) / (self.end_s - self.start_s)
        return self.rate_start * span + 0.5 * slope * span * span

    def time_of(self, count: float) -> float:
        """The time at which `count` arrivals (from the segment's start) are expected."""
        slope = (self.rate_end - self.rate_start) / (self.end_s - self.start_s)
        if abs(slope) < 1e-12:
            return self.start_s + count / self.rate_start
        # rate_start * x + slope/2 * x^2 = count, the root in [0, length]
        root = (-self.rate_start + math.sqrt(max(0.0, self.rate_start**2 + 2 * slope * count))) / slope
        return self.start_s + root


@dataclass(frozen=True)
class LoadShape:
    """A rate over time; `text` is how it was written (kept in the run's load spec)."""

    text: str
    segments: tuple[Segment, ...]

    @property
    def duration_s(self) -> float:
        return self.segments[-1].end_s

    @property
    def peak_rate(self) -> float:
        return max(max(s.rate_start, s.rate_end) for s in self.segments)

    @property
    def expected_requests(self) -> float:
        return sum(s.count(s.end_s) for s in self.segments)

    def rate_at(self, t: float) -> float:
        for segment in self.segments:
            if segment.start_s <= t < segment.end_s:
                fraction = (t - segment.start_s) / (segment.end_s - segment.start_s)
                return segment.rate_start + fraction * (segment.rate_end - segment.rate_start)
        return 0.0

    def arrival_offsets(self, arrival: str, burstiness: float, rng: random.Random) -> list[float]:
        """Send offsets (seconds from the start) following the shape (time rescaling)."""
        totals = [0.0]
        for segment in self.segments:
            totals.append(totals[-1] + segment.count(segment.end_s))
        offsets: list[float] = []
        level = 0.0
        while True:
            if level >= totals[-1]:
                return offsets
            index = bisect.bisect_right(totals, level) - 1
            segment = self.segments[index]
            offsets.append(segment.time_of(level - totals[index]))
            if arrival == "constant":
                level = float(len(offsets))
            elif arrival == "poisson":
                level += rng.expovariate(1.0)
            else:
                level += rng.gammavariate(burstiness, 1.0 / burstiness)


def parse_load_shape(text: str) -> LoadShape:
    """The shape `text` names; UserError (one line, naming --load-shape) otherwise."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in ("steps", "ramp", "burst", "trace") or not rest.strip():
        raise UserError(f"--load-shape {text!r}: write {FORMS}")
    try:
        if kind == "steps":
            segments = _steps(rest)
        elif kind == "ramp":
            segments = _ramps(rest)
        elif kind == "burst":
            segments = _burst(rest)
        else:
            segments = _trace(rest)
    except ValueError as err:
        raise UserError(f"--load-shape {text!r}: {err}") from None
    shape = LoadShape(text, tuple(segments))
    if shape.duration_s > MAX_DURATION_S:
        raise UserError(
            f"--load-shape {text!r}: lasts {shape.duration_s:g} s, over the {MAX_DURATION_S:g} s a run may take; "
            "squeeze a trace with trace:PATH@SECONDS"
        )
    if shape.expected_requests > MAX_REQUESTS:
        raise UserError(
            f"--load-shape {text!r}: sends about {shape.expected_requests:,.0f} requests, over the "
            f"{MAX_REQUESTS:,} a run may send; lower the rates or squeeze the shape"
        )
    if shape.expected_requests < 1:
        raise UserError(f"--load-shape {text!r}: sends no request (every rate is 0)")
    return shape


def _number(text: str, what: str, *, positive: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text.strip()!r} is not a number") from None
    if (
        not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
        or value > (MAX_RATE if "rate" in what else MAX_DURATION_S)
    ):
        raise ValueError(
            f"{what} {text.strip()!r} must be a finite number {'above' if positive else 'of at least'} 0"
            f"{' and at most ' + format(MAX_RATE, 'g') if 'rate' in what else ''}"
        )
    return value


def _split_at(part: str, what: str) -> tuple[str, float]:
    head, at, seconds = part.rpartition("@")
    if not at:
        raise ValueError(f"{what} {part.strip()!r} has no @SECONDS")
    return head, _number(seconds, "duration", positive=True)


def _chain(pieces: list[tuple[float, float, float]]) -> list[Segment]:
    """(rate_start, rate_end, seconds) pieces one after another."""
    segments: list[Segment] = []
    now = 0.0
    for rate_start, rate_end, seconds in pieces:
        segments.append(Segment(now, now + seconds, rate_start, rate_end))
        now += seconds
    return segments


def _steps(rest: str) -> list[Segment]:
    pieces = []
    for part in rest.split(","):
        rate, seconds = _split_at(part, "step")
        value = _number(rate, "rate")
        pieces.append((value, value, seconds))
    return _chain(pieces)


def _ramps(rest: str) -> list[Segment]:
    pieces = []
    for part in rest.split(","):
        rates, seconds = _split_at(part, "ramp")
        low, dash, high = rates.partition("-")
        if not dash:
            raise ValueError(f"ramp {part.strip()!r}: write FROM-TO@SECONDS, e.g. 2-20@60")
        pieces.append((_number(low, "rate"), _number(high, "rate"), seconds))
    return _chain(pieces)


def _burst(rest: str) -> list[Segment]:
    head, total = _split_at(rest, "burst")
    base_text, comma, burst_text = head.partition(",")
    burst, slash, every_text = burst_text.partition("/")
    peak_text, at, length_text = burst.partition("@")
    if not comma or not slash or not at:
        raise ValueError("write burst:BASE,PEAK@SECONDS/EVERY@TOTAL, e.g. burst:2,20@5/30@120")
    base, peak = _number(base_text, "rate"), _number(peak_text, "rate")
    length, every = _number(length_text, "duration", positive=True), _number(every_text, "duration", positive=True)
    if length >= every:
        raise ValueError(f"a {length:g} s burst every {every:g} s never ends; make the burst shorter than the period")
    pieces: list[tuple[float, float, float]] = []
    now = 0.0
    while now < total - 1e-9:
        quiet = min(every - length, total - now)
        pieces.append((base, base, quiet))
        now += quiet
        if now < total - 1e-9:
            loud = min(length, total - now)
            pieces.append((peak, peak, loud))
            now += loud
    return _chain(pieces)


def _trace(rest: str) -> list[Segment]:
    path_text, at, squeeze_text = rest.rpartition("@")
    if not at or not squeeze_text.replace(".", "", 1).isdigit():
        path_text, squeeze = rest, None
    else:
        squeeze = _number(squeeze_text, "duration", positive=True)
    path = Path(path_text).expanduser()
    try:
        text = read_bytes(path, CONFIG_FILE).decode("utf-8")
    except Refused as err:
        raise ValueError(str(err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {path} ({getattr(err, 'strerror', None) or type(err).__name__})") from None
    points: list[tuple[float, float]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        time_text, comma, rate_text = line.partition(",")
        if not comma:
            raise ValueError(f"{path} line {number}: write TIME,RATE (seconds, requests/s)")
        at_s, rate = _number(time_text, f"{path} line {number}: time"), _number(rate_text, f"{path} line {number}: rate")
        if points and at_s <= points[-1][0]:
            raise ValueError(f"{path} line {number}: time {at_s:g} is not after {points[-1][0]:g}")
        if not points and at_s != 0:
            raise ValueError(f"{path} line {number}: the first time must be 0")
        points.append((at_s, rate))
        if len(points) > MAX_TRACE_POINTS:
            raise ValueError(
                f"{path}: more than {MAX_TRACE_POINTS:,} TIME,RATE lines; aggregate the trace (a point a minute is plenty)"
            )
    if len(points) < 2:
        raise ValueError(f"{path}: give at least two TIME,RATE lines (the last one marks the end)")
    scale = squeeze / points[-1][0] if squeeze else 1.0
    return [Segment(a * scale, b * scale, rate, rate) for (a, rate), (b, _) in zip(points, points[1:])]
