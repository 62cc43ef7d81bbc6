"""`vlmserve batch INPUT.jsonl --output OUT.jsonl --base-url URL`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from vlmserve.errors import UserError

if TYPE_CHECKING:
    from vlmserve.batch.output import BatchOutcome


def batch(
    input_path: Path = typer.Argument(..., metavar="INPUT.jsonl", help="OpenAI Batch-format input lines."),
    output: Path = typer.Option(..., "--output", "-o", help="Results JSONL; appended to, so a rerun resumes."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000."),
    concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=4096, help="Requests in flight."),
    priority: Optional[str] = typer.Option(None, "--priority", help="Gateway priority class sent as X-Priority (e.g. batch)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="VLMSERVE_API_KEY", help="Bearer token."),
    max_retries: int = typer.Option(5, "--max-retries", min=0, help="Retries on 429/5xx and lost connections."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", min=1.0, help="Seconds per request."),
    price_per_gpu_hour: Optional[float] = typer.Option(
        None, "--price-per-gpu-hour", min=0.0, help="$ per GPU-hour, to report the run's cost."
    ),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs behind the endpoint (for the cost)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (logs, CI)."),
    runner: str = typer.Option(
        "builtin", "--runner", help="builtin (this process sends) or ray (Ray Data actors send; docs/batch.md)."
    ),
    ray_address: Optional[str] = typer.Option(
        None,
        "--ray-address",
        help="--runner ray: the Ray head (HOST:PORT, ray://HOST:PORT, auto); "
        "default $RAY_ADDRESS, else a local Ray instance for this job.",
    ),
    ray_workers: Optional[int] = typer.Option(
        None,
        "--ray-workers",
        min=1,
        max=1024,
        help="--runner ray: sender actors, sharing --concurrency (default 2); with --ray-engine, vLLM engines.",
    ),
    ray_engine: Optional[str] = typer.Option(
        None,
        "--ray-engine",
        metavar="MODEL",
        help="--runner ray without --base-url: Ray starts vLLM engines for MODEL (chat lines only; docs/batch.md).",
    ),
    ray_engine_kwargs: Optional[str] = typer.Option(
        None, "--ray-engine-kwargs", metavar="JSON", help="--ray-engine: vLLM engine arguments, e.g. '{\"max_model_len\": 4096}'."
    ),
) -> None:
    """Run an OpenAI Batch JSONL file against an endpoint; rerun the same command to resume."""
    from vlmserve.batch.runner import BatchOptions, run_batch_job
    from vlmserve.batch.send import RetryPolicy
    from vlmserve.batch.summary import Pricing, print_summary
    from vlmserve.cli import consoles

    _check_flags(priority, runner, base_url, ray_address, ray_workers, ray_engine, ray_engine_kwargs)
    engine_kwargs = _engine_kwargs(ray_engine_kwargs)
    console = consoles.console(stderr=True)
    options = BatchOptions(
        input_path=input_path,
        output_path=output,
        base_url=base_url or "",
        concurrency=concurrency,
        priority=priority,
        api_key=api_key,
        retry=RetryPolicy(max_retries=max_retries),
        request_timeout_s=request_timeout,
        progress=not no_progress,
    )
    if runner == "ray":
        from vlmserve.batch.ray_runner import DEFAULT_WORKERS, RayOptions, run_ray_job

        outcome = run_ray_job(
            options,
            RayOptions(
                address=ray_address, workers=ray_workers or DEFAULT_WORKERS, engine=ray_engine, engine_kwargs=engine_kwargs
            ),
            console,
        )
    else:
        outcome = run_batch_job(options, console)
    pricing = Pricing(price_per_gpu_hour, gpus) if price_per_gpu_hour is not None else None
    print_summary(console, outcome, pricing)
    _exit_for(outcome, output)


def _check_flags(
    priority: str | None,
    runner: str,
    base_url: str | None,
    ray_address: str | None,
    ray_workers: int | None,
    ray_engine: str | None,
    ray_engine_kwargs: str | None,
) -> None:
    """The flags that contradict each other, or name a runner or priority that does not exist, refused."""
    if priority is not None and priority not in ("batch", "interactive"):
        raise UserError(f"--priority '{priority}': use batch or interactive")
    if runner not in ("builtin", "ray"):
        raise UserError(f"--runner '{runner}': use builtin or ray")
    if runner != "ray":
        given = [
            flag
            for flag, value in (
                ("--ray-address", ray_address),
                ("--ray-workers", ray_workers),
                ("--ray-engine", ray_engine),
                ("--ray-engine-kwargs", ray_engine_kwargs),
            )
            if value is not None
        ]
        if given:
            raise UserError(f"{' and '.join(given)} only apply with --runner ray")
    if ray_engine is not None and base_url is not None:
        raise UserError("give --base-url (send to an endpoint) or --ray-engine (Ray starts the engines), not both")
    if ray_engine_kwargs is not None and ray_engine is None:
        raise UserError("--ray-engine-kwargs only applies with --ray-engine")
    if base_url is None and ray_engine is None:
        raise UserError("--base-url is required" + (" (or --ray-engine MODEL)" if runner == "ray" else ""))


def _exit_for(outcome: BatchOutcome, output: Path) -> None:
    """A run that left lines unanswered or failed exits non-zero, saying how to finish it."""
    if outcome.write_error:
        raise UserError(
            f"{outcome.write_error}; every line in it is complete — free space (or pick a writable "
            f"folder) and rerun the same command to answer the {outcome.remaining:,} lines left",
            exit_code=1,
        )
    if outcome.interrupted:
        raise UserError(
            f"interrupted: {outcome.remaining:,} lines not answered yet; rerun the same command to resume", exit_code=130
        )
    if outcome.remaining:
        raise UserError(
            f"{outcome.remaining:,} lines not answered ({outcome.stop_reason or 'no answer'}); "
            "rerun the same command to send them",
            exit_code=1,
        )
    if outcome.failed:
        raise UserError(f"{outcome.failed:,} lines failed; see their response.status_code / error in {output}", exit_code=1)


def _engine_kwargs(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise UserError(
            f"--ray-engine-kwargs: not valid JSON ({err}); give an object, e.g. '{{\"max_model_len\": 4096}}'"
        ) from None
    if not isinstance(value, dict):
        raise UserError("--ray-engine-kwargs: give a JSON object, e.g. '{\"max_model_len\": 4096}'")
    return value


def register(app: typer.Typer) -> None:
    app.command("batch")(batch)
