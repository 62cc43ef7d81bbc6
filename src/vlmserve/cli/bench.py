"""`vlmserve bench` and `vlmserve runs list|show`: flag parsing and wiring only."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from vlmserve.cli import consoles
from vlmserve.cli.bench_options import BENCH, parse_image_size, positive_int, weights
from vlmserve.cli.model_options import ModelOption, with_groups
from vlmserve.errors import UserError
from vlmserve.spec import SLO, LoadSpec, describe_validation_error

FLAG_NAMES = {option.field: option.flag for option in BENCH.options.values() if isinstance(option, ModelOption)}
"""LoadSpec field -> its bench flag, for naming the flag in a refused value."""


GOODPUT_PERCENTILE = "p99"
"""vLLM's `--goodput ttft:500` bounds each request; as a vlmserve SLO the same bound counts goodput
per request, and the run's met/missed verdict is read at this percentile."""
_GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}


def goodput_to_slo(pairs: list[str]) -> str:
    """vLLM's `--goodput ttft:500 tpot:50` (milliseconds) as vlmserve's --slo text."""
    objectives = []
    for pair in (item for text in pairs for item in text.split()):
        key, _, value = pair.partition(":")
        if key not in _GOODPUT_KEYS or not value:
            raise UserError(f"--goodput '{pair}': write KEY:MILLISECONDS with KEY one of ttft, tpot, e2el, e.g. ttft:500")
        try:
            milliseconds = float(value)
        except ValueError:
            raise UserError(f"--goodput '{pair}': {value} is not a number of milliseconds") from None
        objectives.append(f"{_GOODPUT_KEYS[key]}_{GOODPUT_PERCENTILE}={milliseconds:g}ms")
    return ",".join(objectives)


_ENDPOINT_API = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


def _api_from_endpoint(endpoint: str) -> str:
    """vLLM's `--endpoint` path as vlmserve's --api."""
    if endpoint not in _ENDPOINT_API:
        raise UserError(f"--endpoint '{endpoint}': use /v1/chat/completions or /v1/completions")
    return _ENDPOINT_API[endpoint]


def _image_mixes(args: dict[str, Any]) -> dict[str, Any]:
    """The image distribution flags that are not one field each, as LoadSpec fields."""
    sizes = weights("--image-sizes", args["image_sizes"], parse_image_size, "256x256:0.5,1024x768:0.5")
    budgets = weights("--vision-budgets", args["vision_budgets"], positive_int, "70:0.5,280:0.5")
    if budgets and any(value < 1 for value, _ in budgets):
        raise UserError("--vision-budgets: budgets are soft tokens per image, at least 1 (e.g. 70:0.5,280:0.5)")
    return {
        "image_size_mix": [(*size, weight) for size, weight in sizes] if sizes else None,
        "vision_budget_mix": dict(budgets) if budgets else None,
    }


def _check_lora(args: dict[str, Any]) -> None:
    """The many-adapter flags shape --lora-adapters traffic (bench.adapters): one line for each misuse."""
    if args.get("lora_adapters") is None and any(
        args.get(flag) is not None for flag in ("lora_popularity", "lora_skew", "lora_base_share")
    ):
        raise UserError(
            "--lora-popularity, --lora-skew and --lora-base-share shape --lora-adapters traffic; give --lora-adapters"
        )
    if args.get("lora_skew") is not None and args.get("lora_popularity") != "zipf":
        raise UserError("--lora-skew is the Zipf exponent; use it with --lora-popularity zipf")


def _contradictions(args: dict[str, Any]) -> None:
    """Flags that cannot go together: one line naming both."""
    if args["concurrency"] is not None and args["rate"] is not None:
        raise UserError(
            "--concurrency and --rate contradict: give --concurrency N (closed loop) or --rate R (open loop); "
            "vLLM's --max-concurrency with a finite --request-rate (a capped open loop) is not run here"
        )
    if args["concurrency"] is None and args["rate"] is None and args["dataset"] != "trace":
        raise UserError("give --concurrency N (closed loop) or --rate R (open loop)")
    if args["num_requests"] is not None and args["duration"] is not None:
        raise UserError("--num-requests and --duration contradict: give one way to stop")
    if args["num_requests"] is None and args["duration"] is None:
        raise UserError("give --num-requests N or --duration S")
    if args["concurrency"] is not None and (args["arrival"] is not None or args["burstiness"] is not None):
        raise UserError("--arrival/--burstiness shape an open loop; use them with --rate, not --concurrency")
    if args["burstiness"] is not None and (args["arrival"] or "poisson") != "gamma":
        raise UserError("--burstiness applies to --arrival gamma only")
    if args["mix"] is not None and args["dataset"] != "mixed":
        raise UserError("--mix needs --dataset mixed")
    if args["dataset"] == "mixed" and args["mix"] is None:
        raise UserError("--dataset mixed needs --mix, e.g. --mix text:0.7,images:0.3")
    if args["dataset"] in ("sharegpt", "trace") and not args["dataset_path"]:
        raise UserError(f"--dataset {args['dataset']} needs --dataset-path FILE")
    if args["dataset_path"] and args["dataset"] in ("random", "images"):
        raise UserError(f"--dataset-path is read by sharegpt, trace and mixed; --dataset {args['dataset']} makes its own prompts")
    if args["multi_turn"] != "first" and args["dataset"] not in ("sharegpt", "mixed"):
        raise UserError("--multi-turn applies to --dataset sharegpt")
    if args.get("features") and args["api"] != "chat":
        raise UserError(
            "--features needs --api chat: tools, response_format and chat_template_kwargs are chat-completions fields"
        )


RATE_FEATURE = {"schema_valid": "structured", "tool_call_valid": "tools"}
"""Each rate objective and the feature workload whose answers it judges."""


def check_rate_objectives(objectives: SLO, load: LoadSpec) -> None:
    """A rate objective without its feature would never be judged: one line saying what to add."""
    for name in objectives.min_rates:
        if RATE_FEATURE[name] not in load.features:
            raise UserError(
                f"--slo {name}>=...: judges --features {RATE_FEATURE[name]} answers; add {RATE_FEATURE[name]} to --features"
            )


def _with_load_shape(args: dict[str, Any]) -> dict[str, Any]:
    """--load-shape sets the open loop's rate (its peak) and duration (its length) itself."""
    if not args.get("load_shape"):
        return args
    from vlmserve.bench.load_shapes import parse_load_shape

    given = [
        flag
        for name, flag in (
            ("rate", "--rate"),
            ("concurrency", "--concurrency"),
            ("duration", "--duration"),
            ("num_requests", "--num-requests"),
        )
        if args.get(name) is not None
    ]
    if given:
        raise UserError(f"--load-shape sets the rate and the duration itself; drop {', '.join(given)}")
    shape = parse_load_shape(args["load_shape"])
    return {**args, "rate": shape.peak_rate, "duration": f"{shape.duration_s}s"}


def build_load_spec(args: dict[str, Any]) -> LoadSpec:
    """Flags → LoadSpec, with every problem as one line naming the flag.

    Each flag that is one LoadSpec field becomes it (BENCH knows how); a flag not given leaves the
    field at LoadSpec's own default."""
    args = _with_load_shape(args)
    _contradictions(args)
    _check_lora(args)
    from vlmserve.bench.features.assign import parse_tool_choice_flag

    fields = BENCH.fields(args)
    fields["tool_choice"] = parse_tool_choice_flag(args.get("tool_choice"), fields.get("features", []))
    fields.update(_image_mixes(args))
    if args["output_len"] is not None:
        fields["fixed_output_len"] = True
    try:
        return LoadSpec(**fields)
    except ValidationError as err:
        message = describe_validation_error(err, "bench")
        for name, flag in sorted(FLAG_NAMES.items(), key=lambda item: -len(item[0])):
            message = message.replace(f"field '{name}'", flag)
            if "_" in name:  # a rule across fields names them in its text
                message = message.replace(name, flag)
        raise UserError(message.replace("field '(top level)': ", "")) from None


def option_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """`given` flag values with every other bench flag at its default (for verbs that reuse build_load_spec)."""
    return {**BENCH.defaults(), **given}


@with_groups(BENCH)
def bench(flags: dict[str, Any]) -> None:
    """Load-test an OpenAI-compatible endpoint and report latency, throughput and goodput."""
    from vlmserve.bench.console import print_summary
    from vlmserve.bench.post_run import WARNINGS_EXIT_CODE, print_warnings

    args, objectives = _bench_arguments(flags)
    load = build_load_spec(args)
    check_rate_objectives(objectives, load)
    _check_bench_numbers(args, load)
    console = consoles.console(stderr=True)
    result = _run_bench(args, load, objectives, console)
    _write_bench_outputs(result, args, load, objectives, console)
    print_summary(_wide_console(), result.summary)
    print_warnings(result.warnings)  # every warning once more on stderr, unwrapped, for scripts
    if result.meta.interrupted:
        kept = len(result.records)
        console.print(f"interrupted by Ctrl-C: {kept} request record(s) kept and written; the figures cover only them")
        raise typer.Exit(130)
    if result.meta.post_run_failed:
        raise typer.Exit(WARNINGS_EXIT_CODE)


def _bench_arguments(flags: dict[str, Any]) -> tuple[dict[str, Any], SLO]:
    """The flags with vLLM's spellings (--endpoint, --request-rate inf, --goodput) read, and the objectives."""
    args = dict(flags)
    if args["endpoint"] is not None:
        args["api"] = _api_from_endpoint(args["endpoint"])
    if args["rate"] is not None and args["rate"] == float("inf"):
        args["rate"] = None  # vLLM's "no rate": every request at once, in flight up to --max-concurrency
        if args["concurrency"] is None:
            raise UserError("--request-rate inf sends everything at once; give --max-concurrency N with it (N users)")
    slo = args["slo"]
    if args["goodput"]:
        if slo is not None:
            raise UserError("--goodput and --slo contradict: give one set of objectives")
        slo = goodput_to_slo(args["goodput"])
    if args["result_format"] not in ("vlmserve", "vllm"):
        raise UserError(f"--result-format '{args['result_format']}': use vlmserve or vllm")
    if args["result_format"] == "vllm" and args["json_out"] is None:
        raise UserError("--result-format vllm says how --json-out is written; give --json-out FILE with it")
    return args, SLO.parse(slo)


def _check_bench_numbers(args: dict[str, Any], load: LoadSpec) -> None:
    """The bench's own settings, refused before anything runs."""
    if args["engine_traces"] is not None:
        from vlmserve.bench.engine_traces import parse_listen_address

        parse_listen_address(args["engine_traces"])  # a bad address is refused before anything runs
    max_send_lag_ms, scale_window = args["max_send_lag_ms"], args["scale_window"]
    if not (math.isfinite(max_send_lag_ms) and max_send_lag_ms > 0):  # NaN would never mark a run client-limited
        raise UserError(f"--max-send-lag-ms {max_send_lag_ms:g}: give a positive number of milliseconds")
    if not (math.isfinite(scale_window) and scale_window > 0):
        raise UserError(f"--scale-window {scale_window:g}: give a positive number of seconds")
    if args["html_out"] is not None and load.load_shape is None:
        raise UserError("--html-out draws a --load-shape run's scaling timeline; give --load-shape with it")
    interval = args["server_metrics_interval"]
    if not (math.isfinite(interval) and interval >= 0):
        raise UserError(f"--server-metrics-interval {interval:g}: give seconds ≥ 0 (0 = before and after only)")


def _run_bench(args: dict[str, Any], load: LoadSpec, objectives: SLO, console: Console) -> Any:
    """Run the load (repeated as asked) against the endpoint; the run's result."""
    from vlmserve.bench.repeats import run_repeated
    from vlmserve.bench.runner import Target
    from vlmserve.results import metrics

    deployment = None
    if args["deployment_file"] is not None:
        from vlmserve.spec import load_deployment_spec

        deployment = load_deployment_spec(args["deployment_file"]).model_dump(mode="json")
    target = Target(args["base_url"], args["model"], args["api_key"])
    limits = metrics.ClientLimits(send_lag_p99_s=args["max_send_lag_ms"] / 1000.0)
    return asyncio.run(
        run_repeated(
            load,
            target,
            slo=objectives,
            progress=args["progress"],
            label=args["label"],
            deployment=deployment,
            console=console,
            client_limits=limits,
            stop_on_ctrl_c=True,
            server_metrics_interval_s=args["server_metrics_interval"],
            engine_traces=args["engine_traces"],
        )
    )


def _write_bench_outputs(result: Any, args: dict[str, Any], load: LoadSpec, objectives: SLO, console: Console) -> None:
    """The run stored, its JSON (vlmserve's or vLLM's keys), records and scaling timeline written."""
    from vlmserve.bench.post_run import PostRunWarnings, save_results

    json_out, result_format = args["json_out"], args["result_format"]
    if load.load_shape is not None:
        from vlmserve.bench.scale_events import attach_scaling

        attach_scaling(result, objectives, args["scale_window"])
    save_results(
        result,
        store_run=args["store_run"],
        json_out=json_out if result_format == "vlmserve" else None,
        records_out=args["records_out"],
    )
    if args["html_out"] is not None and result.summary.scaling is not None:
        from vlmserve.report.scaling_html import write_scaling_html

        console.print(f"scaling timeline: {write_scaling_html(result.summary, args['html_out'])}")
    if result_format == "vllm" and json_out is not None:
        from vlmserve.interop.vllm_bench import write_vllm_result

        before = len(result.warnings)
        PostRunWarnings(result.warnings).attempt(
            f"writing {json_out}", lambda: write_vllm_result(result, json_out), None, "the vLLM-format result is not in that file"
        )
        if len(result.warnings) > before:
            result.meta.post_run_failed = True


runs_app = typer.Typer(help="The run history: every bench (and sweep) run, stored in DuckDB.", no_args_is_help=True)


RUNS_LIST_COLUMNS = (
    "run id",
    "started (UTC)",
    "label",
    "model",
    "ok",
    "failed",
    "req/s",
    "out tok/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "flags",
)
"""`runs list`'s columns in display order."""
RUNS_LIST_KEPT_FIRST = (
    "run id",
    "label",
    "ok",
    "req/s",
    "TTFT p50",
    "flags",
    "failed",
    "TTFT p99",
    "TPOT p50",
    "out tok/s",
    "model",
    "started (UTC)",
)
"""Which columns a narrow terminal keeps first (the run id already holds the start time)."""


@runs_app.command("list")
def runs_list(
    limit: int = typer.Option(20, "--limit", help="Newest N runs."),
    label: Optional[str] = typer.Option(None, "--label", help="Only runs with this label."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    wide: bool = typer.Option(False, "--wide", help="Every column, however narrow the terminal."),
) -> None:
    """List stored runs, newest first."""
    from vlmserve.results import store

    rows = store.list_runs(limit=limit, label=label)
    if as_json:
        typer.echo(json.dumps(rows, default=str, indent=2))
        return
    if not rows:
        typer.echo(f"no runs stored yet in {store.database_path()}")
        return
    cells = [dict(zip(RUNS_LIST_COLUMNS, _runs_list_cells(row))) for row in rows]
    console = _wide_console()
    shown = list(RUNS_LIST_COLUMNS) if wide else _columns_that_fit(cells, console.width)
    table = Table(show_edge=False, pad_edge=False)
    for column in shown:
        table.add_column(column, no_wrap=True)
    for row_cells in cells:
        table.add_row(*(row_cells[column] for column in shown))
    natural = sum(_column_width(cells, column) for column in shown) + 3 * (len(shown) - 1)
    if wide and natural > console.width:  # every column whole, even past the terminal's edge
        console = Console(width=natural, file=console.file, highlight=False)
    console.print(table)
    left_out = [column for column in RUNS_LIST_COLUMNS if column not in shown]
    if left_out:
        console.print(
            f"({', '.join(left_out)} left out at {console.width} columns: --wide shows every column, --json every field)",
            soft_wrap=True,
        )


def _runs_list_cells(row: dict[str, Any]) -> list[str]:
    flags = ",".join(
        flag
        for flag, on in (
            ("simulated", row["simulated"]),
            ("client-limited", row["client_limited"]),
            ("interrupted", row["interrupted"]),
        )
        if on
    )
    if row.get("tool"):
        flags = ",".join(part for part in (flags, f"from {row['tool']}") if part)
    return [
        row["run_id"],
        str(row["started_at"])[:19],
        row["label"] or "",
        row["model"] or "",
        str(row["completed"]),
        str(row["failed"]),
        _num(row["requests_per_s"]),
        _num(row["output_tokens_per_s"]),
        _num(row["ttft_p50_ms"]),
        _num(row["ttft_p99_ms"]),
        _num(row["tpot_p50_ms"]),
        flags,
    ]


def _column_width(cells: list[dict[str, str]], column: str) -> int:
    return max(len(column), *(len(row[column]) for row in cells))


def _columns_that_fit(cells: list[dict[str, str]], width: int) -> list[str]:
    """The columns, in display order, that fit `width` whole, taken in RUNS_LIST_KEPT_FIRST's order
    (the run id always): a narrow terminal drops whole columns rather than cutting every one."""
    kept: list[str] = []
    used = 0
    for column in RUNS_LIST_KEPT_FIRST:
        extra = _column_width(cells, column) + (3 if kept else 0)  # padding and the rule between columns
        if kept and used + extra > width:
            continue
        kept.append(column)
        used += extra
    return [column for column in RUNS_LIST_COLUMNS if column in kept]


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix) from `vlmserve runs list`."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary JSON."),
) -> None:
    """Show one stored run's summary."""
    from vlmserve.bench.console import print_summary
    from vlmserve.results import store

    result = store.load_run(run_id)
    if as_json:
        typer.echo(result.to_json())
        return
    print_summary(_wide_console(), result.summary)
    typer.echo(f"{len(result.records)} request records stored")


@runs_app.command("import")
def runs_import(
    path: Path = typer.Argument(
        ...,
        metavar="FILE",
        help="A result file of vlmserve (--json-out), vllm bench serve, "
        "AIPerf (profile_export_aiperf.json), guidellm (benchmarks JSON) or inference-perf.",
    ),
    label: Optional[str] = typer.Option(
        None, "--label", help="The run's name in the history (default: the file's own label, else the tool and file name)."
    ),
    simulated: bool = typer.Option(
        False,
        "--simulated",
        help="Mark the run simulated: it ran against a sim engine "
        "(vlmserve's own files say so themselves; other tools' files cannot).",
    ),
) -> None:
    """Store another tool's result file in the history, beside vlmserve's runs (for report and compare)."""
    from vlmserve.interop.importer import import_result_file

    for run_id, result in import_result_file(path, label, simulated=simulated):
        records = f"{len(result.records)} request records" if result.records else "no per-request records (figures only)"
        flags = ", simulated" if result.simulated else ""
        typer.echo(
            f"imported {path} as run {run_id} '{result.meta.label}' "
            f"(from {result.meta.tool}; model {result.meta.model or 'unknown'}; {records}{flags})"
        )
        for line in result.warnings:
            typer.echo(f"warning: {line}", err=True)


def _wide_console() -> Console:
    """Tables keep their columns when piped (rich would squeeze them to 80 characters)."""
    return consoles.console()


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def register(app: typer.Typer) -> None:
    app.command("bench", help="Load-test an OpenAI-compatible endpoint (latency, throughput, goodput).")(bench)
    app.add_typer(runs_app, name="runs")
