"""What a tune hands the user: the recommended spec (YAML), the result (JSON) and the console table.

The recommended spec is the base spec as the user wrote it (fields they left unset stay unset)
with the chosen candidate's flags in engine_args, validated again: it is what `vlmserve up`
starts. Figures from the sim engine or the planner are labelled simulated in every output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from vlmserve.tune.recommend import beats
from vlmserve.tune.run import TuneOutcome
from vlmserve.tune.space import Candidate
from vlmserve.tune.store import CandidateRecord

RESULT_FILE = "result.json"
RECOMMENDED_FILE = "recommended.yaml"
HTML_FILE = "report.html"

SIMULATED_ENGINE_NOTE = "measured on the sim engine: simulated, not measured on real hardware"
PREDICTED_NOTE = "predicted by the planner (simulated)"


def measured_label(outcome: TuneOutcome) -> str:
    """How the measured figures must be labelled: simulated when the engine is the sim engine."""
    return SIMULATED_ENGINE_NOTE if outcome.space.base.engine == "sim" else "measured"


def write_recommended_spec(outcome: TuneOutcome, path: Path) -> Path | None:
    """The chosen candidate as a deployment spec file; None when nothing was chosen."""
    chosen = outcome.recommendation.chosen
    if chosen is None:
        return None
    candidate = Candidate(chosen.id, dict(chosen.params), chosen.baseline)
    spec = outcome.space.spec_for(candidate)
    data = spec.model_dump(mode="json", exclude_unset=True)
    header = (
        f"# vlmserve tune: recommended configuration ({outcome.recommendation.sentence})\n"
        f"# goodput {measured_label(outcome)}; evidence: {outcome.directory / HTML_FILE}\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def candidate_rows(outcome: TuneOutcome) -> list[dict[str, Any]]:
    """Every candidate of the space: measured or failed ones from the store, the rest predicted only."""
    records = {record.id: record for record in outcome.records}
    best = outcome.recommendation.best
    rows = []
    for candidate in outcome.space.candidates():
        record = records.get(candidate.id)
        prediction = outcome.predictions.get(candidate.id)
        row: dict[str, Any] = {
            "id": candidate.id,
            "label": candidate.label,
            "params": candidate.params,
            "baseline": candidate.baseline,
            "predicted_goodput_rps": prediction.goodput_rps if prediction else None,
            "predicted_note": prediction.reason if prediction else None,
            "status": record.status if record else "not measured",
        }
        if record is not None:
            row.update(record.model_dump(mode="json", exclude={"id", "label", "params", "baseline", "predicted_rps"}))
            row["why"] = _why(record, best, outcome)
        else:
            row["why"] = "not measured: ranked below the measured ones, outside the budget"
        rows.append(row)
    return rows


def _why(record: CandidateRecord, best: CandidateRecord | None, outcome: TuneOutcome) -> str:
    chosen = outcome.recommendation.chosen
    if record.status == "failed":
        return f"failed: {record.reason}"
    if chosen is not None and record.id == chosen.id:
        return "recommended"
    if best is not None and record.id == best.id:
        return "best measured goodput, not proven better than the baseline"
    if best is not None and beats(best, record):
        return f"dropped: missed the SLOs at {record.interval.high if record.interval else 0:g} req/s, where the best held"
    return "dropped: within the best candidate's interval, not distinguishable from it"


def result_json(outcome: TuneOutcome) -> dict[str, object]:
    recommendation = outcome.recommendation
    chosen = recommendation.chosen
    return {
        "base": outcome.space.base.name,
        "engine": outcome.space.base.engine,
        "goodput_label": measured_label(outcome),
        "predicted_label": PREDICTED_NOTE,
        "planner": outcome.plan_note or "ranked every candidate (simulated)",
        "flags": {axis.name: list(axis.values) for axis in outcome.space.axes},
        "slo_ms": {key: value * 1000 for key, value in outcome.settings.slo.bounds_s.items()},
        "rate_range": [outcome.settings.search.low, outcome.settings.search.high],
        "space_size": len(outcome.space.candidates()),
        "budget": outcome.budget,
        "measured": sum(1 for record in outcome.records if record.status == "measured"),
        "failed": sum(1 for record in outcome.records if record.status == "failed"),
        "stopped_by": outcome.stopped_by,
        "recommended": None
        if chosen is None
        else {
            "id": chosen.id,
            "params": chosen.params,
            "goodput_rps": chosen.goodput_rps,
            "interval": chosen.interval.model_dump() if chosen.interval else None,
        },
        "best_measured": recommendation.best.id if recommendation.best else None,
        "within_best_interval": recommendation.within_interval,
        "sentence": recommendation.sentence,
        "candidates": candidate_rows(outcome),
    }


def write_result_json(outcome: TuneOutcome, path: Path) -> Path:
    path.write_text(json.dumps(result_json(outcome), indent=2, default=str) + "\n", encoding="utf-8")
    return path


def print_table(outcome: TuneOutcome, console: Console) -> None:
    """Measured candidates in the order they ran, then the sentence."""
    table = Table(
        title=f"vlmserve tune {outcome.space.base.name}: goodput at "
        f"{','.join(f'{k}={v * 1000:g}ms' for k, v in outcome.settings.slo.bounds_s.items())} "
        f"({measured_label(outcome)})",
        show_edge=False,
    )
    for column in ("#", "candidate", "status", "goodput req/s", "interval", "TTFT p95 ms", "predicted req/s", "note"):
        table.add_column(column)
    chosen = outcome.recommendation.chosen
    for record in sorted(outcome.records, key=lambda item: item.order):
        interval = record.interval
        interval_text = (
            ""
            if interval is None
            else (f"[{interval.low:g}, {interval.high:g})" if interval.high is not None else f"≥ {interval.low:g}")
        )
        table.add_row(
            str(record.order + 1),
            record.label + (" ★" if chosen is not None and record.id == chosen.id else ""),
            record.status,
            "" if record.goodput_rps is None else f"{record.goodput_rps:g}",
            interval_text,
            "" if record.ttft_p95_ms is None else f"{record.ttft_p95_ms:.0f}",
            "" if record.predicted_rps is None else f"{record.predicted_rps:g}",
            (record.reason or "") + (f" (log: {record.log})" if record.log and record.log not in (record.reason or "") else ""),
        )
    console.print(table)
    measured = len(outcome.records)
    console.print(
        f"{measured} of {len(outcome.space.candidates())} candidates measured ({outcome.stopped_by}); "
        f"planner: {outcome.plan_note or 'ranked every candidate (simulated)'}"
    )
    console.print(outcome.recommendation.sentence)
