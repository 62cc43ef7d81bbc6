"""`vlmserve vllm-bench` runs vLLM's real `vllm bench serve` from this environment (CPU wheel, no model
hub: the tokenizer is the embedded model's local directory) and stores its result beside vlmserve's runs."""

from __future__ import annotations

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL
from tests.helpers.sim import start_sim_engine
from vlmserve.engines.vllm import resolve_model_path
from vlmserve.results import store

pytest.importorskip("vllm")


def test_vllm_bench_serve_runs_here_and_its_result_is_stored(cli) -> None:
    tokenizer = resolve_model_path("embedded")
    with start_sim_engine(model=SIM_MODEL, ttft_ms=5, itl_ms=1, seed=1) as engine:
        done = cli(
            "vllm-bench",
            "--base-url",
            engine.base_url,
            "--model",
            SIM_MODEL,
            "--tokenizer",
            tokenizer,
            "--simulated",
            "--label",
            "vllm-own",
            "--",
            "--num-prompts",
            "6",
            "--max-concurrency",
            "2",
            "--random-input-len",
            "16",
            "--random-output-len",
            "4",
        )
        assert done.code == 0, done.err
        assert "stored vllm bench serve's result as run" in done.out and "6 request records, simulated" in done.out
        run_id = done.out.split("as run ")[1].split()[0]
        stored = store.load_run(run_id)
        assert stored.meta.tool == "vllm bench serve" and stored.meta.label == "vllm-own"
        assert stored.simulated and len(stored.records) == 6
        report = cli("report", run_id)
        assert report.code == 0 and "Traceback" not in report.err


@pytest.mark.hostile("vllm-bench whose vLLM run fails: vLLM's own message, then one error line, exit 2")
def test_a_failed_vllm_run_is_one_error_line(cli, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import sys

    from vlmserve.interop import vllm_bench_main

    # vLLM takes ~40 s to import before it refuses a flag; a process that exits 2 at once (as vLLM's
    # argparse does) checks the verb's side of a failure without that wait
    monkeypatch.setattr(vllm_bench_main, "command", lambda *args: [sys.executable, "-c", "raise SystemExit(2)"])
    done = cli(
        "vllm-bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", tmp_path, "--", "--num-prompts", "many"
    )
    assert done.code == 2 and "Traceback" not in done.err
    assert done.error_line == "error: vllm bench serve exited with status 2 (its own message is above)"
