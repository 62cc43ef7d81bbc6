"""The repository's Dockerfile builds the image `export k8s` deploys by default: from the package, with its
console script, as the user the manifests run it as."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from vlmserve.export.k8s import GATEWAY_IMAGE, GATEWAY_UID, K8sOptions

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in DOCKERFILE.splitlines() if line.startswith(f"{name} ")]


def test_the_default_image_is_the_one_the_dockerfile_documents_building() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    built = re.findall(r"docker build -t (\S+) \.", DOCKERFILE)
    assert built == [f"vlmserve:{project['version']}"] == [GATEWAY_IMAGE]
    assert K8sOptions().vlmserve_image == GATEWAY_IMAGE


def test_it_installs_the_package_and_runs_its_console_script() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(re.search(r"pip install [^&]*\"\.(\[[a-z0-9,]+\])?\"", run) for run in instructions("RUN"))
    assert json.loads(instructions("ENTRYPOINT")[0]) == ["vlmserve"] and "vlmserve" in project["scripts"]
    extras = re.search(r"\"\.\[([a-z0-9,]+)\]\"", DOCKERFILE)
    assert extras is not None and {"redis", "k8s"} <= set(extras.group(1).split(","))  # --state, --discover k8s:
    assert instructions("USER") == [str(GATEWAY_UID)]  # the manifests' runAsUser and fsGroup
