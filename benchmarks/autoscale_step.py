"""A step load against `up --autoscale` on sim engines with a cold start: the figures of docs/autoscaling.md.

Starts `vlmserve up --autoscale MIN:MAX` (sim engines that take --cold-start-s to serve), runs
`vlmserve bench --load-shape` against its gateway with an SLO, stops the deployment, and prints
the scaling block: SLO misses while the new replicas started and after, failures around each
scale-down, and up's own timing of each scale event (decision -> ready -> warmed -> in rotation).
Everything is SIMULATED (sim engines), by design: the point is the loop, not an engine's speed.

    flock /work/notes/machine.lock .venv/bin/python benchmarks/autoscale_step.py --out /tmp/autoscale-20s
    flock /work/notes/machine.lock .venv/bin/python benchmarks/autoscale_step.py --engine vllm --out /tmp/autoscale-vllm
    .venv/bin/python benchmarks/autoscale_step.py --smoke

`--engine vllm` runs the embedded tiny VLM on vLLM's CPU build instead (one scale-up from 1 to 2
replicas, 2 requests at once per replica so a queue forms): the cold start of a real engine,
broken into vLLM's own phases (up's `in rotation` line and state.json). Not simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from _smoke import parse_args

from vlmserve.deploy.processes import free_port_block

NAME = "autoscale-step"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-start-s", type=float, default=20.0)
    parser.add_argument("--shape", default="steps:2@20,20@70,2@90")
    parser.add_argument("--autoscale", default="1:4")
    parser.add_argument("--slo", default="ttft_p95=1s")
    parser.add_argument("--stabilization-s", type=int, default=60, help="scale-down stabilisation window")
    parser.add_argument("--cooldown-s", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("autoscale-step"))
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    args = parse_args(
        parser, cold_start_s=1.0, shape="steps:2@3,20@6,2@9", stabilization_s=5, cooldown_s=1, window_s=2.0, engine="sim"
    )
    if args.engine == "vllm" and parser.get_default("shape") == args.shape:
        args.shape = "steps:1@5,12@60,1@60"
        args.autoscale = "1:2"
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    port = free_port_block(8)
    rule = {
        "waiting_per_replica": 5,
        "polling_interval_s": 1,
        "scale_down_stabilization_s": args.stabilization_s,
        "scale_down_cooldown_s": args.cooldown_s,
    }
    spec: dict = {
        "name": NAME,
        "engine": "sim",
        "model": "sim-model",
        "port": port,
        "sim": {"ttft_ms": 50, "itl_ms": 10, "cold_start_s": args.cold_start_s},
        "engine_args": {"max_num_seqs": 8},
        "autoscale": rule,
    }
    if args.engine == "vllm":  # the embedded VLM on vLLM's CPU build: 2 at once, so a queue forms
        spec = {
            "name": NAME,
            "engine": "vllm",
            "model": "embedded",
            "port": port,
            "kv_cache_space_gb": 1,
            "engine_args": {"max_model_len": 2048, "max_num_seqs": 2},
            "ready_timeout_s": 600,
            "autoscale": {**rule, "waiting_per_replica": 2},
        }
    model = "embedded" if args.engine == "vllm" else "sim-model"
    (out / "deploy.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "VLMSERVE_HOME": str((out / "home").resolve()), "COLUMNS": "200"}
    command = [sys.executable, "-m", "vlmserve"]
    state_file = out / "home" / "deployments" / NAME / "state.json"
    with (out / "up.log").open("w") as log:
        up = subprocess.Popen(
            [*command, "up", "-f", str(out / "deploy.yaml"), "--autoscale", args.autoscale],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + (600 if args.engine == "vllm" else 60 + 3 * args.cold_start_s)
            while True:
                state = json.loads(state_file.read_text()) if state_file.is_file() else {}
                if (state.get("gateway") or {}).get("state") == "ready":
                    break
                if up.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"`up` did not come up; see {out / 'up.log'}")
                time.sleep(0.2)
            bench = subprocess.run(
                [
                    *command,
                    "bench",
                    "--base-url",
                    f"http://127.0.0.1:{port}",
                    "--model",
                    model,
                    "--load-shape",
                    args.shape,
                    "--output-len",
                    "64",
                    "--slo",
                    args.slo,
                    "--scale-window",
                    str(args.window_s),
                    "--no-store",
                    "--no-progress",
                    "--json-out",
                    str(out / "run.json"),
                    "--html-out",
                    str(out / "scaling.html"),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            (out / "bench.txt").write_text(bench.stdout + bench.stderr)
            if bench.returncode != 0:
                raise SystemExit(f"bench failed ({bench.returncode}); see {out / 'bench.txt'}")
            events = json.loads(state_file.read_text())["autoscale"]["events"]
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=120)
    scaling = json.loads((out / "run.json").read_text())["scaling"]
    what = (
        "vLLM CPU, embedded model (measured)"
        if args.engine == "vllm"
        else f"SIMULATED (sim engines, cold start {args.cold_start_s:g} s)"
    )
    print(f"{what}, load shape {args.shape}, --autoscale {args.autoscale}, SLO {args.slo}")
    for event in scaling["scale_ups"]:
        print(
            f"scale-up {event['replicas_before']:g} -> {event['replicas_after']:g}: {event['missed_during']} of "
            f"{event['requests_during']} requests missed the SLO from {event['began_s']:g} s to {event['last_joined_s']:g} s; "
            f"after: {event['missed_after']} of {event['requests_after']}"
        )
    for event in scaling["scale_downs"]:
        print(
            f"scale-down {event['replicas_before']:g} -> {event['replicas_after']:g} at {event['seen_s']:g} s: "
            f"{event['failed']} of {event['requests_in_flight']} in flight failed"
        )
    print(f"failed requests in the run: {scaling['failed_total']}")
    for event in events:
        phases = {key: value for key, value in event.items() if key.endswith("_s")}
        print(f"up: replica {event['replica']} {event['event']}: {phases}")
    print(f"written: {out / 'run.json'}, {out / 'scaling.html'}, {out / 'up.log'}, {out / 'bench.txt'}")


if __name__ == "__main__":
    main()
