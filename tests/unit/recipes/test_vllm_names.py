"""Recipe flags are checked by name in vLLM's source (nothing imported): a fake vLLM tree stands in."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest

from vlmserve import vllm_flags


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    package = tmp_path / "vllm"
    (package / "engine").mkdir(parents=True)
    (package / "reasoning").mkdir()
    (package / "engine" / "arg_utils.py").write_text("class EngineArgs:\n    limit_mm_per_prompt: dict = None\n")
    (package / "reasoning" / "__init__.py").write_text('_PARSERS = {\n    "qwen3": ("qwen3_parser", "Qwen3"),\n}\n')
    monkeypatch.setattr(vllm_flags, "vllm_package_dir", lambda: package)
    monkeypatch.setattr(vllm_flags, "installed_vllm_flags", lru_cache(maxsize=1)(lambda: None))  # not built
    vllm_flags._flag_source_text.cache_clear()
    vllm_flags._parser_source_text.cache_clear()
    yield package
    vllm_flags._flag_source_text.cache_clear()
    vllm_flags._parser_source_text.cache_clear()


def test_flag_names_are_read_from_the_source(fake_vllm: Path) -> None:
    assert vllm_flags.vllm_has_flag("limit_mm_per_prompt") is True
    assert vllm_flags.vllm_has_flag("async_scheduling") is False
    assert vllm_flags.vllm_has_flag("limit_mm") is False  # whole words only


def test_parser_names_are_read_from_the_registry(fake_vllm: Path) -> None:
    assert vllm_flags.vllm_has_parser("reasoning_parser", "qwen3") is True
    assert vllm_flags.vllm_has_parser("reasoning_parser", "gemma4") is False
    assert vllm_flags.vllm_has_parser("tool_call_parser", "hermes") is None  # no tool_parsers/ here: cannot tell


def test_without_vllm_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_flags, "vllm_package_dir", lambda: None)
    monkeypatch.setattr(vllm_flags, "installed_vllm_flags", lru_cache(maxsize=1)(lambda: None))
    vllm_flags._parser_source_text.cache_clear()
    assert vllm_flags.vllm_has_flag("anything") is None
    assert vllm_flags.vllm_has_parser("reasoning_parser", "gemma4") is None
    vllm_flags._parser_source_text.cache_clear()
