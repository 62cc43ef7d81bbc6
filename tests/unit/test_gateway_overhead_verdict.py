"""benchmarks/gateway_overhead.py's verdict against vllm-router: paired medians and their intervals."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def overhead(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gateway_overhead")


def test_the_median_interval_is_the_order_statistics_that_cover_it_with_95_percent(overhead: ModuleType) -> None:
    values = [float(v) for v in (7, 1, 9, 3, 10, 5, 2, 8, 4, 6)]
    assert overhead.median_interval(values) == (5.5, 2.0, 9.0)  # 2nd smallest, 2nd largest: 97.9 %
    for count in range(6, 40):
        median, low, high = overhead.median_interval([float(v) for v in range(1, count + 1)])
        k = int(low)  # the order statistic's rank
        coverage = 1 - 2 * sum(math.comb(count, i) for i in range(k)) / 2**count
        assert coverage >= 0.95 and high == count + 1 - k
        assert 1 - 2 * sum(math.comb(count, i) for i in range(k + 1)) / 2**count < 0.95  # and no tighter
    assert overhead.median_interval([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)  # too few rounds: the full range


def _trial(overhead: ModuleType, route: str, ttft_ms: float, cpu_per_chunk: float) -> object:
    return overhead.Trial(
        route=route,
        ttft_ms=[ttft_ms] * 100,
        ok=100,
        failed=0,
        output_tokens=3200,
        wall_s=1.0,
        loadgen_cpu=0.1,
        proxy_cpu=0.1,
        proxy_cpu_us_per_chunk=cpu_per_chunk,
        proxy_kernel_share=0.4,
    )


def test_the_verdict_says_below_above_or_not_distinguishable(overhead: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    rounds = []
    for index in range(10):
        noise = (index % 3 - 1) * 0.01
        rounds.append(
            [
                _trial(overhead, "direct", 21.0, 0.0),
                _trial(overhead, "vllm-router", 21.3, 33.0),
                _trial(overhead, "vlmserve", 21.1 + noise, 33.0 * (0.90 + noise)),  # clearly below
                _trial(overhead, "other", 21.3 + 5 * noise, 33.0 * (1.0 + 2 * noise)),
            ]
        )  # around parity
    verdicts = overhead.against(rounds, ["direct", "vlmserve", "other", "vllm-router"])
    assert set(verdicts) == {"vlmserve", "other"}
    median, low, high = verdicts["vlmserve"]["cpu_per_chunk_over"]
    assert high < 1.0 and median == pytest.approx(0.90)
    assert verdicts["vlmserve"]["ttft_p50_ms_minus"][2] < 0
    overhead.print_against(verdicts)
    out = capsys.readouterr().out
    assert "vlmserve: TTFT p50 -0.20 ms [-0.21, -0.19] (below)" in out
    assert "CPU/chunk 0.90x [0.89, 0.91] (below)" in out
    assert "other: TTFT p50 +0.00 ms [-0.05, +0.05] (not distinguishable)" in out
    # without vllm-router in the run there is no verdict (and nothing printed)
    assert overhead.against([[r for r in rounds[0] if r.route != "vllm-router"]], ["vlmserve"]) == {}
    # any route as the reference: a change beside the code before it
    beside = overhead.against(rounds, ["vlmserve"], "other")
    assert beside["vlmserve"]["cpu_per_chunk_over"][2] < 1.0
    overhead.print_against(beside, "other")
    assert "against other, paired by round" in capsys.readouterr().out


# ---- --syscalls: perf stat's counts per proxy --------------------------------------------------------

# `perf stat -x , -e 'syscalls:sys_enter_*' -p PID` as it writes its counts (perf 6.1, Debian 12): count,
# unit, event, run time, share; tracepoints that fired nowhere write 0, those perf could not attach "<not counted>".
PERF_CSV = """379,,syscalls:sys_enter_read,177007145,100.00,,
31,,syscalls:sys_enter_write,177007145,100.00,,
0,,syscalls:sys_enter_mmap,177007145,100.00,,
<not counted>,,syscalls:sys_enter_brk,0,0.00,,
39,,syscalls:sys_enter_futex,177007145,100.00,,
"""


def test_perf_counts_are_read_per_system_call(overhead: ModuleType) -> None:
    assert overhead.parse_syscall_counts(PERF_CSV) == {"read": 379, "write": 31, "futex": 39}
    assert overhead.parse_syscall_counts("Error: No permissions to read /sys/kernel/tracing/events\n") == {}


def test_syscalls_without_perf_is_one_clear_line(overhead: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(overhead.shutil, "which", lambda name: None)
    assert overhead.syscall_tracing_problem() == "--syscalls needs `perf` (Debian: apt-get install linux-perf)"
    monkeypatch.setattr(overhead.shutil, "which", lambda name: "/usr/bin/perf")
    monkeypatch.setattr(overhead, "SYSCALL_TRACEPOINTS", tmp_path / "missing")
    assert "syscall tracepoints" in overhead.syscall_tracing_problem() and "run as root" in overhead.syscall_tracing_problem()


def _json_run(overhead: ModuleType, path: Path, ttft_offset: float, **settings: str) -> Path:
    """A --json-out file of five rounds, as main() writes it (settings as str, each TTFT kept)."""
    args = {key: "1" for key in overhead.POOLED_SETTINGS} | {"rounds": "5"} | settings
    rounds = [
        [
            {**vars(_trial(overhead, name, ttft, 33.0))}
            for name, ttft in (("direct", 21.0), ("vllm-router", 21.3), ("vlmserve", 21.3 + ttft_offset))
        ]
        for _ in range(5)
    ]
    path.write_text(json.dumps({"args": args, "rounds": rounds}))
    return path


def test_pooled_runs_are_paired_round_by_round_as_one_run(
    overhead: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _json_run(overhead, tmp_path / "a.json", -0.10)
    second = _json_run(overhead, tmp_path / "b.json", +0.05)
    args, rounds = overhead.load_rounds([first, second])
    assert args.rounds == 10 and args.streams == "1" and len(rounds) == 10
    _, verdicts, _ = overhead.report(rounds, args)
    median, low, high = verdicts["vlmserve"]["ttft_p50_ms_minus"]
    assert median == pytest.approx(-0.025) and low == pytest.approx(-0.10) and high == pytest.approx(0.05)
    assert "10 rounds x 1 requests" in capsys.readouterr().out
    pooled = tmp_path / "pooled.json"
    overhead.write_results(pooled, args, overhead.report(rounds, args), {"pooled_from": [str(first), str(second)]})
    assert json.loads(pooled.read_text())["against_vllm_router"]["vlmserve"]["ttft_p50_ms_minus"] == [median, low, high]
    with pytest.raises(
        SystemExit,
        match=r"pooled\.json: it is a pooled summary with no rounds; pool the files it came "
        r"from: .*a\.json .*b\.json",
    ):
        overhead.load_rounds([pooled, first])  # its rounds would count twice


def test_pooling_refuses_runs_it_cannot_pair_with_one_line(overhead: ModuleType, tmp_path: Path) -> None:
    first = _json_run(overhead, tmp_path / "a.json", 0.0)
    other_load = _json_run(overhead, tmp_path / "b.json", 0.0, streams="256")
    with pytest.raises(
        SystemExit, match=r"b\.json: --streams is 256, not 1 as in .*a\.json: only runs of the same settings pool"
    ):
        overhead.load_rounds([first, other_load])
    old = tmp_path / "old.json"
    data = json.loads(first.read_text())
    data["rounds"][0][0]["ttft_ms"] = None  # what runs wrote before --pool existed
    old.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match=r"old\.json: its rounds keep no TTFT samples"):
        overhead.load_rounds([old])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"bad\.json: not a --json-out file of this benchmark \(JSONDecodeError"):
        overhead.load_rounds([tmp_path / "bad.json"])
    with pytest.raises(SystemExit, match=r"missing\.json: cannot read it \(No such file or directory\)"):
        overhead.load_rounds([tmp_path / "missing.json"])
