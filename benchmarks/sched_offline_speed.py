"""How much faster than real time the scheduler model runs on its virtual clock.

    python benchmarks/sched_offline_speed.py --requests 5000 --rate 20 --profile h100-8b
    python benchmarks/sched_offline_speed.py --smoke    # seconds: checks it still runs

Poisson arrivals, random prompts (distinct, so no prefix hits) of --prompt-len tokens and
--output-len output tokens each; prints simulated seconds, wall seconds, their ratio and
engine steps per wall second.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from _smoke import parse_args

from vlmserve.sched.parametric_cost import get_profile
from vlmserve.sched.scheduler import SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import SimulationStats, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per second")
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--profile", default="h100-8b")
    parser.add_argument("--num-kv-blocks", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, requests=50, prompt_len=64, output_len=8)

    rng = random.Random(args.seed)
    now = 0.0
    requests = []
    for index in range(args.requests):
        now += rng.expovariate(args.rate)
        prompt = [rng.randrange(200_000) for _ in range(args.prompt_len)]
        requests.append(SimRequest(f"r{index}", prompt, args.output_len, arrival_s=now))
    config = SchedulerConfig(num_kv_blocks=args.num_kv_blocks)
    stats = SimulationStats()
    started = time.perf_counter()
    timings = simulate(requests, config, get_profile(args.profile), record_token_times=False, stats=stats)
    wall_s = time.perf_counter() - started
    simulated_s = max(t.finished_s or 0.0 for t in timings) - requests[0].arrival_s
    print(
        json.dumps(
            {
                "requests": args.requests,
                "simulated_s": round(simulated_s, 1),
                "wall_s": round(wall_s, 2),
                "faster_than_real_time": round(simulated_s / wall_s, 1),
                "steps": stats.steps,
                "steps_per_wall_s": round(stats.steps / wall_s),
                "preemptions": stats.num_preemptions,
                "max_running": stats.max_num_running,
            }
        )
    )


if __name__ == "__main__":
    main()
