"""`vlmserve engine sim`: start a simulated vLLM engine (OpenAI API, vLLM metrics, no GPU)."""

from __future__ import annotations

import typer

from vlmserve.errors import UserError

engine_app = typer.Typer(
    name="engine",
    help="Inference engines vlmserve can run itself (the simulated engine).",
    no_args_is_help=True,
)


def _parse_int_list(text: str | None, flag: str, example: str) -> tuple[int, ...]:
    """'500,503' → (500, 503); a UserError naming the flag otherwise."""
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{flag} takes a comma-separated list like {example}; got '{text}'") from None


@engine_app.command("sim")
def sim(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on (0 picks a free one and prints it)."),
    model: str = typer.Option("sim-model", help="Model name the engine serves (requests must name it)."),
    served_model_name: list[str] = typer.Option([], help="Extra names the model answers to (repeatable)."),
    seed: int = typer.Option(0, help="Seed for output lengths, text and injected faults (same seed, same run)."),
    profile: str = typer.Option(None, help="Step-cost profile: tiny-cpu, a10g-8b, l40s-8b, a100-8b, h100-8b, h200-8b, h100-qwen3vl-4b."),
    ttft_ms: float = typer.Option(None, help="Constant mode: every request's first token after this many ms."),
    itl_ms: float = typer.Option(None, help="Constant mode: then one token every this many ms."),
    max_model_len: int = typer.Option(8192, help="Longest prompt + output, in tokens (vLLM's --max-model-len)."),
    max_num_seqs: int = typer.Option(256, help="Most requests running at once (vLLM's --max-num-seqs)."),
    max_num_batched_tokens: int = typer.Option(8192, help="Token budget per step (vLLM's --max-num-batched-tokens)."),
    max_num_encoder_input_tokens: int = typer.Option(None, help="Image tokens the vision encoder may run per step (vLLM's --max-num-encoder-input-tokens; default: --max-num-batched-tokens)."),
    encoder_cache_size: int = typer.Option(None, help="Image tokens of encoder output the encoder cache holds (vLLM's --encoder-cache-size; default: --max-num-batched-tokens)."),
    disable_chunked_mm_input: bool = typer.Option(False, "--disable-chunked-mm-input", help="A prefill chunk never ends inside an image (vLLM's flag)."),
    num_kv_blocks: int = typer.Option(8192, help="KV cache size in blocks of --block-size tokens."),
    block_size: int = typer.Option(16, help="Tokens per KV block."),
    no_prefix_caching: bool = typer.Option(False, "--no-prefix-caching", help="Disable prefix caching."),
    no_chunked_prefill: bool = typer.Option(False, "--no-chunked-prefill", help="Disable chunked prefill."),
    image_tokens: int = typer.Option(256, help="Vision tokens per image (a request may pick another via mm_processor_kwargs.max_soft_tokens)."),
    image_budgets: str = typer.Option(None, help="Allowed per-image budgets, e.g. 70,140,280,560,1120 (Gemma)."),
    model_config_dir: str = typer.Option(None, help="A model directory (config.json, processor configs): each image costs what that model's own rule says, not --image-tokens."),
    api_server_count: int = typer.Option(1, help="Frontend processes preprocessing images, as vLLM's --api-server-count: a request waits for a free one."),
    mm_preprocess_ms_per_image: float = typer.Option(0.0, help="Frontend: ms to preprocess an image not in the cache, plus ..."),
    mm_preprocess_ms_per_megapixel: float = typer.Option(0.0, help="... ms per megapixel (both 0: preprocessing is not priced)."),
    mm_cache_items: int = typer.Option(1024, help="Images the multimodal cache holds (0: none); a repeat skips preprocessing and the encoder."),
    output_len: str = typer.Option("lognormal:200:0.8", help="Natural answer length when not forced: fixed:N, uniform:LO:HI, exponential:MEAN, lognormal:MEAN:SIGMA."),
    error_rate: float = typer.Option(0.0, help="Fault: fraction of requests answered with an injected 5xx."),
    error_codes: str = typer.Option("500", help="Fault: status codes injected errors use, e.g. 500,503."),
    crash_after: int = typer.Option(None, help="Fault: the process exits (code 3) when request N+1 arrives."),
    startup_delay: float = typer.Option(0.0, help="Fault: /health and the API answer 503 for this many seconds."),
    freeze_after: int = typer.Option(None, help="Fault (tests): the engine loop stops for good when request N+1 arrives; /health still answers."),
    stall_after_tokens: int = typer.Option(None, help="Fault: streams stop sending after this many tokens ..."),
    stall_s: float = typer.Option(None, help="... for this many seconds (default: forever)."),
    drop_after_tokens: int = typer.Option(None, help="Fault: streams are cut (connection reset) after this many tokens."),
    fault_rate: float = typer.Option(1.0, help="Fault: fraction of streams that stall or drop."),
    poison_marker: str = typer.Option(None, help="Fault: requests whose body contains this text are answered 500, on every replica."),
    swap_answer_rate: float = typer.Option(0.0, help="Fault: fraction of requests arriving while others are in flight that get one of those requests' answers, preferring one of the same prompt length (a batching/cache bug; see `vlmserve consistency`)."),
    reject_over_context: bool = typer.Option(
        False, "--reject-over-context",
        help="Refuse prompt + max_tokens > --max-model-len with 400, as earlier vLLM releases did (default: clamp max_tokens, as vLLM 0.32 does).",
    ),
    no_timing: bool = typer.Option(False, "--no-timing", help="Do not record emission timing error (/debug/timing)."),
    trace_file: str = typer.Option(None, help="Append one JSON line per ended request: arrival, first-token and chunk emission times (monotonic clock), for judging clients' TTFT/ITL."),
    gpu: str = typer.Option(None, help="Planner mode: time steps as --model (a `plan models` preset or config.json) on this GPU; KV blocks from its memory."),
    tp: int = typer.Option(1, min=1, help="Planner mode: tensor-parallel GPUs."),
    cold_start_s: float = typer.Option(0.0, help="Seconds before the engine serves: the port is bound but refuses connections meanwhile, as vLLM while it loads (phases logged as vLLM logs them)."),
    lora_module: list[str] = typer.Option([], help="A LoRA adapter name it serves (repeatable): listed in /v1/models, "
                                          "each takes one of --max-loras slots per step (needs --profile)."),
    max_loras: int = typer.Option(None, min=1, help="Adapters in one step (vLLM's --max-loras; default 1)."),
    max_cpu_loras: int = typer.Option(None, min=1, help="Adapters kept loaded (vLLM's --max-cpu-loras; default --max-loras)."),
    lora_load_ms: float = typer.Option(0.0, help="Time to load an adapter that is not kept loaded."),
    lora_step_ms: float = typer.Option(0.0, help="Time each distinct adapter adds to a step."),
    rehearsal_optimum: str = typer.Option(None, help="Rehearse `vlmserve tune`: steps slow down away from this optimum, e.g. max_num_seqs=32,max_num_batched_tokens=2048 (engines.sim.rehearsal)."),
    rehearsal_penalty: float = typer.Option(2.0, help="Step-time factor per doubling away from --rehearsal-optimum."),
) -> None:
    """Start a simulated vLLM engine: OpenAI API, vLLM metrics, timed by vLLM's scheduler rules."""
    from vlmserve.engines.sim.options import FaultOptions, OutputLengthDistribution, SimEngineConfig
    from vlmserve.engines.sim.server import run_server

    config = SimEngineConfig(
        model=model,
        served_model_names=tuple([model, *served_model_name]) if served_model_name else (),
        host=host,
        port=port,
        seed=seed,
        profile=profile,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_encoder_input_tokens=max_num_encoder_input_tokens,
        encoder_cache_size=encoder_cache_size,
        disable_chunked_mm_input=disable_chunked_mm_input,
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        enable_prefix_caching=not no_prefix_caching,
        enable_chunked_prefill=not no_chunked_prefill,
        image_tokens=image_tokens,
        allowed_image_budgets=_parse_int_list(image_budgets, "--image-budgets", "70,140,280"),
        model_config_dir=model_config_dir,
        api_server_count=api_server_count,
        mm_preprocess_ms_per_image=mm_preprocess_ms_per_image,
        mm_preprocess_ms_per_megapixel=mm_preprocess_ms_per_megapixel,
        mm_cache_items=mm_cache_items,
        output_len=OutputLengthDistribution.parse(output_len),
        faults=FaultOptions(
            error_rate=error_rate,
            error_codes=_parse_int_list(error_codes, "--error-codes", "500,503") or (500,),
            crash_after=crash_after,
            startup_delay_s=startup_delay,
            freeze_after=freeze_after,
            stall_after_tokens=stall_after_tokens,
            stall_s=stall_s,
            drop_after_tokens=drop_after_tokens,
            fault_rate=fault_rate,
            poison_marker=poison_marker,
            swap_answer_rate=swap_answer_rate,
        ),
        reject_over_context=reject_over_context,
        record_timing=not no_timing,
        trace_file=trace_file,
        gpu=gpu,
        tp=tp,
        cold_start_s=cold_start_s,
        lora_modules=tuple(lora_module), max_loras=max_loras, max_cpu_loras=max_cpu_loras,
        lora_load_ms=lora_load_ms, lora_step_ms=lora_step_ms,
        rehearsal_optimum=rehearsal_optimum,
        rehearsal_penalty=rehearsal_penalty,
    )
    run_server(config)


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
