"""The deployment belongs to the cluster, not to the ``serve`` that made it: on a ``ray start
--head`` cluster, a ``serve`` killed with SIGKILL leaves its router, controller, replicas and
stores running (detached actors); while no serve runs, the controller still replaces a replica
that dies (its sessions fail over to the replacement); the next ``serve --address`` attaches to
them and every session continues exactly where it was (transformers' greedy tokens on the same
sequence). A serve that asks for
another model is refused, saying what differs; one whose added replica cannot start exits
without touching the deployment. A clean SIGTERM, and ``session-router stop`` after
a crash, leave no actor in the namespace. Run as a user runs them: console scripts in
subprocesses with a fresh shell's environment."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from router.client import SessionClient
from router.control.api import CONTROLLER_NAME, ROUTER_NAME
from router.control.response_store import RESPONSES_NAME
from tests.support.bpe_peer import save_bpe_peer
from tests.support.cluster import drain_stream, wait_for
from tests.support.hf_peer import hf_greedy
from tests.support.serve_process import (
    CURRENT_CLUSTER,
    REPO,
    ServeProcess,
    kill_session,
    spawn,
    tail,
    user_env,
    wait_ready,
)

BIN = Path(sys.executable).parent
NAMESPACE = "durable-test"
NAMES = [ROUTER_NAME, CONTROLLER_NAME, "replica-0", "replica-0-checkpoints", RESPONSES_NAME]
# a replacement of replica-0 takes the next id the controller has not used (replica-1 went to
# a start that failed)
REPLACED = [ROUTER_NAME, CONTROLLER_NAME, "replica-2", "replica-2-checkpoints", RESPONSES_NAME]
CHECK = """
import json, sys
from router.ops import ray_join
ray_join.prepare(sys.argv[1])  # before Ray is imported, as every command does
import ray
ray_join.connect(sys.argv[1], sys.argv[2], logging_level="ERROR", log_to_driver=False)
alive = []
for name in sys.argv[3:]:
    try:
        ray.get_actor(name)
        alive.append(name)
    except ValueError:
        pass
print(json.dumps(alive))
"""
PID = """
import json, os, sys
from router.ops import ray_join
ray_join.prepare(sys.argv[1])
import ray
ray_join.connect(sys.argv[1], sys.argv[2], logging_level="ERROR", log_to_driver=False)
actor = ray.get_actor(sys.argv[3])
print(json.dumps(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A ``ray start --head`` cluster on loopback (no token: the operator's choice here)."""
    home = tmp_path_factory.mktemp("operator")
    port, log = free_port(), home / "ray-start.log"
    env = user_env(HOME=str(home), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}",
             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0 and "Ray runtime started" in tail(log)

    wait_ready(proc, log, up, 120, "ray start --head")
    yield home, f"127.0.0.1:{port}"
    kill_session(proc.pid)
    if CURRENT_CLUSTER.is_file() and str(port) in CURRENT_CLUSTER.read_text():
        CURRENT_CLUSTER.unlink()  # the record of a cluster this test started and ended


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("peer")
    hf = save_bpe_peer(path, seed=4)
    return str(path), hf


def serve_args(address: str, model: str) -> list[str]:
    return ["--address", address, "--namespace", NAMESPACE, "--model", model,
            "--replicas", "1", "--max-sessions", "4", "--kv-tokens", "1024",
            "--max-context", "256"]  # fmt: skip


def run_script(head, script: str, *args: str):
    """``script`` run in a fresh Python on the cluster: what it printed last, as JSON."""
    home, address = head
    result = subprocess.run(
        [sys.executable, "-c", script, address, NAMESPACE, *args],
        capture_output=True, text=True, timeout=120, env=user_env(HOME=str(home)), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def alive(head, names=NAMES) -> list[str]:
    return run_script(head, CHECK, *names)


def turn(address: str, session_id: str | None, tokens: list[int]) -> tuple[str, list[int]]:
    with SessionClient(address) as client:
        session_id = session_id or client.open(timeout=60).id
        ids, _, _ = drain_stream(client.generate(session_id, tokens=tokens, max_new_tokens=4,
                                                 timeout=60))[:3]  # fmt: skip
        return session_id, list(ids)


def test_a_crashed_serve_leaves_the_sessions_to_the_next(head, checkpoint, tmp_path):
    home, address = head
    model, hf = checkpoint
    first = ServeProcess.start(tmp_path / "serve-1.log", serve_args(address, model),
                               env={"HOME": str(home)})  # fmt: skip
    sessions = {}
    for prompt in ([5, 6, 7], [9, 10, 11, 12]):
        session_id, out = turn(first.grpc_address, None, prompt)
        assert out == hf_greedy(hf, prompt, 4)
        sessions[session_id] = prompt + out
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    assert set(alive(head)) == set(NAMES), "the crash took actors with it"

    # another model on the same namespace is refused, saying what differs
    refused = spawn(tmp_path / "serve-other.log", serve_args(address, "tiny-bamba"),
                    env={"HOME": str(home)})  # fmt: skip
    assert refused.wait(180) != 0
    assert "already runs a deployment" in tail(tmp_path / "serve-other.log")

    # a serve that attaches, then cannot start the replica it adds (it asks for a GPU the
    # cluster lacks), exits 1 and takes only what it made: the deployment keeps its actors
    failed = spawn(tmp_path / "serve-failed.log",
                   [*serve_args(address, model), "--replicas", "2", "--replica-gpus", "1",
                    "--replica-start-timeout-s", "5"],
                   env={"HOME": str(home)})  # fmt: skip
    assert failed.wait(180) == 1, tail(tmp_path / "serve-failed.log")
    assert "attached to the deployment" in tail(tmp_path / "serve-failed.log")
    assert set(alive(head, [*NAMES, "replica-1"])) == set(NAMES), "a failed start removed actors"

    # with no serve running, a replica dies: the controller replaces it, and the router fails
    # its sessions over to the replacement from their checkpoints
    os.kill(run_script(head, PID, "replica-0"), signal.SIGKILL)
    wait_for(lambda: set(alive(head, [*NAMES, *REPLACED])) == set(REPLACED), 180, 1.0,
             "the controller to replace replica-0 while no serve runs")  # fmt: skip

    second = ServeProcess.start(tmp_path / "serve-2.log", serve_args(address, model),
                                env={"HOME": str(home)})  # fmt: skip
    assert "attached to the deployment" in tail(second.log)
    for session_id, history in sessions.items():
        _, out = turn(second.grpc_address, session_id, [13, 14])
        assert out == hf_greedy(hf, history + [13, 14], 4)
    assert second.stop(signal.SIGTERM, timeout=60) == 0
    assert alive(head, [*NAMES, *REPLACED]) == []


def test_stop_ends_a_deployment_whose_serve_crashed(head, checkpoint, tmp_path):
    home, address = head
    model, _ = checkpoint
    serve = ServeProcess.start(tmp_path / "serve.log", serve_args(address, model),
                               env={"HOME": str(home)})  # fmt: skip
    turn(serve.grpc_address, None, [5, 6, 7])
    serve.proc.send_signal(signal.SIGKILL)
    serve.proc.wait(30)
    result = subprocess.run(
        [str(BIN / "session-router"), "stop", "--address", address, "--namespace", NAMESPACE],
        capture_output=True, text=True, timeout=180, env=user_env(HOME=str(home)), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 session(s) released" in result.stdout
    assert alive(head) == []
    again = subprocess.run(
        [str(BIN / "session-router"), "stop", "--address", address, "--namespace", NAMESPACE],
        capture_output=True, text=True, timeout=180, env=user_env(HOME=str(home)), cwd=REPO,
    )  # fmt: skip
    assert again.returncode == 2 and "no deployment" in again.stderr
