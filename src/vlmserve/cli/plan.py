"""`vlmserve plan`: predict a deployment, search for the cheapest one, calibrate from runs.

`vlmserve plan --model M --gpu G ...` runs one simulated configuration (the group's
default action); `plan search`, `plan calibrate`, `plan models` and `plan gpus` are
subcommands. All output that comes from the planner is labelled as simulated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlmserve.cli import consoles
from vlmserve.cli.bench_options import parse_image_size
from vlmserve.cli.model_options import GROUP, Flag, ModelOption, OptionGroup, model_option, with_groups
from vlmserve.errors import UserError
from vlmserve.hardware.gpus import GIB
from vlmserve.hardware.setup import (
    COST_MODELS,
    DEFAULT_COST_MODEL,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    FRONTEND_PER_IMAGE_MS,
    FRONTEND_PER_MEGAPIXEL_MS,
    PlanSetup,
)
from vlmserve.results.blocks import SimulationBlock
from vlmserve.results.summary import RunSummary
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS, SIMULATED_POLICIES
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.spec import SLO, LoadSpec, describe_validation_error

if TYPE_CHECKING:  # imported where used, so the CLI starts without them
    from vlmserve.plan.search import Candidate, SearchOutcome, SearchSpace
    from vlmserve.plan.simulate import SimulationOutput

SIMULATED_NOTE = "[yellow]planner output (simulated, not measured)[/]"

plan_app = typer.Typer(
    name="plan",
    help="Predict latency, throughput and cost of a deployment on GPUs you don't have (simulated).",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


_PLANNED = "the planner's workload: a typical chat request (1024-token prompt, 128-token answer, 1024x1024 images)"
_PLANNED_IMAGE = "1024x1024"


def _load(name: str, **kwargs: Any) -> ModelOption:
    """A plan flag that sets LoadSpec's `name` (generated from the field; no vLLM bench alias)."""
    return model_option(LoadSpec, name, vllm_alias=False, **kwargs)


_INPUT_LEN = model_option(
    LoadSpec, "input_len", default=1024, because=_PLANNED, vllm_alias=False, min=1, help="Prompt tokens (random/images)."
)
_OUTPUT_LEN = model_option(
    LoadSpec, "output_len", default=128, because=_PLANNED, vllm_alias=False, min=1, help="Output tokens (random/images)."
)
_DATASET = model_option(LoadSpec, "dataset", vllm_alias=False, help="random | sharegpt | images.")


def _console() -> Console:
    """A console wide enough for the tables when output is piped to a file or a test."""
    return consoles.console()


def _load_spec(**fields: Any) -> LoadSpec:
    from pydantic import ValidationError

    clean = {key: value for key, value in fields.items() if value is not None}
    if clean.get("concurrency") is None and clean.get("rate") is None:
        raise UserError("give --concurrency N (closed loop) or --rate R (open loop, requests/s)")
    if clean.get("dataset") == "sharegpt" and not clean.get("dataset_path"):
        clean["dataset_path"] = "builtin"
    try:
        return LoadSpec.model_validate(clean)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, "plan")) from None


def _setup(model: str, gpu: str, calibration_path: Optional[str], **options: Any) -> PlanSetup:
    from vlmserve.hardware.calibration import load_calibration

    return PlanSetup.from_names(model, gpu, calibration=load_calibration(calibration_path), **options)


PLAN = OptionGroup(
    "flags",
    {
        # every `vlmserve plan` flag once, in its --help order
        "model": Flag(
            typer.Option(None, "--model", help="Preset name (see `plan models`) or a config.json path."), Optional[str]
        ),
        "gpu": Flag(typer.Option("h100", "--gpu", help="GPU type (see `plan gpus`)."), str),
        "tp": Flag(typer.Option(1, "--tp", min=1, help="Tensor-parallel GPUs per replica."), int),
        "ep": Flag(
            typer.Option(
                None,
                "--ep",
                min=1,
                help="MoE: expert-parallel GPUs per replica (vLLM --enable-expert-parallel with data parallel = ep ÷ tp; default: experts split by TP).",
            ),
            Optional[int],
        ),
        "replicas": Flag(typer.Option(1, "--replicas", min=1, help="Independent replicas behind the router."), int),
        "input_len": _INPUT_LEN,
        "output_len": _OUTPUT_LEN,
        "concurrency": _load("concurrency", min=1, help="Closed loop: concurrent clients in all."),
        "rate": _load("rate", min=0.0, help="Open loop: requests/s offered in all."),
        "num_requests": _load("num_requests", default=500, because=_PLANNED, min=1, help="Requests to simulate."),
        "dataset": _DATASET,
        "dataset_path": _load("dataset_path", help="ShareGPT file (default: built-in length distribution)."),
        "images_per_request": _load("images_per_request", min=0, help="images dataset: images per request."),
        "image_size": _load(
            "image_size",
            default=_PLANNED_IMAGE,
            because=_PLANNED,
            annotation=str,
            parse=parse_image_size,
            help="images dataset: image size WxH (tokens by the model's own rule).",
        ),
        "image_repeat_rate": _load(
            "image_repeat_rate", help="images dataset: share of requests resending an earlier image (hits the multimodal cache)."
        ),
        "api_server_count": Flag(
            typer.Option(
                1, "--api-server-count", help="vLLM's --api-server-count: frontend processes preprocessing images, per replica."
            ),
            int,
        ),
        "mm_preprocess_ms_per_image": Flag(
            typer.Option(
                FRONTEND_PER_IMAGE_MS,
                "--mm-preprocess-ms-per-image",
                help="Frontend ms per image not in the cache (a prior; see docs/plan.md).",
            ),
            float,
        ),
        "mm_preprocess_ms_per_megapixel": Flag(
            typer.Option(
                FRONTEND_PER_MEGAPIXEL_MS, "--mm-preprocess-ms-per-megapixel", help="Frontend ms per megapixel (a prior)."
            ),
            float,
        ),
        "arrival": _load("arrival", help="Open loop arrivals: poisson | constant | gamma."),
        "max_num_seqs": Flag(
            typer.Option(None, "--max-num-seqs", min=1, help="vLLM --max-num-seqs (default: vLLM's for the GPU)."), Optional[int]
        ),
        "max_num_batched_tokens": Flag(
            typer.Option(None, "--max-num-batched-tokens", min=1, help="vLLM --max-num-batched-tokens."), Optional[int]
        ),
        "max_model_len": Flag(typer.Option(None, "--max-model-len", min=16, help="vLLM --max-model-len."), Optional[int]),
        "max_num_encoder_input_tokens": Flag(
            typer.Option(
                None,
                "--max-num-encoder-input-tokens",
                help="vLLM --max-num-encoder-input-tokens: image tokens encoded per step (default: --max-num-batched-tokens).",
            ),
            Optional[int],
        ),
        "encoder_cache_size": Flag(
            typer.Option(
                None,
                "--encoder-cache-size",
                help="vLLM --encoder-cache-size: image tokens the encoder cache holds (default: --max-num-batched-tokens).",
            ),
            Optional[int],
        ),
        "gpu_memory_utilization": Flag(
            typer.Option(
                DEFAULT_GPU_MEMORY_UTILIZATION,
                "--gpu-memory-utilization",
                help="vLLM --gpu-memory-utilization (default: vLLM's).",
            ),
            float,
        ),
        "weight_dtype": Flag(
            typer.Option(None, "--weight-dtype", help="bf16 | fp8 | mxfp4 (default: the checkpoint's)."), Optional[str]
        ),
        "kv_dtype": Flag(typer.Option("bf16", "--kv-dtype", help="KV cache dtype: bf16 | fp8."), str),
        "routing": Flag(typer.Option(LEAST_OUTSTANDING_TOKENS, "--routing", help=" | ".join(SIMULATED_POLICIES) + "."), str),
        "async_scheduling": Flag(typer.Option(False, "--async-scheduling", help="Model vLLM --async-scheduling."), bool),
        "staggered": Flag(
            typer.Option(False, "--steady-state", help="Closed loop: stagger client starts (no synchronized first wave)."), bool
        ),
        "calibration": Flag(typer.Option(None, "--calibration", help="Calibration JSON from `plan calibrate`."), Optional[str]),
        "slo": Flag(typer.Option(None, "--slo", help="e.g. ttft_p95=500ms,tpot_p95=50ms (goodput)."), Optional[str]),
        "price": Flag(
            typer.Option(None, "--price", min=0.0, help="Dollars per GPU-hour, for cost per million tokens."), Optional[float]
        ),
        "seed": _load("seed", help="Random seed for lengths and arrivals."),
        "json_out": Flag(typer.Option(None, "--json-out", help="Write the summary JSON (bench format) here."), Optional[Path]),
        "save": Flag(typer.Option(False, "--save", help="Store the simulated run in the run history (report/compare)."), bool),
        "cost_model": Flag(
            typer.Option(
                DEFAULT_COST_MODEL,
                "--cost-model",
                help=" | ".join(COST_MODELS)
                + ": price steps from measured vLLM kernel tables (kernels), the calibrated roofline, or kernels where the tables cover the GPU (auto).",
            ),
            str,
        ),
        "vllm_version": Flag(
            typer.Option(
                None,
                "--vllm-version",
                help="The deployment's vLLM version: kernel tables closest to it are used (default: the newest).",
            ),
            Optional[str],
        ),
        "explain": Flag(
            typer.Option(False, "--explain", help="Print where each op's cost comes from, and roofline napkin math."), bool
        ),
        "compare": Flag(
            typer.Option(None, "--compare", help="A measured bench JSON to set the prediction against."), Optional[Path]
        ),
    },
)


@plan_app.callback()
@with_groups(PLAN)
def plan(ctx: typer.Context, flags: dict[str, Any] = GROUP) -> None:
    """Simulate one deployment at one load (the default action of `vlmserve plan`)."""
    if ctx.invoked_subcommand is not None:
        return
    if flags["model"] is None:
        typer.echo(ctx.get_help())
        raise UserError("give --model NAME|config.json (and --gpu, --concurrency or --rate)")
    from vlmserve.plan.simulate import simulate_run

    load = _load_spec(**PLAN.fields(flags, LoadSpec))
    setup = _plan_setup(flags)
    slo_spec = SLO.parse(flags["slo"]).refuse_rates("vlmserve plan") if flags["slo"] else None
    output = simulate_run(
        setup,
        load,
        slo=slo_spec,
        staggered=flags["staggered"],
        encoder_cache_size=flags["encoder_cache_size"],
        max_num_encoder_input_tokens=flags["max_num_encoder_input_tokens"],
    )
    _report_plan(
        output,
        setup,
        load,
        price=flags["price"],
        compare=flags["compare"],
        explain=flags["explain"],
        json_out=flags["json_out"],
        save=flags["save"],
    )


def _plan_setup(flags: dict[str, Any]) -> PlanSetup:
    """The deployment `vlmserve plan`'s flags describe."""
    engine = {
        name: flags[name]
        for name in (
            "tp",
            "ep",
            "replicas",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "gpu_memory_utilization",
            "weight_dtype",
            "kv_dtype",
            "routing",
            "async_scheduling",
            "vllm_version",
        )
    }
    frontend = FrontendConfig(
        flags["api_server_count"], flags["mm_preprocess_ms_per_image"], flags["mm_preprocess_ms_per_megapixel"]
    )
    return _setup(
        flags["model"], flags["gpu"], flags["calibration"], **engine, frontend=frontend, cost_model_kind=flags["cost_model"]
    )


def _report_plan(
    output: SimulationOutput,
    setup: PlanSetup,
    load: LoadSpec,
    *,
    price: float | None,
    compare: Path | None,
    explain: bool,
    json_out: Path | None,
    save: bool,
) -> None:
    """The simulated run printed (with findings, the explanation and a comparison where asked), written, stored."""
    from vlmserve.plan.explain import frontend_findings

    result = output.result
    console = _console()
    _print_run(console, result.summary, setup, output.wall_s, price)
    for line in frontend_findings(setup, load, result.summary):
        console.print(line)
    measured = _read_measured(compare) if compare else None
    if explain or measured is not None:
        _print_explain(console, setup, load, result.summary, measured)
    if measured is not None:
        _print_comparison(console, result.summary, measured)
    if json_out:
        result.write_json(json_out)
        console.print(f"summary written to {json_out}")
    if save:
        from vlmserve.results.store import save_run

        console.print(f"stored as run {save_run(result)} (simulated)")


def _print_run(console: Console, summary: RunSummary, setup: PlanSetup, wall_s: float, price: float | None) -> None:
    from vlmserve.bench.console import print_summary

    console.print(SIMULATED_NOTE)
    console.print(f"step costs: {setup.cost_model_summary()}")
    memory = setup.memory()
    simulation = summary.simulation or SimulationBlock()
    console.print(
        f"{setup.model.name} on {setup.replicas}× ({setup.tp}× {setup.gpu.name}), weights {setup.weight_dtype}, "
        f"KV {setup.kv_dtype}: {memory.weight_bytes_per_gpu / GIB:.1f} GiB weights and "
        f"{memory.kv_gib_per_gpu:.1f} GiB KV cache per GPU "
        f"({summary.meta.kv_cache_tokens_per_replica or 0:,} tokens per replica)"
    )
    max_model_len = setup.max_model_len or setup.model.max_position_embeddings  # vLLM's default: the model's own
    if max_model_len and setup.model.kv_bytes_per_token(setup.kv_dtype) > 0:
        startup = setup.vllm_startup_report(max_model_len)
        console.print(
            f"vLLM would print (predicted): GPU KV cache size: {startup.kv_cache_tokens:,} tokens; "
            f"Maximum concurrency for {max_model_len:,} tokens per request: {startup.max_concurrency:.2f}x"
        )
    print_summary(console, summary)
    console.print(
        f"engine: {simulation.steps:,} steps, max running {simulation.max_num_running}, "
        f"max waiting {simulation.max_num_waiting}, peak KV use {simulation.max_kv_usage:.0%}, "
        f"{simulation.preemptions} preemptions; simulated in {wall_s:.2f} s"
    )
    if price is not None:
        output_rate = summary.throughput.output_tokens_per_s
        per_hour = price * setup.num_gpus
        per_million = per_hour / (output_rate * 3600 / 1e6) if output_rate > 0 else float("inf")
        console.print(f"cost: ${per_hour:.2f}/h for {setup.num_gpus} GPU(s), ${per_million:.3f} per million output tokens")


def _read_measured(path: Path) -> RunSummary:
    from vlmserve.hardware.jsonfile import read_json_file

    data = read_json_file(path, "file for --compare", "give a `vlmserve bench --json-out` result")
    if not isinstance(data, dict) or "throughput" not in data:
        raise UserError(f"--compare {path}: not a bench summary (no 'throughput'); give a `vlmserve bench --json-out` result")
    try:
        return RunSummary.model_validate(data)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, f"--compare {path}")) from None


def _print_explain(console: Console, setup: PlanSetup, load: LoadSpec, summary: RunSummary, measured: RunSummary | None) -> None:
    from vlmserve.plan.explain import measured_efficiency, napkin

    prompt = summary.tokens.actual_prompt_mean or load.input_len
    output = summary.tokens.actual_output_mean or load.output_len
    context = int(prompt + output / 2)  # the mean context a decode step reads
    max_seqs = setup.max_num_seqs or 1  # never None once the setup exists (vLLM's default filled in), as setup.py reads it
    batch = min(load.concurrency or max_seqs, max_seqs)
    facts = napkin(setup, context, batch)
    table = Table(title="roofline napkin math (one replica)", show_edge=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    kinds = ", ".join(f"{kind} {value / 1024:.1f} KiB" for kind, value in facts["kv_bytes_per_token"].items())
    rows = [
        ("weights (all GPUs)", f"{facts['weights_total_gb']:.1f} GB"),
        ("KV bytes per token", kinds or "none"),
        (f"KV cache capacity at {context}-token context", f"{facts['kv_tokens_capacity']:,} tokens"),
        ("bytes streamed per decode token, batch 1", f"{facts['decode_bytes_per_token_batch1'] / 1e9:.2f} GB"),
        (
            f"bytes per decode step, batch {batch} (calibrated routing spread)",
            f"{facts['decode_bytes_per_step_at_batch'] / 1e9:.2f} GB",
        ),
        (
            "bandwidth-bound tok/s, batch 1 (peak / calibrated)",
            f"{facts['bandwidth_bound_tok_s_batch1_peak']:.0f} / {facts['bandwidth_bound_tok_s_batch1_calibrated']:.0f}",
        ),
        (f"bandwidth-bound tok/s, batch {batch} (peak)", f"{facts['bandwidth_bound_tok_s_at_batch_peak']:.0f}"),
        ("prefill FLOPs per token", f"{facts['prefill_flops_per_token'] / 1e9:.1f} GFLOP"),
        (
            "compute-bound prefill tok/s (peak / calibrated)",
            f"{facts['compute_bound_prefill_tok_s_peak']:.0f} / {facts['compute_bound_prefill_tok_s_calibrated']:.0f}",
        ),
        ("efficiency used (bandwidth, compute)", f"{facts['efficiency']['bandwidth']:.2f}, {facts['efficiency']['compute']:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    if measured is not None:
        for quantity, fraction in measured_efficiency(setup, measured, context, batch).items():
            table.add_row(f"measured: {quantity.replace('_', ' ')}", f"{fraction:.3g}")
    console.print(table)
    from vlmserve.plan.explain import step_cost_sources

    sources = Table(title=f"step costs (simulated): {setup.cost_model_summary()}", show_edge=False)
    sources.add_column("op class")
    sources.add_column("priced from")
    for op_class, source in step_cost_sources(setup):
        sources.add_row(op_class, escape(source))
    console.print(sources)
    for key, value in facts["assumed_gpu_figures"].items():
        console.print(f"assumed for {setup.gpu.name}: {key} = {value:g} (not on the datasheet)")
    for note in facts["model_notes"]:
        console.print(f"model note: {note}")


def _print_comparison(console: Console, predicted: RunSummary, measured: RunSummary) -> None:
    from vlmserve.plan.calibrate import METRICS, metric_value

    table = Table(title="planner vs measured run", show_edge=False)
    for column in ("metric", "measured", "planner", "rel. error"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for metric in METRICS:
        real, sim = metric_value(measured, metric), metric_value(predicted, metric)
        if real is None or sim is None or real == 0:
            continue
        table.add_row(metric, f"{real:.4g}", f"{sim:.4g}", f"{sim / real - 1:+.0%}")
    console.print(table)


SEARCH = OptionGroup(
    "flags",
    {
        # every `vlmserve plan search` flag once, in its --help order
        "model": Flag(typer.Option(..., "--model", help="Preset name or config.json path."), str),
        "slo": Flag(typer.Option(..., "--slo", help="Objectives to meet, e.g. ttft_p95=500ms,tpot_p95=50ms."), str),
        "gpus": Flag(typer.Option("h100,h200,l40s", "--gpus", help="Comma-separated GPU types to consider."), str),
        "price": Flag(
            typer.Option(None, "--price", help="Dollars per GPU-hour, e.g. h100=3.0,h200=4.0,l40s=1.1."), Optional[str]
        ),
        "rate": _load("rate", min=0.0, help="Target load: requests/s offered (open loop)."),
        "concurrency": _load("concurrency", min=1, help="Target load: concurrent clients."),
        "input_len": _INPUT_LEN,
        "output_len": _OUTPUT_LEN,
        "dataset": _DATASET,
        "image_size": _load(
            "image_size",
            default=_PLANNED_IMAGE,
            because=_PLANNED,
            annotation=str,
            parse=parse_image_size,
            help="images dataset: image size WxH.",
        ),
        "image_repeat_rate": _load("image_repeat_rate", help="images dataset: share of requests resending an earlier image."),
        "api_server_counts": Flag(
            typer.Option("1", "--api-server-counts", help="vLLM --api-server-count values to try, e.g. 1,2,4."), str
        ),
        "mm_preprocess_ms_per_image": Flag(
            typer.Option(FRONTEND_PER_IMAGE_MS, "--mm-preprocess-ms-per-image", help="Frontend ms per image (a prior)."), float
        ),
        "mm_preprocess_ms_per_megapixel": Flag(
            typer.Option(
                FRONTEND_PER_MEGAPIXEL_MS, "--mm-preprocess-ms-per-megapixel", help="Frontend ms per megapixel (a prior)."
            ),
            float,
        ),
        "num_requests": _load("num_requests", default=300, because=_PLANNED, min=1, help="Requests simulated per configuration."),
        "tps": Flag(typer.Option("1,2,4,8", "--tps", help="TP sizes to try."), str),
        "replicas": Flag(typer.Option("1,2,3,4,6,8", "--replicas", help="Replica counts to try."), str),
        "max_num_seqs": Flag(typer.Option("64,128,256", "--max-num-seqs", help="max-num-seqs values to try."), str),
        "max_gpus": Flag(typer.Option(8, "--max-gpus", min=1, help="Most GPUs a deployment may use."), int),
        "weight_dtype": Flag(typer.Option(None, "--weight-dtype"), Optional[str]),
        "kv_dtype": Flag(typer.Option("bf16", "--kv-dtype"), str),
        "calibration": Flag(typer.Option(None, "--calibration", help="Calibration JSON."), Optional[str]),
        "no_prune": Flag(typer.Option(False, "--no-prune", help="Simulate every candidate (no early stop on replicas)."), bool),
        "top": Flag(typer.Option(8, "--top", min=1, help="Runners-up to show."), int),
        "json_out": Flag(typer.Option(None, "--json-out", help="Write all candidates as JSON."), Optional[Path]),
    },
)


@plan_app.command("search")
@with_groups(SEARCH)
def search(flags: dict[str, Any] = GROUP) -> None:
    """Find the cheapest GPU × TP × replicas × max-num-seqs (× API servers) meeting the SLO at the target load."""
    import time

    from rich.progress import Progress

    from vlmserve.hardware.calibration import load_calibration
    from vlmserve.plan.search import parse_prices, run_search

    load = _load_spec(**SEARCH.fields(flags, LoadSpec))
    space = _search_space(flags)
    prices = parse_prices(flags["price"])
    slo_spec = SLO.parse(flags["slo"]).refuse_rates("vlmserve plan search")
    console = _console()
    started = time.perf_counter()
    total = len(space.gpus) * len(space.tps) * len(space.replicas) * len(space.max_num_seqs) * len(space.api_server_counts)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating configurations", total=total)
        outcome = run_search(
            space,
            load,
            slo_spec,
            prices=prices,
            calibration=load_calibration(flags["calibration"]),
            prune=not flags["no_prune"],
            progress=lambda _c: progress.advance(task),
        )
    elapsed = time.perf_counter() - started
    console.print(SIMULATED_NOTE)
    console.print(
        f"{outcome.evaluated} configurations ({outcome.simulated} simulated) in {elapsed:.1f} s; ranked by {outcome.ranked_by}"
    )
    _print_candidates(console, outcome, flags["top"])
    if flags["json_out"]:
        flags["json_out"].write_text(json.dumps([_candidate_json(c) for c in outcome.candidates], indent=2) + "\n")
        console.print(f"candidates written to {flags['json_out']}")
    if outcome.best is None:
        raise typer.Exit(1)


def _search_space(flags: dict[str, Any]) -> SearchSpace:
    """The configurations `plan search`'s flags ask for (the frontend's numbers refused here, once)."""
    from vlmserve.plan.search import SearchSpace

    server_counts = _ints(flags["api_server_counts"], "--api-server-counts")
    frontend = FrontendConfig(max(server_counts), flags["mm_preprocess_ms_per_image"], flags["mm_preprocess_ms_per_megapixel"])
    for problem in frontend.validate():  # once, here: inside the search a bad value would read as "does not fit"
        raise UserError(problem.replace("--api-server-count ", "--api-server-counts ", 1))
    return SearchSpace(
        model=flags["model"],
        gpus=_names(flags["gpus"], "--gpus"),
        tps=_ints(flags["tps"], "--tps"),
        replicas=_ints(flags["replicas"], "--replicas"),
        max_num_seqs=_ints(flags["max_num_seqs"], "--max-num-seqs"),
        max_gpus=flags["max_gpus"],
        weight_dtype=flags["weight_dtype"],
        kv_dtype=flags["kv_dtype"],
        api_server_counts=server_counts,
        frontend=frontend,
    )


def _print_candidates(console: Console, outcome: SearchOutcome, top: int) -> None:
    """The best configuration and the runners-up as a table (or why none meets the SLO)."""
    from vlmserve.plan.search import runners_up

    table = Table(show_edge=False)
    for column in ("", "configuration", "GPUs", "$/h", "$/M out tok", "req/s", "TTFT p95 ms", "TPOT p95 ms", "verdict"):
        table.add_column(column)
    shown = ([outcome.best] if outcome.best else []) + runners_up(outcome, top)
    for candidate in shown:
        summary = candidate.summary
        mark = "best" if candidate is outcome.best else ""
        table.add_row(
            mark,
            candidate.label,
            str(candidate.num_gpus),
            "-" if candidate.cost_per_hour is None else f"{candidate.cost_per_hour:.2f}",
            "-" if candidate.cost_per_million_output_tokens is None else f"{candidate.cost_per_million_output_tokens:.3f}",
            f"{summary.throughput.requests_per_s:.1f}" if summary is not None else "-",
            _ms(summary, "ttft_ms"),
            _ms(summary, "tpot_ms"),
            "meets the SLO" if candidate is outcome.best else f"{candidate.status}: {candidate.reason}",
        )
    console.print(table)
    if outcome.best is None:
        console.print("[red]no configuration meets the SLO at this load[/]; relax the SLO, raise --max-gpus or add GPU types")


def _ms(summary: RunSummary | None, key: str) -> str:
    value = summary.latency(key).p95 if summary is not None else None
    return "-" if value is None else f"{value:.0f}"


def _candidate_json(candidate: Candidate) -> dict[str, object]:
    figures = candidate.summary.to_dict() if candidate.summary is not None else {}
    return {
        "gpu": candidate.gpu,
        "tp": candidate.tp,
        "replicas": candidate.replicas,
        "max_num_seqs": candidate.max_num_seqs,
        "api_server_count": candidate.api_server_count,
        "num_gpus": candidate.num_gpus,
        "cost_per_hour": candidate.cost_per_hour,
        "status": candidate.status,
        "reason": candidate.reason,
        "throughput": figures.get("throughput"),
        "ttft_ms": figures.get("ttft_ms"),
        "tpot_ms": figures.get("tpot_ms"),
    }


def _names(text: str, flag: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UserError(f"{flag}: give at least one value")
    return names


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in _names(text, flag)]
    except ValueError:
        raise UserError(f"{flag}: '{text}' is not a comma-separated list of whole numbers") from None
    if any(value < 1 for value in values):
        raise UserError(f"{flag}: values must be at least 1")
    return values


@plan_app.command("calibrate")
def calibrate(
    runs: list[Path] = typer.Argument(..., help="Measured bench results (--json-out files)."),
    gpu: str = typer.Option(..., "--gpu", help="The GPU the runs were measured on."),
    model: Optional[str] = typer.Option(None, "--model", help="Model preset or config.json (default: from the runs)."),
    output: Path = typer.Option(Path("calibration.json"), "--output", "-o", help="Where to save the calibration."),
    start: Optional[str] = typer.Option(None, "--calibration", help="Start from this calibration (default: built-in)."),
    parameters: str = typer.Option("bandwidth,compute,step_overhead_s", "--fit", help="Coefficients to fit."),
) -> None:
    """Fit efficiency coefficients for one GPU from measured runs; save a calibration `plan` can use."""
    from vlmserve.hardware.calibration import load_calibration
    from vlmserve.plan.calibrate import calibrate_runs, relative_errors

    console = _console()
    result, scenarios = calibrate_runs(
        [str(path) for path in runs],
        gpu=gpu,
        model=model,
        start=load_calibration(start),
        parameters=_names(parameters, "--fit"),
        progress=lambda line: console.print(f"  {line}"),
    )
    result.calibration.save(output)
    table = Table(title="fit error per metric (planner vs measured)", show_edge=False)
    for column in ("run", "metric", "rel. error"):
        table.add_column(column)
    for scenario_id, metric, error in relative_errors(scenarios, result.predictions):
        table.add_row(scenario_id, metric, f"{error:+.1%}")
    console.print(table)
    for family, error in result.errors_by_family.items():
        console.print(f"median abs error, {family}: {error:.1%}")
    console.print(f"saved {output} ({result.evaluations} simulations); use it with --calibration {output}")


@plan_app.command("models")
def models() -> None:
    """List the model presets (HF config.json files shipped with vlmserve)."""
    from vlmserve.hardware.models import load_model, preset_index, preset_names

    table = Table(show_edge=False)
    for column in ("preset", "aliases", "params", "active", "KV KiB/token", "vision"):
        table.add_column(column)
    for name in preset_names():
        cost = load_model(name)
        kv = ", ".join(f"{kind} {value / 1024:.0f}" for kind, value in cost.kv_bytes_per_token_by_kind().items())
        table.add_row(
            name,
            ", ".join(preset_index()[name].get("aliases", [])),
            f"{cost.total_params / 1e9:.1f}B",
            f"{cost.active_params_per_token / 1e9:.1f}B",
            kv,
            "yes" if cost.vision else "",
        )
    _console().print(table)


@plan_app.command("gpus")
def gpus() -> None:
    """List the GPU catalog (datasheet figures)."""
    from vlmserve.hardware.gpus import ASSUMED_FIGURES, catalog

    table = Table(show_edge=False)
    for column in ("name", "GPU", "memory GB", "TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "interconnect GB/s"):
        table.add_column(column)
    for key, gpu in sorted(catalog().items()):
        assumed = "*" if key in ASSUMED_FIGURES else ""
        table.add_row(
            key,
            gpu.name,
            f"{gpu.memory_gb:g}",
            f"{gpu.memory_bandwidth_tb_s:g}",
            f"{gpu.bf16_tflops:g}{assumed}",
            "-" if gpu.fp8_tflops is None else f"{gpu.fp8_tflops:g}{assumed}",
            f"{gpu.interconnect_gb_s:g}",
        )
    console = _console()
    console.print(table)
    for key, figures in ASSUMED_FIGURES.items():
        console.print(f"* {key}: not on the datasheet, assumed {figures}")


def _register_day() -> None:
    from vlmserve.cli.plan_day import day

    plan_app.command("day")(day)


_register_day()


def register(app: typer.Typer) -> None:
    """Attach `vlmserve plan` (and its subcommands) to the root CLI."""
    app.add_typer(plan_app, name="plan")
