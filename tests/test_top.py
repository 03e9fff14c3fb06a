"""`session-router top` against a real /metrics endpoint serving ClusterCollector's exposition."""

from __future__ import annotations

import io
import re
import socket

import pytest

from router.gateway.metrics import build_registry, serve_metrics
from router.ops.cli import main as cli_main
from router.ops.pool_table import PoolRow, render
from router.ops.top import CLEAR_SCREEN, fetch_metrics, parse_table, run_top
from tests.support.metrics import cluster_views


@pytest.fixture
def metrics_url():
    registry, gateway = build_registry(cluster_views)
    gateway.observe_rpc("OpenSession", "OK", 0.01)
    server = serve_metrics(0, registry)
    yield server.url
    server.close()


@pytest.fixture
def closed_port_url():
    """A URL nobody answers: its port is bound (so no one else gets it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"


def cells(table: str, starts: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(starts))
    return re.split(r"\s+", line.strip())


def test_parse_table_reads_every_replica(metrics_url):
    rows = {row.replica: row for row in parse_table(fetch_metrics(metrics_url))}
    assert list(rows) == ["replica-a", "replica-b", "replica-c"]
    a, b, c = rows["replica-a"], rows["replica-b"], rows["replica-c"]
    assert (a.state, b.state, c.state) == ("up", "draining", "dead")
    assert (a.sessions, a.parked, a.pinned, a.snapshot_age_s) == (8, 3, 8, 0.25)
    assert [pool.pool for pool in a.pools] == [
        "mamba",
        "kv_tokens",
        "req",
        "host_mamba",
        "host_kv_tokens",
        "checkpoints",
    ]
    assert a.pools[3] == PoolRow("host_mamba", 3, 7, 0, 0, 10, 0)
    assert (a.moving, a.moved, b.moving, b.moved, c.moved) == (0, 1, 2, 3, 5)
    assert b.parked is None  # replica-b does not park
    mamba = a.pools[0]
    assert (
        mamba.session_held,
        mamba.free,
        mamba.in_use,
        mamba.cached,
        mamba.capacity,
        mamba.leaked,
    ) == (8, 6, 2, 0, 16, 0)
    assert b.pools[0].leaked == 2 and b.leaked == 2 and a.leaked == 0
    assert (c.sessions, c.pinned, c.snapshot_age_s, c.pools) == (None, None, None, ())


def test_render_shows_the_numbers_and_marks_leaks(metrics_url):
    table = render(parse_table(fetch_metrics(metrics_url)))
    header = table.splitlines()[0]
    assert header.split() == [
        "REPLICA",
        "STATE",
        "SESSIONS",
        "PARKED",
        "MOVING",
        "MOVED",
        "PINNED",
        "AGE",
        "POOL",
        "HELD",
        "FREE",
        "IN_USE",
        "CACHED",
        "CAPACITY",
        "LEAKED",
    ]
    assert cells(table, "replica-a") == [
        "replica-a",
        "up",
        "8",
        "3",
        "0",
        "1",
        "8",
        "0.2s",
        "mamba",
        "8",
        "6",
        "2",
        "0",
        "16",
        "0",
    ]
    assert cells(table, "replica-b") == [
        "replica-b",
        "draining",
        "5",
        "-",
        "2",
        "3",
        "4",
        "1.5s",
        "mamba",
        "10",
        "4",
        "0",
        "0",
        "16",
        "2",
        "<<",
        "LEAK",
    ]
    assert cells(table, "replica-c")[:2] == ["replica-c", "dead"]
    kv_lines = [line.split() for line in table.splitlines() if "kv_tokens" in line]
    assert kv_lines[0] == ["kv_tokens", "1000", "3000", "96", "0", "4096", "0"]
    host_lines = [line.split() for line in table.splitlines() if "host_kv_tokens" in line]
    assert host_lines == [["host_kv_tokens", "192", "448", "0", "0", "640", "0"]]
    assert table.count("<< LEAK") == 1
    assert "LEAKED SLOTS: 2" in table.splitlines()[-1]
    # columns line up: every line puts POOL at the same offset
    offset = header.index("POOL")
    assert all(
        line[offset:].split()[0]
        in ("mamba", "kv_tokens", "req", "host_mamba", "host_kv_tokens", "checkpoints", "-")
        for line in table.splitlines()[1:-1]
    )


def test_once_mode_prints_the_table(metrics_url, capsys):
    assert cli_main(["top", "--metrics-url", metrics_url, "--once"]) == 0
    printed = capsys.readouterr().out
    assert metrics_url in printed
    assert cells(printed, "replica-a")[8:12] == ["mamba", "8", "6", "2"]
    assert CLEAR_SCREEN not in printed  # not a tty


def test_refreshes_and_clears_screen_on_a_tty(metrics_url):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, naps = Tty(), []
    assert run_top(metrics_url, interval=0.5, iterations=3, out=out, sleep=naps.append) == 0
    assert out.getvalue().count(CLEAR_SCREEN) == 3
    assert out.getvalue().count("replica-b") == 3
    assert naps == [0.5, 0.5]


def test_unreachable_endpoint_is_reported_and_retried(metrics_url, closed_port_url):
    url = closed_port_url
    out = io.StringIO()
    assert run_top(url, interval=0.01, iterations=2, out=out, sleep=lambda _: None) == 1
    text = out.getvalue()
    assert text.count(f"cannot read {url}") == 2
    assert "retrying in 0.01s" in text and "giving up" in text
    # it recovers once the endpoint answers
    urls = iter([url, metrics_url])
    out = io.StringIO()
    fetch = lambda _: fetch_metrics(next(urls))
    assert (
        run_top(url, interval=0.01, iterations=2, out=out, fetch=fetch, sleep=lambda _: None) == 0
    )
    assert "cannot read" in out.getvalue() and "replica-a" in out.getvalue()


def test_once_mode_fails_cleanly_when_unreachable(capsys, closed_port_url):
    assert cli_main(["top", "--metrics-url", closed_port_url, "--once"]) == 1
    assert "cannot read" in capsys.readouterr().out
