"""`vlmserve slo-search`: the highest rate or concurrency at which the SLOs hold, in one command.

Wiring only: the search itself is `vlmserve.bench.slo_search`; a deployment spec is started
once the way `sweep` starts one (fresh ports, verified, torn down at the end), then searched.
It lives beside `sweep` because it may start a deployment, which the bench layer never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Optional

import typer
from rich.console import Console
from rich.table import Table

from vlmserve.bench.slo_search import DEFAULT_MAX_PROBES, DEFAULT_PRECISION
from vlmserve.cli import consoles
from vlmserve.cli.bench import build_load_spec, option_defaults
from vlmserve.cli.bench_options import BENCH, SEARCH_REPEAT
from vlmserve.cli.model_options import GROUP, with_groups
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject

if TYPE_CHECKING:  # imported where used, so the CLI starts without them
    from collections.abc import Callable

    from vlmserve.bench.slo_search import RunPoint, SearchOutcome
    from vlmserve.bench.target import Target
    from vlmserve.results.run import RunResult
    from vlmserve.spec import SLO, LoadSpec
    from vlmserve.sweep.runner import ReadyDeployment


_LOAD = BENCH.only(
    "api",
    "dataset",
    "dataset_path",
    "input_len",
    "output_len",
    "arrival",
    "num_requests",
    "duration",
    "warmup",
    "image_size",
    "images_per_request",
    "tokenizer",
    "seed",
    "prompt_pool_size",
    "shared_prefix_len",
    "timeout",
    "api_key",
    "stop_when_oversaturated",
    name="load",
)
"""The bench's load flags slo-search takes (the level searched comes from its range)."""
_SHOWN = BENCH.only("progress", name="shown")


@with_groups(_LOAD, _SHOWN)
def slo_search_command(
    slo: str = typer.Option(..., "--slo", help="Objectives that must hold, e.g. ttft_p95=500ms,tpot_p95=50ms."),
    rate_range: Optional[str] = typer.Option(
        None, "--rate-range", help="Open loop: search request rates LOW:HIGH (req/s), e.g. 0.5:64."
    ),
    concurrency_range: Optional[str] = typer.Option(
        None, "--concurrency-range", help="Closed loop: search users LOW:HIGH, e.g. 1:256."
    ),
    precision: float = typer.Option(
        DEFAULT_PRECISION, "--precision", help="Stop when the highest held and lowest missed levels are within this fraction."
    ),
    max_probes: int = typer.Option(DEFAULT_MAX_PROBES, "--max-probes", help="Most load levels tried (both ends included)."),
    repeat: int = SEARCH_REPEAT.info,
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint to search (or --deployment)."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model name as listed in /v1/models (default with --deployment: its served name)."
    ),
    deployment_file: Optional[Path] = typer.Option(
        None, "--deployment", help="Deployment spec YAML: started once (as sweep does), searched, torn down."
    ),
    load: dict[str, Any] = GROUP,
    label: Optional[str] = typer.Option(None, "--label", help="Label prefix of the stored probe runs (default slo-search)."),
    json_out: Optional[Path] = typer.Option(
        None, "--json-out", help="Write the search (boundary, every probe, run ids) as JSON here."
    ),
    shown: dict[str, Any] = GROUP,
) -> None:
    """Find the highest request rate (--rate-range) or concurrency (--concurrency-range) at which the SLOs hold.

    Each load level runs --repeat times (fresh prompts each) and is stored as one run; a level
    holds when more than half of its repeats meet every objective. The search bisects between
    the highest level that held and the lowest that missed, and prints both with their runs.
    """
    from vlmserve.bench.slo_search import SearchSpace, parse_range, require_objectives, search
    from vlmserve.spec import SLO

    if (rate_range is None) == (concurrency_range is None):
        raise UserError("give one of --rate-range LOW:HIGH (open loop) or --concurrency-range LOW:HIGH (closed loop)")
    if (base_url is None) == (deployment_file is None):
        raise UserError("give --base-url URL (an endpoint) or --deployment SPEC.yaml (started for the search), not both")
    if base_url is not None and model is None:
        raise UserError("--base-url needs --model NAME (as listed in /v1/models)")
    knob: Literal["rate", "concurrency"] = "rate" if rate_range is not None else "concurrency"
    low, high = parse_range(rate_range or concurrency_range or "", f"--{knob}-range")
    space = SearchSpace(knob, low, high, precision, max_probes)
    objectives = SLO.parse(slo).refuse_rates("vlmserve slo-search")
    if objectives.by_type:
        raise UserError(
            "--slo: slo-search judges run-wide objectives only; drop the TYPE: ones "
            "(vlmserve bench reports them per request type)"
        )
    require_objectives(objectives)  # before a deployment is started for nothing
    template = build_load_spec(
        option_defaults(
            {
                **load,
                "repeat": repeat,
                "rate": low if knob == "rate" else None,
                "concurrency": int(low) if knob == "concurrency" else None,
            }
        )
    )
    console = consoles.console(stderr=True)
    with _endpoint(base_url, model, deployment_file, console) as (url, served_model, deployment):
        from vlmserve.bench.target import Target

        target = Target(url, served_model, load["api_key"])
        run_point = _stored_runs(target, objectives, label or "slo-search", deployment, console, shown["progress"])
        outcome = asyncio.run(search(template, objectives, space, run_point, console))
    print_outcome(outcome, _wide_console())
    if json_out is not None:
        json_out.write_text(json.dumps(outcome.to_json(), indent=2, default=str) + "\n")
        typer.echo(f"search written to {json_out}")


def _stored_runs(
    target: Target, slo: SLO, label: str, deployment: JSONObject | None, console: Console, progress: bool
) -> RunPoint:
    """The probe runner: every repeat of one level, combined and saved in the history."""
    from vlmserve.bench.repeats import run_repeated
    from vlmserve.results import store

    async def run_point(load: LoadSpec, settled: Callable[[list[RunResult]], bool]) -> RunResult:
        result = await run_repeated(
            load,
            target,
            slo=slo,
            settled=settled,
            console=console,
            progress=progress,
            label=f"{label} {load.name}",
            deployment=deployment,
        )
        store.save_run(result)
        return result

    return run_point


class _endpoint:
    """Yield (base URL, model, deployment spec JSON): the given endpoint, or a deployment started once."""

    def __init__(self, base_url: str | None, model: str | None, deployment_file: Path | None, console: Console) -> None:
        self.base_url, self.model, self.deployment_file, self.console = base_url, model, deployment_file, console
        self._context: contextlib.AbstractContextManager[ReadyDeployment] | None = None

    def __enter__(self) -> tuple[str, str, JSONObject | None]:
        if self.deployment_file is None:
            assert self.base_url is not None and self.model is not None
            return self.base_url.rstrip("/"), self.model, None
        from vlmserve.spec import load_deployment_spec
        from vlmserve.sweep.hygiene import verify_serving, with_free_ports
        from vlmserve.sweep.runner import deployment_endpoint
        from vlmserve.sweep.spec import DeploymentEntry

        spec = with_free_ports(load_deployment_spec(self.deployment_file))
        entry = DeploymentEntry(name=spec.name, spec=spec, model=self.model)
        self.console.print(f"starting deployment {spec.name} from {self.deployment_file}")
        context = self._context = deployment_endpoint(entry)
        ready = context.__enter__()
        try:
            verify_serving(ready.base_url, entry.served_model(), spec.engine_args.max_model_len)
        except BaseException:
            context.__exit__(*sys.exc_info())
            raise
        return ready.base_url, entry.served_model(), spec.model_dump(mode="json")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None) -> None:
        if self._context is not None:
            self._context.__exit__(kind, error, traceback)


def print_outcome(outcome: SearchOutcome, console: Console) -> None:
    """The probes as a table (in level order), then the answer in one line."""
    unit = "req/s" if outcome.space.knob == "rate" else "users"
    table = Table(title=f"SLO search over {outcome.space.knob} ({unit})", show_edge=False)
    for column in (outcome.space.knob, "verdict", "repeats met", *outcome.slo.bounds_s, "achieved req/s", "stopped", "run id"):
        table.add_column(column)
    for probe in sorted(outcome.probes, key=lambda probe: probe.level):
        summary = probe.result.summary  # the figures ProbePoint.row() writes to --json-out
        checks = summary.goodput.checks if summary.goodput is not None else {}
        measured = [_ms(checks[key].measured_ms if key in checks else None) for key in outcome.slo.bounds_s]
        table.add_row(
            f"{probe.level:g}",
            "held" if probe.held else "missed",
            f"{probe.met}/{probe.ran}",
            *measured,
            _num(summary.throughput.requests_per_s),
            summary.meta.stopped or "",
            probe.run_id or "",
        )
    console.print(table)
    console.print(outcome.sentence())


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.1f} ms"


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.2f}"


def _wide_console() -> Console:
    return consoles.console()


def register(app: typer.Typer) -> None:
    app.command("slo-search", help="Find the highest rate or concurrency at which the SLOs hold (bisection with repeats).")(
        slo_search_command
    )
