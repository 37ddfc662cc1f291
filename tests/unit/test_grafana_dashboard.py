"""The shipped Grafana dashboard (docs/grafana/agentic-rollout.json) is one Grafana
imports: checked against a JSON schema of the dashboard model's fields it needs, and for
what a schema cannot say (unique panel ids, panels that do not overlap, every query on
the dashboard's Prometheus data source). That every series its queries name is exported
is asserted on live scrapes in tests/integration/test_worker_metrics.py."""

import json
import re
from pathlib import Path

import jsonschema

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "agentic-rollout.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

GRID = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
}
TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {"refId": {"type": "string"}, "expr": {"type": "string", "minLength": 1}},
}
SCHEMA = {
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": {"required": ["name", "type"]}}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"enum": ["row", "timeseries", "stat", "heatmap", "gauge"]},
                    "gridPos": GRID,
                    "targets": {"type": "array", "minItems": 1, "items": TARGET},
                },
                "if": {"properties": {"type": {"not": {"const": "row"}}}},
                "then": {"required": ["targets", "datasource"]},
            },
        },
    },
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_matches_the_schema() -> None:
    jsonschema.validate(dashboard(), SCHEMA)


def test_the_schema_refuses_a_panel_without_queries() -> None:
    """Control: the schema is not one everything passes."""
    broken = dashboard()
    panel = next(p for p in broken["panels"] if p["type"] == "timeseries")
    del panel["targets"]
    try:
        jsonschema.validate(broken, SCHEMA)
    except jsonschema.ValidationError as exc:
        assert "targets" in exc.message
    else:
        raise AssertionError("a panel without targets passed")


def test_panels_have_unique_ids_do_not_overlap_and_use_the_datasource_variable() -> None:
    d = dashboard()
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == DATASOURCE
            assert all(t["datasource"] == DATASOURCE for t in p["targets"])
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]


def dashboard_series() -> set[str]:
    """Every metric name the dashboard's queries read."""
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    return {name for e in exprs for name in re.findall(r"\brollout_[a-z_]+", e)}


def test_the_dashboard_covers_the_gateway_and_the_workers() -> None:
    names = dashboard_series()
    assert any(n.startswith("rollout_gateway_") for n in names)
    assert any(n.startswith("rollout_worker_") for n in names)
