"""How long `vlmserve plan` takes to plan one configuration, per step cost model.

    python benchmarks/plan_speed.py                    # 1,000 requests, Llama-3.1-8B on one H100
    python benchmarks/plan_speed.py --smoke            # seconds: checks it still runs

For each cost model (measured kernels, roofline) the same load is simulated twice in one
process: the first run includes building the cost model (reading the kernel tables, cold), the
second reuses a fresh PlanSetup's model with the tables already cached in the process (what
`plan search` sees from its second candidate on). Prints wall and CPU seconds (CPU is the figure
to quote on a shared machine), engine steps and
microseconds per priced step (the step-cost calls alone, timed around `step_time_s`). The
speed guard: one configuration of 1,000 requests plans in under a second.
"""

from __future__ import annotations

import argparse
import json
import time

from _smoke import parse_args

from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.simulate import simulate_run
from vlmserve.sched.step_cost import StepContents
from vlmserve.spec import LoadSpec


def _time_steps(setup: PlanSetup, samples: int) -> float:
    """µs per step_time_s call over a spread of decode and mixed steps (warm caches after the first pass)."""
    cost = setup.cost_model()
    steps = [
        StepContents(
            prefill_tokens=(i % 5) * 512,
            prefill_seqs=1 if i % 5 else 0,
            decode_seqs=1 + i % 64,
            kv_tokens_read=(1 + i % 64) * (900 + 16 * (i % 40)) + (i % 5) * 512,
        )
        for i in range(samples)
    ]
    started = time.perf_counter()
    for step in steps:
        cost.step_time_s(step)
    return (time.perf_counter() - started) / samples * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--step-samples", type=int, default=20000)
    args = parse_args(parser, requests=50, output_len=16, step_samples=500)

    load = LoadSpec(
        input_len=args.input_len, output_len=args.output_len, concurrency=args.concurrency, num_requests=args.requests
    )
    for kind in ("kernels", "roofline"):
        runs = []
        for attempt in ("cold", "warm"):
            started, cpu_started = time.perf_counter(), time.process_time()
            setup = PlanSetup.from_names(args.model, args.gpu, cost_model_kind=kind)
            output = simulate_run(setup, load, record_token_times=False)
            runs.append(
                {
                    "run": attempt,
                    "wall_s": round(time.perf_counter() - started, 3),
                    "cpu_s": round(time.process_time() - cpu_started, 3),
                    "steps": sum(stat.steps for stat in output.stats),
                }
            )
        print(
            json.dumps(
                {
                    "cost_model": kind,
                    "model": args.model,
                    "gpu": args.gpu,
                    "requests": args.requests,
                    "concurrency": args.concurrency,
                    "runs": runs,
                    "us_per_step_priced": round(
                        _time_steps(PlanSetup.from_names(args.model, args.gpu, cost_model_kind=kind), args.step_samples), 2
                    ),
                    "simulated": True,
                }
            )
        )


if __name__ == "__main__":
    main()
