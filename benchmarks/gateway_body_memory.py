"""How much memory does one large request body cost the gateway? Peak RSS per body shape.

Each case starts a fresh `vlmserve gateway` process in front of a "black hole" replica (it
answers /health and /v1/models, and holds every generation request open without answering,
so an admitted request stays in flight with whatever the gateway keeps for it), reads the
gateway's resident-set high-water mark (VmHWM in /proc/PID/status) after start-up, sends the
case's requests all at once, gives up on them after a hold time, and reads the mark again.
The difference is what those requests cost the gateway at their peak. Status "held" means the
gateway admitted the request and forwarded it; a number is the gateway's own answer.

Cases:
  many-small    N tiny chat messages {"role":"user","content":"x"} (1,000,000 ≈ 30 MiB)
  one-string    one message whose content is a single string of the same size (an inline image's shape)
  many-small x4 four many-small bodies at once (one-string x4 likewise)

    PYTHONPATH=src .venv/bin/python benchmarks/gateway_body_memory.py            # full, ~30 MiB bodies
    PYTHONPATH=src .venv/bin/python benchmarks/gateway_body_memory.py --smoke    # seconds

Linux only (reads /proc). The gateway runs from whatever `vlmserve` PYTHONPATH resolves, so
pointing PYTHONPATH at another checkout measures that one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
from _smoke import parse_args, wait_healthy
from aiohttp import web

HELD = 0  # status recorded for a request the gateway forwarded and the black hole held

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def high_water_mark_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/PID/status: this benchmark needs Linux")


class BlackHoleReplica:
    """An engine stand-in in a background thread that never answers generation requests."""

    def __init__(self) -> None:
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        async def health(_: web.Request) -> web.Response:
            return web.json_response({})

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

        async def hold(request: web.Request) -> web.Response:
            await request.read()
            await asyncio.sleep(3600)
            return web.json_response({})

        app = web.Application(client_max_size=256 * MIB)
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", hold)

        async def start() -> None:
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()


def many_small_body(messages: int) -> bytes:
    item = b'{"role":"user","content":"x"}'
    return b'{"model":"m","max_tokens":1,"messages":[' + b",".join([item] * messages) + b"]}"


def one_string_body(size: int) -> bytes:
    return b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"' + b"A" * size + b'"}]}'


@dataclass
class Case:
    name: str
    body: bytes
    copies: int = 1


@dataclass
class Measured:
    case: Case
    statuses: list[int]
    baseline_bytes: int
    peak_bytes: int

    @property
    def cost_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes

    def row(self) -> str:
        body_mib = len(self.case.body) / MIB
        ratio = self.cost_bytes / (len(self.case.body) * self.case.copies)
        statuses = ",".join("held" if status == HELD else str(status) for status in sorted(set(self.statuses)))
        return (
            f"{self.case.name:<16} {body_mib:8.1f} {self.case.copies:6d} {statuses:>8} "
            f"{self.baseline_bytes / MIB:9.0f} {self.peak_bytes / MIB:9.0f} {self.cost_bytes / MIB:9.0f} {ratio:8.1f}"
        )


HEADER = f"{'case':<16} {'body MiB':>8} {'copies':>6} {'status':>8} {'base MiB':>9} {'peak MiB':>9} {'cost MiB':>9} {'x body':>8}"


async def send_all(url: str, case: Case, hold_s: float) -> list[int]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, read=hold_s)) as client:

        async def one() -> int:
            try:
                response = await client.post(url, content=case.body, headers={"Content-Type": "application/json"})
            except httpx.ReadTimeout:
                return HELD
            return response.status_code

        return list(await asyncio.gather(*(one() for _ in range(case.copies))))


def measure(case: Case, replica: BlackHoleReplica, log_dir: Path, hold_s: float) -> Measured:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vlmserve",
        "gateway",
        "--replica",
        f"http://127.0.0.1:{replica.port}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--health-interval",
        "5",
    ]
    log_path = log_dir / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        # ready once /health says the black hole is routable
        wait_healthy(f"http://127.0.0.1:{port}/health", process, log_path=log_path)
        baseline = high_water_mark_bytes(process.pid)
        statuses = asyncio.run(send_all(f"http://127.0.0.1:{port}/v1/chat/completions", case, hold_s))
        return Measured(case, statuses, baseline, high_water_mark_bytes(process.pid))
    finally:
        process.terminate()
        process.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="tiny messages in the many-small body")
    parser.add_argument("--json", type=Path, help="also write the rows here as JSON")
    args = parse_args(parser, messages=20_000)
    messages = args.messages
    small = many_small_body(messages)
    big_string = one_string_body(len(small))
    cases = [Case("many-small", small), Case("one-string", big_string)]
    if not args.smoke:
        cases += [Case("many-small x4", small, copies=4), Case("one-string x4", big_string, copies=4)]
    hold_s = 1.0 if args.smoke else 5.0
    replica = BlackHoleReplica()
    print(HEADER, flush=True)
    results = []
    with tempfile.TemporaryDirectory() as log_dir:
        for case in cases:
            measured = measure(case, replica, Path(log_dir), hold_s)
            results.append(measured)
            print(measured.row(), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "case": m.case.name,
                        "body_bytes": len(m.case.body),
                        "copies": m.case.copies,
                        "statuses": m.statuses,
                        "baseline_bytes": m.baseline_bytes,
                        "peak_bytes": m.peak_bytes,
                    }
                    for m in results
                ],
                indent=1,
            )
        )
    if any(status >= 500 for m in results for status in m.statuses):
        sys.exit("a request failed inside the gateway (5xx): see above")


if __name__ == "__main__":
    main()
