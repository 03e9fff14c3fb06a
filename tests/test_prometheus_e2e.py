"""End to end with a real Prometheus: `session-router serve` (embedded Ray, 2 CPU replicas of
tiny-bamba) is scraped every second by Prometheus on loopback, which loads the repo's scrape job
and alert rules (deploy/prometheus). Checks that the pool gauges account for idle sessions
exactly, that the alert rules load and, without a fault, not one expression holds (their
1-second variant stays quiet too), that every query of the Grafana dashboard
(deploy/grafana/session-router.json) evaluates and returns data, and that promtool accepts the
live exposition.

Needs Debian's prometheus package (prometheus and promtool on PATH): run .ci/install-system.sh.
"""

from __future__ import annotations

import signal
import subprocess
import time

import grpc
import pytest

from router.client import SessionClient
from tests.support.grafana import (
    BUILTINS,
    dashboard,
    dashboard_queries,
    legend_labels,
    substitute,
    substitutions,
    variable_promql,
    variables_in,
)
from tests.support.metrics import parse_samples, select
from tests.support.prometheus import (
    PromError,
    Prometheus,
    alert_rules,
    has_data,
    http_get,
    require_tool,
)
from tests.support.serve_process import ServeProcess, stop_with_sessions_open

MAX_SESSIONS = 8
MAX_PARKED = 4  # per replica: the parking panels and the host pools get data
TRACK_BUFFERS = 2
SLOTS_PER_SESSION = 1 + TRACK_BUFFERS
SERVE_ARGS = [
    "--replicas",
    "2",
    "--max-sessions",
    str(MAX_SESSIONS),
    "--mamba-track-buffers",
    str(TRACK_BUFFERS),
    "--kv-tokens",
    "4096",
    "--max-context",
    "512",
    "--max-parked-sessions",
    str(MAX_PARKED),
    # Tests run strict (docs/contract.md, invariants); a short open timeout makes the forced
    # RESOURCE_EXHAUSTED (for the "Opens rejected" panel) cost 1 s instead of 10.
    "--strict",
    "--open-timeout-s",
    "1",
]
HELD = 'sum(session_router_pool_slots{pool="mamba",state="session_held"})'
LEAKED_MAX = "max(session_router_pool_leaked_slots)"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    # Fail (never skip) before the serve start when Prometheus is missing.
    require_tool("prometheus")
    require_tool("promtool")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = ServeProcess.start(log, SERVE_ARGS, ready_timeout=120)
    try:
        yield server
    finally:
        # docs/contract.md, Command line: SIGTERM with sessions open releases them and stops Ray.
        stop_with_sessions_open(server, signal.SIGTERM)


@pytest.fixture(scope="module")
def prom(serve, tmp_path_factory):
    # With the short-for variant too: an expression that holds even for a second shows.
    server = Prometheus.start(
        tmp_path_factory.mktemp("prometheus"), serve.metrics_port, short_for=True
    )
    try:
        # The target is up and the serve process's metrics are in the TSDB.
        server.wait_value(
            f'up{{job="session-router",instance="127.0.0.1:{serve.metrics_port}"}}', 1, timeout=20
        )
        server.wait_value("count(session_router_replica_up)", 2, timeout=20)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(serve):
    with SessionClient(serve.grpc_address) as c:
        yield c


def assert_no_leak(prom: Prometheus) -> None:
    value = prom.scalar(LEAKED_MAX)
    assert value == 0, (
        f"{LEAKED_MAX} is {value}; the pools leak:\n"
        f"{prom.query('session_router_pool_leaked_slots != 0')}"
    )


def alert_names() -> list[str]:
    return [r["alert"] for g in alert_rules()["groups"] for r in g["rules"] if "alert" in r]


def exposed(serve: ServeProcess, name: str, **labels: str) -> float:
    """The sum of ``name`` on serve's /metrics right now."""
    return sum(select(parse_samples(http_get(serve.metrics_url).decode()), name, **labels))


def test_idle_sessions_hold_exact_mamba_slots_and_rules_stay_quiet(serve, prom, client):
    # Other tests of the module may hold sessions (the dashboard's traffic keeps a few open):
    # everything below is counted from what is open now.
    before = exposed(serve, "session_router_sessions")
    closed_before = exposed(serve, "session_router_sessions_released_total", reason="closed")
    prom.wait_value(HELD, before * SLOTS_PER_SESSION, check=lambda: assert_no_leak(prom))

    sessions = [client.open(timeout=30) for _ in range(6)]
    try:
        assert {s.replica_id for s in sessions} == {"replica-0", "replica-1"}
        now = before + 6
        prom.wait_value(HELD, now * SLOTS_PER_SESSION, check=lambda: assert_no_leak(prom))
        prom.wait_value("sum(session_router_sessions_pinned)", now)
        prom.wait_value("sum(session_router_sessions)", now)
        prom.wait_value('sum(session_router_pool_slots{pool="req",state="session_held"})', now)
        assert_no_leak(prom)
    finally:
        closed = [s.close() for s in sessions]
    assert all(closed), f"CloseSession said was_open=False for some: {closed}"
    prom.wait_value(HELD, before * SLOTS_PER_SESSION, check=lambda: assert_no_leak(prom))
    prom.wait_value("sum(session_router_sessions_pinned)", before)
    prom.wait_value("sum(session_router_sessions)", before)
    prom.wait_value(
        'sum(session_router_sessions_released_total{reason="closed"})', closed_before + 6
    )

    # "Throughout": every sample scraped since Prometheus started, not only the polled ones.
    for fn in ("max_over_time", "min_over_time"):
        value = prom.scalar(f"max(abs({fn}(session_router_pool_leaked_slots[10m])))")
        assert value == 0, f"a scrape saw leaked slots ({fn}: {value})"

    # The rule files load: every alert of alerts.yml is there and evaluates without error.
    names = alert_names()
    assert names, "deploy/prometheus/alerts.yml has no alerts"

    def rule_health() -> dict[str, dict]:
        groups = prom.api("rules", type="alert")["groups"]
        return {r["name"]: r for g in groups for r in g["rules"]}

    loaded = rule_health()
    assert sorted(loaded) == sorted(names), f"loaded {sorted(loaded)}, alerts.yml has {names}"
    deadline = time.monotonic() + 10  # health is "unknown" until a rule's first evaluation
    while any(r["health"] != "ok" for r in loaded.values()) and time.monotonic() < deadline:
        time.sleep(0.25)
        loaded = rule_health()
    bad = {n: (r["health"], r.get("lastError")) for n, r in loaded.items() if r["health"] != "ok"}
    assert not bad, f"alert rules not healthy: {bad}"

    # No fault, so no rule's expression holds: not even the 1-second variant is pending.
    active = prom.api("alerts")["alerts"]
    assert not active, f"alerts active without a fault: {active}"


# ----- the Grafana dashboard ----------------------------------------------------------------


QUERIES = dashboard_queries()


@pytest.fixture(scope="module")
def activity(prom, client):
    """Traffic that gives every dashboard series samples: fill the cluster, GPU slots and host
    memory, until OpenSession is refused (open_rejected_total; the sessions opened first are
    parked), close most, run Generate turns on the first ones (restores, TTFT, tokens, RPC
    histograms), and leave those sessions open while the dashboard is queried."""
    opened, refused = [], None
    try:
        for _ in range(4 * MAX_SESSIONS):
            try:
                opened.append(client.open(timeout=30))
            except grpc.RpcError as exc:
                refused = exc
                break
        assert refused is not None, f"{len(opened)} sessions opened and none refused"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert len(opened) == 2 * (MAX_SESSIONS + MAX_PARKED), f"cluster held {len(opened)}"
        keep, extra = opened[:4], opened[4:]
        for session in extra:
            session.close()
        opened = keep
        for turn in range(2):
            for session in keep:
                ids, _, reason = session.complete(
                    f"turn {turn} of {session.id[:8]}", max_new_tokens=8
                )
                assert ids and reason, (turn, session.id, ids, reason)
        prom.wait_value("sum(session_router_sessions_pinned)", len(keep))
        prom.wait_value('sum(session_router_open_rejected_total{reason="no_room"})', 1)
        prom.wait_value("sum(session_router_session_restores_total) >= bool 4", 1)
        yield keep
    finally:
        for session in opened:
            session.close()


@pytest.fixture(scope="module")
def variable_choices(prom, activity) -> dict[str, tuple[str, ...]]:
    """The values each dashboard variable may take: for a query variable, its "All" value, one
    real value and a multi-value regex, from evaluating its query against Prometheus."""
    choices: dict[str, tuple[str, ...]] = dict(BUILTINS)
    for var in dashboard().get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type")
        if kind == "datasource":
            continue  # must not appear in an expression (checked per query)
        if kind == "query":
            query = var.get("query")
            query = query.get("query", "") if isinstance(query, dict) else query
            expr, read = variable_promql(substitute(query, {k: v[0] for k, v in choices.items()}))
            values = read(prom.query(expr))
            assert values, f"variable ${name} ({query}) has no values"
            regex = "(" + "|".join(values) + ")"
            picks = [var.get("allValue") or regex] if var.get("includeAll") else []
            picks.append(values[0])
            if var.get("multi"):
                picks.append(regex)
            choices[name] = tuple(dict.fromkeys(picks))
        elif kind in ("custom", "interval"):
            values = [o["value"] for o in var.get("options", []) if "value" in o]
            values = values or [v.strip() for v in str(var.get("query", "")).split(",")]
            choices[name] = tuple(v for v in values if v)
        else:  # constant, textbox, adhoc
            current = var.get("current", {}).get("value") or var.get("query", "")
            choices[name] = (str(current),)
    return choices


def test_dashboard_has_queries():
    assert len(QUERIES) >= 10, QUERIES
    datasource_vars = {
        v["name"]
        for v in dashboard().get("templating", {}).get("list", [])
        if v.get("type") == "datasource"
    }
    for q in QUERIES:
        assert q.expr.strip(), f"{q.where} has an empty expression"
        used = set(variables_in(q.expr)) & datasource_vars
        assert not used, f"{q.where} uses data source variables in its expression: {used}"


@pytest.mark.parametrize("query", QUERIES, ids=[q.where for q in QUERIES])
def test_dashboard_query_returns_data(prom, activity, variable_choices, query):
    if query.where.startswith("variable "):  # a variable's query may use those before it
        first = {name: values[0] for name, values in variable_choices.items()}
        expr, read = variable_promql(substitute(query.expr, first))
        assert read(prom.query(expr)), f"{query.where}: {query.expr} gives no values"
        return
    combos = list(substitutions(query.expr, variable_choices))
    for values in combos:
        expr = substitute(query.expr, values)
        assert "$" not in expr and "[[" not in expr, f"unsubstituted variable in {expr}"
        deadline = time.monotonic() + 15  # rate() needs two scrapes after the first sample
        while True:
            try:
                result = prom.query(expr)
            except PromError as exc:
                pytest.fail(f"{query.where}: {expr} does not evaluate: {exc}")
            if has_data(result) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert has_data(result), (
            f"{query.where}: {expr} (variables {values}) returned no data: {result}"
        )
        for label in legend_labels(query.legend):
            lacking = [s["metric"] for s in result if label not in s["metric"]]
            assert not lacking, (
                f"{query.where}: legend {query.legend!r} uses {{{{{label}}}}}"
                f" but {expr} returns series without it: {lacking}"
            )


# ----- promtool -------------------------------------------------------------------------------


def test_promtool_check_metrics_on_live_exposition(serve, activity):
    promtool = require_tool("promtool")
    exposition = http_get(serve.metrics_url)
    for family in (
        "session_router_pool_slots",
        "session_router_rpc_requests_total",
        "session_router_time_to_first_token_seconds_bucket",
        "session_router_open_rejected_total",
    ):
        assert family.encode() in exposition, f"{family} missing from {serve.metrics_url}"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60
    )
    assert result.returncode == 0, (
        f"promtool check metrics failed ({result.returncode}) on {serve.metrics_url}:\n"
        f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}"
    )
