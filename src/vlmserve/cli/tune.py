"""`vlmserve tune SPEC --flag NAME=V1,V2 --slo ... --rate-range LOW:HIGH`: the best vLLM flags, measured.

Wiring only: the search is `vlmserve.tune`; the workload flags are the bench's own (built by the
same `build_load_spec`), the rate search's flags are slo-search's.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console

from vlmserve.bench.slo_search import DEFAULT_MAX_PROBES, DEFAULT_PRECISION
from vlmserve.cli.bench import build_load_spec, option_defaults
from vlmserve.cli.bench_options import BENCH, SEARCH_REPEAT
from vlmserve.cli.model_options import GROUP, with_groups
from vlmserve.errors import UserError

if TYPE_CHECKING:
    from vlmserve.tune.run import TuneOutcome


_LOAD = BENCH.only(
    "api",
    "dataset",
    "dataset_path",
    "input_len",
    "output_len",
    "arrival",
    "num_requests",
    "duration",
    "image_size",
    "images_per_request",
    "image_format",
    "image_repeat_rate",
    "seed",
    "tokenizer",
    "timeout",
    name="load",
)
"""The bench's load flags tune takes (the rate comes from --rate-range)."""


@with_groups(_LOAD)
def tune_command(
    spec_file: Path = typer.Argument(..., help="Deployment spec YAML: the baseline, and the base of every candidate."),
    flag: list[str] = typer.Option(
        [], "--flag", help="A vLLM flag and its values, NAME=V1,V2,... (repeatable), e.g. max-num-seqs=16,32,64."
    ),
    slo: str = typer.Option(..., "--slo", help="Objectives goodput must meet, e.g. ttft_p95=500ms,tpot_p95=50ms."),
    rate_range: str = typer.Option(
        ..., "--rate-range", help="Request rates searched per candidate, LOW:HIGH (req/s), e.g. 0.5:32."
    ),
    precision: float = typer.Option(
        DEFAULT_PRECISION,
        "--precision",
        help="Each candidate's search stops when held and missed rates are within this fraction.",
    ),
    max_probes: int = typer.Option(DEFAULT_MAX_PROBES, "--max-probes", help="Most load levels tried per candidate."),
    repeat: int = SEARCH_REPEAT.info,
    max_candidates: Optional[int] = typer.Option(
        None,
        "--max-candidates",
        min=1,
        help="Most candidates measured (failed ones count), over every resumed run; default a third of the space.",
    ),
    max_time: Optional[str] = typer.Option(
        None, "--max-time", help="Start no new candidate after this long (30m, 2h); the one running finishes."
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Tune directory (default $VLMSERVE_HOME/tunes/<spec name>); rerun to resume."
    ),
    restart: bool = typer.Option(False, "--restart", help="Forget the candidates finished in --out and start over."),
    plan: bool = typer.Option(True, "--plan/--no-plan", help="Rank candidates with the planner first (sim engine specs)."),
    tune_seed: int = typer.Option(0, "--tune-seed", help="Seed of Optuna's sampler."),
    load: dict[str, Any] = GROUP,
) -> None:
    """Search vLLM flags for the highest goodput at the SLOs: plan every candidate, measure the promising ones.

    The spec as given is the baseline, measured first. The planner (sim engine specs) ranks every
    candidate; the first half of the budget goes to its best, the rest to Optuna's TPE sampler.
    Each measured candidate is deployed from its own spec, verified, warmed and searched for the
    highest rate meeting the SLOs (an interval: held at one rate, missed at the next). A change is
    recommended only when the baseline missed the SLOs at a rate where the winner held them.
    Writes tune.json (the resumable store), result.json, recommended.yaml and report.html to --out.
    """
    from vlmserve import paths
    from vlmserve.bench.slo_search import SearchSpace, parse_range, require_objectives
    from vlmserve.spec import SLO, load_deployment_spec
    from vlmserve.tune.propose import require_optuna

    require_optuna()
    base = load_deployment_spec(spec_file)
    objectives = SLO.parse(slo).refuse_rates("vlmserve tune")
    if objectives.by_type:
        raise UserError("--slo: tune judges run-wide objectives only; drop the TYPE: ones")
    require_objectives(objectives)
    low, high = parse_range(rate_range, "--rate-range")
    search = SearchSpace("rate", low, high, precision, max_probes)
    max_time_s = _max_time_s(max_time)
    template = build_load_spec(option_defaults({**load, "repeat": repeat, "rate": low, "concurrency": None}))

    from vlmserve.tune.run import TuneSettings, run_tune
    from vlmserve.tune.space import TuneSpace

    space = TuneSpace.parse(base, flag)
    settings = TuneSettings(template, objectives, search, max_candidates, max_time_s, tune_seed, plan)
    directory = out or paths.tune_dir(base.name)
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    outcome = run_tune(space, settings, directory, restart=restart, console=Console(stderr=True))
    _report(outcome, directory)


def _max_time_s(max_time: str | None) -> float | None:
    """--max-time in seconds (None: no limit)."""
    from vlmserve.spec import parse_duration_s

    if max_time is None:
        return None
    try:
        return _minutes_or_duration(max_time, parse_duration_s)
    except ValueError as err:
        raise UserError(f"--max-time: {err}") from None


def _report(outcome: TuneOutcome, directory: Path) -> None:
    """The table printed; result.json, report.html and the recommended spec (where there is one) written to --out."""
    from vlmserve.tune.html import write_html
    from vlmserve.tune.output import (
        HTML_FILE,
        RECOMMENDED_FILE,
        RESULT_FILE,
        print_table,
        write_recommended_spec,
        write_result_json,
    )

    print_table(outcome, Console() if _tty() else Console(width=220))
    recommended = write_recommended_spec(outcome, directory / RECOMMENDED_FILE)
    typer.echo(f"result: {write_result_json(outcome, directory / RESULT_FILE)}")
    typer.echo(f"HTML report: {write_html(outcome, directory / HTML_FILE)}")
    if recommended is not None:
        typer.echo(f"recommended spec: {recommended} (start it with: vlmserve up {recommended})")


def _minutes_or_duration(text: str, parse: object) -> float:
    """'30m' and '2h' besides the durations parse_duration_s reads ('90s', '1500ms')."""
    cleaned = text.strip()
    for suffix, scale in (("m", 60.0), ("h", 3600.0)):
        if cleaned.endswith(suffix) and not cleaned.endswith("ms"):
            try:
                value = float(cleaned[:-1]) * scale
            except ValueError:
                raise ValueError(f"'{text}' is not a duration; write it like 30m, 2h or 90s") from None
            if value <= 0:
                raise ValueError(f"'{text}' must be positive")
            return value
    assert callable(parse)
    value = float(parse(cleaned))
    if value <= 0:
        raise ValueError(f"'{text}' must be positive")
    return value


def _tty() -> bool:
    import sys

    return sys.stdout.isatty()


def _terminate_like_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (a CI timeout, `kill`) takes the Ctrl-C path: the candidate's engine torn down, finished ones kept."""
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.command("tune", help="Search vLLM flags for the highest goodput at an SLO: plan, measure, recommend a spec.")(
        tune_command
    )
