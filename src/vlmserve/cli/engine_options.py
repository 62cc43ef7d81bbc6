"""The flags of `vlmserve engine sim`, declared once from SimEngineConfig and FaultOptions (cli.model_options).

Each flag's default is its field's; `--no-prefix-caching`, `--no-chunked-prefill`, `--no-timing`
and `--served-model-name` are the command's own spellings of a field they invert or extend.
"""

from __future__ import annotations

import typer

from vlmserve.cli.model_options import Flag, OptionGroup, model_option
from vlmserve.engines.sim.options import FaultOptions, OutputLengthDistribution, SimEngineConfig
from vlmserve.errors import UserError


def parse_int_list(text: str | None, flag: str, example: str) -> tuple[int, ...]:
    """'500,503' → (500, 503); a UserError naming the flag otherwise."""
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{flag} takes a comma-separated list like {example}; got '{text}'") from None


def _budgets(text: str) -> tuple[int, ...]:
    return parse_int_list(text, "--image-budgets", "70,140,280")


def _error_codes(text: str) -> tuple[int, ...]:
    return parse_int_list(text, "--error-codes", "500,503") or (500,)


def _codes_text(codes: tuple[int, ...]) -> str:
    return ",".join(str(code) for code in codes)


def distribution_text(distribution: OutputLengthDistribution) -> str:
    """An output length distribution as --output-len writes it (lognormal:200:0.8)."""
    numbers = (distribution.a, distribution.b) if distribution.kind in ("uniform", "lognormal") else (distribution.a,)
    return ":".join([distribution.kind, *(f"{number:g}" for number in numbers)])


SIM_ENGINE = OptionGroup(
    "flags",
    {
        "host": model_option(SimEngineConfig, "host", help="Address to listen on."),
        "port": model_option(SimEngineConfig, "port", help="Port to listen on (0 picks a free one and prints it)."),
        "model": model_option(SimEngineConfig, "model", help="Model name the engine serves (requests must name it)."),
        "served_model_name": Flag(typer.Option([], help="Extra names the model answers to (repeatable)."), list[str]),
        "seed": model_option(
            SimEngineConfig, "seed", help="Seed for output lengths, text and injected faults (same seed, same run)."
        ),
        "profile": model_option(
            SimEngineConfig,
            "profile",
            help="Step-cost profile: tiny-cpu, a10g-8b, l40s-8b, a100-8b, h100-8b, h200-8b, h100-qwen3vl-4b.",
        ),
        "ttft_ms": model_option(
            SimEngineConfig, "ttft_ms", help="Constant mode: every request's first token after this many ms."
        ),
        "itl_ms": model_option(SimEngineConfig, "itl_ms", help="Constant mode: then one token every this many ms."),
        "max_model_len": model_option(
            SimEngineConfig, "max_model_len", help="Longest prompt + output, in tokens (vLLM's --max-model-len)."
        ),
        "max_num_seqs": model_option(
            SimEngineConfig, "max_num_seqs", help="Most requests running at once (vLLM's --max-num-seqs)."
        ),
        "max_num_batched_tokens": model_option(
            SimEngineConfig, "max_num_batched_tokens", help="Token budget per step (vLLM's --max-num-batched-tokens)."
        ),
        "max_num_encoder_input_tokens": model_option(
            SimEngineConfig,
            "max_num_encoder_input_tokens",
            help="Image tokens the vision encoder may run per step (vLLM's --max-num-encoder-input-tokens; default: --max-num-batched-tokens).",
        ),
        "encoder_cache_size": model_option(
            SimEngineConfig,
            "encoder_cache_size",
            help="Image tokens of encoder output the encoder cache holds (vLLM's --encoder-cache-size; default: --max-num-batched-tokens).",
        ),
        "disable_chunked_mm_input": model_option(
            SimEngineConfig, "disable_chunked_mm_input", help="A prefill chunk never ends inside an image (vLLM's flag)."
        ),
        "num_kv_blocks": model_option(SimEngineConfig, "num_kv_blocks", help="KV cache size in blocks of --block-size tokens."),
        "block_size": model_option(SimEngineConfig, "block_size", help="Tokens per KV block."),
        "no_prefix_caching": Flag(typer.Option(False, "--no-prefix-caching", help="Disable prefix caching."), bool),
        "no_chunked_prefill": Flag(typer.Option(False, "--no-chunked-prefill", help="Disable chunked prefill."), bool),
        "image_tokens": model_option(
            SimEngineConfig,
            "image_tokens",
            help="Vision tokens per image (a request may pick another via mm_processor_kwargs.max_soft_tokens).",
        ),
        "allowed_image_budgets": model_option(
            SimEngineConfig,
            "allowed_image_budgets",
            help="Allowed per-image budgets, e.g. 70,140,280,560,1120 (Gemma).",
            given_only=True,
            annotation=str,
            parse=_budgets,
        ),
        "model_config_dir": model_option(
            SimEngineConfig,
            "model_config_dir",
            help="A model directory (config.json, processor configs): each image costs what that model's own rule says, not --image-tokens.",
        ),
        "api_server_count": model_option(
            SimEngineConfig,
            "api_server_count",
            help="Frontend processes preprocessing images, as vLLM's --api-server-count: a request waits for a free one.",
        ),
        "mm_preprocess_ms_per_image": model_option(
            SimEngineConfig, "mm_preprocess_ms_per_image", help="Frontend: ms to preprocess an image not in the cache, plus ..."
        ),
        "mm_preprocess_ms_per_megapixel": model_option(
            SimEngineConfig, "mm_preprocess_ms_per_megapixel", help="... ms per megapixel (both 0: preprocessing is not priced)."
        ),
        "mm_cache_items": model_option(
            SimEngineConfig,
            "mm_cache_items",
            help="Images the multimodal cache holds (0: none); a repeat skips preprocessing and the encoder.",
        ),
        "output_len": model_option(
            SimEngineConfig,
            "output_len",
            help="Natural answer length when not forced: fixed:N, uniform:LO:HI, exponential:MEAN, lognormal:MEAN:SIGMA.",
            annotation=str,
            parse=OutputLengthDistribution.parse,
            text=distribution_text,
        ),
        "error_rate": model_option(FaultOptions, "error_rate", help="Fault: fraction of requests answered with an injected 5xx."),
        "error_codes": model_option(
            FaultOptions,
            "error_codes",
            help="Fault: status codes injected errors use, e.g. 500,503.",
            annotation=str,
            parse=_error_codes,
            text=_codes_text,
        ),
        "crash_after": model_option(
            FaultOptions, "crash_after", help="Fault: the process exits (code 3) when request N+1 arrives."
        ),
        "startup_delay_s": model_option(
            FaultOptions, "startup_delay_s", help="Fault: /health and the API answer 503 for this many seconds."
        ),
        "freeze_after": model_option(
            FaultOptions,
            "freeze_after",
            help="Fault (tests): the engine loop stops for good when request N+1 arrives; /health still answers.",
        ),
        "stall_after_tokens": model_option(
            FaultOptions, "stall_after_tokens", help="Fault: streams stop sending after this many tokens ..."
        ),
        "stall_s": model_option(FaultOptions, "stall_s", help="... for this many seconds (default: forever)."),
        "drop_after_tokens": model_option(
            FaultOptions, "drop_after_tokens", help="Fault: streams are cut (connection reset) after this many tokens."
        ),
        "fault_rate": model_option(FaultOptions, "fault_rate", help="Fault: fraction of streams that stall or drop."),
        "poison_marker": model_option(
            FaultOptions,
            "poison_marker",
            help="Fault: requests whose body contains this text are answered 500, on every replica.",
        ),
        "swap_answer_rate": model_option(
            FaultOptions,
            "swap_answer_rate",
            help="Fault: fraction of requests arriving while others are in flight that get one of those requests' answers, preferring one of the same prompt length (a batching/cache bug; see `vlmserve consistency`).",
        ),
        "reject_over_context": model_option(
            SimEngineConfig,
            "reject_over_context",
            help="Refuse prompt + max_tokens > --max-model-len with 400, as earlier vLLM releases did (default: clamp max_tokens, as vLLM 0.32 does).",
        ),
        "no_timing": Flag(typer.Option(False, "--no-timing", help="Do not record emission timing error (/debug/timing)."), bool),
        "trace_file": model_option(
            SimEngineConfig,
            "trace_file",
            help="Append one JSON line per ended request: arrival, first-token and chunk emission times (monotonic clock), for judging clients' TTFT/ITL.",
        ),
        "gpu": model_option(
            SimEngineConfig,
            "gpu",
            help="Planner mode: time steps as --model (a `plan models` preset or config.json) on this GPU; KV blocks from its memory.",
        ),
        "tp": model_option(SimEngineConfig, "tp", help="Planner mode: tensor-parallel GPUs.", min=1),
        "cold_start_s": model_option(
            SimEngineConfig,
            "cold_start_s",
            help="Seconds before the engine serves: the port is bound but refuses connections meanwhile, as vLLM while it loads (phases logged as vLLM logs them).",
        ),
        "lora_modules": model_option(
            SimEngineConfig,
            "lora_modules",
            help="A LoRA adapter name it serves (repeatable): listed in /v1/models, "
            "each takes one of --max-loras slots per step (needs --profile).",
            annotation=list[str],
            parse=tuple,
            text=list,
        ),
        "max_loras": model_option(
            SimEngineConfig, "max_loras", help="Adapters in one step (vLLM's --max-loras; default 1).", min=1
        ),
        "max_cpu_loras": model_option(
            SimEngineConfig, "max_cpu_loras", help="Adapters kept loaded (vLLM's --max-cpu-loras; default --max-loras).", min=1
        ),
        "lora_load_ms": model_option(SimEngineConfig, "lora_load_ms", help="Time to load an adapter that is not kept loaded."),
        "lora_step_ms": model_option(SimEngineConfig, "lora_step_ms", help="Time each distinct adapter adds to a step."),
        "rehearsal_optimum": model_option(
            SimEngineConfig,
            "rehearsal_optimum",
            help="Rehearse `vlmserve tune`: steps slow down away from this optimum, e.g. max_num_seqs=32,max_num_batched_tokens=2048 (engines.sim.rehearsal).",
        ),
        "rehearsal_penalty": model_option(
            SimEngineConfig, "rehearsal_penalty", help="Step-time factor per doubling away from --rehearsal-optimum."
        ),
    },
)
"""Every `vlmserve engine sim` flag, in its --help order."""
