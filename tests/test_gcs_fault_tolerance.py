"""A head restart loses no session (Ray's GCS fault tolerance): a ``ray start --head`` that keeps
its GCS in a real Redis (``RAY_REDIS_ADDRESS``) and offers no CPU, a second node joined to it
that holds the replicas and their checkpoint stores, and ``serve --address``. The head node's
processes (GCS, raylet, serve) are killed and the head is started again on the same Redis and
port; a new ``serve --address`` attaches, and every session continues exactly (transformers'
greedy tokens on its whole history). A clean SIGTERM then leaves no actor. Run as a user runs
them: console scripts in subprocesses with a fresh shell's environment."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.hf_peer import hf_greedy
from tests.support.serve_process import (
    REPO,
    ServeProcess,
    kill_session,
    session_pids,
    tail,
    user_env,
    wait_ready,
)
from tests.test_durable_control_plane import (
    BIN,
    CURRENT_CLUSTER,
    checkpoint,  # noqa: F401 - the fixture
    free_port,
    serve_args,
    turn,
)

pytestmark = pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")

NAMESPACE = "durable-test"  # serve_args's
NAMED = """
import json, sys
from router.ops import ray_join
ray_join.prepare(sys.argv[1])
import ray
ray_join.connect(sys.argv[1], sys.argv[2], logging_level="ERROR", log_to_driver=False)
print(json.dumps(sorted(ray.util.list_named_actors())))
"""


def started(args: list[str], log: Path, env: dict, ready: str, timeout: float = 120):
    """``args`` in a new session with a clean environment, once ``ready`` is in its output."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    wait_ready(proc, log, lambda: ready in tail(log, 100_000), timeout, args[:2])
    return proc


@pytest.fixture
def cluster(tmp_path):
    """Redis, then a head on it (no CPU) and a worker node (2 CPUs); yields a start of the head
    (callable again after its processes were killed), the nodes' ``ray start`` processes, the
    Ray address and the environment."""
    redis_port, port = free_port(), free_port()
    redis = started([shutil.which("redis-server"), "--port", str(redis_port), "--bind",
                     "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                    tmp_path / "redis.log", user_env(), "Ready to accept connections")  # fmt: skip
    # "1": two nodes on one machine (Ray's single-node loopback mode, "0", refuses a second
    # node); the nodes then advertise the machine's address, and the GCS port answers on both
    env = user_env(HOME=str(tmp_path), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1")
    # the same storage namespace on every start of the head: that is what it reloads
    head_env = {**env, "RAY_REDIS_ADDRESS": f"127.0.0.1:{redis_port}",
                "RAY_external_storage_namespace": "gcsft-test"}  # fmt: skip
    common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    procs = {}

    def start_head():
        procs["head"] = started(
            [str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=0",
             "--include-dashboard=false", *common],
            tmp_path / f"head-{len(procs)}.log", head_env, "Ray runtime started", 180,
        )  # fmt: skip

    start_head()
    address = f"127.0.0.1:{port}"
    procs["worker"] = started(
        [str(BIN / "ray"), "start", f"--address={address}", "--num-cpus=2", *common],
        tmp_path / "worker.log",
        env,
        "Ray runtime started",
        180,
    )
    yield start_head, procs, address, env
    for proc in (procs["head"], procs["worker"], redis):
        kill_session(proc.pid)
    if CURRENT_CLUSTER.is_file() and str(port) in CURRENT_CLUSTER.read_text():
        CURRENT_CLUSTER.unlink()  # the record of a cluster this test started and ended


def named_actors(address: str, env: dict) -> list[str]:
    result = subprocess.run([sys.executable, "-c", NAMED, address, NAMESPACE], capture_output=True,
                            text=True, timeout=120, env=env, cwd=REPO)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_head_restart_loses_no_session(cluster, checkpoint, tmp_path):  # noqa: F811
    start_head, procs, address, env = cluster
    model, hf = checkpoint
    args = [*serve_args(address, model), "--replicas", "2"]
    first = ServeProcess.start(tmp_path / "serve-1.log", args, env=env, ready_timeout=240)
    sessions = {}
    for prompt in ([5, 6, 7], [9, 10, 11, 12], [3, 4]):
        session_id, out = turn(first.grpc_address, None, prompt)
        assert out == hf_greedy(hf, prompt, 4)
        sessions[session_id] = prompt + out

    kill_session(first.proc.pid)  # the head node's processes: serve, then GCS and raylet
    kill_session(procs["head"].pid)
    procs["head"].wait(30)
    deadline = time.monotonic() + 30  # the old GCS gone, or the new head refuses its port
    while session_pids(procs["head"].pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    # One machine's artefact: `ray start --head` refuses the port of the cluster it recorded
    # when a local raylet (the worker's) still points at it; a head pod is a machine of its own
    if CURRENT_CLUSTER.is_file() and address.split(":")[1] in CURRENT_CLUSTER.read_text():
        CURRENT_CLUSTER.unlink()
    restarted = time.monotonic()
    start_head()
    second = ServeProcess.start(tmp_path / "serve-2.log", args, env=env, ready_timeout=240)
    assert "attached to the deployment" in tail(second.log)
    for session_id, history in sessions.items():
        _, out = turn(second.grpc_address, session_id, [13, 14])
        assert out == hf_greedy(hf, history + [13, 14], 4)
    print(f"head restart to every session served again: {time.monotonic() - restarted:.1f} s")
    assert second.stop(signal.SIGTERM, timeout=60) == 0
    assert named_actors(address, env) == []
