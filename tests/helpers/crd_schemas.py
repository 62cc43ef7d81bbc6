"""JSON schemas for the custom resources we emit, written by hand from their CRD definitions.

The core Kubernetes schemas (bundled offline by `kubernetes-validate`) do not cover CRDs.
These follow the openAPIV3Schema of KEDA's `keda.sh_scaledobjects.yaml` (keda.sh/v1alpha1)
and the Prometheus Operator's `monitoring.coreos.com_servicemonitors.yaml` /
`monitoring.coreos.com_prometheusrules.yaml` (monitoring.coreos.com/v1), restricted to the
fields vlmserve uses: unknown fields are refused (a misspelt field is an error, as with
`kubectl apply --validate=strict`), types, required fields and duration patterns are checked.
"""

from __future__ import annotations

from typing import Any

# Prometheus Operator's Duration pattern (monitoring.coreos.com/v1).
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                   "namespace": {"type": "string"}, "labels": _STRING_MAP, "annotations": _STRING_MAP},
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": _STRING_MAP, "matchExpressions": {"type": "array"}},
}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind},
                       "metadata": _METADATA, "spec": spec},
    }


SCALED_OBJECT = _resource("keda.sh/v1alpha1", "ScaledObject", {
    "type": "object",
    "required": ["scaleTargetRef", "triggers"],
    "additionalProperties": False,
    "properties": {
        "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                           "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                          "name": {"type": "string"}, "envSourceContainerName": {"type": "string"}}},
        "pollingInterval": {"type": "integer", "minimum": 1},
        "cooldownPeriod": {"type": "integer", "minimum": 0},
        "initialCooldownPeriod": {"type": "integer", "minimum": 0},
        "idleReplicaCount": {"type": "integer", "minimum": 0},
        "minReplicaCount": {"type": "integer", "minimum": 0},
        "maxReplicaCount": {"type": "integer", "minimum": 1},
        "fallback": {"type": "object"},
        "advanced": {"type": "object", "additionalProperties": False, "properties": {
            "restoreToOriginalReplicaCount": {"type": "boolean"},
            "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False, "properties": {
                "name": {"type": "string"},
                "behavior": {"type": "object", "additionalProperties": False, "properties": {
                    direction: {"type": "object", "additionalProperties": False, "properties": {
                        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
                        "selectPolicy": {"type": "string"}, "policies": {"type": "array"}}}
                    for direction in ("scaleUp", "scaleDown")}}}},
            "scalingModifiers": {"type": "object"}}},
        "triggers": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "name": {"type": "string"},
                           "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                           "useCachedMetrics": {"type": "boolean"},
                           "authenticationRef": {"type": "object", "required": ["name"]},
                           # every metadata value is a string in the CRD (threshold: "5", not 5)
                           "metadata": _STRING_MAP}}},
    },
})

SERVICE_MONITOR = _resource("monitoring.coreos.com/v1", "ServiceMonitor", {
    "type": "object",
    "required": ["selector"],
    "additionalProperties": False,
    "properties": {
        "jobLabel": {"type": "string"},
        "selector": _LABEL_SELECTOR,
        "namespaceSelector": {"type": "object", "additionalProperties": False,
                              "properties": {"any": {"type": "boolean"},
                                             "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "endpoints": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"port": {"type": "string"}, "targetPort": {}, "path": {"type": "string"},
                           "scheme": {"enum": ["http", "https"]},
                           "interval": {"type": "string", "pattern": DURATION},
                           "scrapeTimeout": {"type": "string", "pattern": DURATION},
                           "honorLabels": {"type": "boolean"},
                           "relabelings": {"type": "array", "items": {
                               "type": "object", "additionalProperties": False,
                               "properties": {"sourceLabels": {"type": "array", "items": {"type": "string"}},
                                              "targetLabel": {"type": "string"}, "regex": {"type": "string"},
                                              "replacement": {"type": "string"}, "separator": {"type": "string"},
                                              "action": {"type": "string"}}}}}}},
    },
})

PROMETHEUS_RULE = _resource("monitoring.coreos.com/v1", "PrometheusRule", {
    "type": "object",
    "additionalProperties": False,
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "interval": {"type": "string", "pattern": DURATION},
            "rules": {"type": "array", "items": {
                "type": "object", "required": ["expr"], "additionalProperties": False,
                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                "properties": {"alert": {"type": "string"}, "record": {"type": "string"},
                               "expr": {"type": ["string", "integer"]},
                               "for": {"type": "string", "pattern": DURATION},
                               "keep_firing_for": {"type": "string", "pattern": DURATION},
                               "labels": _STRING_MAP, "annotations": _STRING_MAP}}},
        }}}},
})

CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
