"""How every command reaches Ray: an embedded local instance, or a running cluster it joins.

Ray reads two settings once, when it is imported: its token mode (``RAY_AUTH_MODE``) and whether
a node may live on loopback only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``: unset on Linux, Ray
rewrites 127.0.0.1 to the machine's address and binds every port to all interfaces). Set after
the import they are ignored, so ``prepare(address)`` runs before anything imports ``ray`` (the
command line calls it first), and ``connect`` then checks, before ``ray.init``, that the cluster
answers and takes the token, so that a wrong or missing token ends at once with a message instead
of Ray's endless retries.

- Embedded (``address`` None): always a new local instance (``ray.init(address="local")``, never a
  cluster found in Ray's current-cluster file), every Ray process on 127.0.0.1; token mode on
  (Ray's default for the clusters it starts).
- Joined: token mode is on when a token is at hand (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
  ``~/.ray/auth_token``) and ``RAY_AUTH_MODE`` does not say otherwise; a loopback address keeps
  this process on loopback too (a loopback-only cluster does not listen on the machine's address).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc

AUTH_MODE = "RAY_AUTH_MODE"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
LOOPBACK_NODE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": the node's address is 127.0.0.1
PROBE_TIMEOUT_S = 10.0
# The cheapest GCS call there is; answered UNAUTHENTICATED when the token is missing or wrong.
GCS_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"

log = logging.getLogger(__name__)


class JoinError(Exception):
    """The cluster cannot be joined; the message says why and what to do."""


@dataclass(frozen=True)
class Token:
    value: str
    source: str  # where it was read, for messages


def token_at_hand() -> Token | None:
    """Ray's token, looked up where Ray looks: the variable, the file it names, the default."""
    if value := os.environ.get(TOKEN, "").strip():
        return Token(value, f"${TOKEN}")
    path = Path(os.environ.get(TOKEN_PATH) or Path.home() / ".ray" / "auth_token")
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return Token(value, str(path)) if value else None


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare(address: str | None) -> None:
    """Settle Ray's start-up settings for ``address`` (None: embedded). Call before ``ray`` is
    imported; idempotent; a setting the user made in the environment wins."""
    if "ray" in sys.modules:
        log.debug("ray was imported before its settings were settled; they may not apply")
    target = current_cluster_address() if address == "auto" else address
    if target is None or is_loopback(target):  # "auto": the cluster it names
        os.environ.setdefault(LOOPBACK_NODE, "0")
    if address is not None and AUTH_MODE not in os.environ and token_at_hand():
        os.environ[AUTH_MODE] = "token"


def cluster_record() -> Path:
    """The file where ``ray start`` records the machine's cluster, where Ray keeps it:
    under $RAY_TMPDIR, else (on Linux) $TMPDIR, else /tmp."""
    temp = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None
    )
    return Path(temp or "/tmp") / "ray" / "ray_current_cluster"


def current_cluster_address() -> str | None:
    """What ``address="auto"`` finds: ``RAY_ADDRESS``, else the cluster ``ray start`` recorded."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        return cluster_record().read_text().strip() or None
    except OSError:
        return None


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ``JoinError`` unless the GCS at ``address`` answers and accepts this process's
    token (or needs none)."""
    target = current_cluster_address() if address == "auto" else address
    if target is None:
        raise JoinError(
            "--address auto found no running Ray cluster on this machine (no RAY_ADDRESS, no "
            "cluster recorded by `ray start`): pass the address `session-router serve` printed"
        )
    token = token_at_hand() if os.environ.get(AUTH_MODE, "").lower() == "token" else None
    metadata = [("authorization", f"Bearer {token.value}")] if token else []
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            GCS_PROBE_METHOD, request_serializer=bytes, response_deserializer=bytes
        )
        try:
            call(b"", timeout=timeout_s, metadata=metadata, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise JoinError(refusal(target, exc.code(), token)) from None


def refusal(target: str, code: grpc.StatusCode, token: Token | None) -> str:
    if code == grpc.StatusCode.UNAUTHENTICATED:
        tried = f"the token from {token.source}" if token else "a join without a token"
        return (
            f"the Ray cluster at {target} refused {tried}: it requires its own token. Set "
            f"{TOKEN}=<token> or {TOKEN_PATH}=<file> (on the cluster's head: `ray get-auth-token`;"
            " a local serve keeps it in ~/.ray/auth_token)"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return (
            f"no Ray cluster answers at {target} (waited {PROBE_TIMEOUT_S:g}s): check the address "
            "(the one `session-router serve` printed) and that the cluster is up"
        )
    return f"the Ray cluster at {target} did not answer: {code.name}"


def connect(address: str | None, namespace: str | None, **options) -> None:
    """``ray.init`` for ``address`` (None: a new embedded instance on loopback), once
    ``prepare`` has run; a cluster that cannot be joined raises ``JoinError`` first."""
    if address is not None and not os.environ.get("RAY_USE_TLS"):
        probe(address)
    import ray

    if address is None:
        options = {"_node_ip_address": "127.0.0.1", "dashboard_host": "127.0.0.1", **options}
    ray.init(address=address or "local", namespace=namespace, **options)
