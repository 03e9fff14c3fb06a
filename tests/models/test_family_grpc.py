"""Each family served end to end: ``serve --model-path`` on the checkpoint transformers saved (a
local Ray cluster, one replica, loopback gRPC); a session's two turns through the public client
give transformers' greedy ``generate`` tokens, and closing it frees every slot.

The four servers run one after the other on the suite's one local Ray (``ray_cluster``).
"""

from __future__ import annotations

import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient
from tests.models.peers import FAMILIES, conversation
from tests.support.cluster import ServerThread


@pytest.fixture(scope="module", params=FAMILIES)
def served(request, ray_cluster, peer_checkpoint):
    """(family, a running server of its peer checkpoint); one server at a time."""
    name = request.param
    srv = ServerThread(
        model_path=peer_checkpoint(name), replicas=1, max_sessions=2, kv_tokens=1024
    ).start()
    yield name, srv
    srv.stop()


def test_turns_through_grpc_match_generate(served):
    name, server = served
    a, o1, b, o2 = conversation(name)
    with SessionClient(server.address) as client:
        session = client.open()
        assert session.complete(tokens=a, max_new_tokens=10)[::2] == (o1, pb.FINISH_REASON_LENGTH)
        assert session.complete(tokens=b, max_new_tokens=8)[::2] == (o2, pb.FINISH_REASON_LENGTH)
        assert session.close()
    server.wait_at_capacity()
