"""Start-up never waits silently. Issue 8: ``serve --replicas 4`` on a 2-core machine hung
forever: each CPU replica asked Ray for a whole CPU, the third was never scheduled, and start-up
waited on it with no timeout and no message.

Now CPU replicas ask for a share of the cluster's CPUs (this suite's Ray has the machine's cores),
and replicas that cannot be scheduled fail start-up within ``--replica-start-timeout-s`` with what
they asked for and what the cluster has.
"""

from __future__ import annotations

import pytest
import ray

from router.control.reattach import named_replicas
from router.control.scheduling import ReplicaStartError
from tests.support.cluster import ServerThread, drain_stream
from tests.support.servers import grpc_client, serve_cluster


def test_more_cpu_replicas_than_cores_start_and_serve(ray_cluster):
    replicas = 2 * int(ray.cluster_resources()["CPU"])
    with serve_cluster(replicas=replicas, max_sessions=2, replica_start_timeout_s=120) as srv:
        with grpc_client(srv.address) as client:
            sessions = [client.open() for _ in range(replicas)]
            assert {s.replica_id for s in sessions} == set(srv.replicas)
            for s in sessions:
                drain_stream(s.generate(tokens=[1, 2], max_new_tokens=2))
                assert s.close() is True
        srv.wait_at_capacity()


def test_replicas_that_cannot_be_scheduled_are_reported(ray_cluster):
    gpus = ray.cluster_resources().get("GPU", 0.0)
    srv = ServerThread(replica_gpus=gpus + 1, replica_start_timeout_s=3)
    with pytest.raises(ReplicaStartError) as err:
        srv.start()
    message = str(err.value)
    assert f"GPU {gpus + 1:g}" in message  # what each replica asked for
    assert f"the cluster has GPU {gpus:g}" in message  # and what there is
    assert "cannot be scheduled" in message and "--replica-gpus" in message
    # nothing half-started is left holding resources
    assert named_replicas(srv.config.namespace) == set()
