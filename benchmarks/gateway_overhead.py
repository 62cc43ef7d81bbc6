"""What does a proxy in front of an engine cost? TTFT and throughput, direct vs through proxies.

One simulated engine (`vlmserve engine sim`, fixed TTFT and inter-token latency) is reached
several ways, alternately, in many rounds of the same closed-loop load (N concurrent streams):

  direct          the client talks to the engine
  vlmserve        through `vlmserve gateway` (default policy)
  vlmserve-traced (only with --only) the same gateway exporting OpenTelemetry spans of every request
                  (--otlp-traces-endpoint, --trace-ratio) to the project's OTLP receiver in a process of its own
  nginx           through nginx with proxy_buffering off: the near-zero-overhead floor
  vllm-router     through the vLLM project's router (PyPI `vllm-router`), if it installs
  vlmserve-base   (--baseline-src) another checkout's gateway, e.g. main's: before and after
  uvloop-pump     (only with --only) a byte pump with no HTTP on uvloop: the floor for a Python relay

Each round runs every configuration once, in a rotated order; a configuration's cost is its
difference from `direct` *in the same round* (paired), and the figures quoted are the medians
of those paired differences over the rounds. The engine, the proxies and the load generator
are pinned to CPUs (taskset / sched_setaffinity), and the load generator's and the proxy's CPU
use are printed with every trial so a saturated client is visible rather than hidden. "CPU/chunk"
is the proxy's CPU time (all its processes) over the streamed chunks it relayed (the sim engine
writes one per token), "kernel" the share of that time spent in the kernel (system time).
With vllm-router in the run, a last block compares every other proxy with it round by round:
TTFT p50 and p99 differences and the CPU-per-chunk ratio, each a median with an interval that
holds the true median with at least 95 %, and a verdict (below / above / not distinguishable).
With vlmserve-base in the run, the same block compares this checkout's gateway with it: a change
measured beside the code before it. With vlmserve-traced and vlmserve in the run, it compares the
traced gateway with the untraced one: what tracing costs.
The load generator runs each trial with its garbage collector off (see run_trial).
With --syscalls, one more trial per proxy runs after the rounds under `perf stat` on the kernel's
system-call tracepoints, and the system calls each proxy made per request are printed: where the
kernel share of CPU/chunk comes from, proxy by proxy (perf slows the proxy, so that trial is
not one of the rounds).

    .venv/bin/python benchmarks/gateway_overhead.py --streams 256 --rounds 6 --baseline-src /tmp/base/src
    (after `git archive main src | tar -x -C /tmp/base`: main's gateway beside this one)

    .venv/bin/python benchmarks/gateway_overhead.py --streams 256 --rounds 8
    .venv/bin/python benchmarks/gateway_overhead.py --streams 256 --rounds 1 --syscalls --only vlmserve,vllm-router
    .venv/bin/python benchmarks/gateway_overhead.py --smoke    # seconds: checks it still runs
    .venv/bin/python benchmarks/gateway_overhead.py --pool a.json b.json   # runs' rounds (--json-out) as one run

--pool reads the files that earlier runs wrote with --json-out (each keeps every request's TTFT)
and prints the tables and paired blocks over all their rounds together: several runs of the same
code, one verdict. The runs must share the settings that shape the figures (POOLED_SETTINGS).
With --json-out it also writes the pooled summary and paired blocks (no rounds, so it is never
pooled again with the files it came from).

Figures are from the simulated engine: they measure the proxies, not a model.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _smoke import parse_args, skip, wait_healthy

from vlmserve.bench.client import RequestOptions, build_body, encode_body, stream_request
from vlmserve.bench.http_stream import ConnectionPool
from vlmserve.results.records import RequestRecord

MODEL = "sim-model"
VLLM_ROUTER_VENV = Path(tempfile.gettempdir()) / "vlmserve-bench-vllm-router"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pinned(cpus: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus and shutil.which("taskset") else argv


@dataclass
class Route:
    """One way of reaching the engine, and the processes that make it."""

    name: str
    base_url: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def process_trees(self) -> list[list[psutil.Process]]:
        """Each process of the proxy, first, with its live descendants (nginx's or the gateway's workers)."""
        trees = []
        for process in self.processes:
            try:
                parent = psutil.Process(process.pid)
                trees.append([parent, *parent.children(recursive=True)])
            except psutil.Error:
                pass
        return trees

    def cpu_seconds(self) -> tuple[float, float]:
        """User and system CPU time of the proxy's processes and their children; children that
        exited count through their parent's children_* times."""
        user = system = 0.0
        for tree in self.process_trees():
            try:
                for proc in tree:
                    times = proc.cpu_times()
                    user += times.user
                    system += times.system
                reaped = tree[0].cpu_times()
                user += reaped.children_user
                system += reaped.children_system
            except psutil.Error:
                pass
        return user, system

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def start_engine(args: argparse.Namespace, log_dir: Path) -> Route:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vlmserve",
        "engine",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        MODEL,
        "--ttft-ms",
        str(args.ttft_ms),
        "--itl-ms",
        str(args.itl_ms),
        "--max-num-seqs",
        str(max(1024, args.streams * 2)),
    ]
    with (log_dir / "engine.log").open("wb") as log:
        process = subprocess.Popen(pinned(args.engine_cpus, argv), stdout=log, stderr=subprocess.STDOUT)
    route = Route("direct", f"http://127.0.0.1:{port}", [process])
    wait_healthy(route.base_url + "/health", process=process)
    return route


def start_vlmserve(
    engine: Route,
    args: argparse.Namespace,
    log_dir: Path,
    name: str = "vlmserve",
    src: Path | None = None,
    extra: tuple[str, ...] = (),
) -> Route:
    """This checkout's gateway, or (`src`) another checkout's, e.g. main's, to compare before and after."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vlmserve",
        "gateway",
        "--replica",
        engine.base_url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        args.policy,
        *extra,
    ]
    if args.workers != 1 and src is None:
        argv += ["--workers", str(args.workers)]
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    with (log_dir / f"{name}-gateway.log").open("wb") as log:
        process = subprocess.Popen(pinned(args.proxy_cpus, argv), stdout=log, stderr=subprocess.STDOUT, env=env)
    route = Route(name, f"http://127.0.0.1:{port}", [process])
    wait_healthy(route.base_url + "/health", process=process)
    return route


TRACE_RECEIVER = """
import asyncio, signal, sys
from vlmserve.bench.engine_traces import TraceReceiver

async def main() -> None:
    receiver = TraceReceiver("127.0.0.1", int(sys.argv[1]))
    await receiver.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    print(f"OTLP exports received {receiver.exports}, refused {receiver.rejected}", flush=True)
    await receiver.stop()

asyncio.run(main())
"""
SIDECARS: list[subprocess.Popen] = []
"""Processes a route needs that are not the proxy (the trace receiver): their CPU is not the proxy's."""


def start_vlmserve_traced(engine: Route, args: argparse.Namespace, log_dir: Path) -> Route:
    """This checkout's gateway with tracing on, exporting to the project's OTLP/HTTP receiver (its own
    process, on the engine's CPUs): the gateway's side of tracing is what is measured."""
    port = free_port()
    log_path = log_dir / "trace-receiver.log"
    with log_path.open("wb") as log:
        receiver = subprocess.Popen(
            pinned(args.engine_cpus, [sys.executable, "-c", TRACE_RECEIVER, str(port)]), stdout=log, stderr=subprocess.STDOUT
        )
    SIDECARS.append(receiver)
    deadline = time.monotonic() + 60
    while b"ready" not in log_path.read_bytes():
        if receiver.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the trace receiver did not start; see {log_path}")
        time.sleep(0.1)
    return start_vlmserve(
        engine,
        args,
        log_dir,
        "vlmserve-traced",
        extra=("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces", "--trace-sample-ratio", str(args.trace_ratio)),
    )


NGINX_CONF = """
worker_processes 1;
daemon off;
user root;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream engine {{ server 127.0.0.1:{engine_port}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def start_nginx(engine: Route, args: argparse.Namespace, log_dir: Path) -> Route | None:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        print("note: nginx not installed (apt-get install -y nginx); skipping the nginx floor")
        return None
    port = free_port()
    conf_dir = log_dir / "nginx"
    conf_dir.mkdir(exist_ok=True)
    conf = conf_dir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=conf_dir, engine_port=engine.base_url.rsplit(":", 1)[1], port=port))
    with (log_dir / "nginx.log").open("wb") as log:
        process = subprocess.Popen(
            pinned(args.proxy_cpus, [binary, "-c", str(conf), "-p", str(conf_dir)]), stdout=log, stderr=subprocess.STDOUT
        )
    route = Route("nginx", f"http://127.0.0.1:{port}", [process])
    wait_healthy(route.base_url + "/health", process=process)
    return route


def start_uvloop_pump(engine: Route, args: argparse.Namespace, log_dir: Path) -> Route:
    """_uvloop_pump.py: bytes passed on with no HTTP at all, the floor for a relay written in Python."""
    port = free_port()
    argv = [
        sys.executable,
        str(Path(__file__).with_name("_uvloop_pump.py")),
        "127.0.0.1",
        engine.base_url.rsplit(":", 1)[1],
        str(port),
    ]
    with (log_dir / "uvloop-pump.log").open("wb") as log:
        process = subprocess.Popen(pinned(args.proxy_cpus, argv), stdout=log, stderr=subprocess.STDOUT)
    route = Route("uvloop-pump", f"http://127.0.0.1:{port}", [process])
    wait_healthy(route.base_url + "/health", process=process)
    return route


def vllm_router_binary(venv: Path) -> Path | None:
    """vllm-router from a private venv, installed there (pip) on first use; None if it cannot be."""
    binary = venv / "bin" / "vllm-router"
    if binary.exists():
        return binary
    print(f"installing vllm-router into {venv} ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "vllm-router"], check=True, capture_output=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        stderr = getattr(err, "stderr", b"") or b""
        print(f"note: vllm-router did not install ({stderr.decode(errors='replace').strip()[-200:]}); skipping it")
        return None
    return binary if binary.exists() else None


def start_vllm_router(engine: Route, args: argparse.Namespace, log_dir: Path) -> Route | None:
    binary = vllm_router_binary(Path(args.vllm_router_venv))
    if binary is None:
        return None
    port = free_port()
    argv = [
        str(binary),
        "--worker-urls",
        engine.base_url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "round_robin",
        "--log-level",
        "warning",
    ]
    with (log_dir / "vllm-router.log").open("wb") as log:
        process = subprocess.Popen(pinned(args.proxy_cpus, argv), stdout=log, stderr=subprocess.STDOUT)
    route = Route("vllm-router", f"http://127.0.0.1:{port}", [process])
    wait_healthy(route.base_url + "/health", process=process)
    return route


# ---- load generation ------------------------------------------------------------------------------


@dataclass
class Trial:
    """One configuration's share of one round."""

    route: str
    ttft_ms: list[float]
    ok: int
    failed: int
    output_tokens: int
    wall_s: float
    loadgen_cpu: float  # cores used by this process during the trial
    proxy_cpu: float  # cores used by the proxy during the trial
    proxy_cpu_us_per_chunk: float  # the proxy's CPU time per streamed chunk (the sim engine sends one per token)
    proxy_kernel_share: float  # the part of the proxy's CPU time spent in the kernel (system time)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s


async def run_trial(
    pool: ConnectionPool, route: Route, bodies: list[bytes], requests: int, streams: int, stagger_s: float
) -> Trial:
    """Closed loop: `streams` workers send `requests` streamed requests in total.

    Output lengths vary (the `bodies` cycle) and workers start `stagger_s` apart, so requests do
    not finish and restart in lock-step: otherwise every proxy would see bursts of `streams`
    simultaneous arrivals, which no real deployment produces.
    """
    remaining = requests
    records: list[RequestRecord] = []

    async def worker(index: int) -> None:
        nonlocal remaining
        await asyncio.sleep(index * stagger_s)
        while remaining > 0:
            remaining -= 1
            record = RequestRecord(request_id=str(remaining), scheduled_at_s=0.0, sent_at_s=0.0)
            await stream_request(pool, bodies[remaining % len(bodies)], record, clock_offset=0.0, timeout_s=120)
            records.append(record)

    # No collection during the trial: a full one in this process (40 ms, measured) put 50-65 ms on
    # the TTFT of every request in flight, whatever the route, and made p99 a lottery. The
    # collector runs between trials instead, off the clock.
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        proxy_before = route.cpu_seconds() if route.name != "direct" else (0.0, 0.0)
        started = time.perf_counter()
        await asyncio.gather(*(worker(index) for index in range(streams)))
        wall = time.perf_counter() - started
        usage_after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        gc.enable()
        gc.unfreeze()
    loadgen_cpu = (usage_after.ru_utime - usage_before.ru_utime + usage_after.ru_stime - usage_before.ru_stime) / wall
    proxy_after = route.cpu_seconds() if route.name != "direct" else (0.0, 0.0)
    proxy_user, proxy_system = proxy_after[0] - proxy_before[0], proxy_after[1] - proxy_before[1]
    proxy_total = proxy_user + proxy_system
    ok = [r for r in records if r.ok]
    # the sim engine writes one HTTP chunk per token (role and usage ride along with the first and last)
    chunks = sum(len(r.chunk_times_s) for r in ok) or 1
    return Trial(
        route=route.name,
        ttft_ms=[r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        ok=len(ok),
        failed=len(records) - len(ok),
        output_tokens=sum(r.output_tokens or 0 for r in ok),
        wall_s=wall,
        loadgen_cpu=loadgen_cpu,
        proxy_cpu=proxy_total / wall,
        proxy_cpu_us_per_chunk=proxy_total / chunks * 1e6,
        proxy_kernel_share=proxy_system / proxy_total if proxy_total else 0.0,
    )


def summarize(trials: list[list[Trial]], names: list[str]) -> dict:
    """Per configuration: medians of the per-round paired differences from direct."""
    summary: dict[str, dict] = {}
    for name in names:
        rows = []
        for round_trials in trials:
            by_name = {t.route: t for t in round_trials}
            direct, this = by_name["direct"], by_name[name]
            rows.append(
                {
                    "ttft_p50_ms": this.percentile(0.50),
                    "ttft_p99_ms": this.percentile(0.99),
                    "tokens_per_s": this.tokens_per_s,
                    "added_ttft_p50_ms": this.percentile(0.50) - direct.percentile(0.50),
                    "added_ttft_p99_ms": this.percentile(0.99) - direct.percentile(0.99),
                    "throughput_ratio": this.tokens_per_s / direct.tokens_per_s,
                    "failed": this.failed,
                    "loadgen_cpu": this.loadgen_cpu,
                    "proxy_cpu": this.proxy_cpu,
                    "proxy_cpu_us_per_chunk": this.proxy_cpu_us_per_chunk,
                    "proxy_kernel_share": this.proxy_kernel_share,
                    # the yardstick: CPU per chunk over vllm-router's in the same round (absent without it)
                    **(
                        {"cpu_per_chunk_vs_router": this.proxy_cpu_us_per_chunk / by_name["vllm-router"].proxy_cpu_us_per_chunk}
                        if "vllm-router" in by_name and by_name["vllm-router"].proxy_cpu_us_per_chunk > 0
                        else {}
                    ),
                }
            )
        summary[name] = {
            key: {
                "median": statistics.median(r[key] for r in rows),
                "min": min(r[key] for r in rows),
                "max": max(r[key] for r in rows),
            }
            for key in rows[0]
        }
        summary[name]["failed_total"] = sum(r["failed"] for r in rows)
    return summary


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The median of per-round figures and a distribution-free interval for it.

    The interval is the order statistics x(k) and x(n+1-k), with k the largest for which
    P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2: it holds the true median with at least
    `confidence`, whatever the figures' distribution (with 10 rounds: the 2nd smallest and the
    2nd largest, 97.9 %). Below 6 rounds no k qualifies and the full range is returned, which
    then covers less than `confidence`."""
    ordered = sorted(values)
    count = len(ordered)
    tail, k = 0.0, 0
    while k < count // 2:
        tail += math.comb(count, k) / 2**count
        if tail > (1 - confidence) / 2:
            break
        k += 1
    low, high = (ordered[k - 1], ordered[count - k]) if k else (ordered[0], ordered[-1])
    return statistics.median(ordered), low, high


def against(
    trials: list[list[Trial]], names: list[str], reference: str = "vllm-router"
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Each route paired round by round against `reference` (#18's yardstick with vllm-router): the
    added TTFT p50 and p99 as differences from the reference's (direct cancels out), CPU per chunk
    as a ratio to its; each a median with its interval (median_interval). Empty without the reference."""
    verdicts: dict[str, dict[str, tuple[float, float, float]]] = {}
    for name in names:
        if name in ("direct", reference):
            continue
        p50, p99, cpu = [], [], []
        for round_trials in trials:
            by_name = {t.route: t for t in round_trials}
            this, other = by_name[name], by_name.get(reference)
            if other is None or other.proxy_cpu_us_per_chunk <= 0:
                return {}
            p50.append(this.percentile(0.50) - other.percentile(0.50))
            p99.append(this.percentile(0.99) - other.percentile(0.99))
            cpu.append(this.proxy_cpu_us_per_chunk / other.proxy_cpu_us_per_chunk)
        verdicts[name] = {
            "ttft_p50_ms_minus": median_interval(p50),
            "ttft_p99_ms_minus": median_interval(p99),
            "cpu_per_chunk_over": median_interval(cpu),
        }
    return verdicts


def print_against(verdicts: dict[str, dict[str, tuple[float, float, float]]], reference: str = "vllm-router") -> None:
    if not verdicts:
        return
    print(f"\nagainst {reference}, paired by round: median [interval holding the median with >= 95 %]")
    for name, figures in verdicts.items():
        parts = []
        for key, label, unit, parity in (
            ("ttft_p50_ms_minus", "TTFT p50", " ms", 0.0),
            ("ttft_p99_ms_minus", "TTFT p99", " ms", 0.0),
            ("cpu_per_chunk_over", "CPU/chunk", "x", 1.0),
        ):
            median, low, high = figures[key]
            verdict = "below" if high < parity else "above" if low > parity else "not distinguishable"
            number = f"{median:.2f}x [{low:.2f}, {high:.2f}]" if unit == "x" else f"{median:+.2f} ms [{low:+.2f}, {high:+.2f}]"
            parts.append(f"{label} {number} ({verdict})")
        print(f"  {name}: " + "; ".join(parts))


def print_summary(summary: dict, args: argparse.Namespace) -> None:
    print()
    print(
        f"{args.streams} streams, {args.rounds} rounds x {args.requests} requests per configuration, "
        f"engine TTFT {args.ttft_ms} ms / ITL {args.itl_ms} ms / {args.output_tokens} tokens (simulated engine)"
    )
    header = (
        f"{'route':<15} {'TTFT p50':>9} {'TTFT p99':>9} {'+p50 (paired)':>14} {'+p99 (paired)':>14} "
        f"{'tok/s':>8} {'tput vs direct':>15} {'proxy CPU':>10} {'CPU/chunk':>10} {'kernel':>7} "
        f"{'client CPU':>11} {'failed':>7}"
    )
    print(header)
    for name, figures in summary.items():

        def med(key: str, figures: dict = figures) -> float:
            return figures[key]["median"]

        spread = f"[{figures['added_ttft_p50_ms']['min']:+.2f},{figures['added_ttft_p50_ms']['max']:+.2f}]"
        print(
            f"{name:<15} {med('ttft_p50_ms'):>8.2f}ms {med('ttft_p99_ms'):>8.2f}ms "
            f"{med('added_ttft_p50_ms'):>+12.2f}ms {med('added_ttft_p99_ms'):>+12.2f}ms "
            f"{med('tokens_per_s'):>8.0f} {med('throughput_ratio'):>14.3f}x "
            f"{med('proxy_cpu'):>9.2f}c {med('proxy_cpu_us_per_chunk'):>8.1f}us {med('proxy_kernel_share'):>6.0%} "
            f"{med('loadgen_cpu'):>10.2f}c {figures['failed_total']:>7d}   p50 diff range {spread}"
        )
    ratios = {
        name: figures["cpu_per_chunk_vs_router"]
        for name, figures in summary.items()
        if "cpu_per_chunk_vs_router" in figures and name not in ("vllm-router", "direct")
    }
    for name, ratio in ratios.items():
        print(
            f"CPU/chunk vs vllm-router, {name}: paired median {ratio['median']:.2f}x "
            f"(rounds {ratio['min']:.2f}x..{ratio['max']:.2f}x)"
        )


# ---- system calls per request (--syscalls) ----------------------------------------------------------

SYSCALL_TRACEPOINTS = Path("/sys/kernel/tracing/events/syscalls")


def syscall_tracing_problem() -> str | None:
    """Why `perf stat` cannot count a proxy's system calls here, or None when it can."""
    if shutil.which("perf") is None:
        return "--syscalls needs `perf` (Debian: apt-get install linux-perf)"
    if not SYSCALL_TRACEPOINTS.is_dir():
        return f"--syscalls needs the kernel's syscall tracepoints ({SYSCALL_TRACEPOINTS} is missing or unreadable: run as root)"
    return None


def start_syscall_count(route: Route) -> subprocess.Popen[str]:
    """`perf stat` on every system-call tracepoint of the proxy's processes (nginx's or the gateway's workers too)."""
    pids = [proc.pid for tree in route.process_trees() for proc in tree]
    return subprocess.Popen(
        ["perf", "stat", "-x", ",", "-e", "syscalls:sys_enter_*", "-p", ",".join(map(str, pids))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def parse_syscall_counts(perf_csv: str) -> dict[str, int]:
    """`perf stat -x ,` lines (count,unit,event,...) -> calls per system call, those made at least once."""
    counts: dict[str, int] = {}
    for line in perf_csv.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit() and "sys_enter_" in fields[2] and int(fields[0]) > 0:
            name = fields[2].split("sys_enter_", 1)[1]
            counts[name] = counts.get(name, 0) + int(fields[0])
    return counts


async def count_syscalls(
    pool: ConnectionPool, route: Route, bodies: list[bytes], args: argparse.Namespace, stagger_s: float
) -> dict[str, float]:
    """One trial of `args.requests` under perf: system calls per completed request, most frequent first."""
    perf = start_syscall_count(route)
    try:
        await asyncio.sleep(0.5)  # perf attaches
        trial = await run_trial(pool, route, bodies, args.requests, args.streams, stagger_s)
        perf.send_signal(signal.SIGINT)  # perf prints its counts as it exits
        _, report = await asyncio.to_thread(perf.communicate, timeout=60)
    finally:
        if perf.poll() is None:  # the trial failed or was interrupted: no perf left attached to the proxy
            perf.kill()
            perf.wait()
    counts = parse_syscall_counts(report)
    if not counts:
        raise SystemExit(f"--syscalls: perf counted nothing for {route.name}: {report.strip()[-300:]}")
    per_request = {name: count / max(1, trial.ok) for name, count in counts.items()}
    return dict(sorted(per_request.items(), key=lambda item: -item[1]))


def print_syscalls(per_route: dict[str, dict[str, float]], requests: int) -> None:
    if not per_route:
        return
    print(
        f"\nsystem calls per request (one more trial of {requests} requests per proxy, under perf stat; "
        "those made at least 0.05 times a request)"
    )
    for name, per_request in per_route.items():
        listed = ", ".join(f"{call} {count:.2f}" for call, count in per_request.items() if count >= 0.05)
        print(f"  {name:<13} {sum(per_request.values()):6.1f}: {listed}")


async def run(args: argparse.Namespace, routes: list[Route], syscall_counts: dict[str, dict[str, float]]) -> list[list[Trial]]:
    """The rounds; with --syscalls, then one trial per proxy under perf, its counts put in `syscall_counts`."""
    if args.loadgen_cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(cpu) for cpu in args.loadgen_cpus.split(",")})
    rng = random.Random(0)
    options = RequestOptions(model=MODEL, per_chunk_usage=False)
    messages = [{"role": "user", "content": "Describe the radiograph in one line."}]
    low, high = max(1, args.output_tokens // 2), args.output_tokens * 3 // 2
    bodies = [encode_body(build_body(options, rng.randint(low, high), messages=messages)) for _ in range(97)]
    request_s = (args.ttft_ms + args.itl_ms * args.output_tokens) / 1000
    stagger_s = request_s / args.streams
    # the bench's own keep-alive pool, one per route (a pool holds connections to one endpoint)
    pools = {route.name: ConnectionPool(route.base_url + options.path) for route in routes}
    rounds: list[list[Trial]] = []
    try:
        for route in routes:  # warm-up: connections, caches, JITs of the proxies
            await run_trial(pools[route.name], route, bodies, min(args.requests, args.streams), args.streams, stagger_s)
        for index in range(args.rounds):
            order = routes[index % len(routes) :] + routes[: index % len(routes)]
            trials = []
            for route in order:
                trial = await run_trial(pools[route.name], route, bodies, args.requests, args.streams, stagger_s)
                trials.append(trial)
                print(
                    f"round {index + 1}/{args.rounds} {route.name:<15} TTFT p50 {trial.percentile(0.5):7.2f} ms "
                    f"p99 {trial.percentile(0.99):7.2f} ms  {trial.tokens_per_s:8.0f} tok/s  "
                    f"failed {trial.failed}  client CPU {trial.loadgen_cpu:.2f}  proxy CPU {trial.proxy_cpu:.2f} "
                    f"({trial.proxy_cpu_us_per_chunk:.1f} us/chunk, {trial.proxy_kernel_share:.0%} kernel)",
                    flush=True,
                )
            rounds.append(trials)
        if args.syscalls:
            for route in routes:
                if route.name != "direct":
                    syscall_counts[route.name] = await count_syscalls(pools[route.name], route, bodies, args, stagger_s)
    finally:
        for pool in pools.values():
            pool.close()
    return rounds


POOLED_SETTINGS = (
    "streams",
    "requests",
    "ttft_ms",
    "itl_ms",
    "output_tokens",
    "policy",
    "engine_cpus",
    "proxy_cpus",
    "loadgen_cpus",
    "workers",
)
"""What runs pooled together must share: the load and the placement that the figures depend on."""


def load_rounds(paths: list[Path]) -> tuple[argparse.Namespace, list[list[Trial]]]:
    """The rounds of several --json-out files as one run; exits with one line on a file it cannot pool."""
    settings: dict[str, str] | None = None
    rounds: list[list[Trial]] = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "pooled_from" in data:
                raise SystemExit(
                    f"--pool {path}: it is a pooled summary with no rounds; pool the files it came from: "
                    f"{' '.join(data['pooled_from'])}"
                )
            file_settings = {key: data["args"][key] for key in POOLED_SETTINGS}
            file_rounds = [[Trial(**trial) for trial in trials] for trials in data["rounds"]]
        except OSError as err:
            raise SystemExit(f"--pool {path}: cannot read it ({err.strerror})") from None
        except (ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"--pool {path}: not a --json-out file of this benchmark ({type(err).__name__}: {err})") from None
        if any(trial.ttft_ms is None for trials in file_rounds for trial in trials):
            raise SystemExit(f"--pool {path}: its rounds keep no TTFT samples (written before --pool existed): run it again")
        if settings is None:
            settings = file_settings
        elif differ := [key for key in POOLED_SETTINGS if file_settings[key] != settings[key]]:
            key = differ[0]
            raise SystemExit(
                f"--pool {path}: --{key.replace('_', '-')} is {file_settings[key]}, not {settings[key]} as in "
                f"{paths[0]}: only runs of the same settings pool"
            )
        if rounds and {t.route for t in file_rounds[0]} != {t.route for t in rounds[0]}:
            raise SystemExit(f"--pool {path}: its routes differ from {paths[0]}'s: only runs of the same routes pool")
        rounds += file_rounds
    assert settings is not None
    # the settings as --json-out wrote them (text): print_summary only shows them
    return argparse.Namespace(**settings, rounds=len(rounds)), rounds


def write_results(path: Path, args: argparse.Namespace, figures: tuple[dict, dict, dict], extra: dict) -> None:
    """--json-out: the settings, the summary and the paired blocks (report's figures), and `extra`."""
    summary, verdicts, this_against = figures
    path.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "summary": summary,
                "against_vllm_router": verdicts,
                "vlmserve_against": this_against,
                **extra,
            },
            indent=2,
        )
    )


def report(rounds: list[list[Trial]], args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """The summary table and the paired blocks (against vllm-router; this checkout against its other forms)."""
    names = [t.route for t in rounds[0]]  # a run's first round has the routes in their start order (run)
    summary = summarize(rounds, names)
    print_summary(summary, args)
    verdicts = against(rounds, names)
    print_against(verdicts)
    this_against = {
        other: against(rounds, ["vlmserve"], other) for other in ("vlmserve-base",) if other in names and "vlmserve" in names
    }
    if "vlmserve-traced" in names and "vlmserve" in names:  # what tracing costs: traced minus untraced
        this_against["vlmserve"] = against(rounds, ["vlmserve-traced"], "vlmserve")
    for other, figures in this_against.items():
        print_against(figures, other)
    return summary, verdicts, this_against


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256, help="concurrent streams (closed loop)")
    parser.add_argument("--requests", type=int, default=768, help="requests per configuration per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="the sim engine's time to first token")
    parser.add_argument("--itl-ms", type=float, default=40.0, help="the sim engine's inter-token latency")
    parser.add_argument("--output-tokens", type=int, default=32, help="mean output length (uniform 0.5x..1.5x)")
    parser.add_argument("--policy", default="least-outstanding-tokens", help="vlmserve gateway policy")
    parser.add_argument("--engine-cpus", default="0", help="taskset CPU list for the engine")
    parser.add_argument("--proxy-cpus", default="1", help="taskset CPU list for each proxy")
    parser.add_argument("--loadgen-cpus", default="0", help="CPU list for this load generator")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated subset of vlmserve,vlmserve-base,vlmserve-traced,nginx,vllm-router,"
        "uvloop-pump (default: all but vlmserve-traced and uvloop-pump, a byte pump with no HTTP: "
        "the floor for a Python relay)",
    )
    parser.add_argument(
        "--trace-ratio",
        type=float,
        default=1.0,
        help="vlmserve-traced: the gateway's --trace-sample-ratio (1: every request traced)",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="a checkout's src/ directory (e.g. main's, from `git archive main src | tar -x -C DIR`) "
        "whose gateway runs beside this one as `vlmserve-base`",
    )
    parser.add_argument("--workers", type=int, default=1, help="vlmserve gateway --workers (this checkout's gateway)")
    parser.add_argument("--vllm-router-venv", default=str(VLLM_ROUTER_VENV))
    parser.add_argument(
        "--json-out", type=Path, help="write per-round trials and the summary here (with --pool: the pooled summary, no rounds)"
    )
    parser.add_argument(
        "--syscalls",
        action="store_true",
        help="after the rounds, count each proxy's system calls per request under perf stat (Linux, root)",
    )
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: report the rounds of these --json-out files together, as one run",
    )
    args = parse_args(
        parser, streams=4, requests=16, rounds=1, ttft_ms=5.0, itl_ms=2.0, output_tokens=4, only="vlmserve,vlmserve-traced,nginx"
    )
    if args.pool:
        pooled_args, pooled_rounds = load_rounds(args.pool)
        figures = report(pooled_rounds, pooled_args)
        if args.json_out:
            # no rounds: a pooled file cannot be pooled again with the files it came from (counted twice)
            write_results(args.json_out, pooled_args, figures, {"pooled_from": [str(path) for path in args.pool]})
        return
    wanted = set(args.only.split(",")) if args.only else {"vlmserve", "vlmserve-base", "nginx", "vllm-router"}
    if args.baseline_src is not None and not (args.baseline_src / "vlmserve" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-src {args.baseline_src}: no vlmserve package there; give a checkout's src/ directory")
    if args.baseline_src is None:
        wanted.discard("vlmserve-base")
    if args.syscalls and (problem := syscall_tracing_problem()) is not None:
        raise SystemExit(problem)
    syscall_counts: dict[str, dict[str, float]] = {}
    if args.smoke and "vllm-router" not in wanted:
        skip("vllm-router: it is installed from PyPI into a private venv on first use (add --only vllm-router)")

    # SIGTERM unwinds like Ctrl-C, so the `finally` below stops the engine and proxies.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = Path(tempfile.mkdtemp(prefix="gateway-overhead-"))
    routes: list[Route] = []
    try:
        engine = start_engine(args, log_dir)
        routes.append(engine)
        starters = {
            "vlmserve": start_vlmserve,
            "vlmserve-base": lambda engine, args, log_dir: start_vlmserve(
                engine, args, log_dir, "vlmserve-base", args.baseline_src
            ),
            "vlmserve-traced": start_vlmserve_traced,
            "nginx": start_nginx,
            "vllm-router": start_vllm_router,
            "uvloop-pump": start_uvloop_pump,
        }
        for name, starter in starters.items():
            if name in wanted:
                route = starter(engine, args, log_dir)
                if route is not None:
                    routes.append(route)
        print(
            f"routes: {', '.join(r.name for r in routes)}; cpus: engine {args.engine_cpus}, proxies "
            f"{args.proxy_cpus}, load generator {args.loadgen_cpus} (of {os.cpu_count()}); logs in {log_dir}"
        )
        import uvloop

        rounds = uvloop.run(run(args, routes, syscall_counts))
        summary, verdicts, this_against = report(rounds, args)
        print_syscalls(syscall_counts, args.requests)
        failed = sum(figures["failed_total"] for figures in summary.values())
        if args.smoke and failed:
            raise SystemExit(f"smoke: {failed} requests failed; see the logs in {log_dir}")
        if args.json_out:
            write_results(
                args.json_out,
                args,
                (summary, verdicts, this_against),
                {
                    "syscalls_per_request": syscall_counts,
                    # every request's TTFT (to the µs), so that --pool can pair the rounds of several runs
                    "rounds": [[{**vars(t), "ttft_ms": [round(x, 3) for x in t.ttft_ms]} for t in trials] for trials in rounds],
                },
            )
    finally:
        for route in reversed(routes):
            route.stop()
        for sidecar in SIDECARS:
            Route("sidecar", "", [sidecar]).stop()
        if SIDECARS:
            print((log_dir / "trace-receiver.log").read_text().replace("ready\n", "").strip())


if __name__ == "__main__":
    main()
