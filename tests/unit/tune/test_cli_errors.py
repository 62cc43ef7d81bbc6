"""`vlmserve tune` refuses bad input with one line and a non-zero exit, before any engine starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SPEC = "name: t\nengine: sim\nmodel: m\ngateway: false\nsim: {profile: a10g-8b}\n"
GOOD = ["--flag", "max-num-seqs=8,16", "--slo", "ttft_p95=400ms", "--rate-range", "1:8", "--duration", "1s"]


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--flag", "max-num-seqs=", "--slo", "ttft_p95=1s", "--rate-range", "1:8", "--duration", "1s"],
            "error: --flag max-num-seqs: give at least one value, e.g. max-num-seqs=16,32",
        ),
        (
            ["--flag", "kv-cache-dtype=fp8", "--slo", "ttft_p95=1s", "--rate-range", "1:8", "--duration", "1s"],
            "error: --flag kv-cache-dtype: the sim engine does not model it (every candidate would be the same); it models "
            "max-num-seqs, max-num-batched-tokens, api-server-count, max-model-len",
        ),
        (
            ["--slo", "ttft_p95=1s", "--rate-range", "1:8", "--duration", "1s"],
            "error: give at least one --flag NAME=V1,V2,..., e.g. --flag max-num-seqs=16,32,64",
        ),
        (
            ["--flag", "max-num-seqs=8", "--slo", "image:ttft_p95=1s", "--rate-range", "1:8", "--duration", "1s"],
            "error: --slo: tune judges run-wide objectives only; drop the TYPE: ones",
        ),
        (
            ["--flag", "max-num-seqs=8", "--slo", "ttft_p95=1s", "--rate-range", "8:1", "--duration", "1s"],
            "error: --rate-range 8:1: give LOW:HIGH with 0 < LOW < HIGH, e.g. 1:64",
        ),
        ([*GOOD, "--max-time", "soon"], "error: --max-time: 'soon' is not a duration; write it like 500ms or 5s"),
        ([*GOOD, "--max-time", "0m"], "error: --max-time: '0m' must be positive"),
        (
            ["--flag", "max-num-seqs=8", "--slo", "ttft_p95=1s", "--rate-range", "1:8"],
            "error: give --num-requests N or --duration S",
        ),
    ],
)
@pytest.mark.hostile("tune: empty value lists, flags the engine ignores, no flag, typed SLOs, a reversed range, a bad --max-time")
def test_bad_arguments_are_one_line(cli, spec: Path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    done = cli("tune", spec, *args)
    assert done.code == 2 and done.error_line == message, done.err
    assert "Traceback" not in done.err


@pytest.mark.hostile("tune SPEC: a spec path that does not exist is one line")
def test_unknown_spec_path(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = cli("tune", tmp_path / "nope.yaml", *GOOD)
    assert done.code == 2 and done.error_line == f"error: {tmp_path / 'nope.yaml'}: no such file; check the path"


@pytest.mark.hostile("tune --out DIR: a corrupt resume store is one line naming --restart; nothing starts")
def test_corrupt_store_through_the_cli(cli, spec: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    out.mkdir()
    (out / "tune.json").write_text('{"version": 1, "fingerprint": ')
    done = cli("tune", spec, *GOOD, "--out", out)
    assert done.code == 2
    assert done.error_line == (
        f"error: {out / 'tune.json'}: not a tune store (not readable JSON); remove it, or pass --restart to start the tune over"
    )
    assert not (out / "candidates").exists(), "no candidate was started"


@pytest.mark.hostile("tune without Optuna installed: one line naming the extra to install")
def test_without_optuna_the_extra_is_named(cli, spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    done = cli("tune", spec, *GOOD)
    assert done.code == 2
    assert done.error_line == "error: vlmserve tune needs Optuna; install it with: pip install 'vlmserve[tune]'"
