"""deploy/monitoring: the alert rules and the Grafana panel ask for the metric the plugin exports, by
labels it sets (vllm_tmaguard/metrics.py) or that Prometheus' Kubernetes discovery adds."""

from __future__ import annotations

import json
import re

import yaml
from deploykit import DEPLOY

from vllm_tmaguard.metrics import LABELS, METRIC

SCRAPE_LABELS = {"namespace", "pod"}  # added by the scrape configuration, not by the exporter


def _selectors(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names an expression uses."""
    groups = re.findall(r"by\s*\(([^)]*)\)", expr)
    labels = {name.strip() for group in groups for name in group.split(",")}
    labels |= set(re.findall(r"(\w+)\s*[!=]~?\s*\"", expr))
    outside_groups = re.sub(r"by\s*\([^)]*\)", "", expr)
    return set(re.findall(r"\b(tmaguard_\w+)\b", outside_groups)), labels


def test_alert_rules_ask_for_the_exported_labels() -> None:
    rules = yaml.safe_load((DEPLOY / "monitoring/tmaguard-alerts.yaml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert exprs
    for expr in exprs:
        metrics, labels = _selectors(expr)
        assert metrics == {METRIC}, expr
        assert labels <= set(LABELS) | SCRAPE_LABELS, labels - set(LABELS)


def test_grafana_panel_asks_for_the_exported_labels() -> None:
    panel = json.loads((DEPLOY / "monitoring/tmaguard-grafana-panel.json").read_text())
    (target,) = panel["targets"]
    metrics, labels = _selectors(target["expr"])
    assert metrics == {METRIC} and labels == set(LABELS) | SCRAPE_LABELS
