"""Resident memory of the sim engine while clients read a long stream very slowly.

Starts `vlmserve engine sim` in constant fast mode (100,000 tokens/s per stream), opens
--clients raw sockets with a small receive buffer (4 KiB), asks each for a --tokens long
stream, then reads one byte a second (a slow reader) for --seconds, sampling the engine's
RSS four times a second. Reports the RSS before the streams and its peak during them: with
backpressure the growth stays near the kernel's socket buffers; without it, the engine
queues the whole stream in memory.

    .venv/bin/python benchmarks/sim_slow_reader.py --clients 4 --tokens 400000 --seconds 10

    PYTHONPATH=src .venv/bin/python benchmarks/sim_slow_reader.py --smoke    # seconds: checks it still runs
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

import psutil
from _smoke import parse_args, wait_healthy

MODEL = "sim-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slow_stream(port: int, tokens: int, receive_buffer: int = 4096) -> socket.socket:
    """A socket that asked for a `tokens` long stream and has read nothing yet."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(
        {"model": MODEL, "prompt": "tell me a long story", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    ).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parse_args(parser, clients=1, seconds=2.0)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vlmserve",
        "engine",
        "sim",
        "--port",
        str(port),
        "--model",
        MODEL,
        "--ttft-ms",
        "1",
        "--itl-ms",
        "0.01",
        "--max-model-len",
        str(args.tokens + 1000),
        "--num-kv-blocks",
        str(args.clients * (args.tokens + 1000) // 16 + 64),
        "--no-timing",
    ]
    engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", engine, timeout_s=30)
        process = psutil.Process(engine.pid)
        before = process.memory_info().rss
        sockets = [slow_stream(port, args.tokens) for _ in range(args.clients)]
        peak = before
        end = time.monotonic() + args.seconds
        next_read = time.monotonic()
        while time.monotonic() < end:
            if time.monotonic() >= next_read:
                for sock in sockets:
                    sock.recv(1)
                next_read += 1.0
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.25)
        for sock in sockets:
            sock.close()
        print(
            json.dumps(
                {
                    "clients": args.clients,
                    "tokens": args.tokens,
                    "seconds": args.seconds,
                    "rss_before_mb": round(before / 2**20, 1),
                    "rss_peak_mb": round(peak / 2**20, 1),
                    "growth_mb": round((peak - before) / 2**20, 1),
                }
            )
        )
    finally:
        engine.terminate()
        engine.wait(timeout=10)


if __name__ == "__main__":
    main()
