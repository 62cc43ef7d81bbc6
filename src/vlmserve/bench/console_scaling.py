"""The console view of a `--load-shape` run: attainment over time with the replica count, then
each scale-up (SLO misses while it started, and after) and scale-down (requests it failed)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vlmserve.results.blocks import ScalingBlock

BAR_WIDTH = 20


def _bar(fraction: float | None) -> str:
    if fraction is None:
        return ""
    filled = round(fraction * BAR_WIDTH)
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def print_scaling(console: Console, scaling: ScalingBlock, *, simulated: bool) -> None:
    """Windows as rows (attainment bar, replicas), then one line per scale event."""
    label = " (SIMULATED: sim engines)" if simulated else ""
    table = Table(
        title=f"load shape {scaling.load_shape}: SLO attainment per {scaling.window_s:g} s window{label}", title_justify="left"
    )
    for column in ("from", "sent", "met SLO", "failed", "attainment", "replicas"):
        table.add_column(column, justify="left" if column == "attainment" else "right")
    for window in scaling.windows:
        attainment = window.attainment
        shown = f"{_bar(attainment)} {attainment:.0%}" if attainment is not None else "-"
        replicas = window.replicas
        table.add_row(
            f"{window.start_s:g} s",
            str(window.requests),
            str(window.met),
            str(window.failed),
            shown,
            "-" if replicas is None else f"{replicas:g}",
        )
    console.print(table)
    if scaling.replicas_timeline is None:
        console.print("replica count: not available (the target is not a vlmserve gateway, or its /metrics was not read)")
    for event in scaling.scale_ups:
        console.print(
            f"scale-up {event.replicas_before:g} -> {event.replicas_after:g} replicas: from {event.began_s:g} s "
            f"(first miss) to {event.last_joined_s:g} s (last replica in rotation): "
            f"{event.missed_during} of {event.requests_during} requests missed the SLO ({event.failed_during} failed); "
            f"after it: {event.missed_after} of {event.requests_after} missed ({event.failed_after} failed)"
        )
    for down in scaling.scale_downs:
        verdict = "[green]none failed[/]" if down.failed == 0 else f"[bold red]{down.failed} failed[/]"
        console.print(
            f"scale-down {down.replicas_before:g} -> {down.replicas_after:g} replicas at "
            f"{down.seen_s:g} s: {down.requests_in_flight} requests in flight around it, {verdict}"
        )
