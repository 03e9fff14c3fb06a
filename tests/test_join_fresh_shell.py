"""Every documented way to reach a cluster, run as a user runs it: the console scripts in
subprocesses whose environment is a fresh shell's (no ``RAY_*`` variable; a HOME of their own,
where serve's embedded Ray keeps its token), from the clone's root.

- An embedded ``serve`` starts its own Ray even while a ``ray start`` cluster runs on the machine
  (and after it died, its address still in Ray's current-cluster file), says "embedded", and
  every process of it listens on loopback only.
- ``gateway``, ``sessions``, ``restart`` and ``drain --this-node`` join it from another shell with
  the token the user's HOME holds; a wrong or missing token ends at once, saying which token was
  tried and how to give one.
- ``serve --address HOST:PORT`` joins a ``ray start --head`` cluster that requires a token, and
  ``gateway``, ``sessions``, ``restart`` and ``drain`` join it too (by its address and by
  ``auto``).
"""

from __future__ import annotations

import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router.client import SessionClient
from tests.support.cluster import drain_stream
from tests.support.listening import listeners
from tests.support.serve_process import (
    CURRENT_CLUSTER,
    REPO,
    ServeProcess,
    kill_session,
    session_pids,
    tail,
    user_env,
    wait_ready,
)

BIN = Path(sys.executable).parent
SERVE_ARGS = ["--replicas", "1", "--max-sessions", "4", "--kv-tokens", "1024"]


def ray_address(serve: ServeProcess) -> tuple[str, str]:
    """The Ray address serve printed and whether it says embedded or joined."""
    line = re.search(r"Ray at (\S+) \((embedded|joined);", serve.log.read_text())
    assert line, tail(serve.log)
    return line[1], line[2]


def command(
    home: Path, *args: str, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "session-router"), *args],
        cwd=REPO,
        env=user_env(HOME=str(home), **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_turn(address: str, session_id: str | None = None) -> tuple[str, int]:
    """A turn on ``session_id`` (a new session when None) through the gateway at ``address``;
    returns the session and its committed tokens."""
    with SessionClient(address) as client:
        session_id = session_id or client.open(timeout=60).id
        stream = client.generate(session_id, tokens=[3, 4, 5], max_new_tokens=4, timeout=60)
        return session_id, drain_stream(stream)[2]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A ``ray start --head`` cluster on loopback that requires a token (an operator's)."""
    home = tmp_path_factory.mktemp("operator-home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(16))
    port = free_port()
    log = home / "ray-start.log"
    env = user_env(HOME=str(home), RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}"]
            + ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false"]
            + ["--disable-usage-stats"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0 and "Ray runtime started" in tail(log)

    wait_ready(proc, log, up, 120, "ray start --head")
    yield home, f"127.0.0.1:{port}", proc
    kill_session(proc.pid)
    if CURRENT_CLUSTER.is_file() and str(port) in CURRENT_CLUSTER.read_text():
        CURRENT_CLUSTER.unlink()  # the record of a cluster this test started and ended


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("user-home")


@pytest.fixture(scope="module")
def serve(ray_head, home, tmp_path_factory):
    """A default embedded serve, started while the ``ray start`` cluster runs."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    s = ServeProcess.start(log, SERVE_ARGS, env={"HOME": str(home)})
    yield s
    s.stop()


def test_embedded_serve_starts_its_own_ray_on_loopback_only(serve, ray_head):
    address, kind = ray_address(serve)
    assert kind == "embedded"
    assert address.startswith("127.0.0.1:") and address != ray_head[1]
    found = listeners(session_pids(serve.proc.pid))
    ports = {listener.port for listener in found}
    assert int(serve.grpc_address.rsplit(":", 1)[1]) in ports
    assert serve.metrics_port in ports and int(address.rsplit(":", 1)[1]) in ports  # the GCS
    wide = [str(listener) for listener in found if not listener.loopback]
    assert not wide, f"listening beyond loopback: {wide}"
    assert len(found) >= 8, [str(x) for x in found]  # gRPC, metrics, GCS, raylet, workers...


def turn_through_a_gateway(
    home: Path, address: str, session_id: str, committed: int, gcs: str
) -> None:
    """``session-router gateway --address ADDRESS`` from a fresh shell with ``home``: it says it
    joined the cluster at ``gcs`` (what ``auto`` found), the turn it serves continues the session
    (7 tokens more), and it stops with 0 on SIGTERM."""
    proc = subprocess.Popen(
        [str(BIN / "session-router"), "gateway", "--address", address]
        + ["--grpc-port", "0", "--metrics-port", "0", "--http-port", "0"],
        cwd=REPO,
        env=user_env(HOME=str(home)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("session-router: ready"):
                break
        gateway = re.search(r"gRPC listening on (127\.0\.0\.1:\d+)", "".join(lines))
        assert gateway, "".join(lines)
        assert f"joined the cluster at {gcs} " in "".join(lines), "".join(lines)
        assert one_turn(gateway[1], session_id) == (session_id, committed + 7)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines) + proc.stdout.read()
        kill_session(proc.pid)


def test_gateway_joins_from_a_fresh_shell(serve, home):
    address, _ = ray_address(serve)
    session_id, committed = one_turn(serve.grpc_address)
    turn_through_a_gateway(home, address, session_id, committed, gcs=address)


def test_operator_commands_join_from_a_fresh_shell(serve, home):
    address, _ = ray_address(serve)
    session_id, _ = one_turn(serve.grpc_address)
    listed = command(home, "sessions", "--replica", "replica-0", "--address", address)
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^{session_id}\s.*\bok$", listed.stdout, re.M), listed.stdout
    refused = command(home, "restart", "--replica", "replica-0", "--address", address)
    assert refused.returncode == 1 and "holds" in refused.stdout, refused.stdout + refused.stderr
    drained = command(
        home, "drain", "--grpc", serve.grpc_address, "--this-node", "--address", address
    )
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert "replica-0: draining" in drained.stdout
    resumed = command(home, "resume", "--grpc", serve.grpc_address, "--replica", "replica-0")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr


@pytest.mark.parametrize("token", ["wrong", None])
def test_a_refused_token_ends_at_once_and_says_what_to_do(serve, tmp_path, token):
    address, _ = ray_address(serve)
    env = {"RAY_AUTH_TOKEN": secrets.token_hex(16)} if token else {}
    start = time.monotonic()
    # tmp_path: a HOME without serve's token
    ports = ("--grpc-port", "0", "--http-port", "0")
    result = command(tmp_path, "gateway", "--address", address, *ports, **env)
    assert time.monotonic() - start < 60
    assert result.returncode == 1, result.stdout + result.stderr
    tried = "the token from $RAY_AUTH_TOKEN" if token else "a join without a token"
    assert f"refused {tried}" in result.stderr, result.stderr
    assert "RAY_AUTH_TOKEN_PATH" in result.stderr


def test_serve_joins_a_ray_start_cluster_by_its_address(ray_head, tmp_path):
    """On the operator's ``ray start`` cluster, by its address and by ``auto`` (Ray's record of
    the machine's cluster): serve joins, and so do a gateway and the operator commands."""
    operator_home, address, _ = ray_head
    joined = ServeProcess.start(
        tmp_path / "serve.log",
        [*SERVE_ARGS, "--address", address],
        env={"HOME": str(operator_home)},
    )
    try:
        assert ray_address(joined) == (address, "joined")
        session_id, committed = one_turn(joined.grpc_address)
        assert committed == 7
        turn_through_a_gateway(operator_home, "auto", session_id, committed, gcs=address)
        listed = command(operator_home, "sessions", "--replica", "replica-0", "--address", "auto")
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"^{session_id}\s.*\bok$", listed.stdout, re.M), listed.stdout
        refused = command(operator_home, "restart", "--replica", "replica-0", "--address", address)
        assert refused.returncode == 1 and "holds" in refused.stdout, refused.stdout
        drained = command(operator_home, "drain", "--grpc", joined.grpc_address, "--this-node",
                          "--address", address)  # fmt: skip
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "replica-0: draining" in drained.stdout
    finally:
        assert joined.stop() == 0, tail(joined.log)


def test_embedded_serve_ignores_a_dead_cluster_of_the_machine(ray_head, serve, home, tmp_path):
    _, address, head = ray_head
    kill_session(head.pid)  # SIGKILL: its record stays behind
    head.wait(30)
    assert CURRENT_CLUSTER.is_file() and address.split(":")[1] in CURRENT_CLUSTER.read_text()
    start = time.monotonic()
    embedded = ServeProcess.start(tmp_path / "serve.log", SERVE_ARGS, env={"HOME": str(home)})
    try:
        assert time.monotonic() - start < 100
        assert ray_address(embedded)[1] == "embedded"
        assert one_turn(embedded.grpc_address)[1] == 7
    finally:
        assert embedded.stop() == 0, tail(embedded.log)
