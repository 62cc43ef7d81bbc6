"""Schemas for every object `vlmserve export` writes: Kubernetes' own for core kinds, the published
CRD schemas for KEDA's ScaledObject, the Prometheus Operator's ServiceMonitor and PrometheusRule,
the Gateway API Inference Extension's InferencePool, the Gateway API's HTTPRoute and KServe's
LLMInferenceService; the production-stack chart's values schema; and, where the project publishes
no schema (the endpoint picker's EndpointPickerConfig), one derived from its Go type.

The CRD schemas are each project's `openAPIV3Schema`, vendored unchanged under
tests/fixtures/crd_schemas/ (README.md there says from which release). Loading adds what
`kubectl apply --validate=strict` adds on a cluster: a field the schema does not declare is an
error (a CRD's structural schema would prune it silently), and apiVersion/kind must match.
"""

from __future__ import annotations

import copy
import functools
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
    ("inference.networking.k8s.io/v1", "InferencePool"): "inference.networking.k8s.io_v1_inferencepool.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_v1_httproute.json",
    ("serving.kserve.io/v1alpha2", "LLMInferenceService"): "serving.kserve.io_v1alpha2_llminferenceservice.json",
}
EPP_CONFIG_FILE = "llm-d.ai_v1alpha1_endpointpickerconfig.json"
HELM_VALUES_FILE = "production-stack_vllm-stack-0.1.12_values.schema.json"
_METADATA = {  # a CRD's schema says only `metadata: {type: object}`; the API server checks the name
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _strict(node: Any) -> Any:
    """Unknown fields refused wherever the schema lists the known ones and does not keep unknown ones.

    Go's regular expressions take an inline flag after `^` (`^(?i)...`); Python's want it first."""
    if isinstance(node, dict):
        node = {key: _strict(value) for key, value in node.items()}
        if isinstance(node.get("pattern"), str) and node["pattern"].startswith("^(?i)"):
            node["pattern"] = "(?i)^" + node["pattern"].removeprefix("^(?i)")
        if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        node = [_strict(item) for item in node]
    return node


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The strict schema of one CRD kind (loaded on first use: KServe's is 0.9 MB)."""
    schema = _strict(copy.deepcopy(json.loads((CRD_DIR / _FILES[(api_version, kind)]).read_text())))
    schema["properties"].update(apiVersion={"const": api_version}, kind={"const": kind}, metadata=_METADATA)
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return schema


@functools.cache
def _validator(api_version: str, kind: str) -> Any:
    """The validator of one CRD kind, made once. The schema itself is not checked against the JSON Schema
    meta-schema (API servers serve these schemas; checking KServe's 0.9 MB one takes 11 s here)."""
    schema = crd_schema(api_version, kind)
    return jsonschema.validators.validator_for(schema)(schema)


def _raise_first(validator: Any, instance: dict) -> None:
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is not None:
        raise error


def validate(manifest: dict) -> None:
    """Core kinds against Kubernetes' own schemas (strict: unknown fields fail); CRDs against theirs."""
    key = (manifest["apiVersion"], manifest["kind"])
    if key in _FILES:
        _raise_first(_validator(*key), manifest)
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def validate_epp_config(config: dict) -> None:
    """An EndpointPickerConfig against the schema derived from its Go type (README.md says how)."""
    jsonschema.validate(config, json.loads((CRD_DIR / EPP_CONFIG_FILE).read_text()))


def validate_helm_values(values: dict) -> None:
    """production-stack values against the chart's values.schema.json (draft 2020-12, as Helm 3 reads it),
    strict as a CRD: a key the chart does not declare is an error, not a silently ignored value."""
    schema = _strict(json.loads((CRD_DIR / HELM_VALUES_FILE).read_text()))
    jsonschema.Draft202012Validator(schema).validate(values)
