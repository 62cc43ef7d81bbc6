"""Grafana dashboards (JSON model) for the gateway and the vLLM engines.

Built from `queries.py` panels; a datasource variable lets the same JSON import into any
Grafana with a Prometheus datasource.
"""

from __future__ import annotations

from typing import Any

from vlmserve.observe.queries import ENGINE_PANELS, GATEWAY_PANELS, Panel

GRAFANA_RATE_WINDOW = "$__rate_interval"
_PANEL_WIDTH = 12
_PANEL_HEIGHT = 8
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel_json(panel: Panel, panel_id: int) -> dict[str, Any]:
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
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + index), "datasource": _DATASOURCE,
             "expr": query.render(GRAFANA_RATE_WINDOW), "legendFormat": query.legend}
            for index, query in enumerate(panel.queries)
        ],
    }


def dashboard(uid: str, title: str, panels: tuple[Panel, ...]) -> dict[str, Any]:
    """A complete Grafana dashboard JSON model."""
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
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0,
        }]},
        "panels": [_panel_json(panel, index + 1) for index, panel in enumerate(panels)],
    }


def engine_dashboard() -> dict[str, Any]:
    return dashboard("vlmserve-engines", "vlmserve — vLLM engines", ENGINE_PANELS)


def gateway_dashboard() -> dict[str, Any]:
    return dashboard("vlmserve-gateway", "vlmserve — gateway", GATEWAY_PANELS)
