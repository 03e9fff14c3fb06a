"""How long sessions wait when the head node restarts (Ray's GCS fault tolerance): a real Redis
(``redis-server``), a ``ray start --head`` that keeps its GCS there and offers no CPU, a worker
node that holds the replicas and their checkpoint stores, and ``serve --address`` (on the head)
holding 8 sessions (one turn each). Each repetition kills every process of the head node (the
GCS, its raylet, serve: as a head pod dies), starts the head again on the same Redis and port
and a new ``serve --address``; measured, for each session, from the kill to its next turn's end
through the new serve (a client retrying every 0.2 s). Side by side in each repetition: the time
the new serve took to print ready, counted from the head's restart.

Every process is a subprocess started as a user starts it (the console script's code, a fresh
shell's environment). Run: ``python -m bench.head_restart [--quick]``; figures in seconds, p50 and
max over the sessions of each repetition (median over repetitions).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import cli
from bench.serve_crash import (
    free_port,
    open_sessions,
    print_waits,
    served_again,
    start,
    user_env,
    wait_for,
)
from tests.support.serve_process import session_pids

SESSIONS, NAMESPACE = 8, "head-restart-bench"
READY = re.compile(r"^session-router: gRPC listening on (127\.0\.0\.1:\d+)$", re.M)
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")


def serve(address: str, log: Path, env: dict[str, str]) -> tuple[object, str]:
    args = [sys.executable, "-m", "router.ops.cli", "serve", "--address", address]
    args += ["--namespace", NAMESPACE, "--replicas", "2", "--max-sessions", "8"]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--http-port", "0"]
    proc = start(args, log, env)
    return proc, wait_for(proc, log, READY, 300)


def gone(pid: int, timeout: float = 30.0) -> None:
    """Wait until no process of session ``pid`` is left (the old GCS holds the port)."""
    deadline = time.monotonic() + timeout
    while session_pids(pid) and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> None:
    args = cli.parse(cli.parser(__doc__))
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        sys.exit("needs redis-server (Debian: apt-get install redis-server)")
    work = Path(tempfile.mkdtemp(prefix="head-restart-"))
    env = {**user_env(work), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}  # two nodes, one machine
    redis_port, port = free_port(), free_port()
    redis = start([redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(work)], work / "redis.log", env)  # fmt: skip
    head_env = {**env, "RAY_REDIS_ADDRESS": f"127.0.0.1:{redis_port}",
                "RAY_external_storage_namespace": "head-restart-bench"}  # fmt: skip
    ray = str(Path(sys.executable).parent / "ray")
    common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    address = f"127.0.0.1:{port}"

    def start_head(n: int):
        head = start([ray, "start", "--head", f"--port={port}", "--num-cpus=0",
                      "--include-dashboard=false", *common], work / f"head-{n}.log",
                     head_env)  # fmt: skip
        wait_for(head, work / f"head-{n}.log", re.compile("Ray runtime started"), 180)
        return head

    procs = [redis]
    rows = []
    try:
        wait_for(redis, work / "redis.log", re.compile("Ready to accept connections"), 60)
        head = start_head(0)
        procs.append(head)
        worker = start([ray, "start", f"--address={address}", "--num-cpus=2", *common],
                       work / "worker.log", env)  # fmt: skip
        procs.append(worker)
        wait_for(worker, work / "worker.log", re.compile("Ray runtime started"), 180)
        current, grpc_address = serve(address, work / "serve-0.log", env)
        sessions = open_sessions(grpc_address, SESSIONS)
        for n in range(1, args.repeats + 1):
            for proc in (current, head):  # the head node's processes, as a head pod dies
                os.killpg(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            gone(head.pid)
            if CURRENT_CLUSTER.is_file():  # one machine's artefact: a head pod has its own
                CURRENT_CLUSTER.unlink()
            head = start_head(n)
            procs.append(head)
            restarted = time.monotonic()
            current, grpc_address = serve(address, work / f"serve-{n}.log", env)
            ready = time.monotonic() - restarted
            waits = served_again(grpc_address, sessions, killed)
            rows.append((statistics.median(waits), max(waits), ready))
            print(f"repetition {n}: served again p50 {rows[-1][0]:.1f} s, max {rows[-1][1]:.1f} s",
                  flush=True)  # fmt: skip
        current.send_signal(signal.SIGTERM)  # a clean stop: sessions released, actors removed
        current.wait(120)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if CURRENT_CLUSTER.is_file() and str(port) in CURRENT_CLUSTER.read_text():
            CURRENT_CLUSTER.unlink()
    print_waits("head restart", rows, "new serve ready {ready:.1f} s after the head")


if __name__ == "__main__":
    main()
