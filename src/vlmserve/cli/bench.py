"""`vlmserve bench` and `vlmserve runs list|show`: flag parsing and wiring only."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from pydantic import ValidationError
from rich.console import Console

from vlmserve.cli import consoles
from rich.table import Table

from vlmserve.cli.options import parse_json_object_flag
from vlmserve.errors import UserError
from vlmserve.spec import SLO, LoadSpec, describe_validation_error, parse_duration_s

FLAG_NAMES = {
    "concurrency": "--concurrency", "rate": "--rate", "num_requests": "--num-requests", "duration_s": "--duration",
    "dataset_path": "--dataset-path", "input_len": "--input-len", "output_len": "--output-len", "warmup": "--warmup",
    "burstiness": "--burstiness", "images_per_request": "--images-per-request", "workers": "--workers",
    "prompt_pool_size": "--prompt-pool-size", "shared_prefix_len": "--shared-prefix-len", "repeat": "--repeat",
    "image_repeat_rate": "--image-repeat-rate", "image_popularity_skew": "--image-popularity-skew",
    "lora_skew": "--lora-skew", "lora_base_share": "--lora-base-share", "lora_adapters": "--lora-adapters",
}


VLLM_ALIASES: dict[str, str] = {
    "--dataset": "--dataset-name", "--num-requests": "--num-prompts", "--input-len": "--random-input-len",
    "--output-len": "--random-output-len", "--concurrency": "--max-concurrency", "--rate": "--request-rate",
}
"""vlmserve flag -> the `vllm bench serve` flag accepted as its alias, so existing vLLM command lines run.

Same meanings, except: `--max-concurrency N` is vLLM's cap on requests in flight under its
`--request-rate` (default inf: all sent at once, so N in flight = N closed-loop users); here it
is N closed-loop users, and a finite `--request-rate` with it is refused (vlmserve runs either
loop, not a capped open loop). `--request-rate inf` means "no rate": use it with --max-concurrency.
`--dataset-name` takes vlmserve's workloads (random and sharegpt are vLLM's too). `--endpoint`
and `--goodput` are separate flags below (they map onto --api and --slo)."""


def _alias(flag: str) -> tuple[str, ...]:
    """The flag's names: its own, then its vLLM alias (for `typer.Option`)."""
    return (flag, VLLM_ALIASES[flag]) if flag in VLLM_ALIASES else (flag,)


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


def _duration(text: str | None) -> float | None:
    if text is None:
        return None
    cleaned = text.strip().lower()
    try:
        if cleaned.endswith("min") or (cleaned.endswith("m") and not cleaned.endswith("ms")):
            return float(cleaned.rstrip("min")) * 60.0
        return parse_duration_s(cleaned)
    except ValueError:
        raise UserError(f"--duration '{text}': write it like 30s, 2m or 500ms") from None


def parse_image_size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    try:
        width, height = (int(part) for part in parts) if len(parts) == 2 else (int(parts[0]),) * 2
    except ValueError:
        raise UserError(f"--image-size '{text}': write it like 512x512") from None
    if width < 1 or height < 1 or width * height > 8192 * 8192:
        raise UserError(f"--image-size '{text}': give a size between 1x1 and 8192x8192")
    return width, height


def _weights(flag: str, text: str | None, key: Callable[[str], Any], example: str) -> list[tuple[Any, float]] | None:
    """'A:0.5,B:0.5' as [(key(A), 0.5), ...]; one line naming the flag for anything else."""
    if not text:
        return None
    pairs: list[tuple[Any, float]] = []
    for part in (piece.strip() for piece in text.split(",") if piece.strip()):
        name, sep, weight = part.rpartition(":")
        try:
            value = float(weight)
            if not sep or value < 0:
                raise ValueError
            pairs.append((key(name), value))
        except (ValueError, UserError):
            raise UserError(f"{flag} '{part}': write VALUE:WEIGHT pairs, e.g. {example}") from None
    if not pairs or sum(weight for _, weight in pairs) <= 0:
        raise UserError(f"{flag}: give at least one positive weight, e.g. {example}")
    return pairs


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _image_mixes(args: dict[str, Any]) -> dict[str, Any]:
    """The image workload's distribution flags as LoadSpec fields."""
    sizes = _weights("--image-sizes", args["image_sizes"], parse_image_size, "256x256:0.5,1024x768:0.5")
    counts = _weights("--images-per-request-mix", args["images_per_request_mix"], _positive_int, "1:0.8,3:0.2")
    budgets = _weights("--vision-budgets", args["vision_budgets"], _positive_int, "70:0.5,280:0.5")
    if budgets and any(value < 1 for value, _ in budgets):
        raise UserError("--vision-budgets: budgets are soft tokens per image, at least 1 (e.g. 70:0.5,280:0.5)")
    return {
        "image_size_mix": [(*size, weight) for size, weight in sizes] if sizes else None,
        "images_per_request_mix": dict(counts) if counts else None,
        "vision_budget_mix": dict(budgets) if budgets else None,
        "image_repeat_rate": args["image_repeat_rate"], "image_popularity_skew": args["image_popularity_skew"],
    }


def _lora(args: dict[str, Any]) -> dict[str, Any]:
    """The many-adapter flags as LoadSpec fields (bench.adapters)."""
    from vlmserve.bench.adapters import parse_lora_adapters

    adapters = parse_lora_adapters(args.get("lora_adapters"))
    if adapters is None and any(args.get(flag) is not None for flag in ("lora_popularity", "lora_skew", "lora_base_share")):
        raise UserError("--lora-popularity, --lora-skew and --lora-base-share shape --lora-adapters traffic; give --lora-adapters")
    if args.get("lora_popularity") not in (None, "uniform", "zipf"):
        raise UserError(f"--lora-popularity '{args['lora_popularity']}': use uniform or zipf")
    if args.get("lora_skew") is not None and args.get("lora_popularity") != "zipf":
        raise UserError("--lora-skew is the Zipf exponent; use it with --lora-popularity zipf")
    given = {"lora_popularity": args.get("lora_popularity"), "lora_skew": args.get("lora_skew"),
             "lora_base_share": args.get("lora_base_share")}
    return {"lora_adapters": adapters, **{key: value for key, value in given.items() if value is not None}}


def _contradictions(args: dict[str, Any]) -> None:
    """Flags that cannot go together: one line naming both."""
    if args["concurrency"] is not None and args["rate"] is not None:
        raise UserError("--concurrency and --rate contradict: give --concurrency N (closed loop) or --rate R (open loop); "
                        "vLLM's --max-concurrency with a finite --request-rate (a capped open loop) is not run here")
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
        raise UserError("--features needs --api chat: tools, response_format and chat_template_kwargs are chat-completions fields")


RATE_FEATURE = {"schema_valid": "structured", "tool_call_valid": "tools"}
"""Each rate objective and the feature workload whose answers it judges."""


def check_rate_objectives(objectives: SLO, load: LoadSpec) -> None:
    """A rate objective without its feature would never be judged: one line saying what to add."""
    for name in objectives.min_rates:
        if RATE_FEATURE[name] not in load.features:
            raise UserError(f"--slo {name}>=...: judges --features {RATE_FEATURE[name]} answers; add {RATE_FEATURE[name]} to --features")


def _with_load_shape(args: dict[str, Any]) -> dict[str, Any]:
    """--load-shape sets the open loop's rate (its peak) and duration (its length) itself."""
    if not args.get("load_shape"):
        return args
    from vlmserve.bench.load_shapes import parse_load_shape

    given = [flag for name, flag in (("rate", "--rate"), ("concurrency", "--concurrency"), ("duration", "--duration"),
                                      ("num_requests", "--num-requests")) if args.get(name) is not None]
    if given:
        raise UserError(f"--load-shape sets the rate and the duration itself; drop {', '.join(given)}")
    shape = parse_load_shape(args["load_shape"])
    return {**args, "rate": shape.peak_rate, "duration": f"{shape.duration_s}s"}


def build_load_spec(args: dict[str, Any]) -> LoadSpec:
    """Flags → LoadSpec, with every problem as one line naming the flag."""
    args = _with_load_shape(args)
    _contradictions(args)
    from vlmserve.bench.features.assign import parse_features_flag, parse_tool_choice_flag
    from vlmserve.bench.workloads.mixed import parse_mix

    features = parse_features_flag(args.get("features"))

    fields: dict[str, Any] = {
        "api": args["api"], "dataset": args["dataset"], "dataset_path": args["dataset_path"],
        "concurrency": args["concurrency"], "rate": args["rate"], "arrival": args["arrival"] or "poisson",
        "burstiness": args["burstiness"] if args["burstiness"] is not None else 1.0,
        "num_requests": args["num_requests"], "duration_s": _duration(args["duration"]), "warmup": args["warmup"],
        "multi_turn": args["multi_turn"], "image_size": parse_image_size(args["image_size"]),
        "images_per_request": args["images_per_request"], "image_format": args["image_format"],
        "mix": parse_mix(args["mix"]) if args["mix"] else None,
        "extra_body": parse_json_object_flag("--extra-body", args["extra_body"]), "seed": args["seed"],
        "tokenizer": args["tokenizer"], "ignore_eos": args["ignore_eos"], "per_chunk_usage": args["per_chunk_usage"],
        "image_dir": args["image_dir"], "image_urls": args["image_url"] or None,
        "mm_processor_kwargs": parse_json_object_flag("--mm-processor-kwargs", args["mm_processor_kwargs"]),
        "request_timeout_s": args["timeout"], "workers": args["workers"],
        "prompt_pool_size": args["prompt_pool_size"], "shared_prefix_len": args["shared_prefix_len"],
        "repeat": args["repeat"], "stop_when_oversaturated": args["stop_when_oversaturated"],
        "features": features, "tool_choice": parse_tool_choice_flag(args.get("tool_choice"), features),
        "load_shape": args.get("load_shape"),
        **_image_mixes(args), **_lora(args),
    }
    if args["input_len"] is not None:
        fields["input_len"] = args["input_len"]
    if args["output_len"] is not None:
        fields["output_len"] = args["output_len"]
        fields["fixed_output_len"] = True
    try:
        return LoadSpec(**fields)
    except ValidationError as err:
        message = describe_validation_error(err, "bench")
        for name, flag in FLAG_NAMES.items():
            message = message.replace(f"field '{name}'", flag)
            if "_" in name:  # a rule across fields names them in its text
                message = message.replace(name, flag)
        raise UserError(message.replace("field '(top level)': ", "")) from None


OPTIONS: dict[str, Any] = {
    # every bench flag once; `slo-search` reuses the load-shape ones from here
    "base_url": typer.Option(..., "--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000"),
    "model": typer.Option(..., "--model", help="Model name as listed in /v1/models."),
    "api": typer.Option("chat", "--api", help="chat or completions."),
    "dataset": typer.Option("random", *_alias("--dataset"), help="random, sharegpt, images, mixed or trace."),
    "dataset_path": typer.Option(None, "--dataset-path", help="ShareGPT JSON or trace JSONL file."),
    "input_len": typer.Option(None, *_alias("--input-len"), help="Prompt tokens (random, images). Default 128."),
    "output_len": typer.Option(None, *_alias("--output-len"), help="Output tokens. Default 64; for sharegpt, the dataset reply's length."),
    "concurrency": typer.Option(None, *_alias("--concurrency"), help="Closed loop: N users, each sending when its last answer ends. As --max-concurrency: N users, not vLLM's in-flight cap on an open loop."),
    "rate": typer.Option(None, *_alias("--rate"), help="Open loop: requests per second (inf: none, as vLLM)."),
    "arrival": typer.Option(None, "--arrival", help="Open-loop arrivals: poisson (default), constant or gamma."),
    "burstiness": typer.Option(None, "--burstiness", help="Gamma shape; < 1 burstier than Poisson."),
    "num_requests": typer.Option(None, *_alias("--num-requests"), help="Stop after N measured requests."),
    "duration": typer.Option(None, "--duration", help="Stop sending after this long (30s, 2m)."),
    "load_shape": typer.Option(None, "--load-shape", help="Open loop whose rate changes: steps:2@30,20@60,2@40 | ramp:2-20@60 | burst:2,20@5/30@120 | trace:FILE[@SECONDS] (TIME,RATE lines); reports SLO attainment over time and across scale events (docs/autoscaling.md)."),
    "scale_window": typer.Option(5.0, "--scale-window", help="--load-shape: seconds per window of the SLO-attainment timeline."),
    "html_out": typer.Option(None, "--html-out", help="--load-shape: write the scaling timeline (attainment per window, replica count over it) as an HTML page."),
    "warmup": typer.Option(0, "--warmup", help="Requests sent first and left out of every figure."),
    "slo": typer.Option(None, "--slo", help="Objectives for goodput, e.g. ttft_p95=500ms,tpot_p99=50ms,e2e_p95=5s; with --features also rate objectives, e.g. 'schema_valid>=0.99,tool_call_valid>=0.95'."),
    "goodput": typer.Option(None, "--goodput", help="vLLM's SLO syntax, 'ttft:500 tpot:50' (ms; quoted or repeated): each becomes --slo KEY_p99."),
    "endpoint": typer.Option(None, "--endpoint", help="vLLM's name for --api: /v1/chat/completions or /v1/completions."),
    "json_out": typer.Option(None, "--json-out", help="Write the summary JSON here."),
    "result_format": typer.Option("vlmserve", "--result-format", help="--json-out's format: vlmserve (the summary) or vllm (the keys of vllm bench serve --save-result --save-detailed)."),
    "records_out": typer.Option(None, "--records-out", help="Write one row per request here (Parquet)."),
    "label": typer.Option(None, "--label", help="A name for this run in the history."),
    "api_key": typer.Option(None, "--api-key", envvar="VLMSERVE_API_KEY", help="Bearer token for the endpoint."),
    "tokenizer": typer.Option(None, "--tokenizer", help="Local tokenizer (path or cached name) for exact prompt lengths; default: the server's /tokenize."),
    "multi_turn": typer.Option("first", "--multi-turn", help="sharegpt: first (first turn only), dataset (dataset replies as history) or live (live replies as history)."),
    "image_size": typer.Option("64x64", "--image-size", help="Synthetic image size WxH."),
    "images_per_request": typer.Option(1, "--images-per-request", help="Images in each request (images dataset)."),
    "image_format": typer.Option("png", "--image-format", help="Synthetic image format: png or jpeg."),
    "image_dir": typer.Option(None, "--image-dir", help="Use images from this folder instead of synthetic ones."),
    "image_url": typer.Option(None, "--image-url", help="Send this image URL (repeatable) instead of data URLs."),
    "image_sizes": typer.Option(None, "--image-sizes", help="Resolution buckets WxH:weight, e.g. 256x256:0.5,1024x768:0.5 (overrides --image-size)."),
    "images_per_request_mix": typer.Option(None, "--images-per-request-mix", help="Images per request as N:weight, e.g. 1:0.8,3:0.2."),
    "image_repeat_rate": typer.Option(None, "--image-repeat-rate", help="Share of image requests that resend earlier images (0-1); the rest bring new ones."),
    "image_popularity_skew": typer.Option(1.0, "--image-popularity-skew", help="Zipf exponent of which earlier image a repeat picks (0 = uniform)."),
    "vision_budgets": typer.Option(None, "--vision-budgets", help="Per-request vision budgets (mm_processor_kwargs.max_soft_tokens) as N:weight, e.g. 70:0.5,280:0.5."),
    "mm_processor_kwargs": typer.Option(None, "--mm-processor-kwargs", help="JSON passed per request as mm_processor_kwargs (vision budget)."),
    "mix": typer.Option(None, "--mix", help="mixed dataset ratios, e.g. text:0.7,images:0.3."),
    "features": typer.Option(None, "--features", help="Feature workloads on top of the dataset, comma-separated: tools (tool schemas; valid tool-call rate), structured (response_format json_schema; schema-valid rate), thinking (enable_thinking; reasoning tokens and timings). See docs/metrics.md."),
    "tool_choice": typer.Option(None, "--tool-choice", help="tools: named (default: each request names one offered tool), required or auto. vLLM needs --tool-call-parser for all three, and --enable-auto-tool-choice for auto."),
    "lora_adapters": typer.Option(None, "--lora-adapters", help="LoRA adapters to send conversations to (each request's model), comma-separated, or embedded:N (the embedded model's first N)."),
    "lora_popularity": typer.Option(None, "--lora-popularity", help="--lora-adapters popularity: uniform (default) or zipf (the first listed most popular)."),
    "lora_skew": typer.Option(None, "--lora-skew", help="Zipf exponent of adapter popularity (default 1.0; --lora-popularity zipf)."),
    "lora_base_share": typer.Option(None, "--lora-base-share", help="Share of conversations sent to the base model (--model) instead of an adapter (0-1)."),
    "extra_body": typer.Option(None, "--extra-body", help="JSON (or @file) merged into every request body."),
    "ignore_eos": typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Ask for exactly the output length (vLLM ignore_eos)."),
    "per_chunk_usage": typer.Option(True, "--per-chunk-usage/--no-per-chunk-usage", help="Ask for token counts on every chunk (exact ITL per token) where the server supports it."),
    "workers": typer.Option(None, "--workers", help="Client worker processes; default: as many as the load needs."),
    "timeout": typer.Option(600.0, "--timeout", help="Seconds one request may take before it counts as failed."),
    "seed": typer.Option(0, "--seed", help="Seed for prompts, images and arrivals."),
    "prompt_pool_size": typer.Option(None, "--prompt-pool-size", help="Cycle N distinct prompts (explicit reuse the prefix cache serves); default: every request gets its own prompt."),
    "shared_prefix_len": typer.Option(0, "--shared-prefix-len", help="Tokens at the start of every prompt that all requests share (part of --input-len; random dataset)."),
    "max_send_lag_ms": typer.Option(25.0, "--max-send-lag-ms", help="Send-lag p99 above this marks the run client-limited."),
    "server_metrics_interval": typer.Option(1.0, "--server-metrics-interval", help="Seconds between /metrics samples during the run (peaks); 0: only before and after (each scrape costs a small server a few ms)."),
    "engine_traces": typer.Option(None, "--engine-traces", help="HOST:PORT to receive the engine's OpenTelemetry spans on (start vLLM with --otlp-traces-endpoint http://HOST:PORT/v1/traces): per-request engine TTFT, queue and prefill."),
    "deployment_file": typer.Option(None, "--deployment", help="Deployment spec YAML this run targets (recorded with the run)."),
    "store_run": typer.Option(True, "--store/--no-store", help="Save the run in the history (vlmserve runs)."),
    "progress": typer.Option(True, "--progress/--no-progress", help="Show the live progress bar."),
    "repeat": typer.Option(1, "--repeat", help="Run the same load N times, fresh prompts each; N > 1 reports each headline figure with its mean and 95% confidence interval (student t)."),
    "stop_when_oversaturated": typer.Option(None, "--stop-when-oversaturated/--no-stop-when-oversaturated", help="Open loop: stop early once requests waiting and TTFT keep growing (past saturation); the summary says stopped: oversaturated. Default: off for bench, on for sweep and slo-search."),
}
"""The bench flags by parameter name (one definition each, shared with `vlmserve slo-search`)."""


def option_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """`given` flag values with every other bench flag at its default (for verbs that reuse build_load_spec)."""
    defaults = {name: option.default for name, option in OPTIONS.items() if option.default is not ...}
    return {**defaults, **given}


def bench(
    base_url: str = OPTIONS["base_url"],
    model: str = OPTIONS["model"],
    api: str = OPTIONS["api"],
    dataset: str = OPTIONS["dataset"],
    dataset_path: Optional[str] = OPTIONS["dataset_path"],
    input_len: Optional[int] = OPTIONS["input_len"],
    output_len: Optional[int] = OPTIONS["output_len"],
    concurrency: Optional[int] = OPTIONS["concurrency"],
    rate: Optional[float] = OPTIONS["rate"],
    arrival: Optional[str] = OPTIONS["arrival"],
    burstiness: Optional[float] = OPTIONS["burstiness"],
    num_requests: Optional[int] = OPTIONS["num_requests"],
    duration: Optional[str] = OPTIONS["duration"],
    load_shape: Optional[str] = OPTIONS["load_shape"],
    scale_window: float = OPTIONS["scale_window"],
    html_out: Optional[Path] = OPTIONS["html_out"],
    warmup: int = OPTIONS["warmup"],
    slo: Optional[str] = OPTIONS["slo"],
    goodput: Optional[list[str]] = OPTIONS["goodput"],
    endpoint: Optional[str] = OPTIONS["endpoint"],
    json_out: Optional[Path] = OPTIONS["json_out"],
    result_format: str = OPTIONS["result_format"],
    records_out: Optional[Path] = OPTIONS["records_out"],
    label: Optional[str] = OPTIONS["label"],
    api_key: Optional[str] = OPTIONS["api_key"],
    tokenizer: Optional[str] = OPTIONS["tokenizer"],
    multi_turn: str = OPTIONS["multi_turn"],
    image_size: str = OPTIONS["image_size"],
    images_per_request: int = OPTIONS["images_per_request"],
    image_format: str = OPTIONS["image_format"],
    image_dir: Optional[str] = OPTIONS["image_dir"],
    image_url: Optional[list[str]] = OPTIONS["image_url"],
    image_sizes: Optional[str] = OPTIONS["image_sizes"],
    images_per_request_mix: Optional[str] = OPTIONS["images_per_request_mix"],
    image_repeat_rate: Optional[float] = OPTIONS["image_repeat_rate"],
    image_popularity_skew: float = OPTIONS["image_popularity_skew"],
    vision_budgets: Optional[str] = OPTIONS["vision_budgets"],
    mm_processor_kwargs: Optional[str] = OPTIONS["mm_processor_kwargs"],
    mix: Optional[str] = OPTIONS["mix"],
    features: Optional[str] = OPTIONS["features"],
    tool_choice: Optional[str] = OPTIONS["tool_choice"],
    lora_adapters: Optional[str] = OPTIONS["lora_adapters"],
    lora_popularity: Optional[str] = OPTIONS["lora_popularity"],
    lora_skew: Optional[float] = OPTIONS["lora_skew"],
    lora_base_share: Optional[float] = OPTIONS["lora_base_share"],
    extra_body: Optional[str] = OPTIONS["extra_body"],
    ignore_eos: bool = OPTIONS["ignore_eos"],
    per_chunk_usage: bool = OPTIONS["per_chunk_usage"],
    workers: Optional[int] = OPTIONS["workers"],
    timeout: float = OPTIONS["timeout"],
    seed: int = OPTIONS["seed"],
    prompt_pool_size: Optional[int] = OPTIONS["prompt_pool_size"],
    shared_prefix_len: int = OPTIONS["shared_prefix_len"],
    max_send_lag_ms: float = OPTIONS["max_send_lag_ms"],
    server_metrics_interval: float = OPTIONS["server_metrics_interval"],
    engine_traces: Optional[str] = OPTIONS["engine_traces"],
    deployment_file: Optional[Path] = OPTIONS["deployment_file"],
    store_run: bool = OPTIONS["store_run"],
    repeat: int = OPTIONS["repeat"],
    stop_when_oversaturated: Optional[bool] = OPTIONS["stop_when_oversaturated"],
    progress: bool = OPTIONS["progress"],
) -> None:
    """Load-test an OpenAI-compatible endpoint and report latency, throughput and goodput."""
    from vlmserve.results import metrics
    from vlmserve.bench.console import print_summary
    from vlmserve.bench.post_run import WARNINGS_EXIT_CODE, PostRunWarnings, print_warnings, save_results
    from vlmserve.bench.repeats import run_repeated
    from vlmserve.bench.runner import Target

    args = dict(locals())
    if endpoint is not None:
        args["api"] = _api_from_endpoint(endpoint)
    if rate is not None and rate == float("inf"):
        args["rate"] = None  # vLLM's "no rate": every request at once, in flight up to --max-concurrency
        if concurrency is None:
            raise UserError("--request-rate inf sends everything at once; give --max-concurrency N with it (N users)")
    if goodput:
        if slo is not None:
            raise UserError("--goodput and --slo contradict: give one set of objectives")
        slo = goodput_to_slo(goodput)
    for name, allowed in (("api", ("chat", "completions")), ("dataset", ("random", "sharegpt", "images", "mixed", "trace")),
                          ("arrival", ("poisson", "constant", "gamma", None)), ("multi_turn", ("first", "dataset", "live")),
                          ("image_format", ("png", "jpeg"))):
        if args[name] not in allowed:
            choices = ", ".join(value for value in allowed if value)
            raise UserError(f"--{name.replace('_', '-')} '{args[name]}': use one of {choices}")
    if result_format not in ("vlmserve", "vllm"):
        raise UserError(f"--result-format '{result_format}': use vlmserve or vllm")
    if result_format == "vllm" and json_out is None:
        raise UserError("--result-format vllm says how --json-out is written; give --json-out FILE with it")
    load = build_load_spec(args)
    objectives = SLO.parse(slo)
    check_rate_objectives(objectives, load)
    if engine_traces is not None:
        from vlmserve.bench.engine_traces import parse_listen_address

        parse_listen_address(engine_traces)  # a bad address is refused before anything runs
    deployment = None
    if deployment_file is not None:
        from vlmserve.spec import load_deployment_spec

        deployment = load_deployment_spec(deployment_file).model_dump(mode="json")
    target = Target(base_url, model, api_key)
    console = consoles.console(stderr=True)
    if not (math.isfinite(max_send_lag_ms) and max_send_lag_ms > 0):  # NaN would never mark a run client-limited
        raise UserError(f"--max-send-lag-ms {max_send_lag_ms:g}: give a positive number of milliseconds")
    limits = metrics.ClientLimits(send_lag_p99_s=max_send_lag_ms / 1000.0)
    if not (math.isfinite(scale_window) and scale_window > 0):
        raise UserError(f"--scale-window {scale_window:g}: give a positive number of seconds")
    if html_out is not None and load.load_shape is None:
        raise UserError("--html-out draws a --load-shape run's scaling timeline; give --load-shape with it")
    if not (math.isfinite(server_metrics_interval) and server_metrics_interval >= 0):
        raise UserError(f"--server-metrics-interval {server_metrics_interval:g}: give seconds ≥ 0 (0 = before and after only)")
    result = asyncio.run(
        run_repeated(load, target, slo=objectives, progress=progress, label=label, deployment=deployment,
                     console=console, client_limits=limits, stop_on_ctrl_c=True,
                     server_metrics_interval_s=server_metrics_interval, engine_traces=engine_traces)
    )
    if load.load_shape is not None:
        from vlmserve.bench.scale_events import attach_scaling

        attach_scaling(result, objectives, scale_window)
    save_results(result, store_run=store_run, json_out=json_out if result_format == "vlmserve" else None,
                 records_out=records_out)
    if html_out is not None and result.summary.scaling is not None:
        from vlmserve.report.scaling_html import write_scaling_html

        console.print(f"scaling timeline: {write_scaling_html(result.summary, html_out)}")
    if result_format == "vllm" and json_out is not None:
        from vlmserve.interop.vllm_bench import write_vllm_result

        before = len(result.warnings)
        PostRunWarnings(result.warnings).attempt(f"writing {json_out}", lambda: write_vllm_result(result, json_out),
                                                 None, "the vLLM-format result is not in that file")
        if len(result.warnings) > before:
            result.meta.post_run_failed = True
    print_summary(_wide_console(), result.summary)
    print_warnings(result.warnings)  # every warning once more on stderr, unwrapped, for scripts
    if result.meta.interrupted:
        kept = len(result.records)
        console.print(f"interrupted by Ctrl-C: {kept} request record(s) kept and written; the figures cover only them")
        raise typer.Exit(130)
    if result.meta.post_run_failed:
        raise typer.Exit(WARNINGS_EXIT_CODE)


runs_app = typer.Typer(help="The run history: every bench (and sweep) run, stored in DuckDB.", no_args_is_help=True)


RUNS_LIST_COLUMNS = ("run id", "started (UTC)", "label", "model", "ok", "failed", "req/s", "out tok/s", "TTFT p50",
                     "TTFT p99", "TPOT p50", "flags")
"""`runs list`'s columns in display order."""
RUNS_LIST_KEPT_FIRST = ("run id", "label", "ok", "req/s", "TTFT p50", "flags", "failed", "TTFT p99", "TPOT p50",
                        "out tok/s", "model", "started (UTC)")
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
        console.print(f"({', '.join(left_out)} left out at {console.width} columns: --wide shows every column, "
                      "--json every field)", soft_wrap=True)


def _runs_list_cells(row: dict[str, Any]) -> list[str]:
    flags = ",".join(flag for flag, on in (("simulated", row["simulated"]), ("client-limited", row["client_limited"]),
                                           ("interrupted", row["interrupted"])) if on)
    if row.get("tool"):
        flags = ",".join(part for part in (flags, f"from {row['tool']}") if part)
    return [row["run_id"], str(row["started_at"])[:19], row["label"] or "", row["model"] or "", str(row["completed"]),
            str(row["failed"]), _num(row["requests_per_s"]), _num(row["output_tokens_per_s"]), _num(row["ttft_p50_ms"]),
            _num(row["ttft_p99_ms"]), _num(row["tpot_p50_ms"]), flags]


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
    from vlmserve.results import store
    from vlmserve.bench.console import print_summary

    result = store.load_run(run_id)
    if as_json:
        typer.echo(result.to_json())
        return
    print_summary(_wide_console(), result.summary)
    typer.echo(f"{len(result.records)} request records stored")


@runs_app.command("import")
def runs_import(
    path: Path = typer.Argument(..., metavar="FILE", help="A result file of vlmserve (--json-out), vllm bench serve, "
                                "AIPerf (profile_export_aiperf.json), guidellm (benchmarks JSON) or inference-perf."),
    label: Optional[str] = typer.Option(None, "--label", help="The run's name in the history (default: the file's "
                                        "own label, else the tool and file name)."),
    simulated: bool = typer.Option(False, "--simulated", help="Mark the run simulated: it ran against a sim engine "
                                   "(vlmserve's own files say so themselves; other tools' files cannot)."),
) -> None:
    """Store another tool's result file in the history, beside vlmserve's runs (for report and compare)."""
    from vlmserve.interop.importer import import_result_file

    for run_id, result in import_result_file(path, label, simulated=simulated):
        records = f"{len(result.records)} request records" if result.records else "no per-request records (figures only)"
        flags = ", simulated" if result.simulated else ""
        typer.echo(f"imported {path} as run {run_id} '{result.meta.label}' "
                   f"(from {result.meta.tool}; model {result.meta.model or 'unknown'}; {records}{flags})")
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
