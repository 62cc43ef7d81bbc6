"""`vlmserve sweep SPEC.yaml`: run a study of deployments × load cells and write its report."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from vlmserve.cli import consoles


def sweep_command(
    spec_file: Path = typer.Argument(..., help="Sweep spec YAML (see examples/sweep-*.yaml)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Sweep directory (default $VLMSERVE_HOME/sweeps/<name>); rerun to resume."
    ),
    restart: bool = typer.Option(False, "--restart", help="Forget finished cells in --out and start over."),
    html: Path | None = typer.Option(None, "--html", help="Write the HTML report here (default <out>/report.html)."),
    md: Path | None = typer.Option(None, "--md", help="Also write the Markdown summary here."),
    scale_requests: float = typer.Option(
        1.0, "--scale-requests", min=0.001, help="Multiply every cell's num_requests and duration_s (smoke runs)."
    ),
    scale_users: float = typer.Option(
        1.0, "--scale-users", min=0.001, help="Multiply every cell's concurrency and rate (smoke runs)."
    ),
    max_output_len: int | None = typer.Option(None, "--max-output-len", min=1, help="Cap every cell's output_len."),
    requests_per_user: int | None = typer.Option(
        None,
        "--requests-per-user",
        min=1,
        help="Replace every cell's count or duration by N requests per user (quick smoke runs).",
    ),
    cells: str | None = typer.Option(
        None, "--cells", help="Run only these cells: comma-separated names or shell patterns (in512-*)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the live progress display."),
) -> None:
    """Start each deployment fresh, verify and warm it, run every load cell, tear it down; then report.

    Failed cells and deployments are recorded with their reason and the sweep goes on; the exit
    code is 1 when any cell failed. Rerunning the same command skips finished cells.
    """
    from vlmserve.report.console import print_report
    from vlmserve.report.html import write_html
    from vlmserve.report.markdown import write_markdown
    from vlmserve.report.source import default_sweep_dir, results_from_sweep_dir
    from vlmserve.sweep.runner import SweepOverrides, run_sweep
    from vlmserve.sweep.spec import load_sweep_spec

    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    spec = load_sweep_spec(spec_file)
    directory = out or default_sweep_dir(spec.name)
    console = consoles.console(stderr=True)
    patterns = tuple(part.strip() for part in (cells or "").split(",") if part.strip())
    overrides = SweepOverrides(
        request_scale=scale_requests,
        user_scale=scale_users,
        max_output_len=max_output_len,
        cell_patterns=patterns,
        requests_per_user=requests_per_user,
    )
    run_sweep(spec, directory, overrides=overrides, restart=restart, progress=progress, console=console)
    results = results_from_sweep_dir(directory)
    print_report(results, consoles.console())
    html_path = write_html(results, html or directory / "report.html")
    typer.echo(f"sweep directory: {directory}")
    if md is not None:
        typer.echo(f"markdown summary: {write_markdown(results, md)}")
    typer.echo(f"HTML report: {html_path}")
    done, total = results.counts()
    if done < total:
        raise SystemExit(1)  # typer.Exit codes are swallowed under standalone_mode=False


def _terminate_like_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (a CI timeout, `kill`) takes the Ctrl-C path: engines torn down, finished cells kept."""
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
