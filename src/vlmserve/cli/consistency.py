"""`vlmserve consistency`: temperature-0 answers alone vs under concurrent load (docs/consistency.md).

Wiring only: the check is `vlmserve.bench.consistency`; with --deployment the variants are started
by `vlmserve.sweep.consistency` (the bench layer never starts a deployment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from vlmserve.cli.bench_options import image_size_text
from vlmserve.cli.model_options import GROUP, ModelOption, OptionGroup, model_option, with_groups
from vlmserve.errors import UserError


def _parse_size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
        raise UserError(f"--image-size '{text}': write it like 64x64")
    return int(width), int(height)


def _checks() -> OptionGroup:
    """The check's own settings, one flag per ConsistencyOptions field."""
    from vlmserve.bench.consistency.runner import ConsistencyOptions

    def option(name: str, help: str, **kwargs: Any) -> ModelOption:
        return model_option(ConsistencyOptions, name, help=help, **kwargs)

    return OptionGroup(
        "checks",
        {
            "num_requests": option("num_requests", "Checked text requests (distinct prompts)."),
            "num_image_requests": option(
                "num_image_requests", "Checked image requests: one question, each with its own synthetic image (0: none)."
            ),
            "concurrency": option("concurrency", "Requests in flight during the loaded run (checked ones among filler load)."),
            "output_len": option("output_len", "max_tokens of each checked request (fillers ask for twice as many)."),
            "filler_per_request": option(
                "filler_per_request", "Filler requests queued after each checked one in the loaded run."
            ),
            "image_size": option(
                "image_size", "Synthetic image size WxH.", annotation=str, parse=_parse_size, text=image_size_text
            ),
            "min_identical": option("min_identical", "Fail (exit 1) when fewer than this fraction of answers are identical."),
            "seed": option("seed", "Seed for prompts and images (same seed, same requests)."),
            "timeout": option("timeout_s", "Seconds one request may take."),
        },
    )


CHECKS = _checks()


@with_groups(CHECKS)
def consistency(
    base_url: Optional[str] = typer.Option(
        None, "--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000 (or --deployment)."
    ),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model name as listed in /v1/models (default with --deployment: its served name)."
    ),
    deployment_file: Optional[Path] = typer.Option(
        None, "--deployment", help="Deployment spec YAML: started once per --prefix-caching variant, checked, torn down."
    ),
    prefix_caching: str = typer.Option(
        "both", "--prefix-caching", help="With --deployment: on, off or both (one deployment each)."
    ),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="VLMSERVE_API_KEY", help="Bearer token for the endpoint."),
    checks: dict[str, Any] = GROUP,
    json_out: Optional[Path] = typer.Option(None, "--result-file", "--json-out", help="Write the JSON result here."),
) -> None:
    """Send temperature-0 requests alone, then inside concurrent load, and compare the answers token by token."""
    from vlmserve.bench.consistency.console import print_report
    from vlmserve.bench.consistency.runner import ConsistencyOptions, run_check
    from vlmserve.bench.target import Target
    from vlmserve.cli import consoles

    if (base_url is None) == (deployment_file is None):
        raise UserError("give --base-url URL (an endpoint) or --deployment SPEC.yaml (started for the check), not both")
    if base_url is not None and model is None:
        raise UserError("--model is required with --base-url (the name in the endpoint's /v1/models)")
    if deployment_file is None and prefix_caching != "both":
        raise UserError("--prefix-caching needs --deployment (an endpoint's engine is already configured)")
    if json_out is not None and not json_out.resolve().parent.is_dir():
        raise UserError(f"--result-file {json_out}: its directory does not exist")
    options = ConsistencyOptions(**CHECKS.fields(checks))

    # no markup: answers are model text and may hold [brackets]; wide when logged (tables whole)
    console = consoles.console(highlight=False, markup=False)

    def progress(line: str) -> None:
        console.print(line, style="dim")

    result: dict[str, Any]
    if deployment_file is not None:
        from vlmserve.sweep.consistency import check_deployment, combined_result

        reports = check_deployment(deployment_file, options, prefix_caching, model, api_key, progress)
        result = combined_result(reports)
    else:
        assert base_url is not None and model is not None
        reports = [run_check(Target(base_url, model, api_key), options, progress)]
        result = reports[0].to_dict()
    for report in reports:
        print_report(report, console)
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"result written to {json_out}")
    if not all(report.passed for report in reports):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("consistency")(consistency)
