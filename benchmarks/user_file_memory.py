"""How much memory does reading a hostile user file cost? Peak RSS per reader and file shape.

Each case writes its file, then reads it in a fresh interpreter (`vlmserve` from whatever
PYTHONPATH resolves, so pointing it at another checkout measures that one) and reports that
process's peak resident set (VmHWM) after its imports and after the read, the time the
read took, and how it ended (read, or the first line of the error). The child's address
space is capped (--cap-gb) so an unbounded reader ends in MemoryError instead of taking the
machine down.

Cases:
  sharegpt-brackets  a ShareGPT file of N nested brackets (100,000: a 200 KB file), `bench --dataset sharegpt`'s reader
  import-records     a `vllm bench serve --save-detailed` file of M requests, `runs import`'s reader
  batch-deep-line    one OpenAI Batch line nested N deep, `batch`'s line parser

    PYTHONPATH=src .venv/bin/python benchmarks/user_file_memory.py            # 100,000 brackets, 1,000,000 records
    PYTHONPATH=src .venv/bin/python benchmarks/user_file_memory.py --smoke    # seconds

Measured 2026-11-29 on the 2-core CI machine (peak RSS of the reading process; 55 MB is the interpreter):
  before (main at fdbb7ef): ShareGPT 10,000 brackets 295 MB, 20,000 brackets 1,013 MB (100,000: 23.6 GB per
  issue 40); import of 100,000 requests 401 MB in 35 s (a million: ~4.5 GB); a 10,000-deep batch line RecursionError.
  after: ShareGPT 100,000 brackets 60 MB, refused in 0.01 s; a million-request import 349 MB, refused by its
  value count in 2 s (200,000 requests, within the bound, are read: 728 MB); a 100,000-deep batch line an
  error record, 56 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _smoke import parse_args

CHILD = """
import json, resource, sys, time


def high_water_mb():
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would start at the parent's peak
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM: this benchmark needs Linux")


cap = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
case, path = sys.argv[1], sys.argv[2]
from collections import Counter
from vlmserve.bench.workloads.sharegpt import _stream_items
from vlmserve.interop.importer import read_result_file
from vlmserve.batch.lines import parse_line
from vlmserve.errors import UserError
before = high_water_mb()
started = time.perf_counter()
try:
    if case == "sharegpt-brackets":
        items = sum(1 for _ in _stream_items(__import__("pathlib").Path(path), Counter()))
        outcome = f"read ({items} items)"
    elif case == "import-records":
        outcome = f"read ({len(read_result_file(__import__('pathlib').Path(path)).records)} records)"
    else:
        entry = parse_line(open(path, "rb").read(), 1)
        outcome = f"line parsed: {getattr(entry, 'reason', entry)}"
except UserError as err:
    outcome = f"error: {err}"
except BaseException as err:
    outcome = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
elapsed = time.perf_counter() - started
after = high_water_mb()
print(json.dumps({"before_mb": before, "after_mb": after, "seconds": elapsed, "outcome": outcome[:160]}))
"""


def write_brackets(path: Path, depth: int) -> None:
    path.write_bytes(b"[" * depth + b"]" * depth)


def write_records(path: Path, count: int) -> None:
    """A detailed vLLM result file: seven per-request lists of `count` entries, ten ITL gaps each."""
    with path.open("w") as handle:
        handle.write(
            '{"duration": 100.0, "completed": %d, "failed": 0, "request_throughput": 1.0, '
            '"output_throughput": 1.0, "backend": "openai-chat"' % count
        )
        for name, value in (
            ("start_times", "0.5"),
            ("ttfts", "0.02"),
            ("latencies", "0.3"),
            ("input_lens", "100"),
            ("output_lens", "11"),
            ("errors", '""'),
            ("itls", "[" + ",".join(["0.01"] * 10) + "]"),
        ):
            handle.write(f', "{name}": [{value}')
            for _ in range(count - 1):  # entry by entry: the writer's own memory stays small
                handle.write(f",{value}")
            handle.write("]")
        handle.write("}")


def write_deep_line(path: Path, depth: int) -> None:
    path.write_bytes(
        b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": ' + b"[" * depth + b"]" * depth + b"}"
    )


def measure(case: str, path: Path, cap_bytes: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(path), str(cap_bytes)], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0 or not done.stdout.strip():
        return {"outcome": f"child exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=100_000, help="nesting of the bracket files")
    parser.add_argument("--records", type=int, default=1_000_000, help="requests in the import file")
    parser.add_argument("--cap-gb", type=float, default=8.0, help="address-space cap of the reading process")
    parser.add_argument("--cases", default="sharegpt-brackets,import-records,batch-deep-line")
    args = parse_args(parser, depth=10_000, records=10_000)
    cap = int(args.cap_gb * (1 << 30))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        print(
            f"{'case':<18} {'size':>12} {'file MB':>8} {'RSS after imports MB':>21} {'peak RSS MB':>12} {'seconds':>8}  outcome"
        )
        for case in args.cases.split(","):
            path = folder / f"{case}.json"
            if case == "sharegpt-brackets":
                write_brackets(path, args.depth)
                size = f"{args.depth:,} deep"
            elif case == "import-records":
                write_records(path, args.records)
                size = f"{args.records:,} req"
            else:
                write_deep_line(path, args.depth)
                size = f"{args.depth:,} deep"
            figures = measure(case, path, cap)
            print(
                f"{case:<18} {size:>12} {path.stat().st_size / (1 << 20):>8.1f} "
                f"{figures.get('before_mb', float('nan')):>21.0f} {figures.get('after_mb', float('nan')):>12.0f} "
                f"{figures.get('seconds', float('nan')):>8.2f}  {figures['outcome']}",
                flush=True,
            )
            path.unlink()


if __name__ == "__main__":
    main()
