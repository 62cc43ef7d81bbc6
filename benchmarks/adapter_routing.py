"""Adapter-affinity vs least-outstanding-tokens: eight LoRA adapters, Zipf popularity, two replicas, paired rounds.

Two embedded vLLM replicas (one core each) serve the embedded model's first eight adapters with
`max_loras 2` (two adapters per batch; all eight fit in the adapter cache, `max_cpu_loras 8`) and
prefix caching off (both policies send the same requests in a round). One
gateway per policy sits in front of both. Each round runs `bench --lora-adapters embedded:8
--lora-popularity zipf` through each gateway with a fresh seed, in A B B A order so drift on a shared
machine hits both alike. Per run: client TTFT p50/p95, TPOT p50, the busiest replica's share of the
requests, and, from the gateway's audit log, how many distinct adapters each replica had in flight
when a request arrived (what fills vLLM's slots). Printed: medians over rounds and the medians of
the paired differences (adapter-affinity − LOT, same round).

    .venv/bin/python benchmarks/adapter_routing.py [--rounds 4] [--num-requests 64] [--concurrency 8]
        [--skew 1.2] [--output-len 16] [--markdown FILE]
    .venv/bin/python benchmarks/adapter_routing.py --smoke     # sim engines stand in (no adapters there)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from _smoke import parse_args, skip, wait_healthy

from vlmserve.results.summary import RunSummary

POLICIES = ("least-outstanding-tokens", "adapter-affinity")
ADAPTERS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def replicas(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[list[str], str, str | None, str]]:
    """(replica URLs, base model, model directory, --lora-adapters value) while two engines run."""
    if args.smoke or args.engine == "sim":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.sim import start_sim_engine

        if args.smoke:
            skip("the embedded vLLM engines with adapters (a minute to start): sim engines with adapter slots stand in")
        names = [f"lora-{index}" for index in range(ADAPTERS)]
        options = {
            "model": "sim-model",
            "profile": "tiny-cpu",
            "max_loras": 2,
            "max_cpu_loras": ADAPTERS,
            "lora_step_ms": 2,
            "lora_module": names,
        }
        with start_sim_engine(**options) as a, start_sim_engine(**options) as b:
            yield [a.base_url, b.base_url], "sim-model", None, ",".join(names)
        return
    from vlmserve.demo.run import demo_spec
    from vlmserve.deploy.supervisor import Supervisor
    from vlmserve.engines.embedded_adapters import adapter_name
    from vlmserve.spec import DeploymentSpec

    # prefix caching off: both policies send the same requests in a round, and the second must not find them cached
    base = demo_spec(replicas=2, name="bench-adapter-routing", max_model_len=1024, enable_prefix_caching=False).model_dump()
    spec = DeploymentSpec.model_validate(
        {
            **base,
            "gateway": False,
            "cpu_threads_per_replica": 1,
            "max_loras": 2,
            "max_cpu_loras": ADAPTERS,
            "lora_modules": {adapter_name(index): f"embedded:{index}" for index in range(ADAPTERS)},
        }
    )
    print(
        f"starting two embedded vLLM replicas with {ADAPTERS} adapters, max_loras 2, one core each (logs under {workdir}) ...",
        flush=True,
    )
    with Supervisor(spec, state_dir=workdir) as supervisor:
        yield (
            [r.plan.url for r in supervisor.replicas],
            supervisor.served_model_name,
            supervisor.model_path,
            f"embedded:{ADAPTERS}",
        )


@contextlib.contextmanager
def gateway(policy: str, urls: list[str], log: Path, load_factor: float) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vlmserve",
        "gateway",
        "--port",
        str(port),
        "--policy",
        policy,
        "--prefix-load-factor",
        str(load_factor),
        "--audit-log",
        str(log.with_suffix(".audit.jsonl")),
    ]
    for url in urls:
        argv += ["--replica", url]
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, 30, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def audit_figures(audit: Path, skip_lines: int) -> dict[str, float]:
    """From this run's audit lines: the busiest replica's share, and the mean number of distinct adapters
    each request found in flight on its replica (itself included) when it was received."""
    rows = [json.loads(line) for line in audit.read_text().splitlines()[skip_lines:]]
    rows = [row for row in rows if row.get("status") == "200" and row.get("e2e_ms") is not None]
    served: dict[str, int] = {}
    crowd: list[int] = []
    for row in rows:
        served[row["replica"]] = served.get(row["replica"], 0) + 1
        start = row["received_at"]
        live = {
            other.get("adapter")
            for other in rows
            if other["replica"] == row["replica"]
            and other["received_at"] <= start <= other["received_at"] + other["e2e_ms"] / 1000.0
        }
        crowd.append(len(live))
    total = sum(served.values())
    return {
        "share_max": max(served.values()) / total if total else float("nan"),
        "adapters_in_flight": statistics.mean(crowd) if crowd else float("nan"),
    }


def run_round(
    policy: str,
    base: str,
    model: str,
    adapters: str,
    args: argparse.Namespace,
    seed: int,
    out: Path,
    model_dir: str | None,
    audit: Path,
) -> dict:
    """One bench run through `base` (the local tokenizer fits prompts without loading the engines with /tokenize)."""
    audit_lines = len(audit.read_text().splitlines()) if audit.exists() else 0
    command = [
        sys.executable,
        "-m",
        "vlmserve",
        "bench",
        "--base-url",
        base,
        "--model",
        model,
        "--lora-adapters",
        adapters,
        "--lora-popularity",
        "zipf",
        "--lora-skew",
        str(args.skew),
        "--num-requests",
        str(args.num_requests),
        "--concurrency",
        str(args.concurrency),
        "--input-len",
        "32",
        "--output-len",
        str(args.output_len),
        "--seed",
        str(seed),
        "--no-store",
        "--json-out",
        str(out),
        "--no-progress",
        *(["--tokenizer", model_dir] if model_dir else []),
    ]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode not in (0, 3):  # 3: the run finished with warnings (still measured)
        raise SystemExit(f"bench failed ({policy}): {finished.stderr.strip().splitlines()[-1:]}")
    summary = RunSummary.model_validate(json.loads(out.read_text()))
    return {
        "ttft_p50_ms": summary.figure("ttft_ms.p50"),
        "ttft_p95_ms": summary.figure("ttft_ms.p95"),
        "tpot_p50_ms": summary.figure("tpot_ms.p50"),
        "failed": summary.figure("requests.failed"),
        **audit_figures(audit, audit_lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--skew", type=float, default=1.2, help="Zipf exponent of adapter popularity")
    parser.add_argument(
        "--engine",
        choices=("vllm", "sim"),
        default="vllm",
        help="vllm: two embedded vLLM replicas; sim: two sim engines with adapter slots (simulated figures)",
    )
    parser.add_argument(
        "--load-factor",
        type=float,
        default=1.25,
        help="the gateways' --prefix-load-factor: the load bound adapter affinity stays under",
    )
    parser.add_argument("--markdown", type=Path, help="append the results table to this file")
    args = parse_args(parser, rounds=1, num_requests=12, concurrency=2)
    workdir = Path(tempfile.mkdtemp(prefix="adapter-routing-"))
    results: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    with replicas(args, workdir) as (urls, model, model_dir, adapters), contextlib.ExitStack() as stack:
        bases = {
            policy: stack.enter_context(gateway(policy, urls, workdir / f"gateway-{policy}.log", args.load_factor))
            for policy in POLICIES
        }
        audits = {policy: workdir / f"gateway-{policy}.audit.jsonl" for policy in POLICIES}
        if args.smoke or args.engine == "sim":
            skip("the warm-up round: sim engines have nothing to warm")
        else:
            for policy in POLICIES:  # discarded: both gateways learn the model lists, the engines warm up
                run_round(
                    policy, bases[policy], model, adapters, args, 10_000, workdir / "warmup.json", model_dir, audits[policy]
                )
        for round_index in range(args.rounds):
            order = POLICIES if round_index % 2 == 0 else POLICIES[::-1]
            for policy in order:
                seed = 1000 * (round_index + 1)  # the same requests for both policies within a round
                figures = run_round(
                    policy,
                    bases[policy],
                    model,
                    adapters,
                    args,
                    seed,
                    workdir / f"{policy}-{round_index}.json",
                    model_dir,
                    audits[policy],
                )
                results[policy].append(figures)
                print(
                    f"round {round_index + 1} {policy:26s} TTFT p50 {figures['ttft_p50_ms']:.1f} ms  p95 "
                    f"{figures['ttft_p95_ms']:.1f} ms  TPOT p50 {figures['tpot_p50_ms']:.1f} ms  adapters in flight "
                    f"{figures['adapters_in_flight']:.2f}  busiest replica {figures['share_max']:.0%}",
                    flush=True,
                )
    table = render(results, args)
    print(table)
    if args.markdown and not args.smoke:
        with open(args.markdown, "a") as out:
            out.write(table + "\n")


def render(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    lot, aff = (results[policy] for policy in POLICIES)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    def paired(key: str) -> float:
        return statistics.median(b[key] / a[key] for a, b in zip(lot, aff))

    wins = sum(b["ttft_p95_ms"] < a["ttft_p95_ms"] for a, b in zip(lot, aff))
    engine = (
        "sim engines (smoke)"
        if args.smoke
        else "SIMULATED: sim engines (tiny-cpu profile), 2 replicas, max_loras 2"
        if args.engine == "sim"
        else "embedded vLLM CPU engine, 2 replicas x 1 core, max_loras 2"
    )
    lines = [
        f"Adapter routing, {engine}: {args.num_requests} requests per run over {ADAPTERS} adapters (Zipf {args.skew:g}) "
        f"at concurrency {args.concurrency}, 32 prompt / {args.output_len} output tokens, load factor "
        f"{args.load_factor:g}, {args.rounds} rounds (A B B A), medians.",
        "",
        "| policy | TTFT p50 (ms) | TTFT p95 (ms) | TPOT p50 (ms) | adapters in flight per replica | busiest replica's share | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy, rows in zip(POLICIES, (lot, aff)):
        lines.append(
            f"| {policy} | {med(rows, 'ttft_p50_ms'):.1f} | {med(rows, 'ttft_p95_ms'):.1f} | "
            f"{med(rows, 'tpot_p50_ms'):.1f} | {med(rows, 'adapters_in_flight'):.2f} | "
            f"{med(rows, 'share_max'):.0%} | {sum(row['failed'] for row in rows):.0f} |"
        )
    lines += [
        "",
        f"Paired (adapter-affinity / LOT, same round and requests): TTFT p50 ratio {paired('ttft_p50_ms'):.2f}, "
        f"TTFT p95 ratio {paired('ttft_p95_ms'):.2f}; adapter-affinity's TTFT p95 lower in {wins} of "
        f"{len(lot)} rounds.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
