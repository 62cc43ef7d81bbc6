"""The gateway's own Python per streamed request, without sockets: server, handler and relay.

`benchmarks/gateway_overhead.py` measures the gateway as deployed, and its figures mix the
kernel, the event loop and the gateway's Python; single trials move by ±10 % on a shared
machine. This script isolates the Python: the real server protocol (`http1.server.HttpConnection`),
`Gateway.dispatch`, upstream pool and relay run on a uvloop loop, with in-memory transports in
place of the client's and the replica's sockets. The replica's transport answers each request
with a vLLM-shaped stream (head with the first frame, one frame per token, a usage event,
`[DONE]`, the last chunk), one frame per loop turn as a socket would deliver them; the client's
transport sends the next request when a response ends. The difference between two answer
lengths, over the difference in tokens, is the CPU per streamed chunk. Figures are CPU time of this process per
request (`time.process_time`), the fake transports' own small cost included.

What it is for: comparing two versions of the gateway's code on the same machine in minutes
(`--compare-src`, alternating rounds), and seeing how a request's cost splits between its fixed
part and its per-token part (two `--output-tokens` values). It is not the deployed cost: on
this machine a deployed gateway's Python costs 3–5x these figures (its objects are cold in the
caches between events that the kernel's network work separates), so only differences and
ratios carry over.

    .venv/bin/python benchmarks/gateway_hot_path.py [--output-tokens 2,32] [--concurrency 64] [--requests 20000] [--rounds 6]
    .venv/bin/python benchmarks/gateway_hot_path.py --compare-src /tmp/base/src    # this tree and another, side by side
    .venv/bin/python benchmarks/gateway_hot_path.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _smoke import parse_args

REPLICA_URL = "http://replica.invalid:8000"  # never resolved: the pool is given in-memory connections
MODEL = "sim-vlm"


def stream_frames(output_tokens: int) -> list[bytes]:
    """A vLLM chat-completion stream as chunked frames: role, one frame per token, usage, [DONE], end."""
    base = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1764205200, "model": MODEL}

    def frame(payload: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    def event(choices: list[Any], **extra: Any) -> bytes:
        return frame(b"data: " + json.dumps({**base, "choices": choices, **extra}, separators=(",", ":")).encode() + b"\n\n")

    frames = [event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])]
    frames += [
        event([{"index": 0, "delta": {"content": f" tok{i % 10}"}, "logprobs": None, "finish_reason": None}])
        for i in range(output_tokens)
    ]
    frames.append(event([], usage={"prompt_tokens": 17, "total_tokens": 17 + output_tokens, "completion_tokens": output_tokens}))
    return frames + [frame(b"data: [DONE]\n\n"), b"0\r\n\r\n"]


def client_request(output_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Describe the radiograph in one line."}],
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway:9000\r\nContent-Type: application/json\r\n"
        b"Accept: application/json\r\nUser-Agent: OpenAI/Python 1.99.0\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body


class ReplicaTransport(asyncio.Transport):
    """The replica's socket: each request written to it is answered with `frames`, one per loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, frames: list[bytes]) -> None:
        super().__init__()
        self.loop = loop
        self.frames = frames
        self.head = (
            b"HTTP/1.1 200 OK\r\ndate: Fri, 27 Nov 2026 01:00:00 GMT\r\nserver: uvicorn\r\n"
            b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.protocol: Any = None
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: Any) -> None:
        self.loop.call_soon(self._deliver, 0)

    def writelines(self, parts: Any) -> None:
        self.write(b"")

    def _deliver(self, index: int) -> None:
        if self.closed:
            return
        self.protocol.data_received(self.head + self.frames[0] if index == 0 else self.frames[index])
        if index + 1 < len(self.frames):
            self.loop.call_soon(self._deliver, index + 1)


class ClientTransport(asyncio.Transport):
    """The client's socket: a response's last chunk sends the next request while some remain."""

    def __init__(self, run: Any) -> None:
        super().__init__()
        self.run = run
        self.protocol: Any = None
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True  # the gateway gave up on this client: the run would stall (checked in measure)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data[-5:] == b"0\r\n\r\n":
            self.run.response_ended(self)
        elif data[:9] == b"HTTP/1.1 " and data[:12] != b"HTTP/1.1 200":
            raise SystemExit(f"the gateway answered {bytes(data[:200])!r}")


class Run:
    """Requests kept in flight on `concurrency` client connections until `count` have ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request: bytes) -> None:
        self.loop = loop
        self.request = request
        self.left = 0
        self.done: asyncio.Future[None] | None = None
        self.clients: list[ClientTransport] = []

    def response_ended(self, client: ClientTransport) -> None:
        self.left -= 1
        if self.left == 0 and self.done is not None:
            self.done.set_result(None)
        elif self.left >= len(self.clients):
            self.loop.call_soon(client.protocol.data_received, self.request)

    async def cpu_us_per_request(self, count: int) -> float:
        self.left = count
        self.done = self.loop.create_future()
        for client in self.clients:
            self.loop.call_soon(client.protocol.data_received, self.request)
        started = time.process_time()
        try:
            await asyncio.wait_for(self.done, timeout=600)
        except asyncio.TimeoutError:
            closed = sum(client.closed for client in self.clients)
            raise SystemExit(
                f"requests stopped ending ({self.left} left, {closed} client connection(s) closed by the gateway)"
            ) from None
        return (time.process_time() - started) / count * 1e6


async def measure(output_tokens: int, concurrency: int, requests: int, rounds: int) -> list[float]:
    """CPU µs per request, one figure per round, for the gateway code this interpreter imports."""
    from vlmserve.gateway.app import Gateway
    from vlmserve.gateway.config import GatewayConfig
    from vlmserve.gateway.openai_errors import error_response
    from vlmserve.gateway.proxy import Forwarder
    from vlmserve.gateway.retry_budget import RetryBudget
    from vlmserve.gateway.server import quiet_garbage_collector

    try:
        from vlmserve.http1.client import ClientConnection, ClientPool
    except ImportError:  # a tree from before the one client (--compare-src)
        from vlmserve.gateway.upstream import UpstreamConnection as ClientConnection  # type: ignore[no-redef]
        from vlmserve.gateway.upstream import UpstreamPool as ClientPool  # type: ignore[no-redef]
    from vlmserve.http1.server import HttpConnection, HttpServer, ServerLimits

    loop = asyncio.get_running_loop()
    config = GatewayConfig(replicas=[REPLICA_URL])
    gateway = Gateway(config)
    # What Gateway.start() sets up, without its health checks and background tasks. Built here from
    # the constructors, not through a Gateway method, so that --compare-src also runs older trees (those with http1.server).
    gateway.upstream = ClientPool(config.connect_timeout_s)
    gateway.forwarder = Forwarder(
        gateway.pool,
        gateway.policy,
        gateway.upstream,
        gateway.watchdog,
        max_attempts=config.max_attempts,
        retry_budget=RetryBudget(config.retry_budget_ratio, config.retry_budget_min_per_s),
        idle_chunk_timeout_s=config.idle_chunk_timeout_s,
        first_token_timeout_s=config.first_token_timeout_s,
    )
    for replica in gateway.pool.replicas:
        replica.healthy = True
        replica.models = [{"id": MODEL, "object": "model"}]
    key, _ = gateway.upstream._target(REPLICA_URL + "/v1/chat/completions")
    frames = stream_frames(output_tokens)
    connections = []
    for _ in range(concurrency + 8):
        connection = ClientConnection(key)
        transport = ReplicaTransport(loop, frames)
        connection.connection_made(transport)
        transport.protocol = connection
        connection.idle_since = loop.time() + 1e9  # never too old to reuse
        connections.append(connection)
    gateway.upstream._idle[key] = connections
    server = HttpServer(
        gateway.dispatch,
        ServerLimits(
            max_body_bytes=config.max_body_bytes,
            header_timeout_s=config.header_timeout_s,
            keepalive_timeout_s=config.keepalive_timeout_s,
        ),
        error_response,
    )
    run = Run(loop, client_request(output_tokens))
    for _ in range(concurrency):
        client = ClientTransport(run)
        protocol = HttpConnection(server)
        client.protocol = protocol
        protocol.connection_made(client)
        run.clients.append(client)
    await run.cpu_us_per_request(max(concurrency, requests // 10))  # warm-up: caches, the pool, the lane's tables
    quiet_garbage_collector()  # as `vlmserve gateway` does once it serves
    return [await run.cpu_us_per_request(requests) for _ in range(rounds)]


def run_in_child(src: Path, output_tokens: int, concurrency: int, requests: int) -> float:
    """One round in a fresh interpreter importing the gateway from `src` (its CPU µs per request)."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parent}"}
    argv = [
        sys.executable,
        __file__,
        "--child",
        "--output-tokens",
        str(output_tokens),
        "--concurrency",
        str(concurrency),
        "--requests",
        str(requests),
        "--rounds",
        "1",
    ]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{src}: {(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    return float(result.stdout.split()[-1])


def main() -> None:
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-tokens", default="2,32", help="comma-separated answer lengths (default 2,32)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    parser.add_argument("--requests", type=int, default=20000, help="requests per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per configuration (default 6)")
    parser.add_argument("--compare-src", type=Path, help="another checkout's src/ to run beside this one, alternating rounds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(parser, requests=200, rounds=2, concurrency=8)
    lengths = [int(value) for value in args.output_tokens.split(",")]
    if args.child:
        print(statistics.median(uvloop.run(measure(lengths[0], args.concurrency, args.requests, 1))))
        return
    print(f"CPU per streamed request, in-process, no sockets ({args.concurrency} in flight, {args.requests} requests per round)")
    if args.compare_src is None:
        for tokens in lengths:
            rounds = uvloop.run(measure(tokens, args.concurrency, args.requests, args.rounds))
            print(
                f"{tokens:4d} tokens: {statistics.median(rounds):7.1f} us/request (rounds {' '.join(f'{f:.1f}' for f in rounds)})"
            )
        return
    here = Path(__file__).resolve().parent.parent / "src"
    for tokens in lengths:
        figures: dict[str, list[float]] = {"this tree": [], "compared": []}
        for round_index in range(args.rounds):
            order = [("this tree", here), ("compared", args.compare_src)]
            for label, src in order[round_index % 2 :] + order[: round_index % 2]:
                figures[label].append(run_in_child(src, tokens, args.concurrency, args.requests))
        ratios = [a / b for a, b in zip(figures["this tree"], figures["compared"])]
        print(
            f"{tokens:4d} tokens: this tree {statistics.median(figures['this tree']):7.1f} us/request, "
            f"compared {statistics.median(figures['compared']):7.1f}; paired ratio {statistics.median(ratios):.3f} "
            f"(rounds {min(ratios):.3f}..{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
