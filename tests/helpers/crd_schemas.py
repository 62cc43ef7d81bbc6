"""Schemas for every object `vlmserve export k8s` writes: Kubernetes' own for core kinds, the published
CRD schemas for KEDA's ScaledObject and the Prometheus Operator's ServiceMonitor and PrometheusRule.

The CRD schemas are each project's `openAPIV3Schema`, vendored unchanged under
tests/fixtures/crd_schemas/ (README.md there says from which release). Loading adds what
`kubectl apply --validate=strict` adds on a cluster: a field the schema does not declare is an
error (a CRD's structural schema would prune it silently), and apiVersion/kind must match.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

CRD_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "crd_schemas"
KUBERNETES_VERSION = "1.30"  # oldest release still widely run; its schemas are bundled offline
_FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_scaledobject.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_v1_prometheusrule.json",
}
_METADATA = {  # a CRD's schema says only `metadata: {type: object}`; the API server checks the name
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                   "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
}


def _strict(node: Any) -> Any:
    """Unknown fields refused wherever the schema lists the known ones and does not keep unknown ones.

    Go's regular expressions take an inline flag after `^` (`^(?i)...`); Python's want it first."""
    if isinstance(node, dict):
        node = {key: _strict(value) for key, value in node.items()}
        if isinstance(node.get("pattern"), str) and node["pattern"].startswith("^(?i)"):
            node["pattern"] = "(?i)^" + node["pattern"].removeprefix("^(?i)")
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        node = [_strict(item) for item in node]
    return node


def _load(api_version: str, kind: str, name: str) -> dict[str, Any]:
    schema = _strict(copy.deepcopy(json.loads((CRD_DIR / name).read_text())))
    schema["properties"].update(apiVersion={"const": api_version}, kind={"const": kind}, metadata=_METADATA)
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return schema


CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {key: _load(*key, name) for key, name in _FILES.items()}


def validate(manifest: dict) -> None:
    """Core kinds against Kubernetes' own schemas (strict: unknown fields fail); CRDs against theirs."""
    key = (manifest["apiVersion"], manifest["kind"])
    if key in CRD_SCHEMAS:
        jsonschema.validate(manifest, CRD_SCHEMAS[key])
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
