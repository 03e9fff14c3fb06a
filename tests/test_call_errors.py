"""``router.call_errors`` on the exceptions real Ray actors produce: an actor that raises (an
application error, even when what it raised is another actor's death), an actor killed with
``ray.kill`` (dead), an actor whose process is killed while it restarts (transient, retried), and
an actor that cannot fetch an object whose owner died (the owner is to blame, not the fetcher)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

import pytest
import ray
from prometheus_client import generate_latest
from ray import exceptions as rex

from replica.api import StatusCode
from router.call_errors import CallFailure, FailureKind, classify, object_lost, retrying
from router.gateway.metrics import build_registry
from tests.support.metrics import cluster_views, parse_samples, select


@ray.remote(num_cpus=0)
class Callee:
    def __init__(self) -> None:
        self.calls = 0

    def pid(self) -> int:
        return os.getpid()

    def count(self) -> int:
        self.calls += 1
        return self.calls

    async def slow(self) -> int:
        await asyncio.sleep(60)
        return 0

    def fail(self) -> None:
        raise ValueError("a bug in the callee")

    def call_dead(self, other) -> None:
        ray.get(other.count.remote())  # ``other`` is dead: its ActorDiedError is raised here

    def make_object(self) -> list:
        return [ray.put(b"x" * 200_000)]  # owned by this actor: lost when it dies

    async def fetch(self, refs: list) -> int:
        return len(await refs[0])


def caught(ref) -> BaseException:
    try:
        ray.get(ref, timeout=60)
    except Exception as exc:  # noqa: BLE001 - the exception under test
        return exc
    raise AssertionError("the call did not fail")


def dead_error(actor) -> BaseException:
    """What a call to ``actor`` raises once its kill (asynchronous) has landed."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.count.remote(), timeout=30)
        except Exception as exc:  # noqa: BLE001 - the exception under test
            return exc
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_an_actor_that_raises_is_an_application_error(ray_cluster):
    callee = Callee.remote()
    exc = caught(callee.fail.remote())
    assert isinstance(exc, rex.RayTaskError) and isinstance(exc, ValueError)
    assert classify(exc) is FailureKind.APPLICATION
    assert not object_lost(exc)
    failure = CallFailure.of("fail", "replica r1", exc)
    assert failure.status() == StatusCode.INTERNAL
    assert "ValueError: a bug in the callee" in failure.message()
    assert "retry" in failure.message() and "replica r1" in failure.message()
    assert ray.get(callee.count.remote(), timeout=30) == 1  # alive and well
    ray.kill(callee)


def test_a_killed_actor_is_dead_and_a_callee_raising_its_death_is_not(ray_cluster):
    victim, middle = Callee.remote(), Callee.remote()
    ray.get(victim.count.remote(), timeout=60)
    ray.kill(victim, no_restart=True)
    exc = dead_error(victim)
    assert isinstance(exc, rex.ActorDiedError)
    assert classify(exc) is FailureKind.DEAD
    assert CallFailure.of("count", "replica r2", exc).status() == StatusCode.UNAVAILABLE
    relayed = caught(middle.call_dead.remote(victim))
    assert isinstance(relayed, rex.RayTaskError) and isinstance(relayed, rex.ActorDiedError)
    assert classify(relayed) is FailureKind.APPLICATION  # ``middle`` raised; it lives
    assert ray.get(middle.count.remote(), timeout=30) == 1
    ray.kill(middle)


def test_an_object_whose_owner_died_blames_the_owner(ray_cluster):
    owner, fetcher = Callee.remote(), Callee.remote()
    refs = ray.get(owner.make_object.remote(), timeout=60)
    ray.kill(owner, no_restart=True)
    time.sleep(1.0)  # the owner's death reaches the fetcher's side
    exc = caught(fetcher.fetch.remote(refs))
    assert isinstance(exc, rex.RayTaskError)
    assert object_lost(exc), exc
    assert classify(exc) is FailureKind.APPLICATION  # the fetcher raised; it is not dead
    assert ray.get(fetcher.count.remote(), timeout=30) == 1
    ray.kill(fetcher)


def test_a_restarting_actor_is_transient_and_retried(ray_cluster):
    """The actor's process is killed under a call; Ray restarts it. The call in flight fails
    ``ActorUnavailableError`` (transient); ``retrying`` makes it again, and the restarted actor
    answers."""
    callee = Callee.options(max_restarts=1, max_task_retries=0).remote()
    pid = ray.get(callee.pid.remote(), timeout=60)
    in_flight = [callee.slow.remote()]  # in flight when the process is killed
    seen: list[BaseException] = []

    async def call() -> int:
        try:
            return await (in_flight.pop() if in_flight else callee.count.remote())
        except Exception as exc:
            seen.append(exc)
            raise

    async def retried() -> int:
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        return await retrying(call, time.monotonic() + 60)

    assert asyncio.run(retried()) == 1  # from the restarted actor, fresh
    assert seen and isinstance(seen[0], rex.ActorUnavailableError), seen
    assert {classify(exc) for exc in seen} == {FailureKind.TRANSIENT}
    assert CallFailure.of("slow", "replica r3", seen[0]).status() == StatusCode.UNAVAILABLE
    assert ray.get(callee.pid.remote(), timeout=30) != pid
    ray.kill(callee)


def test_retrying_gives_up_on_anything_but_transient(ray_cluster):
    callee = Callee.remote()
    attempts = []

    async def fail() -> None:
        attempts.append(1)
        await callee.fail.remote()

    with pytest.raises(rex.RayTaskError):
        asyncio.run(retrying(fail))
    assert len(attempts) == 1  # an application error is not made again
    ray.kill(callee)


def test_both_families_are_exported():
    """The gateway's counts and the router's (from its views) on one /metrics exposition."""
    view = dataclasses.replace(
        cluster_views()[0], call_errors={("import_sessions", "application"): 2}
    )
    registry, gateway = build_registry(lambda: [view])
    gateway.replica_call_failed("submit_turns", FailureKind.APPLICATION.value)
    gateway.replica_call_failed("submit_turns", FailureKind.APPLICATION.value)
    gateway.replica_call_failed("get_session", FailureKind.DEAD.value)
    samples = parse_samples(generate_latest(registry).decode())
    gateway_errors = "session_router_replica_call_errors_total"
    assert select(samples, gateway_errors, method="submit_turns", kind="application") == [2]
    assert select(samples, gateway_errors, method="get_session", kind="dead") == [1]
    router_errors = "session_router_router_call_errors_total"
    assert select(samples, router_errors, replica=view.replica_id, method="import_sessions") == [2]
