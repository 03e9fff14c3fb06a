"""A real Prometheus server on loopback (Debian's ``/usr/bin/prometheus``, installed by
.ci/install-system.sh) scraping a metrics endpoint with the repo's scrape job and alert rules
(deploy/prometheus), and a small client of its HTTP API.

It listens on port 0 of 127.0.0.1 and the tests read the port from its log. Rule files beside the
project's are only ever variants of deploy/prometheus/alerts.yml with shorter ``for:`` durations
(``short_for_rules``): the expressions evaluated are the project's.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.serve_process import kill_session, tail, wait_ready

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
JOB = "session-router"
INSTALL_HINT = "run .ci/install-system.sh (it installs Debian's prometheus package)"
SHORT_FOR = "short_for"  # the label that marks alerts of the short-for variant

# Loopback only, whatever proxy the environment names.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require_tool(name: str) -> str:
    """The path of ``name`` on PATH; fails the test (never skips) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {INSTALL_HINT}", pytrace=False)
    return path


def http_get(url: str, timeout: float = 10.0) -> bytes:
    with _HTTP.open(url, timeout=timeout) as response:
        return response.read()


class PromError(AssertionError):
    pass


def alert_rules() -> dict:
    return yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())


def short_for_rules(for_duration: str = "1s") -> dict:
    """deploy/prometheus/alerts.yml with every ``for:`` set to ``for_duration`` and a label
    ``short_for="true"`` on every alert; expressions, names and other labels unchanged. Only for
    seeing an alert fire without waiting minutes."""
    rules = copy.deepcopy(alert_rules())
    for group in rules["groups"]:
        group["name"] += "-short-for"
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = for_duration
                rule.setdefault("labels", {})[SHORT_FOR] = "true"
    return rules


def prometheus_config(metrics_port: int, extra_rule_files: list[Path], interval: str = "1s"):
    """The repo's deploy/prometheus/prometheus.yml, pointed at ``metrics_port`` on loopback, with
    ``interval`` scrapes and rule evaluation, its rule files by absolute path."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config.setdefault("global", {}).update(scrape_interval=interval, evaluation_interval=interval)
    jobs = [job for job in config.get("scrape_configs", []) if job.get("job_name") == JOB]
    assert len(jobs) == 1, f"deploy/prometheus/prometheus.yml has no single job {JOB!r}"
    jobs[0].update(
        scrape_interval=interval,
        scrape_timeout=interval,
        static_configs=[
            {**static, "targets": [f"127.0.0.1:{metrics_port}"]}
            for static in jobs[0].get("static_configs", [{}])
        ],
    )
    rules = [str((PROMETHEUS_DIR / path).resolve()) for path in config.get("rule_files", [])]
    alerts = str((PROMETHEUS_DIR / "alerts.yml").resolve())
    if alerts not in rules:
        rules.append(alerts)
    config["rule_files"] = rules + [str(path) for path in extra_rule_files]
    return config


@dataclass
class Prometheus:
    proc: subprocess.Popen
    log: Path
    url: str

    @classmethod
    def start(
        cls, workdir: Path, metrics_port: int, short_for: bool = False, ready_timeout: float = 60
    ) -> Prometheus:
        """Prometheus scraping ``127.0.0.1:metrics_port`` every second with the project's
        alert rules (and their short-for variant when ``short_for``)."""
        binary = require_tool("prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        extra = []
        if short_for:
            extra.append(workdir / "alerts-short-for.yml")
            extra[0].write_text(yaml.safe_dump(short_for_rules(), sort_keys=False))
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(metrics_port, extra), sort_keys=False))
        log = workdir / "prometheus.log"
        cmd = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            "--web.listen-address=127.0.0.1:0",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

        def ready() -> Prometheus | None:
            listening = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', tail(log))
            if listening:
                try:
                    http_get(f"http://{listening[1]}/-/ready", timeout=2)
                    return cls(proc, log, f"http://{listening[1]}")
                except (urllib.error.URLError, OSError):
                    pass
            return None

        return wait_ready(proc, log, ready, ready_timeout, f"prometheus ({config})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        kill_session(self.proc.pid)

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

    def alerts(self, name: str, short_for: bool = False, **labels: str) -> list[dict]:
        """Active (pending or firing) alerts called ``name`` whose labels include ``labels``,
        of the project's rules (or of their short-for variant when ``short_for``)."""
        return [
            alert
            for alert in self.api("alerts")["alerts"]
            if alert["labels"].get("alertname") == name
            and (alert["labels"].get(SHORT_FOR) == "true") == short_for
            and all(alert["labels"].get(k) == v for k, v in labels.items())
        ]

    def wait_alert(
        self,
        name: str,
        states: set[str],
        value: float | None = None,
        timeout: float = 30.0,
        short_for: bool = False,
        **labels: str,
    ) -> dict:
        """Poll until one alert ``name`` with ``labels`` is in one of ``states`` (with ``value``
        when given); returns it."""
        deadline = time.monotonic() + timeout
        while True:
            found = [
                a
                for a in self.alerts(name, short_for, **labels)
                if a["state"] in states and (value is None or float(a["value"]) == value)
            ]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {name} alert {labels} in {states} (value {value}) after {timeout:.0f}s; "
                    f"active alerts: "
                    f"{self.api('alerts')['alerts']}"
                )
            time.sleep(0.25)


def has_data(result: list[dict]) -> bool:
    """At least one series with a real number (histogram_quantile of nothing gives NaN)."""
    return any(not math.isnan(float(series["value"][1])) for series in result)
