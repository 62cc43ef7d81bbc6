"""Image-aware routing vs least-outstanding-tokens: two replicas, one run, alternating rounds.

A workload where half the image requests resend an earlier image (Zipf popularity) goes through a
gateway in front of two engine replicas (one core each). Each round runs both policies on fresh
images (a new seed per round, so no round finds another's images cached), in A B B A order so drift
on a shared machine hits both alike. Per policy and round: the engines' own multimodal-cache hit
rate (`vllm:mm_cache_hits` / `vllm:mm_cache_queries`, both replicas, scraped around the run),
prefix-cache hit rate, image TTFT p50/p95 (client), and each replica's share of the requests.
Printed: medians over rounds, and medians of the paired differences (image-affinity − LOT).

    .venv/bin/python benchmarks/image_routing.py [--rounds 4] [--num-requests 96] [--concurrency 4]
        [--repeat-rate 0.5] [--popularity-skew 0] [--image-size 1024x1024] [--markdown FILE]
    .venv/bin/python benchmarks/image_routing.py --smoke     # sim engines stand in for vLLM
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
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from _smoke import parse_args, skip

from vlmserve.bench.scrape import parse_samples
from vlmserve.results.summary import RunSummary

POLICIES = ("least-outstanding-tokens", "image-affinity")
COUNTERS = (
    "vllm:mm_cache_queries",
    "vllm:mm_cache_hits",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:request_success",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def replicas(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[list[str], str, str | None]]:
    """(replica URLs, served model, model directory) of two engines, while they run."""
    if args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.sim import start_sim_engine

        skip("the embedded vLLM engines (a minute to start): sim engines stand in")
        with (
            start_sim_engine(model="smoke-model", ttft_ms=5, itl_ms=1) as a,
            start_sim_engine(model="smoke-model", ttft_ms=5, itl_ms=1) as b,
        ):
            yield [a.base_url, b.base_url], "smoke-model", None
        return
    from vlmserve.demo.run import demo_spec
    from vlmserve.deploy.supervisor import Supervisor

    spec = demo_spec(replicas=2, name="bench-image-routing").model_copy(update={"gateway": False, "cpu_threads_per_replica": 1})
    print(f"starting two embedded vLLM replicas, one core each (logs under {workdir}) ...", flush=True)
    with Supervisor(spec, state_dir=workdir) as supervisor:
        yield [r.plan.url for r in supervisor.replicas], supervisor.served_model_name, supervisor.model_path


@contextlib.contextmanager
def gateway(policy: str, urls: list[str], model_dir: str | None, log: Path) -> Iterator[str]:
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
        "--audit-log",
        str(log.with_suffix(".audit.jsonl")),
    ]
    for url in urls:
        argv += ["--replica", url]
    if model_dir:
        argv += ["--model-config-dir", model_dir]
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"gateway ({policy}) did not start: see {log}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def counters(urls: list[str]) -> list[dict[str, float]]:
    """Each replica's cache and request counters (summed over labels)."""
    result = []
    for url in urls:
        samples = parse_samples(httpx.get(url + "/metrics", timeout=10, trust_env=False).text, wanted=None)
        result.append({name: samples.get(name + "_total", 0.0) for name in COUNTERS})
    return result


def audit_split(audit: Path, skip: int) -> dict[str, float]:
    """Median gateway TTFT of this run's requests by where their image was: already sent to the same
    replica (a likely engine cache hit), sent before to the other one only, or new (from the audit log)."""
    seen: dict[str, set[str]] = {}
    groups: dict[str, list[float]] = {"same_replica": [], "other_replica": [], "new": []}
    for line in audit.read_text().splitlines()[skip:]:
        row = json.loads(line)
        if not row.get("images") or row.get("ttft_ms") is None:
            continue
        digest, replica = row["images"][0]["digest"], row["replica"]
        if digest in seen.get(replica, set()):
            group = "same_replica"
        elif any(digest in digests for digests in seen.values()):
            group = "other_replica"
        else:
            group = "new"
        seen.setdefault(replica, set()).add(digest)
        groups[group].append(row["ttft_ms"])
    return {f"ttft_{name}_ms": statistics.median(values) if values else float("nan") for name, values in groups.items()} | {
        f"n_{name}": float(len(values)) for name, values in groups.items()
    }


def run_round(
    policy: str,
    base: str,
    model: str,
    urls: list[str],
    args: argparse.Namespace,
    seed: int,
    out: Path,
    model_dir: str | None,
    audit: Path,
) -> dict:
    """One bench run through `base`; the engines' cache counters around it. The local tokenizer
    fits prompts without /tokenize calls, which would load the engines being measured."""
    before = counters(urls)
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
        "--dataset",
        "images",
        "--image-size",
        args.image_size,
        "--image-format",
        "jpeg",
        "--image-repeat-rate",
        str(args.repeat_rate),
        "--image-popularity-skew",
        str(args.popularity_skew),
        "--num-requests",
        str(args.num_requests),
        "--concurrency",
        str(args.concurrency),
        "--input-len",
        "16",
        "--output-len",
        "8",
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
    after = counters(urls)
    summary = RunSummary.model_validate(json.loads(out.read_text()))
    delta = [{name: a.get(name, 0.0) - b.get(name, 0.0) for name in COUNTERS} for a, b in zip(after, before)]
    queries = sum(d["vllm:mm_cache_queries"] for d in delta)
    prefix_queries = sum(d["vllm:prefix_cache_queries"] for d in delta)
    served = [d["vllm:request_success"] for d in delta]
    return {
        "mm_hit_rate": sum(d["vllm:mm_cache_hits"] for d in delta) / queries if queries else float("nan"),
        "prefix_hit_rate": sum(d["vllm:prefix_cache_hits"] for d in delta) / prefix_queries if prefix_queries else float("nan"),
        "ttft_p50_ms": summary.figure("ttft_ms.p50"),
        "ttft_p95_ms": summary.figure("ttft_ms.p95"),
        "share_max": max(served) / sum(served) if sum(served) else float("nan"),
        "failed": summary.figure("requests.failed"),
        **audit_split(audit, audit_lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--num-requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat-rate", type=float, default=0.5)
    parser.add_argument("--image-size", default="1024x1024")
    parser.add_argument(
        "--popularity-skew", type=float, default=0.0, help="Zipf exponent of which earlier image a repeat picks (0: uniform)"
    )
    parser.add_argument("--markdown", type=Path, help="append the results table to this file")
    args = parse_args(parser, rounds=1, num_requests=12, concurrency=2)
    workdir = Path(tempfile.mkdtemp(prefix="image-routing-"))
    results: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    with replicas(args, workdir) as (urls, model, model_dir), contextlib.ExitStack() as stack:
        bases = {
            policy: stack.enter_context(gateway(policy, urls, model_dir, workdir / f"gateway-{policy}.log"))
            for policy in POLICIES
        }
        audits = {policy: workdir / f"gateway-{policy}.audit.jsonl" for policy in POLICIES}
        if args.smoke:  # the measured rounds below go through the same run_round
            skip("the warm-up round: sim engines have no caches or compilation to warm")
        else:
            run_round(
                POLICIES[0],
                bases[POLICIES[0]],
                model,
                urls,
                args,
                10_000,
                workdir / "warmup.json",
                model_dir,
                audits[POLICIES[0]],
            )  # discarded
        for round_index in range(args.rounds):
            order = POLICIES if round_index % 2 == 0 else POLICIES[::-1]
            for policy in order:
                seed = 1000 * (round_index + 1) + POLICIES.index(policy)  # fresh images every run
                figures = run_round(
                    policy,
                    bases[policy],
                    model,
                    urls,
                    args,
                    seed,
                    workdir / f"{policy}-{round_index}.json",
                    model_dir,
                    audits[policy],
                )
                results[policy].append(figures)
                print(
                    f"round {round_index + 1} {policy:26s} mm hit {figures['mm_hit_rate']:.2f}  prefix hit "
                    f"{figures['prefix_hit_rate']:.2f}  TTFT p50 {figures['ttft_p50_ms']:.1f} ms  p95 "
                    f"{figures['ttft_p95_ms']:.1f} ms  busiest replica {figures['share_max']:.0%}",
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

    def paired(key: str, ratio: bool = False) -> float:
        return statistics.median((b[key] / a[key]) if ratio else (b[key] - a[key]) for a, b in zip(lot, aff))

    engine = "sim engines (smoke)" if args.smoke else "embedded vLLM CPU engine, 2 replicas x 1 core"
    lines = [
        f"Image routing, {engine}: {args.num_requests} image requests per run at concurrency {args.concurrency}, "
        f"repeat rate {args.repeat_rate} (popularity skew {args.popularity_skew:g}), {args.image_size} JPEG, "
        f"{args.rounds} rounds (A B B A), medians.",
        "",
        "| policy | engine mm-cache hit rate | prefix-cache hit rate | image TTFT p50 (ms) | image TTFT p95 (ms) | busiest replica's share |",
        "|---|---|---|---|---|---|",
    ]
    for policy, rows in zip(POLICIES, (lot, aff)):
        lines.append(
            f"| {policy} | {med(rows, 'mm_hit_rate'):.2f} | {med(rows, 'prefix_hit_rate'):.2f} | "
            f"{med(rows, 'ttft_p50_ms'):.1f} | {med(rows, 'ttft_p95_ms'):.1f} | {med(rows, 'share_max'):.0%} |"
        )
    lines += [
        "",
        "Gateway-side TTFT p50 (ms) by where the request's image had gone before, from the audit log "
        "(same replica: the engine's cache can serve it):",
        "",
        "| policy | same replica (n) | other replica only (n) | new image (n) |",
        "|---|---|---|---|",
    ]
    for policy, rows in zip(POLICIES, (lot, aff)):
        cells = [
            f"{med(rows, f'ttft_{name}_ms'):.1f} ({sum(row[f'n_{name}'] for row in rows):.0f})"
            for name in ("same_replica", "other_replica", "new")
        ]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Paired (image-affinity vs LOT, same round): mm-cache hit rate {paired('mm_hit_rate'):+.2f}, "
        f"TTFT p50 ratio {paired('ttft_p50_ms', ratio=True):.2f}, TTFT p95 ratio {paired('ttft_p95_ms', ratio=True):.2f}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
