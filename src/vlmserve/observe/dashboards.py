"""Grafana dashboards (JSON model) for the gateway and the vLLM engines.

Built from `queries.py` panels; a datasource variable lets the same JSON import into any
Grafana with a Prometheus datasource. A `deployment` variable (one at a time, from the label
the scrape config sets) keeps two deployments scraped by one Prometheus from merging into one
curve, and a `model` variable narrows the engine panels to served models (vLLM's `model_name`);
a dashboard gets the variables its queries can use.
"""

from __future__ import annotations

from vlmserve.observe.queries import (
    DEPLOYMENT_LABEL,
    ENGINE_JOB,
    ENGINE_PANELS,
    GATEWAY_JOB,
    GATEWAY_PANELS,
    MODEL_LABEL,
    VLLM_RUNNING,
    Panel,
    scoped_labels,
)

GRAFANA_RATE_WINDOW = "$__rate_interval"
_PANEL_WIDTH = 12
_PANEL_HEIGHT = 8
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
DASHBOARD_FILTERS = {DEPLOYMENT_LABEL: "$deployment", MODEL_LABEL: "$model"}
"""Label -> the variable its selectors match (a regex match, so an unlabelled setup still shows data)."""


def _panel_json(panel: Panel, panel_id: int) -> dict[str, object]:
    column = (panel_id - 1) % 2
    row = (panel_id - 1) // 2
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": _DATASOURCE,
        "gridPos": {"h": _PANEL_HEIGHT, "w": _PANEL_WIDTH, "x": column * _PANEL_WIDTH, "y": row * _PANEL_HEIGHT},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + index),
                "datasource": _DATASOURCE,
                "expr": query.render(GRAFANA_RATE_WINDOW, DASHBOARD_FILTERS),
                "legendFormat": query.legend,
            }
            for index, query in enumerate(panel.queries)
        ],
    }


def _query_variable(name: str, label: str, query: str, **options: object) -> dict[str, object]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": _DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "current": {},
        "hide": 0,
        **options,
    }


def _variables(panels: tuple[Panel, ...], job: str) -> list[dict[str, object]]:
    """The datasource, then a variable per label the panels' queries can be narrowed by."""
    used = set().union(*(scoped_labels(query.expr) for panel in panels for query in panel.queries))
    variables: list[dict[str, object]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0}
    ]
    if DEPLOYMENT_LABEL in used:
        # one deployment at a time: "All" would add two deployments' requests into one curve
        variables.append(
            _query_variable(
                "deployment", "Deployment", f'label_values(up{{job="{job}"}}, {DEPLOYMENT_LABEL})', multi=False, includeAll=False
            )
        )
    if MODEL_LABEL in used:
        variables.append(
            _query_variable(
                "model",
                "Model",
                f'label_values({VLLM_RUNNING}{{{DEPLOYMENT_LABEL}=~"$deployment"}}, {MODEL_LABEL})',
                multi=True,
                includeAll=True,
                allValue=".*",
            )
        )
    return variables


def dashboard(uid: str, title: str, panels: tuple[Panel, ...], job: str) -> dict[str, object]:
    """A complete Grafana dashboard JSON model; `job` is the scrape job whose targets name the deployments."""
    return {
        "uid": uid,
        "title": title,
        "tags": ["vlmserve"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": _variables(panels, job)},
        "panels": [_panel_json(panel, index + 1) for index, panel in enumerate(panels)],
    }


def engine_dashboard() -> dict[str, object]:
    return dashboard("vlmserve-engines", "vlmserve — vLLM engines", ENGINE_PANELS, ENGINE_JOB)


def gateway_dashboard() -> dict[str, object]:
    return dashboard("vlmserve-gateway", "vlmserve — gateway", GATEWAY_PANELS, GATEWAY_JOB)
