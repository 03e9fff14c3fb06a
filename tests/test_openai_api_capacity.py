"""The front door when the cluster cannot serve: no room answers 429 with ``Retry-After``
(after the open's wait), a replica lost mid-turn answers 503 ``replica_lost`` (the client
retries), and neither leaves anything held. The SDK raises its documented classes."""

from __future__ import annotations

import threading
import time

import openai
import pytest
import ray

from tests.support.cluster import wait_for
from tests.support.servers import grpc_client, serve_cluster


@pytest.fixture(scope="module")
def served(ray_cluster):
    with serve_cluster(replicas=1, max_sessions=2, max_parked_sessions=0,
                       open_timeout_s=2.0, max_cached_states=0) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.server.front.http_url, api_key="none", max_retries=0)


def test_no_room_is_429_with_retry_after(served, client):
    with grpc_client(served.address) as held:
        sessions = [held.open(timeout=30) for _ in range(2)]
        try:
            with pytest.raises(openai.RateLimitError) as refused:
                client.completions.create(model="tiny-bamba", prompt="hello", max_tokens=4)
            assert refused.value.response.headers["retry-after"] == "1"
            assert refused.value.code == "no_capacity"
        finally:
            for session in sessions:
                held.close_session(session.id)
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)


def test_a_replica_lost_mid_turn_is_503(served, client):
    caught: list[BaseException] = []

    def long_turn() -> None:
        try:
            client.completions.create(model="tiny-bamba", prompt="hello", max_tokens=400,
                                      extra_body={"ignore_eos": True})  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - read below
            caught.append(exc)

    worker = threading.Thread(target=long_turn)
    worker.start()
    (replica_id,) = served.replicas

    def running() -> bool:
        return served.snapshots([replica_id])[replica_id].running_requests > 0

    wait_for(running, 60, 0.05, "the turn to run")
    ray.kill(served.replicas[replica_id], no_restart=True)
    worker.join(120)
    assert caught and isinstance(caught[0], openai.APIStatusError), caught
    assert caught[0].status_code == 503 and caught[0].code == "replica_lost"
    served.wait_healed()
    time.sleep(1)
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)
    again = client.completions.create(model="tiny-bamba", prompt="hello", max_tokens=4)
    assert again.usage.completion_tokens == 4
