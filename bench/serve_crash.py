"""How long sessions wait when ``serve`` crashes: on a ``ray start --head`` cluster, ``serve
--address`` holds 8 sessions (one turn each); it is SIGKILLed and a new ``serve --address`` is
started at once; measured, for each session, from the kill to its next turn's end through the new
serve (a client retrying every 0.2 s). Side by side in each repetition: the time the new serve
took to print ready, the part of the wait no serve could have shortened.

Every process is a subprocess started as a user starts it (the console script's code, a fresh
shell's environment). Run: ``python -m bench.serve_crash [--quick]``; figures in seconds, p50 and
max over the sessions of each repetition (median over repetitions).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.harness import cli
from bench.harness.report import Table
from router.client import SessionClient

ROOT = Path(__file__).resolve().parents[1]
SESSIONS, NAMESPACE = 8, "serve-crash-bench"
READY = re.compile(r"^session-router: gRPC listening on (127\.0\.0\.1:\d+)$", re.M)


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "HOME": str(home), "PYTHONUNBUFFERED": "1"}


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def wait_for(proc: subprocess.Popen, log: Path, pattern: re.Pattern, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not (found := pattern.search(log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[:4]} not ready:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return found[1] if found.groups() else found[0]


def serve(address: str, log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "router.ops.cli", "serve", "--address", address]
    args += ["--namespace", NAMESPACE, "--replicas", "1", "--max-sessions", "16"]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--http-port", "0"]
    proc = start(args, log, env)
    return proc, wait_for(proc, log, READY, 300)


def turn(address: str, session_id: str, timeout: float = 5.0) -> None:
    with SessionClient(address) as client:
        for _ in client.generate(session_id, tokens=[5, 6], max_new_tokens=2, timeout=timeout):
            pass


def crash_and_recover(address: str, current: subprocess.Popen, sessions: list[str], work: Path,
                      env: dict[str, str], n: int) -> tuple[subprocess.Popen, str, list[float],
                                                            float]:  # fmt: skip
    """SIGKILL ``current``, start the next serve: (it, its gRPC address, each session's wait,
    the new serve's start-up)."""
    os.killpg(current.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc, grpc_address = serve(address, work / f"serve-{n}.log", env)
    ready = time.monotonic() - killed
    return proc, grpc_address, served_again(grpc_address, sessions, killed), ready


def open_sessions(grpc_address: str, count: int) -> list[str]:
    """``count`` sessions through ``grpc_address``, one turn each."""
    with SessionClient(grpc_address) as client:
        sessions = [client.open(timeout=60).id for _ in range(count)]
    for sid in sessions:
        turn(grpc_address, sid, 60)
    return sessions


def served_again(grpc_address: str, sessions: list[str], since: float) -> list[float]:
    """Seconds from ``since`` to each session's next turn's end, turns retried every 0.2 s."""
    waits = []
    for sid in sessions:
        while True:
            try:
                turn(grpc_address, sid)
                break
            except grpc.RpcError:
                time.sleep(0.2)
        waits.append(time.monotonic() - since)
    return waits


def print_waits(what: str, rows: list[tuple[float, float, float]], ready_is: str) -> None:
    """The table of (p50, max, new serve ready) per repetition, and their medians."""
    table = Table("repetition", "served again p50 (s)", "max (s)", "new serve ready (s)")
    for i, (p50, most, ready) in enumerate(rows, 1):
        table.add(i, f"{p50:.1f}", f"{most:.1f}", f"{ready:.1f}")
    table.print()
    p50 = statistics.median(r[0] for r in rows)
    most = statistics.median(r[1] for r in rows)
    ready = statistics.median(r[2] for r in rows)
    print(
        f"\n{what} -> every session served again: p50 {p50:.1f} s, max {most:.1f} s "
        f"({ready_is.format(ready=ready)}: {most / ready:.2f}x of it)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = cli.parse(cli.parser(__doc__))
    work = Path(tempfile.mkdtemp(prefix="serve-crash-"))
    env, port = user_env(work), free_port()
    ray = str(Path(sys.executable).parent / "ray")
    head = start([ray, "start", "--head", "--block", f"--port={port}",
                  "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
                  "--disable-usage-stats"], work / "ray.log", env)  # fmt: skip
    address = f"127.0.0.1:{port}"
    rows = []
    try:
        wait_for(head, work / "ray.log", re.compile("Ray runtime started"), 120)
        current, grpc_address = serve(address, work / "serve-0.log", env)
        sessions = open_sessions(grpc_address, SESSIONS)
        for n in range(1, args.repeats + 1):
            current, grpc_address, waits, ready = crash_and_recover(
                address, current, sessions, work, env, n
            )
            rows.append((statistics.median(waits), max(waits), ready))
        current.send_signal(signal.SIGTERM)  # a clean stop: sessions released, actors removed
        current.wait(120)
    finally:
        os.killpg(head.pid, signal.SIGKILL)
    print_waits("serve crash", rows, "new serve ready after {ready:.1f} s")


if __name__ == "__main__":
    main()
