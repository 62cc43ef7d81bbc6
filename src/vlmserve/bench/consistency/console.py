"""The consistency report on the console: the verdict, the figures, and each differing request."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vlmserve.bench.consistency.compare import ConsistencyReport, same_as_other

MAX_ROWS = 20
EXCERPT_CHARS = 24


def _position(unit: str | None, index: int | None) -> str:
    if index is None:
        return "-"
    return f"{'token' if unit in ('token_id', 'token') else 'char'} {index}"


def print_report(report: ConsistencyReport, console: Console) -> None:
    data = report.to_dict()
    label = " (simulated engine)" if report.simulated else ""
    variant = f" ({report.variant})" if report.variant else ""
    console.print(f"consistency of {report.model} at {report.base_url}{label}{variant}")
    in_flight = data["in_flight_at_send"]
    console.print(
        f"identical: {data['identical']}/{data['compared']} = {report.identical_fraction:.3f} "
        f"(compared as {', '.join(report.units) or 'nothing'}); under {report.concurrency}-way load, "
        f"{in_flight['min']}-{in_flight['max']} others in flight when a checked request was sent "
        f"({data['fillers_sent']} filler requests)"
    )
    if data["max_logprob_delta_identical"] is not None:
        console.print(f"largest logprob change within identical answers: {data['max_logprob_delta_identical']:.3g}")
    if data["image_cases"]:
        console.print(
            f"image cases: {data['image_cases']}, {data['image_distinct_alone_answers']} distinct answers alone, "
            f"{len(report.image_swaps)} image swap(s)"
        )
    differing = [result for result in report.compared if not result.identical]
    if differing:
        table = Table(title="requests whose answer changed under load")
        for column in ("request", "first difference", "char", "alone", "under load", "got the answer of"):
            table.add_column(column, no_wrap=column in ("request", "first difference", "char"))
        for result in differing[:MAX_ROWS]:
            entry = result.to_dict()
            table.add_row(
                result.case_id,
                _position(result.unit, result.first_difference),
                str(result.first_difference_char),
                repr(entry.get("alone_excerpt", "")[:EXCERPT_CHARS]),
                repr(entry.get("loaded_excerpt", "")[:EXCERPT_CHARS]),
                same_as_other(result, report.results) or "-",
            )
        console.print(table)
        if len(differing) > MAX_ROWS:
            console.print(f"... and {len(differing) - MAX_ROWS} more (all in the JSON result)")
    for swap in report.image_swaps[:MAX_ROWS]:
        console.print(f"image swap: {swap.how}")
    for result in report.failed:
        console.print(f"no answer for {result.case_id}: {result.error}")
    for note in report.notes:
        console.print(f"note: {note}")
    if report.passed:
        console.print("PASS: answers under load match the answers alone")
    else:
        console.print("FAIL: " + "; ".join(report.problems))
