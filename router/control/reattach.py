"""The replicas of a deployment that a controller (or ``stop``) takes over, once its router knows
them all.

A router that Ray has just restarted (its node died: a head restart under GCS fault tolerance)
starts with an empty table and learns its replicas from their next snapshot report (about a
second apart, ``replica.actor.reporting``); until the GCS has noticed that the old node is gone,
its handle may not answer at all. Taking over before then (as a controller Ray restarted after a
head restart does) would miss replicas that are alive and serving, and start others beside them.
So the router is asked again until it knows every replica still named in the namespace, within
``REATTACH_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import ray

from replica.api import ActorError
from router.control.client import RouterClient

log = logging.getLogger(__name__)

REATTACH_TIMEOUT_S = 120.0
REPLICA_NAME = re.compile(r"replica-\d+")


def named_replicas(namespace: str) -> set[str]:
    """The replica actors named in ``namespace`` that Ray has not declared dead."""
    return {
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == namespace and REPLICA_NAME.fullmatch(entry["name"])
    }


async def known_replicas(
    router: Any, namespace: str, timeout_s: float = REATTACH_TIMEOUT_S
) -> dict[str, Any]:
    """The router's replica handles (replica id -> handle) once it knows every named replica of
    ``namespace``; after ``timeout_s`` what it knows then (a warning names the others). Raises
    ``ValueError`` when the router never answered."""
    deadline = time.monotonic() + timeout_s
    while True:
        handles = await RouterClient(router).replica_handles()
        named = await asyncio.to_thread(named_replicas, namespace)
        if not isinstance(handles, ActorError) and named <= set(handles):
            return dict(handles)
        if time.monotonic() > deadline:
            if isinstance(handles, ActorError):
                raise ValueError(f"the deployment's router did not answer: {handles.message}")
            log.warning("replicas the router does not know: %s", sorted(named - set(handles)))
            return dict(handles)
        await asyncio.sleep(0.5)
