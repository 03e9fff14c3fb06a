"""A real ``session-router serve`` subprocess (``python -m router.ops.cli serve``, the console
script's code) with an embedded Ray, for the end-to-end tests that need the whole process: its
command line, its environment (``SESSION_ROUTER_FAILPOINTS``), its printed addresses, its signals.

It binds ports 0 and the tests read the ports it prints. Everything it starts (Ray's processes
included) lives in its own session, so a test can check that nothing is left after it exits.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from router.client import SessionClient
from router.ops.ray_join import cluster_record

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# Where Ray records "the machine's cluster" (`ray start`'s address, what `--address auto` joins):
# under $TMPDIR, which each xdist worker of the suite sets for itself (tests/conftest.py).
CURRENT_CLUSTER = cluster_record()


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's fresh shell: this one without Ray's variables (the test
    process's own Ray sets some, which a user's terminal would not have)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def tail(path: Path, chars: int = 6000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return text[-chars:]


def session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (its leader and everything it started that stayed in it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


def kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_ready(
    proc: subprocess.Popen, log: Path, ready: Callable[[], T | None], timeout: float, what: object
) -> T:
    """Poll ``ready()`` until it returns a value, which is returned. Fails, and kills what
    ``proc`` started, when ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_session(proc.pid)
            raise AssertionError(
                f"{what} not ready (exit status {proc.poll()}); its output:\n{tail(log)}"
            )
        time.sleep(0.2)
    return value


def spawn(log: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """``session-router serve ARGS`` on ports 0 of 127.0.0.1, its output in ``log``, in a user's
    environment (``user_env``) with ``env`` over it."""
    cmd = [sys.executable, "-m", "router.ops.cli", "serve", *args]
    cmd += ["--grpc-port", "0", "--metrics-port", "0", "--http-port", "0", "--host", "127.0.0.1"]
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=user_env(**(env or {})),
            start_new_session=True,
        )


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    log: Path
    grpc_address: str
    metrics_url: str

    @property
    def metrics_port(self) -> int:
        return int(re.search(r":(\d+)/metrics$", self.metrics_url).group(1))

    @classmethod
    def start(
        cls,
        log: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        ready_timeout: float = 120.0,
    ) -> ServeProcess:
        """Start serve with ``args`` on ports 0 of 127.0.0.1, in a user's environment; returns
        once it prints ready."""
        proc = spawn(log, args, env)
        ready = re.compile(r"^session-router: ready\b", re.M)
        text = wait_ready(
            proc, log, lambda: ready.search(t := log.read_text()) and t, ready_timeout, args
        )
        grpc_line = re.search(r"^session-router: gRPC listening on (127\.0\.0\.1:\d+)$", text, re.M)
        metrics_line = re.search(
            r"^session-router: metrics on (http://127\.0\.0\.1:\d+/metrics)$", text, re.M
        )
        if not grpc_line or not metrics_line or ":0" in grpc_line[1] + metrics_line[1]:
            kill_session(proc.pid)
            raise AssertionError(f"serve is ready but printed no bound addresses:\n{tail(log)}")
        return cls(proc, log, grpc_line[1], metrics_line[1])

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Send ``sig``; the exit status within ``timeout`` (None: it had to be killed). What is
        left of its session afterwards is killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            kill_session(self.proc.pid)


def _finish_reasons(streaming: Iterator) -> list:
    """The finish reasons of the rest of a turn's stream, or [code] when it ends with UNAVAILABLE
    or CANCELLED (a server that stops may cut it off after its grace period)."""
    try:
        return [chunk.finish_reason for chunk in streaming if chunk.finish_reason]
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), exc
        return [exc.code()]


def stop_with_sessions_open(
    serve: ServeProcess, sig: signal.Signals, sessions: int = 2, turn_tokens: int = 400
) -> None:
    """Stop ``serve`` with ``sig`` while ``sessions`` sessions are open and a turn of
    ``turn_tokens`` streams: it exits 0, says it released exactly those sessions, the streaming
    turn ends (it does not hang) and no process it started (Ray's included) is left."""
    with SessionClient(serve.grpc_address) as client:
        opened = [client.open(timeout=30) for _ in range(sessions)]
        streaming = opened[0].generate(tokens=[1, 2, 3], max_new_tokens=turn_tokens, timeout=60)
        next(streaming)
        # read as a client does: a stream nobody reads holds the server's grace period open
        with ThreadPoolExecutor(1) as pool:
            ending = pool.submit(_finish_reasons, streaming)
            serve.proc.send_signal(sig)
            try:
                code = serve.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
            deadline = time.monotonic() + 10  # ray.shutdown() has signalled them; give them time
            while (left := session_pids(serve.proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.2)
            serve.stop()
            # ends: finished within the server's grace period, or cut off with it
            ended = ending.result(timeout=30)
            assert ended, "the streaming turn ended without a last chunk or an error"
    log = tail(serve.log)
    assert code == 0, f"serve did not exit 0 within 30 s of {sig.name} ({code}):\n{log}"
    assert f"stopped; {sessions} sessions released" in log, log
    assert not left, f"processes of serve left after it exited ({sig.name}): {left}"
