"""The one way end-to-end tests make a server and its clients: ``serve_cluster(**flags)`` (a
started ``ServerThread`` on the suite's local Ray, stopped on exit) and ``grpc_client(address,
key)`` (a blocking ``SessionClient``, its channel closed on exit).

A module-scoped server is shared by the module's tests, so each test leaves it as it found it:
its sessions closed and every pool back at capacity with nothing leaked (``leave_clean``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from replica import failpoints as replica_failpoints
from router.client import SessionClient
from tests.support.cluster import SETTLE_S, ServerThread


@contextmanager
def serve_cluster(failpoints: str | None = None, **flags) -> Iterator[ServerThread]:
    """A started server with ``flags`` over ``SMALL`` (tests/support/cluster.py), on the
    ``ray_cluster`` fixture's Ray; stopped when the block ends. ``failpoints`` is the
    ``SESSION_ROUTER_FAILPOINTS`` its replicas read at start-up (the variable is set only while
    the server starts)."""
    before = os.environ.get(replica_failpoints.ENV_VAR)
    if failpoints is not None:
        os.environ[replica_failpoints.ENV_VAR] = failpoints
    try:
        server = ServerThread(**flags).start()
    finally:
        if failpoints is not None:
            if before is None:
                del os.environ[replica_failpoints.ENV_VAR]
            else:
                os.environ[replica_failpoints.ENV_VAR] = before
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def grpc_client(
    address: str, key: str | None = None, credentials: grpc.ChannelCredentials | None = None
) -> Iterator[SessionClient]:
    """A blocking client of ``address`` sending ``key`` as its bearer token (none without);
    over TLS with ``credentials``. The channel closes when the block ends."""
    with SessionClient(address, api_key=key, credentials=credentials) as client:
        yield client


def api_keys_file(folder: Path, keys: dict[str, str]) -> str:
    """An ``--api-keys`` file in ``folder``: one ``KEY TENANT [admin]`` line per entry of
    ``keys`` (key -> the rest of its line); returns its path."""
    path = folder / "api-keys"
    path.write_text("# key tenant [admin]\n" + "".join(f"{k} {v}\n" for k, v in keys.items()))
    return str(path)


# The keys of the suite's server with API keys on (``tenants_server`` in tests/conftest.py): two
# tenants and an admin.
ALICE, BOB, ADMIN = "alice-key-0123456789", "bob-key-9876543210", "ops-key-5555555555"
TENANTS = {ALICE: "alice", BOB: "bob", ADMIN: "ops admin"}


def leave_clean(server: ServerThread, timeout: float = SETTLE_S) -> None:
    """What every test of a shared server ends with: no session open on any replica and every
    pool entirely free, nothing leaked (strict snapshots and the replicas' own check)."""
    server.wait_at_capacity(timeout=timeout)
