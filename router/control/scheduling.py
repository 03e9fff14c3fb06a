"""What a replica asks Ray for, and why a replica is not up yet.

CPU replicas ask for a share of the cluster's CPUs, so that ``--replicas`` of them plus one
replacement fit whatever the core count (``serve --replicas 4`` on 2 cores: 0.4 CPU each); GPU
replicas ask for ``--replica-gpus``. Start-up never waits silently: replicas that cannot be
scheduled are reported after ``WARN_AFTER_S`` with what they asked for and what the cluster has,
and start-up fails with that report when ``--replica-start-timeout-s`` passes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from typing import Any

import ray

log = logging.getLogger(__name__)

WARN_AFTER_S = 10.0


class ReplicaStartError(RuntimeError):
    """Replicas did not come up in time; the message says what they asked for and what the
    cluster has."""


def replica_resources(replica_gpus: float, replicas: int) -> dict[str, float]:
    """``num_cpus``/``num_gpus`` of one replica actor."""
    if replica_gpus:
        return {"CPU": 0.0, "GPU": replica_gpus}
    cpus = ray.cluster_resources().get("CPU", 1.0)
    share = math.floor(100 * cpus / (replicas + 1)) / 100  # room for one replacement
    return {"CPU": max(0.01, min(1.0, share)), "GPU": 0.0}


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in resources.items() if amount) or "none"


def fits_free(ask: Mapping[str, float]) -> bool:
    """Whether one more replica with ``ask`` fits what the cluster has free now."""
    free = ray.available_resources()
    return all(free.get(name, 0.0) >= amount for name, amount in ask.items() if amount)


def start_report(pending: list[str], ask: Mapping[str, float], waited_s: float) -> str:
    """Why ``pending`` replicas are not up: their ask against the cluster's total and free."""
    total, free = ray.cluster_resources(), ray.available_resources()
    has = ", ".join(
        f"{name} {total.get(name, 0.0):g} ({free.get(name, 0.0):g} free)"
        for name, amount in ask.items()
        if amount
    )
    why = (
        "they fit the free resources, so they are still starting (loading the model?)"
        if fits_free(ask)
        else "they cannot be scheduled: lower --replicas or --replica-gpus, or add nodes"
    )
    return (
        f"{len(pending)} replica(s) not up after {waited_s:.0f} s ({', '.join(pending)}): each "
        f"asks Ray for {_amounts(ask)}; the cluster has {has or 'nothing of that'}; {why}"
    )


def died_why(error: BaseException) -> str:
    """The last line of an actor's death: for an exception in ``__init__`` (the model would not
    load, say) its type and message, without the module path."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    last = lines[-1] if lines else type(error).__name__
    kind, sep, message = last.partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}: {message}" if sep and " " not in kind else last


async def wait_until_up(
    calls: Mapping[str, Any], ask: Mapping[str, float], timeout_s: float
) -> dict[str, Any]:
    """Await each replica's first call (``calls``: replica id -> its awaitable). Warns with a
    report once replicas that cannot be scheduled have waited ``WARN_AFTER_S`` (any replica,
    after three times that), and raises ``ReplicaStartError`` after ``timeout_s``, or at once
    when a replica dies starting (its ``__init__`` raised: the message says what)."""
    tasks = {asyncio.ensure_future(ref): rid for rid, ref in calls.items()}
    loop = asyncio.get_running_loop()
    started, pending, warned = loop.time(), set(tasks), False
    while pending:
        done, pending = await asyncio.wait(pending, timeout=min(1.0, timeout_s))
        for task in done:
            if isinstance(error := task.exception(), ray.exceptions.RayActorError):
                for other in pending:
                    other.cancel()
                raise ReplicaStartError(f"{tasks[task]} did not start: {died_why(error)}")
        waited = loop.time() - started
        if not pending:
            break
        late = sorted(tasks[t] for t in pending)
        if waited >= timeout_s:
            for task in pending:
                task.cancel()
            raise ReplicaStartError(start_report(late, ask, waited))
        if (
            not warned
            and waited >= WARN_AFTER_S
            and (waited >= 3 * WARN_AFTER_S or not fits_free(ask))
        ):
            warned = True
            log.warning("session-router: %s", start_report(late, ask, waited))
    return {rid: task.result() for task, rid in tasks.items()}
