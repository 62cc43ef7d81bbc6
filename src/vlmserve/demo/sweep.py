"""The demo's closing act: a short sweep against the deployment the demo already runs, then the report.

`vlmserve demo` starts the embedded model (behind the gateway when there is one), proves a
text and an image request, and then calls `sweep_running_deployment` so the user ends with
an HTML report in hand. The sweep reuses the running deployment (no second engine start)
and records its spec, so the report still says what produced the numbers.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from vlmserve.report.html import write_html
from vlmserve.report.source import default_sweep_dir, results_from_sweep_dir
from vlmserve.spec import DeploymentSpec, LoadSpec
from vlmserve.sweep.runner import run_sweep
from vlmserve.sweep.spec import CellEntry, DeploymentEntry, SweepSpec

DEMO_TEXT_USERS = (1, 2, 4)
DEMO_REQUESTS_PER_CELL = 8


def demo_sweep_spec(endpoint: str, model: str, deployment: DeploymentSpec, tokenizer: str | None = None) -> SweepSpec:
    """The cells of examples/sweep-embedded-short.yaml, against an already running endpoint."""
    cells = [
        CellEntry(
            name=f"text-c{users}",
            load=LoadSpec(
                dataset="random",
                input_len=32,
                output_len=16,
                tokenizer=tokenizer,
                concurrency=users,
                num_requests=DEMO_REQUESTS_PER_CELL,
            ),
        )
        for users in DEMO_TEXT_USERS
    ]
    cells.append(
        CellEntry(
            name="images-c2",
            load=LoadSpec(
                dataset="images",
                input_len=16,
                output_len=16,
                tokenizer=tokenizer,
                image_size=(64, 64),
                concurrency=2,
                num_requests=6,
            ),
        )
    )
    entry = DeploymentEntry(name=deployment.name, endpoint=endpoint, model=model, spec=deployment)
    return SweepSpec(
        name="demo",
        description="vlmserve demo: the embedded tiny VLM under light load.",
        deployments=[entry],
        cells=cells,
        warmup_requests=2,
    )


def sweep_running_deployment(
    endpoint: str,
    model: str,
    deployment: DeploymentSpec,
    console: Console,
    out_dir: Path | None = None,
    tokenizer: str | None = None,
) -> Path:
    """Run the demo sweep against `endpoint`, write report.html, and return its path.

    `tokenizer` (the model's directory) gives exact prompt lengths; the gateway has no /tokenize.
    """
    directory = out_dir or default_sweep_dir(time.strftime("demo-%Y%m%d-%H%M%S"))
    spec = demo_sweep_spec(endpoint, model, deployment, tokenizer)
    run_sweep(spec, directory, restart=True, console=console)
    results = results_from_sweep_dir(directory)
    console.print(f"[bold]short sweep[/bold]: {results.outcome_line()}")
    return write_html(results, directory / "report.html")
