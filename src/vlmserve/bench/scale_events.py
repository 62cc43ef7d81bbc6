"""What a run under a changing load did across scale events: the `scaling` block of a summary.

From the records and the replica count sampled from the gateway during the run
(`ServerScraper.replicas_timeline`):

- **windows**: the run cut into `window_s` windows by send time; per window the requests sent,
  how many met the SLO (every per-request objective, as goodput counts them), how many failed,
  and the replicas in rotation (the highest count sampled in the window).
- **scale-ups**: each rise of the replica count (rises less than `MERGE_S` apart are one event,
  the replicas of one decision joining together). The event begins where the SLO began to be
  missed before the rise (the run of windows with misses leading into it; the rise itself if
  none), and ends when the last replica joined. It reports the requests sent in it that missed
  the SLO or failed, and the same for the requests sent after it, until the next event.
- **scale-downs**: each fall of the count; the requests in flight around it (sent before the
  count fell and finished, or failed, after the sample before the fall) are those a careless
  scale-down would cut; the failures among them are reported (the target is none).

All times are seconds from the run's first send. With no SLO, "missed" counts failures only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vlmserve.results.blocks import ScaleDown, ScaleUp, ScalingBlock, ScalingWindow
from vlmserve.results.metrics import meets_slo
from vlmserve.results.records import RequestRecord
from vlmserve.results.run import RunResult
from vlmserve.spec import SLO

MERGE_S = 10.0
"""Replica-count rises closer than this are one scale-up (one decision's replicas joining)."""

Change = tuple[float, float, float, float]
"""(time of the sample before, time seen, count before, count after): one change of the replica count."""


def _good(record: RequestRecord, slo: SLO | None) -> bool:
    return record.ok and (slo is None or not slo.bounds_s or meets_slo(record, slo))


def _count_at(timeline: Sequence[tuple[float, float]], t: float) -> float | None:
    """The count last sampled at or before t."""
    value = None
    for at, count in timeline:
        if at > t:
            break
        value = count
    return value


def _changes(timeline: Sequence[tuple[float, float]]) -> list[Change]:
    """(time of the sample before, time seen, count before, count after) for every change."""
    changes = []
    for (at_before, before), (at, after) in zip(timeline, timeline[1:]):
        if after != before:
            changes.append((at_before, at, before, after))
    return changes


def scaling_block(
    records: Sequence[RequestRecord],
    timeline: Sequence[tuple[float, float]] | None,
    slo: SLO | None,
    window_s: float,
    load_shape: str | None,
) -> ScalingBlock:
    """The `scaling` block (module docstring); `timeline` is (wall time, replicas), absent for a
    target that is not a vlmserve gateway (then only the windows are reported)."""
    measured = sorted((r for r in records if not r.warmup), key=lambda r: r.sent_at_s)
    if not measured:
        return ScalingBlock(load_shape=load_shape, window_s=window_s, windows=[], scale_ups=[], scale_downs=[])
    start = min(r.scheduled_at_s for r in measured)
    rel_timeline = [(at - start, count) for at, count in (timeline or [])]
    windows = _windows(measured, start, rel_timeline, slo, window_s)
    changes = _changes(rel_timeline)
    falls = [change for change in changes if change[3] < change[2]]
    groups = _rise_groups([change for change in changes if change[3] > change[2]])
    scale_ups = [
        _scale_up(measured, start, windows, slo, group, groups[number + 1][0][0] if number + 1 < len(groups) else math.inf, falls)
        for number, group in enumerate(groups)
    ]
    return ScalingBlock(
        load_shape=load_shape,
        window_s=window_s,
        slo=slo.bounds_s if slo else None,
        replicas_timeline=[(round(at, 3), count) for at, count in rel_timeline] or None,
        windows=windows,
        scale_ups=scale_ups,
        scale_downs=_scale_downs(measured, start, falls),
        failed_total=sum(not r.ok for r in measured),
    )


def _windows(
    measured: Sequence[RequestRecord], start: float, rel_timeline: Sequence[tuple[float, float]], slo: SLO | None, window_s: float
) -> list[ScalingWindow]:
    """The run cut into `window_s` windows by send time (at least one)."""
    end = max((r.finished_at_s or r.sent_at_s) for r in measured) - start
    windows: list[ScalingWindow] = []
    for index in range(max(1, math.ceil(end / window_s))):
        low, high = index * window_s, (index + 1) * window_s
        inside = [r for r in measured if low <= r.sent_at_s - start < high]
        sampled = [count for at, count in rel_timeline if low <= at < high]
        before = _count_at(rel_timeline, low)
        replicas = max(sampled) if sampled else before
        good = sum(_good(r, slo) for r in inside)
        windows.append(
            ScalingWindow(
                start_s=round(low, 3),
                requests=len(inside),
                met=good,
                failed=sum(not r.ok for r in inside),
                attainment=round(good / len(inside), 4) if inside else None,
                replicas=replicas,
            )
        )
    return windows


def _rise_groups(rises: Sequence[Change]) -> list[list[Change]]:
    """Rises less than `MERGE_S` apart as one group (one decision's replicas joining)."""
    groups: list[list[Change]] = []
    for rise in rises:
        if groups and rise[1] - groups[-1][-1][1] <= MERGE_S:
            groups[-1].append(rise)
        else:
            groups.append([rise])
    return groups


def _scale_up(
    measured: Sequence[RequestRecord],
    start: float,
    windows: Sequence[ScalingWindow],
    slo: SLO | None,
    group: Sequence[Change],
    next_group_at: float,
    falls: Sequence[Change],
) -> ScaleUp:
    """One scale-up: from the misses leading into it to the last replica joining, and what followed
    until the next event (the next group's rise, or a fall)."""
    first_seen, joined = group[0][1], group[-1][1]
    began = first_seen
    leading = list(reversed([w for w in windows if w.start_s < first_seen]))
    if leading and not leading[0].missed:
        leading = leading[1:]  # the window the rise falls in may be all served by the new replicas
    for window in leading:
        if not window.missed:
            break
        began = window.start_s
    falls_after = [fall[0] for fall in falls if fall[0] > joined]
    until = min([next_group_at, *falls_after])
    during = [r for r in measured if began <= r.sent_at_s - start < joined]
    later = [r for r in measured if joined <= r.sent_at_s - start < until]
    return ScaleUp(
        began_s=round(began, 3),
        first_joined_s=round(first_seen, 3),
        last_joined_s=round(joined, 3),
        replicas_before=group[0][2],
        replicas_after=group[-1][3],
        requests_during=len(during),
        missed_during=sum(not _good(r, slo) for r in during),
        failed_during=sum(not r.ok for r in during),
        requests_after=len(later),
        missed_after=sum(not _good(r, slo) for r in later),
        failed_after=sum(not r.ok for r in later),
        after_until_s=None if math.isinf(until) else round(until, 3),
    )


def _scale_downs(measured: Sequence[RequestRecord], start: float, falls: Sequence[Change]) -> list[ScaleDown]:
    """Each fall of the count, with the requests in flight around it and the failures among them."""
    scale_downs: list[ScaleDown] = []
    for sample_before, seen, before, after in falls:
        around = [
            r
            for r in measured
            if r.sent_at_s - start <= seen and ((r.finished_at_s or math.inf) - start >= sample_before or not r.ok)
        ]
        scale_downs.append(
            ScaleDown(
                seen_s=round(seen, 3),
                replicas_before=before,
                replicas_after=after,
                requests_in_flight=len(around),
                failed=sum(not r.ok for r in around),
            )
        )
    return scale_downs


def attach_scaling(result: RunResult, slo: SLO | None, window_s: float) -> None:
    """Fill `result.summary.scaling` from its records and the replica count its scrape sampled."""
    server = result.summary.server
    timeline = [(float(at), float(count)) for at, count in (server.replicas_timeline or [])] if server else []
    load_spec = result.meta.load_spec or {}
    shape = load_spec.get("load_shape")
    load_shape = shape if isinstance(shape, str) else None
    result.summary.scaling = scaling_block(result.records, timeline or None, slo, window_s, load_shape)
