"""`vlmserve vllm-bench`: vLLM's own `vllm bench serve`, run from vlmserve's environment against a deployment.

Why: users trust the tool vLLM ships, and should be able to run it beside `vlmserve bench` without
the traps of this environment (the CPU wheel's metadata, a tokenizer fetched from a model hub by
default). This verb fills in what vlmserve knows — the endpoint, the served model name and the
model's local directory as the tokenizer — passes every other flag to vLLM unchanged, and stores the
result in the run history, so `report` and `compare` read it beside vlmserve's own runs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import typer

from vlmserve.errors import UserError

FILLED_FLAGS = ("--base-url", "--model", "--tokenizer")
"""The flags this verb fills from the deployment unless the user's own vLLM flags give them."""
DEFAULT_LOAD = ("--dataset-name", "random", "--num-prompts", "100")
"""Flag/value pairs used unless given: vLLM's own defaults need a dataset file or hub access (and
send 1,000 prompts); a random set of 100 prompts needs neither."""


def _given(args: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def _target(deployment: str, base_url: str | None, model: str | None, tokenizer: str | None) -> tuple[str, str, str, bool]:
    """(base URL, model, tokenizer, simulated): given flags first, the rest from the deployment's state."""
    if base_url is not None:
        if model is None or tokenizer is None:
            raise UserError(
                "--base-url needs --model and --tokenizer (a local directory: "
                "vLLM would otherwise fetch the tokenizer from a model hub)"
            )
        return base_url, model, tokenizer, False
    from vlmserve.deploy.state import read_state, state_path
    from vlmserve.paths import home_dir

    state = read_state(state_path(deployment))
    if state is None:
        raise UserError(
            f"no deployment named '{deployment}' under {home_dir()}; start one with `vlmserve up` "
            "or pass --base-url, --model and --tokenizer"
        )
    if not state.supervisor_alive() or not state.endpoint:
        raise UserError(f"deployment '{deployment}' is not running; start it with `vlmserve up`")
    local = tokenizer or state.model_path
    if not local or not Path(local).is_dir():
        raise UserError(f"deployment '{deployment}' has no local model directory for the tokenizer; pass --tokenizer DIR")
    return state.endpoint, model or state.served_model_name or state.model, local, state.engine == "sim"


def vllm_bench(
    ctx: typer.Context,
    deployment: str = typer.Option(
        "default", "--deployment", help="The deployment to load (its endpoint, served model name and local tokenizer)."
    ),
    base_url: Optional[str] = typer.Option(
        None, "--base-url", help="An endpoint instead of a deployment (then --model and --tokenizer are needed)."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="The served model name (default: the deployment's)."),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="A local tokenizer directory (default: the deployment's model directory)."
    ),
    label: Optional[str] = typer.Option(None, "--label", help="The run's name in the history."),
    store: bool = typer.Option(True, "--store/--no-store", help="Store the result in the run history."),
    simulated: bool = typer.Option(
        False,
        "--simulated",
        help="Mark the run simulated (the endpoint is a sim engine; a deployment's own state says so itself).",
    ),
) -> None:
    """Run vLLM's `vllm bench serve` against a deployment, then store its result for report and compare.

    Every argument after `--` goes to `vllm bench serve` unchanged, e.g.
    `vlmserve vllm-bench -- --num-prompts 200 --max-concurrency 8 --random-input-len 256`.
    """
    from vlmserve.interop import vllm_bench_main

    passed = list(ctx.args)
    url, served, local_tokenizer, sim_deployment = _target(deployment, base_url, model, tokenizer)
    for flag in FILLED_FLAGS:
        if _given(passed, flag):
            raise UserError(f"give {flag} to vlmserve vllm-bench itself (before `--`), not to vLLM")
    for flag in ("--result-dir", "--result-filename"):
        if _given(passed, flag):
            raise UserError(f"{flag}: vlmserve keeps the result itself (in the run history, or printed with --no-store)")
    load = [
        item
        for flag, value in zip(DEFAULT_LOAD[::2], DEFAULT_LOAD[1::2], strict=True)
        if not _given(passed, flag)
        for item in (flag, value)
    ]
    with tempfile.TemporaryDirectory(prefix="vlmserve-vllm-bench-") as scratch:
        result = Path(scratch) / "vllm-bench-serve.json"
        argv = vllm_bench_main.command(
            "bench",
            "serve",
            "--backend",
            "openai",
            "--base-url",
            url,
            "--model",
            served,
            "--tokenizer",
            local_tokenizer,
            *load,
            "--save-result",
            "--save-detailed",
            "--result-dir",
            scratch,
            "--result-filename",
            result.name,
            *passed,
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # never a hub: the tokenizer is local
        typer.echo(f"running vllm bench serve against {url} (model {served}, tokenizer {local_tokenizer})", err=True)
        code = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=False).returncode
        if code != 0:
            raise UserError(f"vllm bench serve exited with status {code} (its own message is above)")
        if not result.is_file():
            raise UserError("vllm bench serve wrote no result file (was --save-result turned off?)")
        if store:
            _store(result, label, simulated or sim_deployment)
        else:
            typer.echo(result.read_text())


def _store(result: Path, label: str | None, simulated: bool) -> None:
    from vlmserve.interop.importer import import_result_file

    for run_id, run in import_result_file(result, label, simulated=simulated):
        flags = ", simulated" if run.simulated else ""
        typer.echo(
            f"stored vllm bench serve's result as run {run_id} '{run.meta.label}' "
            f"({len(run.records)} request records{flags}); see `vlmserve report {run_id}`"
        )
        for line in run.warnings:
            typer.echo(f"warning: {line}", err=True)


def register(app: typer.Typer) -> None:
    app.command("vllm-bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(vllm_bench)
