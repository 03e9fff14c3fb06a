"""The Grafana dashboard's queries (deploy/grafana/session-router.json), with its variables
substituted the way Grafana does, for tests/test_prometheus_e2e.py to evaluate in Prometheus."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "session-router.json"


@dataclass(frozen=True)
class DashboardQuery:
    where: str  # e.g. "panel 'Mamba slots on $replica' target A"
    expr: str
    legend: str = ""


def _walk_panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels or []:
        yield panel
        yield from _walk_panels(panel.get("panels", []))  # collapsed rows hold their panels


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(board: dict | None = None) -> list[DashboardQuery]:
    """Every Prometheus expression of the dashboard: panel targets (rows and nested panels
    included) and the templating variables' queries."""
    board = dashboard() if board is None else board
    found = []
    for panel in _walk_panels(board.get("panels", [])):
        for i, target in enumerate(panel.get("targets", []) or []):
            expr = target.get("expr")
            if expr is None:
                continue
            where = f"panel {panel.get('title', panel.get('id'))!r} target {target.get('refId', i)}"
            found.append(DashboardQuery(where, expr, target.get("legendFormat", "") or ""))
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            if isinstance(query, dict):
                query = query.get("query", "")
            found.append(DashboardQuery(f"variable {var['name']!r}", query or ""))
    return found


_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:(?P<sel>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$", re.S
)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.+)\)\s*$", re.S)


def variable_promql(query: str) -> tuple[str, Callable[[list[dict]], list[str]]]:
    """Grafana's variable query language → (PromQL to evaluate, how to read the values).

    ``label_values(selector, label)`` becomes ``group by (label) (selector)``; bare
    ``label_values(label)`` becomes ``group by (label) ({label!=""})``; ``query_result(expr)``
    is ``expr`` itself; anything else is taken as PromQL (the "classic query" form)."""
    match = _LABEL_VALUES.match(query)
    if match:
        label = match["label"]
        selector = match["sel"] or f'{{{label}!=""}}'
        expr = f"group by ({label}) ({selector})"
        return expr, lambda result: sorted({s["metric"].get(label, "") for s in result} - {""})
    match = _QUERY_RESULT.match(query)
    expr = match["expr"] if match else query
    return expr, lambda result: sorted({json.dumps(s["metric"], sort_keys=True) for s in result})


# Grafana's built-in variables, each with the values the dashboard may see.
BUILTINS: dict[str, tuple[str, ...]] = {
    "__rate_interval": ("1m", "30s"),
    "__interval": ("15s",),
    "__interval_ms": ("15000",),
    "__range": ("1h",),
    "__range_s": ("3600",),
    "__range_ms": ("3600000",),
    "__auto_interval": ("15s",),
}
_VAR = re.compile(r"\$\{(?P<a>\w+)(?::(?P<fmt>\w+))?\}|\[\[(?P<b>\w+)\]\]|\$(?P<c>\w+)")


def variables_in(expr: str) -> list[str]:
    return sorted({m["a"] or m["b"] or m["c"] for m in _VAR.finditer(expr)})


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name = match["a"] or match["b"] or match["c"]
        if name not in values:
            raise KeyError(f"dashboard variable ${name} has no value in the test")
        return values[name]

    return _VAR.sub(one, expr)


def substitutions(expr: str, choices: dict[str, tuple[str, ...]]) -> Iterator[dict[str, str]]:
    """Every combination of the choices of the variables ``expr`` uses."""
    names = variables_in(expr)
    missing = [n for n in names if n not in choices]
    if missing:
        raise KeyError(f"{expr!r} uses variables the test cannot fill: {missing}")
    combos: list[dict[str, str]] = [{}]
    for name in names:
        combos = [{**c, name: v} for c in combos for v in choices[name]]
    yield from combos


def legend_labels(legend: str) -> list[str]:
    return re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
