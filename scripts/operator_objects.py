"""Writes the Prometheus Operator's objects in deploy/kuberay/operator/ from their one source:
the PrometheusRule from deploy/prometheus/alerts.yml, the Grafana sidecar's ConfigMap from
deploy/grafana/session-router.json. tests/test_deploy_manifests.py checks the files are current.

Run after changing either source: python scripts/operator_objects.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "session-router.json"
OPERATOR = REPO / "deploy" / "kuberay" / "operator"
# kube-prometheus-stack's Prometheus selects rules and monitors by its Helm release's name.
RELEASE = "kube-prometheus-stack"
LABELS = {"app.kubernetes.io/name": "session-router", "release": RELEASE}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (rule expressions, the dashboard) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _document(header: str, obj: dict) -> str:
    body = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100)
    return header + body


def prometheus_rule() -> str:
    rules = yaml.safe_load(ALERTS.read_text())
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "session-router", "labels": LABELS},
        "spec": {"groups": rules["groups"]},
    }
    header = (
        "# Generated from deploy/prometheus/alerts.yml by scripts/operator_objects.py: edit that\n"
        f"# file and rerun. Label `release: {RELEASE}` is what kube-prometheus-stack's\n"
        "# Prometheus selects rules by (set it to your Helm release's name).\n"
    )
    return _document(header, obj)


def dashboard_configmap() -> str:
    board = json.loads(DASHBOARD.read_text())
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "session-router-dashboard",
            "labels": {**LABELS, "grafana_dashboard": "1"},
        },
        "data": {"session-router.json": json.dumps(board, indent=2) + "\n"},
    }
    header = (
        "# Generated from deploy/grafana/session-router.json by scripts/operator_objects.py.\n"
        "# Grafana's dashboard sidecar (kube-prometheus-stack: grafana.sidecar.dashboards) loads\n"
        "# ConfigMaps labelled grafana_dashboard=1 from the namespaces it watches.\n"
    )
    return _document(header, obj)


def generated() -> dict[Path, str]:
    return {
        OPERATOR / "prometheusrule.yaml": prometheus_rule(),
        OPERATOR / "grafana-dashboard.yaml": dashboard_configmap(),
    }


def main() -> int:
    for path, text in generated().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
