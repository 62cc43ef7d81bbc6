"""The scaling block: attainment per window and SLO misses / failures across scale events."""

from __future__ import annotations

from vlmserve.bench.scale_events import scaling_block
from vlmserve.results.records import RequestRecord
from vlmserve.spec import SLO

T0 = 1_800_000_000.0
SLO_1S = SLO.parse("ttft_p95=1s")


def record(sent: float, ttft: float, ok: bool = True, e2e: float = 1.0) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{sent}",
        scheduled_at_s=T0 + sent,
        sent_at_s=T0 + sent,
        first_token_at_s=T0 + sent + ttft if ok else None,
        finished_at_s=T0 + sent + max(e2e, ttft),
        ok=ok,
        error_kind=None if ok else "http_500",
    )


def run(slow_from: float, slow_until: float, failing_at: float | None = None) -> list[RequestRecord]:
    """Two requests a second for 60 s; slow (2 s TTFT) ones sent in [slow_from, slow_until)."""
    records = []
    for i in range(120):
        sent = i * 0.5
        slow = slow_from <= sent < slow_until
        records.append(record(sent, 2.0 if slow else 0.1, ok=not (failing_at is not None and sent == failing_at)))
    return records


TIMELINE = (
    [(T0 + t, 1.0) for t in range(0, 28)]
    + [(T0 + 28, 2.0), (T0 + 29, 3.0)]
    + [(T0 + t, 3.0) for t in range(30, 50)]
    + [(T0 + t, 2.0) for t in range(50, 62)]
)


def test_misses_fall_in_the_scale_up_and_none_after() -> None:
    block = scaling_block(run(10, 29), TIMELINE, SLO_1S, 5.0, "steps:2@60")
    (up,) = block.scale_ups
    assert (up.began_s, up.first_joined_s, up.last_joined_s) == (10.0, 28.0, 29.0)
    assert (up.replicas_before, up.replicas_after) == (1.0, 3.0)
    assert up.requests_during == 38 and up.missed_during == 38  # sent 10 s .. 29 s, all slow
    assert up.missed_after == 0 and up.requests_after == 40 and up.after_until_s == 49.0  # sent 29 s .. 48.5 s, until the fall
    windows = block.windows
    assert windows[0].attainment == 1.0 and windows[2].attainment == 0.0 and windows[2].replicas == 1.0
    assert windows[6].replicas == 3.0 and windows[6].attainment == 1.0


def test_a_scale_down_without_failures_and_one_with() -> None:
    (down,) = scaling_block(run(10, 29), TIMELINE, SLO_1S, 5.0, None).scale_downs
    assert (down.replicas_before, down.replicas_after, down.failed) == (3.0, 2.0, 0)
    assert down.requests_in_flight == 5  # sent 48 s .. 50 s: still in flight at the sample before the fall (49 s)
    (cut,) = scaling_block(run(10, 29, failing_at=49.5), TIMELINE, SLO_1S, 5.0, None).scale_downs
    assert cut.failed == 1


def test_without_a_gateway_only_windows_are_reported() -> None:
    block = scaling_block(run(0, 0), None, None, 10.0, "steps:2@60")
    assert block.scale_ups == [] and block.replicas_timeline is None
    assert [w.requests for w in block.windows][:6] == [20] * 6


def test_a_rise_in_a_window_without_misses_still_counts_the_misses_before_it() -> None:
    """The window the replicas join in can be all good (the new replicas serve it): the misses
    of the windows before it are still the scale-up's."""
    timeline = [(T0 + t, 1.0) for t in range(0, 15)] + [(T0 + 15.05, 4.0)] + [(T0 + t, 4.0) for t in range(16, 60)]
    (up,) = scaling_block(run(6, 15), timeline, SLO_1S, 5.0, None).scale_ups
    assert up.began_s == 5.0 and up.missed_during == 18 and up.missed_after == 0
