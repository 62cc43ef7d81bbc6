"""The unit tier starts no process: a test (or a fixture it uses) that tries fails with a clear message.

Unit tests run in about a minute on two cores because nothing here waits for an engine, a gateway
or a CLI in a subprocess; those tests belong in tests/integration (vlmserve processes) or tests/e2e
(real vLLM, Chromium, Prometheus). In-process servers (aiohttp on a loopback port) are fine.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

MESSAGE = "the unit tier starts no subprocess ({what}); move this test to tests/integration or tests/e2e"


def _refuse(what: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(MESSAGE.format(what=what))

    return refuse


@contextmanager
def _no_subprocesses() -> Iterator[None]:
    saved = (
        subprocess.Popen.__init__,
        asyncio.create_subprocess_exec,
        asyncio.create_subprocess_shell,
        multiprocessing.process.BaseProcess.start,
    )
    subprocess.Popen.__init__ = _refuse("subprocess.Popen")  # type: ignore[method-assign]
    asyncio.create_subprocess_exec = _refuse("asyncio.create_subprocess_exec")
    asyncio.create_subprocess_shell = _refuse("asyncio.create_subprocess_shell")
    multiprocessing.process.BaseProcess.start = _refuse("multiprocessing")  # type: ignore[method-assign]
    try:
        yield
    finally:
        (
            subprocess.Popen.__init__,
            asyncio.create_subprocess_exec,
            asyncio.create_subprocess_shell,
            multiprocessing.process.BaseProcess.start,
        ) = saved  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _no_subprocesses():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _no_subprocesses():
        yield


@pytest.fixture(autouse=True)
def _no_model_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tier asks no model hub: a hub id's config.json (model recipes) is not fetched, so
    a launcher planned for `org/some-vlm` is the same with or without a network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
