"""Helpers of tests/test_prometheus_e2e.py: a real ``session-router serve`` subprocess, a real
Prometheus server on loopback scraping it (with the repo's scrape job and alert rules), a small
client of Prometheus's HTTP API, and the queries of the Grafana dashboard with its variables
substituted the way Grafana does.

Nothing here is mocked: the serve process is the console script's code (``python -m router.ops.cli
serve``), Prometheus is Debian's ``/usr/bin/prometheus`` (installed by .ci/install-system.sh).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "session-router.json"
JOB = "session-router"
INSTALL_HINT = "run .ci/install-system.sh (it installs Debian's prometheus package)"

# Loopback only, whatever proxy the environment names.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require_tool(name: str) -> str:
    """The path of ``name`` on PATH; fails the test (never skips) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {INSTALL_HINT}", pytrace=False)
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 10.0) -> bytes:
    with _HTTP.open(url, timeout=timeout) as response:
        return response.read()


def tail(path: Path, chars: int = 6000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return text[-chars:]


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group ``proc`` leads (it was started in its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# ----- session-router serve -----------------------------------------------------------------


@dataclass
class ServeProcess:
    """``python -m router.ops.cli serve ...`` from the repo root; output goes to ``log``."""

    proc: subprocess.Popen
    log: Path
    grpc_address: str
    metrics_url: str
    metrics_port: int

    @classmethod
    def start(cls, log: Path, args: list[str], ready_timeout: float = 120.0) -> ServeProcess:
        grpc_port, metrics_port = free_port(), free_port()
        while metrics_port == grpc_port:
            metrics_port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "router.ops.cli",
            "serve",
            *args,
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
            "--host",
            "127.0.0.1",
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout
        while True:
            text = log.read_text(errors="replace")
            if re.search(r"^session-router: ready\b", text, re.M):
                break
            if proc.poll() is not None:
                raise AssertionError(
                    f"`{' '.join(cmd)}` exited with {proc.returncode} before "
                    f"printing its ready line; its output:\n{tail(log)}"
                )
            if time.monotonic() > deadline:
                _kill_group(proc)
                raise AssertionError(
                    f"`{' '.join(cmd)}` printed no ready line within "
                    f"{ready_timeout:.0f}s; its output:\n{tail(log)}"
                )
            time.sleep(0.2)
        grpc_line = re.search(r"^session-router: gRPC listening on (\S+)$", text, re.M)
        metrics_line = re.search(r"^session-router: metrics on (\S+)$", text, re.M)
        problems = []
        if not grpc_line or not grpc_line.group(1).endswith(f":{grpc_port}"):
            problems.append(f"no 'gRPC listening on HOST:{grpc_port}' line")
        want_url = f"http://127.0.0.1:{metrics_port}/metrics"
        if not metrics_line or metrics_line.group(1) != want_url:
            problems.append(f"no 'metrics on {want_url}' line")
        if problems:
            _kill_group(proc)
            raise AssertionError(f"serve is ready but printed {'; '.join(problems)}:\n{tail(log)}")
        return cls(proc, log, grpc_line.group(1), metrics_line.group(1), metrics_port)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then the exit status within ``timeout`` (None: it had to be killed).
        Anything left in its process group (Ray's processes after a crash) is killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        _kill_group(self.proc)
        return code


# ----- Prometheus -----------------------------------------------------------------------------


class PromError(AssertionError):
    pass


def prometheus_config(metrics_port: int, interval: str = "1s") -> dict:
    """The repo's deploy/prometheus/prometheus.yml, pointed at ``metrics_port`` on loopback, with
    ``interval`` scrapes and rule evaluation, its rule files by absolute path."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config.setdefault("global", {}).update(scrape_interval=interval, evaluation_interval=interval)
    jobs = [job for job in config.get("scrape_configs", []) if job.get("job_name") == JOB]
    assert len(jobs) == 1, f"deploy/prometheus/prometheus.yml has no single job {JOB!r}"
    job = jobs[0]
    job.update(
        scrape_interval=interval,
        scrape_timeout=interval,
        static_configs=[{"targets": [f"127.0.0.1:{metrics_port}"]}],
    )
    rules = [str((PROMETHEUS_DIR / path).resolve()) for path in config.get("rule_files", [])]
    alerts = str((PROMETHEUS_DIR / "alerts.yml").resolve())
    if alerts not in rules:
        rules.append(alerts)
    config["rule_files"] = rules
    return config


@dataclass
class Prometheus:
    proc: subprocess.Popen
    log: Path
    url: str

    @classmethod
    def start(cls, workdir: Path, metrics_port: int, ready_timeout: float = 60.0) -> Prometheus:
        binary = require_tool("prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(metrics_port), sort_keys=False))
        log = workdir / "prometheus.log"
        port = free_port()
        cmd = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        server = cls(proc, log, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited with {proc.returncode}; its log:\n"
                    f"{tail(log)}\nconfig:\n{config.read_text()}"
                )
            try:
                http_get(f"{server.url}/-/ready", timeout=2)
                return server
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise AssertionError(
                    f"prometheus not ready within {ready_timeout:.0f}s; its log:\n{tail(log)}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc)

    def api(self, path: str, **params) -> object:
        """GET /api/v1/<path>; the ``data`` of a successful answer, PromError otherwise."""
        query = urllib.parse.urlencode(params, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            body = http_get(url)
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = exc.read()
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise PromError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result as a list of series (scalars become one series)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        if data["resultType"] == "matrix":  # a range selector on its own
            return [{"metric": s["metric"], "value": s["values"][-1]} for s in data["result"]]
        return data["result"]

    def scalar(self, expr: str) -> float | None:
        """The single value of ``expr`` (None when it returns nothing)."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"{expr} returned {len(result)} series: {result}"
        return float(result[0]["value"][1])

    def wait_value(
        self, expr: str, want: float, timeout: float = 15.0, check: Callable[[], None] | None = None
    ) -> float:
        """Poll ``expr`` until it equals ``want``; ``check`` runs on every poll."""
        deadline = time.monotonic() + timeout
        while True:
            if check is not None:
                check()
            value = self.scalar(expr)
            if value == want:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr} is {value}, not {want}, after {timeout:.0f}s")
            time.sleep(0.25)


def has_data(result: list[dict]) -> bool:
    """At least one series with a real number (histogram_quantile of nothing gives NaN)."""
    return any(not math.isnan(float(series["value"][1])) for series in result)


# ----- the Grafana dashboard ------------------------------------------------------------------


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
