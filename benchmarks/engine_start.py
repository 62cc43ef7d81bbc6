"""Embedded engine: time to ready and decode speed, eager vs torch.compile, interleaved.

Why: vlmserve runs the embedded model with --enforce-eager by default (see
vlmserve.engines.vllm.eager_by_default). This measures what that choice costs and saves:
start-to-ready time under the supervisor (all readiness checks included) and the
latency of short streamed requests. Runs alternate (eager, compiled, eager, ...) so both
modes see the same machine load.

    .venv/bin/python benchmarks/engine_start.py --repeats 2
    .venv/bin/python benchmarks/engine_start.py --smoke    # seconds: a sim engine stands in for vLLM
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from _smoke import parse_args, skip

from vlmserve.demo.run import demo_spec, stream_chat
from vlmserve.deploy.processes import free_port_block
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.spec import DeploymentSpec, SimEngineOptions

INIT_TOOK = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
"""vLLM's own figure for the engine-core init (profiling, KV cache, warm-up / compilation):
the part that eager mode changes, without the import time that machine load inflates."""


def sim_spec() -> DeploymentSpec:
    """The stand-in for --smoke: one sim replica under the same supervisor, so every step but vLLM's own runs."""
    return DeploymentSpec(
        name="bench-start",
        engine="sim",
        model="sim-model",
        gateway=False,
        port=free_port_block(2),
        sim=SimEngineOptions(ttft_ms=5, itl_ms=1),
    )


def one_run(enforce_eager: bool, requests: int, workdir: Path, smoke: bool = False) -> dict[str, float]:
    spec = sim_spec() if smoke else demo_spec(name="bench-start", enforce_eager=enforce_eager)
    started = time.perf_counter()
    with Supervisor(spec, state_dir=workdir) as supervisor:
        ready_s = time.perf_counter() - started
        url, model = supervisor.endpoint, supervisor.served_model_name
        answers = []
        for index in range(requests):
            messages = [{"role": "user", "content": f"Request {index}: tell me about the clinic."}]
            answers.append(stream_chat(url, model, messages, 64, "text"))
        log_text = supervisor.replicas[0].plan.log_path.read_text(errors="replace")
    init = INIT_TOOK.search(log_text)
    ttft = statistics.median(a.time_to_first_token_s or 0.0 for a in answers)
    e2e = statistics.median(a.end_to_end_s for a in answers)
    tokens = statistics.median(a.completion_tokens or 0 for a in answers)
    return {
        "ready_s": ready_s,
        "init_s": float(init.group(1)) if init else float("nan"),
        "ttft_ms": ttft * 1000,
        "e2e_ms": e2e * 1000,
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--requests", type=int, default=5)
    args = parse_args(parser, repeats=1, requests=2)
    if args.smoke:
        skip(
            "the embedded vLLM engine (a minute or more per start): a sim engine stands in, so eager and compiled "
            "runs are the same engine and the figures compare nothing"
        )
    results: dict[str, list[dict[str, float]]] = {"eager": [], "compiled": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in ("eager", "compiled"):
                run = one_run(mode == "eager", args.requests, Path(tmp) / f"{mode}-{repeat}", args.smoke)
                results[mode].append(run)
                print(
                    f"{mode:9s} run {repeat}: ready {run['ready_s']:.1f} s (engine init {run['init_s']:.1f} s), TTFT p50 {run['ttft_ms']:.0f} ms, "
                    f"E2E p50 {run['e2e_ms']:.0f} ms ({run['tokens']:.0f} tokens)",
                    flush=True,
                )
    print(
        "\n| mode | ready (s), each run | median ready (s) | engine init (s), each run | TTFT p50 (ms) | E2E p50, 64 tokens (ms) |"
    )
    print("|---|---|---:|---|---:|---:|")
    for mode, runs in results.items():
        readies = ", ".join(f"{run['ready_s']:.1f}" for run in runs)
        inits = ", ".join(f"{run['init_s']:.1f}" for run in runs)
        print(
            f"| {mode} | {readies} | {statistics.median(r['ready_s'] for r in runs):.1f} | {inits} | "
            f"{statistics.median(r['ttft_ms'] for r in runs):.0f} | {statistics.median(r['e2e_ms'] for r in runs):.0f} |"
        )
    eager_ready = statistics.median(r["ready_s"] for r in results["eager"])
    compiled_ready = statistics.median(r["ready_s"] for r in results["compiled"])
    print(f"\nready-time ratio compiled/eager: {compiled_ready / eager_ready:.2f}x")


if __name__ == "__main__":
    main()
