"""A ``session-router gateway`` as a real process, joined to this process's Ray cluster (the
benchmarks' local cluster, the tests' ``ray_cluster``).

It runs the command line a user runs (``python -m router.ops.cli gateway --address ...``) with
this checkout on its path, on any free ports; ``start`` returns once it prints that it is ready,
with the address it serves gRPC on (``address``) and the base URL of its OpenAI-compatible API
(``http_url``). ``kill`` is SIGKILL (a gateway that dies), ``stop`` SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import ray

ROOT = Path(__file__).resolve().parents[2]
READY = "session-router: ready"


class GatewayProcess:
    def __init__(self, namespace: str, *flags: str) -> None:
        # A user's fresh shell: none of this process's Ray variables (its token mode included).
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        command = [
            *(sys.executable, "-m", "router.ops.cli", "gateway"),
            *("--address", ray.get_runtime_context().gcs_address, "--namespace", namespace),
            *("--grpc-port", "0", "--metrics-port", "0", "--http-port", "0", *flags),
        ]
        self.proc = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.address = ""
        self.http_url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            port = re.search(r"gRPC listening on [^ ]+:(\d+)", line)
            if port:
                self.address = f"127.0.0.1:{port.group(1)}"
            api = re.search(r"OpenAI-compatible API on (https?)://[^ ]+:(\d+)/v1", line)
            if api:
                self.http_url = f"{api.group(1)}://127.0.0.1:{api.group(2)}/v1"
            if line.startswith(READY):
                self._ready.set()
        self._ready.set()  # the process ended

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> GatewayProcess:
        if not self._ready.wait(timeout) or self.proc.poll() is not None or not self.address:
            self.kill()
            raise AssertionError("the gateway did not start:\n" + "\n".join(self.lines))
        return self

    def kill(self) -> None:
        """SIGKILL: the gateway dies without a word to anyone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM, then its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)
