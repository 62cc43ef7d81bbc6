"""The flags of `vlmserve bench`, declared once: `tune` and `slo-search` take the load ones from here.

Each flag that sets a LoadSpec field is generated from it (cli.model_options): its default,
choices and type are the field's. The rest (outputs, the endpoint, the verb's own switches) are
`Flag`s. `BENCH` is every flag in `vlmserve bench`'s order; `LOAD_FIELDS` lists the load flags
the other verbs share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import typer

from vlmserve.bench.slo_search import DEFAULT_REPEAT
from vlmserve.cli.model_options import Flag, OptionGroup, choices_text, field_default, model_option
from vlmserve.cli.options import parse_json_object_flag
from vlmserve.errors import UserError
from vlmserve.spec import LoadSpec, parse_duration_s


def parse_duration(text: str) -> float:
    """--duration as seconds: 30s, 2m, 500ms."""
    cleaned = text.strip().lower()
    try:
        if cleaned.endswith("min") or (cleaned.endswith("m") and not cleaned.endswith("ms")):
            return float(cleaned.rstrip("min")) * 60.0
        return parse_duration_s(cleaned)
    except ValueError:
        raise UserError(f"--duration '{text}': write it like 30s, 2m or 500ms") from None


def parse_image_size(text: str) -> tuple[int, int]:
    """--image-size WxH (or one number for a square)."""
    parts = text.lower().split("x")
    try:
        width, height = (int(part) for part in parts) if len(parts) == 2 else (int(parts[0]),) * 2
    except ValueError:
        raise UserError(f"--image-size '{text}': write it like 512x512") from None
    if width < 1 or height < 1 or width * height > 8192 * 8192:
        raise UserError(f"--image-size '{text}': give a size between 1x1 and 8192x8192")
    return width, height


def image_size_text(size: tuple[int, int]) -> str:
    """(64, 64) as --image-size writes it."""
    return f"{size[0]}x{size[1]}"


def weights(flag: str, text: str | None, key: Callable[[str], Any], example: str) -> list[tuple[Any, float]] | None:
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


def positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def parse_images_per_request_mix(text: str) -> dict[int, float] | None:
    counts = weights("--images-per-request-mix", text, positive_int, "1:0.8,3:0.2")
    return dict(counts) if counts else None


def _json_flag(flag: str) -> Callable[[str], dict[str, Any] | None]:
    return lambda text: parse_json_object_flag(flag, text)


def _parse_mix(text: str) -> dict[str, float] | None:
    from vlmserve.bench.workloads.mixed import parse_mix

    return parse_mix(text) if text else None


def _parse_features(text: str) -> list[str]:
    from vlmserve.bench.features.assign import parse_features_flag

    return parse_features_flag(text)


def _parse_lora_adapters(text: str) -> list[str] | None:
    from vlmserve.bench.adapters import parse_lora_adapters

    return parse_lora_adapters(text)


def _list_or_none(values: list[str]) -> list[str] | None:
    return values or None


BENCH = OptionGroup(
    "flags",
    {
        # every bench flag once, in its --help order; `tune` and `slo-search` take the load ones (LOAD_FIELDS)
        "base_url": Flag(typer.Option(..., "--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000"), str),
        "model": Flag(typer.Option(..., "--model", help="Model name as listed in /v1/models."), str),
        "api": model_option(LoadSpec, "api", help="chat or completions."),
        "dataset": model_option(LoadSpec, "dataset", help="random, sharegpt, images, mixed or trace."),
        "dataset_path": model_option(LoadSpec, "dataset_path", help="ShareGPT JSON or trace JSONL file."),
        "input_len": model_option(
            LoadSpec,
            "input_len",
            help=f"Prompt tokens (random, images). Default {field_default(LoadSpec, 'input_len')}.",
            given_only=True,
        ),
        "output_len": model_option(
            LoadSpec,
            "output_len",
            help=f"Output tokens. Default {field_default(LoadSpec, 'output_len')}; for sharegpt, the dataset reply's length.",
            given_only=True,
        ),
        "concurrency": model_option(
            LoadSpec,
            "concurrency",
            help="Closed loop: N users, each sending when its last answer ends. As --max-concurrency: N users, not vLLM's in-flight cap on an open loop.",
        ),
        "rate": model_option(LoadSpec, "rate", help="Open loop: requests per second (inf: none, as vLLM)."),
        "arrival": model_option(
            LoadSpec, "arrival", help=f"Open-loop arrivals: {choices_text(LoadSpec, 'arrival')}.", given_only=True
        ),
        "burstiness": model_option(LoadSpec, "burstiness", help="Gamma shape; < 1 burstier than Poisson.", given_only=True),
        "num_requests": model_option(LoadSpec, "num_requests", help="Stop after N measured requests."),
        "duration": model_option(
            LoadSpec, "duration_s", help="Stop sending after this long (30s, 2m).", annotation=str, parse=parse_duration
        ),
        "load_shape": model_option(
            LoadSpec,
            "load_shape",
            help="Open loop whose rate changes: steps:2@30,20@60,2@40 | ramp:2-20@60 | burst:2,20@5/30@120 | trace:FILE[@SECONDS] (TIME,RATE lines); reports SLO attainment over time and across scale events (docs/autoscaling.md).",
        ),
        "scale_window": Flag(
            typer.Option(5.0, "--scale-window", help="--load-shape: seconds per window of the SLO-attainment timeline."), float
        ),
        "html_out": Flag(
            typer.Option(
                None,
                "--html-out",
                help="--load-shape: write the scaling timeline (attainment per window, replica count over it) as an HTML page.",
            ),
            Optional[Path],
        ),
        "warmup": model_option(LoadSpec, "warmup", help="Requests sent first and left out of every figure."),
        "slo": Flag(
            typer.Option(
                None,
                "--slo",
                help="Objectives for goodput, e.g. ttft_p95=500ms,tpot_p99=50ms,e2e_p95=5s; with --features also rate objectives, e.g. 'schema_valid>=0.99,tool_call_valid>=0.95'.",
            ),
            Optional[str],
        ),
        "goodput": Flag(
            typer.Option(
                None,
                "--goodput",
                help="vLLM's SLO syntax, 'ttft:500 tpot:50' (ms; quoted or repeated): each becomes --slo KEY_p99.",
            ),
            Optional[list[str]],
        ),
        "endpoint": Flag(
            typer.Option(None, "--endpoint", help="vLLM's name for --api: /v1/chat/completions or /v1/completions."),
            Optional[str],
        ),
        "json_out": Flag(typer.Option(None, "--json-out", help="Write the summary JSON here."), Optional[Path]),
        "result_format": Flag(
            typer.Option(
                "vlmserve",
                "--result-format",
                help="--json-out's format: vlmserve (the summary) or vllm (the keys of vllm bench serve --save-result --save-detailed).",
            ),
            str,
        ),
        "records_out": Flag(
            typer.Option(None, "--records-out", help="Write one row per request here (Parquet)."), Optional[Path]
        ),
        "label": Flag(typer.Option(None, "--label", help="A name for this run in the history."), Optional[str]),
        "api_key": Flag(
            typer.Option(None, "--api-key", envvar="VLMSERVE_API_KEY", help="Bearer token for the endpoint."), Optional[str]
        ),
        "tokenizer": model_option(
            LoadSpec,
            "tokenizer",
            help="Local tokenizer (path or cached name) for exact prompt lengths; default: the server's /tokenize.",
        ),
        "multi_turn": model_option(
            LoadSpec,
            "multi_turn",
            help="sharegpt: first (first turn only), dataset (dataset replies as history) or live (live replies as history).",
        ),
        "image_size": model_option(
            LoadSpec, "image_size", help="Synthetic image size WxH.", annotation=str, parse=parse_image_size, text=image_size_text
        ),
        "images_per_request": model_option(LoadSpec, "images_per_request", help="Images in each request (images dataset)."),
        "image_format": model_option(LoadSpec, "image_format", help="Synthetic image format: png or jpeg."),
        "image_dir": model_option(LoadSpec, "image_dir", help="Use images from this folder instead of synthetic ones."),
        "image_url": model_option(
            LoadSpec, "image_urls", help="Send this image URL (repeatable) instead of data URLs.", parse=_list_or_none
        ),
        "image_sizes": Flag(
            typer.Option(
                None,
                "--image-sizes",
                help="Resolution buckets WxH:weight, e.g. 256x256:0.5,1024x768:0.5 (overrides --image-size).",
            ),
            Optional[str],
        ),
        "images_per_request_mix": model_option(
            LoadSpec,
            "images_per_request_mix",
            help="Images per request as N:weight, e.g. 1:0.8,3:0.2.",
            annotation=str,
            parse=parse_images_per_request_mix,
        ),
        "image_repeat_rate": model_option(
            LoadSpec,
            "image_repeat_rate",
            help="Share of image requests that resend earlier images (0-1); the rest bring new ones.",
        ),
        "image_popularity_skew": model_option(
            LoadSpec, "image_popularity_skew", help="Zipf exponent of which earlier image a repeat picks (0 = uniform)."
        ),
        "vision_budgets": Flag(
            typer.Option(
                None,
                "--vision-budgets",
                help="Per-request vision budgets (mm_processor_kwargs.max_soft_tokens) as N:weight, e.g. 70:0.5,280:0.5.",
            ),
            Optional[str],
        ),
        "mm_processor_kwargs": model_option(
            LoadSpec,
            "mm_processor_kwargs",
            help="JSON passed per request as mm_processor_kwargs (vision budget).",
            annotation=str,
            parse=_json_flag("--mm-processor-kwargs"),
        ),
        "mix": model_option(
            LoadSpec, "mix", help="mixed dataset ratios, e.g. text:0.7,images:0.3.", annotation=str, parse=_parse_mix
        ),
        "features": model_option(
            LoadSpec,
            "features",
            help="Feature workloads on top of the dataset, comma-separated: tools (tool schemas; valid tool-call rate), structured (response_format json_schema; schema-valid rate), thinking (enable_thinking; reasoning tokens and timings). See docs/metrics.md.",
            given_only=True,
            annotation=str,
            parse=_parse_features,
        ),
        "tool_choice": model_option(
            LoadSpec,
            "tool_choice",
            help="tools: named (default: each request names one offered tool), required or auto. vLLM needs --tool-call-parser for all three, and --enable-auto-tool-choice for auto.",
            given_only=True,
        ),
        "lora_adapters": model_option(
            LoadSpec,
            "lora_adapters",
            help="LoRA adapters to send conversations to (each request's model), comma-separated, or embedded:N (the embedded model's first N).",
            annotation=str,
            parse=_parse_lora_adapters,
        ),
        "lora_popularity": model_option(
            LoadSpec,
            "lora_popularity",
            help=f"--lora-adapters popularity: {choices_text(LoadSpec, 'lora_popularity')} (the first listed most popular).",
            given_only=True,
        ),
        "lora_skew": model_option(
            LoadSpec,
            "lora_skew",
            help=f"Zipf exponent of adapter popularity (default {field_default(LoadSpec, 'lora_skew')}; --lora-popularity zipf).",
            given_only=True,
        ),
        "lora_base_share": model_option(
            LoadSpec,
            "lora_base_share",
            help="Share of conversations sent to the base model (--model) instead of an adapter (0-1).",
            given_only=True,
        ),
        "extra_body": model_option(
            LoadSpec,
            "extra_body",
            help="JSON (or @file) merged into every request body.",
            annotation=str,
            parse=_json_flag("--extra-body"),
        ),
        "ignore_eos": model_option(
            LoadSpec, "ignore_eos", help="Ask for exactly the output length (vLLM ignore_eos).", pair=True
        ),
        "per_chunk_usage": model_option(
            LoadSpec,
            "per_chunk_usage",
            help="Ask for token counts on every chunk (exact ITL per token) where the server supports it.",
            pair=True,
        ),
        "workers": model_option(LoadSpec, "workers", help="Client worker processes; default: as many as the load needs."),
        "timeout": model_option(LoadSpec, "request_timeout_s", help="Seconds one request may take before it counts as failed."),
        "seed": model_option(LoadSpec, "seed", help="Seed for prompts, images and arrivals."),
        "prompt_pool_size": model_option(
            LoadSpec,
            "prompt_pool_size",
            help="Cycle N distinct prompts (explicit reuse the prefix cache serves); default: every request gets its own prompt.",
        ),
        "shared_prefix_len": model_option(
            LoadSpec,
            "shared_prefix_len",
            help="Tokens at the start of every prompt that all requests share (part of --input-len; random dataset).",
        ),
        "max_send_lag_ms": Flag(
            typer.Option(25.0, "--max-send-lag-ms", help="Send-lag p99 above this marks the run client-limited."), float
        ),
        "server_metrics_interval": Flag(
            typer.Option(
                1.0,
                "--server-metrics-interval",
                help="Seconds between /metrics samples during the run (peaks); 0: only before and after (each scrape costs a small server a few ms).",
            ),
            float,
        ),
        "engine_traces": Flag(
            typer.Option(
                None,
                "--engine-traces",
                help="HOST:PORT to receive the engine's OpenTelemetry spans on (start vLLM with --otlp-traces-endpoint http://HOST:PORT/v1/traces): per-request engine TTFT, queue and prefill.",
            ),
            Optional[str],
        ),
        "deployment_file": Flag(
            typer.Option(None, "--deployment", help="Deployment spec YAML this run targets (recorded with the run)."),
            Optional[Path],
        ),
        "store_run": Flag(typer.Option(True, "--store/--no-store", help="Save the run in the history (vlmserve runs)."), bool),
        "repeat": model_option(
            LoadSpec,
            "repeat",
            help="Run the same load N times, fresh prompts each; N > 1 reports each headline figure with its mean and 95% confidence interval (student t).",
        ),
        "stop_when_oversaturated": model_option(
            LoadSpec,
            "stop_when_oversaturated",
            help="Open loop: stop early once requests waiting and TTFT keep growing (past saturation); the summary says stopped: oversaturated. Default: off for bench, on for sweep and slo-search.",
            pair=True,
        ),
        "progress": Flag(typer.Option(True, "--progress/--no-progress", help="Show the live progress bar."), bool),
    },
)
"""The bench flags by parameter name."""

SEARCH_REPEAT = model_option(
    LoadSpec,
    "repeat",
    default=DEFAULT_REPEAT,
    because="a searched level is judged by a majority of its runs",
    help="Runs per load level; a level holds when more than half meet the SLOs.",
)
"""--repeat of the verbs that search load levels (slo-search, tune): LoadSpec.repeat with their own default."""

LOAD_FIELDS = (
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
    "tokenizer",
    "seed",
    "timeout",
)
"""The load flags every verb that builds a LoadSpec from flags takes (each verb adds its own few)."""
