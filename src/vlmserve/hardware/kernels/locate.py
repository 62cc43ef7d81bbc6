"""Where the measured kernel tables for a GPU live, and which vLLM version's to use.

The tables come from the `aiconfigurator-core` package (Apache-2.0, the data behind NVIDIA's
AIConfigurator): `systems/data/<system>/<op>/vllm/<version>/<table>.parquet`, latencies of vLLM's
own kernels measured on that GPU. The package is an optional extra (`vlmserve[plan]`); where it
is absent, or has no vLLM data for a GPU or an op, `locate_table` returns None and the caller
prices that op on the roofline, saying so.

Version choice: the vLLM version closest to the deployment's (by (major, minor, patch),
ties to the newer), the newest when the deployment's is not given. A version folder that only
holds a `reuse.yaml` (AIConfigurator's "same kernels as version X") resolves to the folder it
names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.util import find_spec
from pathlib import Path

DATA_PACKAGE = "aiconfigurator_core"
"""The PyPI distribution `aiconfigurator-core` installs this package."""

SYSTEMS: dict[str, str] = {
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "a100": "a100_sxm",
    "l40s": "l40s",
    "rtx_pro_6000": "rtx_pro_6000_server",
}
"""vlmserve GPU key → AIConfigurator system folder (the SXM parts: the catalogue's H100/H200/A100 are SXM)."""

FRAMEWORK = "vllm"


@dataclass(frozen=True)
class TableRef:
    """One measured table: the file, and what it was measured on."""

    path: Path
    system: str
    op: str
    vllm_version: str
    """The version chosen; its folder may reuse another version's measurements (`path` says whose)."""

    @property
    def measured_version(self) -> str:
        return self.path.parent.name

    @property
    def label(self) -> str:
        """How `plan --explain` names the source: file, GPU, vLLM version."""
        reused = "" if self.measured_version == self.vllm_version else f", reusing {self.measured_version}'s measurements"
        return f"{self.op}/{self.path.name} ({self.system}, vLLM {self.vllm_version}{reused})"


def version_key(text: str) -> tuple[int, ...]:
    """'0.24.0' → (0, 24, 0); non-numeric parts (dev tags) count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in re.split(r"[.+-]", text)[:3])


@cache
def data_root() -> Path | None:
    """`aiconfigurator_core/systems/data`, or None when the package is not installed.

    `find_spec` first, so a missing package costs no import attempt; then
    `importlib.resources` for the files (the package's own import is light: a compiled module).
    """
    if find_spec(DATA_PACKAGE) is None:
        return None
    root = Path(str(resources.files(DATA_PACKAGE).joinpath("systems", "data")))
    return root if root.is_dir() else None


def system_for(gpu_key: str) -> str | None:
    """The AIConfigurator system folder for a vlmserve GPU key, if the tables cover it."""
    system = SYSTEMS.get(gpu_key.lower())
    root = data_root()
    if system is None or root is None or not (root / system).is_dir():
        return None
    return system


def _resolve_reuse(folder: Path) -> Path | None:
    """A version folder's own files, or (reuse.yaml only) the sibling version it names."""
    reuse = folder / "reuse.yaml"
    if any(folder.glob("*.parquet")) or not reuse.exists():
        return folder
    match = re.search(r"from_version:\s*([0-9][^\s]*)", reuse.read_text())
    if match and (folder.parent / match.group(1)).is_dir():
        return folder.parent / match.group(1)
    return None


def choose_version(versions: list[str], wanted: str | None) -> str | None:
    """The version closest to `wanted` (ties → newer); the newest when `wanted` is None."""
    if not versions:
        return None
    ordered = sorted(versions, key=version_key)
    if wanted is None:
        return ordered[-1]
    target = version_key(wanted)

    def distance(version: str) -> tuple[int, ...]:
        return tuple(abs(a - b) for a, b in zip(version_key(version), target))

    return min(reversed(ordered), key=distance)


@cache
def locate_table(gpu_key: str, op: str, table: str, vllm_version: str | None = None, family: str = FRAMEWORK) -> TableRef | None:
    """The measured `table` (file stem) of `op` for this GPU, at the chosen vLLM version, or None.

    Only versions whose folder (after reuse) holds the table are candidates, so a version that
    measured GEMMs but not all-reduce falls back to the closest one that did.
    """
    system = system_for(gpu_key)
    root = data_root()
    if system is None or root is None:
        return None
    base = root / system / op / family
    if not base.is_dir():
        return None
    holding: dict[str, Path] = {}
    for folder in base.iterdir():
        if not folder.is_dir():
            continue
        resolved = _resolve_reuse(folder)
        if resolved is not None and (resolved / f"{table}.parquet").exists():
            holding[folder.name] = resolved / f"{table}.parquet"
    version = choose_version(list(holding), vllm_version)
    if version is None:
        return None
    return TableRef(holding[version], system, op, version)


def covers(gpu_key: str) -> bool:
    """Whether the tables cover this GPU's GEMMs and attention (what `--cost-model auto` needs)."""
    return all(
        locate_table(gpu_key, op, table) is not None
        for op, table in (
            ("gemm", "gemm_perf"),
            ("attention", "context_attention_perf"),
            ("attention", "generation_attention_perf"),
        )
    )
