"""A real, small file system a test can fill: a tmpfs mounted over a directory.

A full disk is not mocked: the supervisor's writes must meet the kernel's own ENOSPC. Mounting
needs root with CAP_SYS_ADMIN (this project's test machines and CI run as root); where the
mount is refused the test is skipped with the mount's own reason.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FILL_CHUNKS = (1 << 16, 1 << 12, 1 << 8, 1)
"""Write sizes tried in turn until not even one byte fits."""


@contextmanager
def small_filesystem(directory: Path, size_kib: int) -> Iterator[Path]:
    """Mount a `size_kib` tmpfs over `directory` (created if missing) for the block's duration."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "vlmserve-test-full", str(directory)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no `mount` command here: a full file system cannot be made for this test")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root with CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield directory
    finally:
        # lazy: a process of a failed test may still hold a file there; the mount goes when it lets go
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Fill the file system under `directory` with one file until writes fail with ENOSPC; return it."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        for size in FILL_CHUNKS:
            chunk = b"\0" * size
            while True:
                try:
                    out.write(chunk)
                except OSError as problem:
                    assert problem.errno == errno.ENOSPC, problem
                    break
    return filler
