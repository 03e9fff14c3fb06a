"""End to end: every status code of docs/api.md, each produced by the input that should produce it,
each with a message; CloseSession idempotence, GetSession, health and reflection.

The server (``tenants_server``, conftest.py) has API keys on (tenants
alice and bob, and an admin key, from a keys file).
The ABORTED test kills a replica and waits for its replacement, so the tests run in any order.
"""

from __future__ import annotations

import secrets

import grpc
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos import session_router_pb2 as pb
from router.client import SessionClient, generate_request
from tests.support.cluster import drain_stream, rpc_error, wait_for
from tests.support.servers import ADMIN, ALICE, BOB

Code = grpc.StatusCode


@pytest.fixture
def server(tenants_server):
    return tenants_server


@pytest.fixture
def alice(server):
    with SessionClient(server.address, api_key=ALICE) as c:
        yield c


@pytest.fixture
def bob(server):
    with SessionClient(server.address, api_key=BOB) as c:
        yield c


def expect(code: grpc.StatusCode, fn, *args, **kwargs) -> grpc.RpcError:
    err = rpc_error(fn, *args, **kwargs)
    assert err.code() == code, f"expected {code}, got {err.code()}: {err.details()}"
    assert err.details() and err.details().strip(), f"{code} without a message"
    return err


def test_not_found(server, alice):
    unknown = secrets.token_hex(16)
    expect(Code.NOT_FOUND, alice.generate, unknown, tokens=[1, 2, 3], max_new_tokens=2)
    expect(
        Code.NOT_FOUND,
        alice.sessions.GetSession,
        pb.GetSessionRequest(session_id=unknown),
        metadata=alice.metadata,
    )
    s = alice.open()
    drain_stream(s.generate(tokens=[1, 2, 3], max_new_tokens=2))
    assert s.close() is True
    expect(Code.NOT_FOUND, s.generate, tokens=[4, 5], max_new_tokens=2)
    expect(
        Code.NOT_FOUND,
        alice.sessions.GetSession,
        pb.GetSessionRequest(session_id=s.id),
        metadata=alice.metadata,
    )
    server.wait_at_capacity()


def test_invalid_argument(server, alice):
    vocab = 384  # tiny-bamba
    with alice.open() as s:
        expect(Code.INVALID_ARGUMENT, s.generate, tokens=[1, vocab + 10], max_new_tokens=2)
        expect(Code.INVALID_ARGUMENT, s.generate, tokens=[-1], max_new_tokens=2)
        expect(Code.INVALID_ARGUMENT, s.generate, tokens=[1], temperature=-0.5)
        expect(Code.INVALID_ARGUMENT, s.generate, tokens=[1], top_p=1.5)
        expect(Code.INVALID_ARGUMENT, alice.generate, "", tokens=[1], max_new_tokens=2)
        expect(
            Code.INVALID_ARGUMENT,
            alice.sessions.GetSession,
            pb.GetSessionRequest(),
            metadata=alice.metadata,
        )
        expect(
            Code.INVALID_ARGUMENT,
            alice.sessions.OpenSession,
            pb.OpenSessionRequest(idle_timeout_s=-1),
            metadata=alice.metadata,
        )
        no_input = pb.GenerateRequest(session_id=s.id, sampling=pb.SamplingParams(max_new_tokens=2))
        err = expect(
            Code.INVALID_ARGUMENT, alice.sessions.Generate, no_input, metadata=alice.metadata
        )
        assert "give text or tokens" in err.details()
        # none of the refusals touched the session: a valid turn still runs from scratch
        ids, reason, committed = drain_stream(s.generate(tokens=[1, 2], max_new_tokens=3))
        assert len(ids) == 3 and reason == pb.FINISH_REASON_LENGTH and committed == 5
    first = pb.ConverseRequest(input=generate_request(tokens=[1, 2], max_new_tokens=2))
    expect(
        Code.INVALID_ARGUMENT,
        alice.sessions.Converse,
        iter([first]),
        metadata=alice.metadata,
        timeout=30,
    )
    server.wait_at_capacity()


def test_out_of_range(server, alice):
    limit = server.config.replica.pools.max_context
    with alice.open() as s:
        err = expect(Code.OUT_OF_RANGE, s.generate, tokens=[1] * 20, max_new_tokens=limit)
        assert str(limit) in err.details()
        expect(Code.OUT_OF_RANGE, s.generate, tokens=[1] * (limit + 1), max_new_tokens=0)
        _, _, committed = drain_stream(s.generate(tokens=[1] * 400, max_new_tokens=limit - 400))
        assert committed == limit  # exactly fits; now nothing more does
        expect(Code.OUT_OF_RANGE, s.generate, tokens=[1], max_new_tokens=0)
    server.wait_at_capacity()


def test_failed_precondition_while_a_turn_runs(server, alice):
    with alice.open() as s:
        long_turn = s.generate(tokens=[1, 2, 3], max_new_tokens=300, timeout=60)
        first = next(long_turn)
        expect(Code.FAILED_PRECONDITION, s.generate, tokens=[4], max_new_tokens=2)
        # the turn in flight is unharmed by the refused one and runs to its end
        ids, reason, committed = drain_stream(long_turn)
        assert len(first.token_ids) + len(ids) == 300
        assert reason == pb.FINISH_REASON_LENGTH and committed == 303
    server.wait_at_capacity()


def test_resource_exhausted(server, alice):
    capacity = server.config.replicas * server.config.replica.pools.max_sessions
    sessions = [alice.open() for _ in range(capacity)]
    err = expect(Code.RESOURCE_EXHAUSTED, alice.open)
    assert "room" in err.details()
    for s in sessions:
        s.close()
    server.wait_at_capacity()


def test_unauthenticated(server, alice):
    with (
        SessionClient(server.address) as anonymous,
        SessionClient(server.address, api_key="not-a-key") as stranger,
    ):
        for c in (anonymous, stranger):
            expect(Code.UNAUTHENTICATED, c.open)
            expect(Code.UNAUTHENTICATED, c.replicas)
        with alice.open() as s:
            for c in (anonymous, stranger):
                expect(Code.UNAUTHENTICATED, c.generate, s.id, tokens=[1], max_new_tokens=2)
                expect(Code.UNAUTHENTICATED, c.close_session, s.id)
                expect(
                    Code.UNAUTHENTICATED,
                    c.sessions.Converse,
                    iter([pb.ConverseRequest(open=pb.OpenSessionRequest())]),
                    timeout=30,
                )
            drain_stream(s.generate(tokens=[1], max_new_tokens=2))  # still alice's, still open
    server.wait_at_capacity()


def test_session_ids_are_128_bit_random(server, alice):
    sessions = [alice.open() for _ in range(2 * server.config.replica.pools.max_sessions)]
    ids = [s.id for s in sessions]
    for s in sessions:
        s.close()
    assert all(len(i) == 32 and int(i, 16) < 2**128 for i in ids), ids  # 32 hex digits
    assert len(set(ids)) == len(ids)
    # random, not counted: every hex digit position varies across the ids
    assert all(len({i[k] for i in ids}) > 1 for k in range(32)), ids
    server.wait_at_capacity()


def test_permission_denied(server, alice, bob):
    with alice.open() as s:
        expect(Code.PERMISSION_DENIED, bob.generate, s.id, tokens=[1], max_new_tokens=2)
        expect(
            Code.PERMISSION_DENIED,
            bob.sessions.GetSession,
            pb.GetSessionRequest(session_id=s.id),
            metadata=bob.metadata,
        )
        expect(Code.PERMISSION_DENIED, bob.close_session, s.id)
        ids, _, committed = drain_stream(s.generate(tokens=[1], max_new_tokens=2))
        assert committed == 3, "bob's refused calls changed alice's session"
    server.wait_at_capacity()


def test_close_is_idempotent_and_get_session_reports_committed(server, alice):
    s = alice.open()
    got = alice.sessions.GetSession(pb.GetSessionRequest(session_id=s.id), metadata=alice.metadata)
    assert (got.committed_tokens, got.turn_running) == (0, False)
    assert (
        got.replica_id == s.replica_id
        and got.max_context_tokens == server.config.replica.pools.max_context
    )
    _, _, committed = drain_stream(s.generate(tokens=[5, 6, 7, 8], max_new_tokens=6))
    got = alice.sessions.GetSession(pb.GetSessionRequest(session_id=s.id), metadata=alice.metadata)
    assert got.committed_tokens == committed == 10
    assert alice.close_session(s.id) is True
    assert alice.close_session(s.id) is False
    assert alice.close_session(secrets.token_hex(16)) is False
    server.wait_at_capacity()


def test_health_and_reflection(server):
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "session_router.v1.SessionService", "session_router.v1.AdminService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        names = {s.name for s in reply.list_services_response.service}
    assert {
        "session_router.v1.SessionService",
        "session_router.v1.AdminService",
        "grpc.health.v1.Health",
    } <= names
    server.wait_at_capacity()


def test_aborted_after_the_replica_died(server, alice):
    """Kills one of the module's replicas, and first its checkpoint store, so that its
    sessions' state is gone (with it, they would be restored elsewhere:
    tests/test_e2e_failover.py); the test ends when the replacement has joined."""
    server.wait_healed()
    sessions = [alice.open() for _ in range(4)]
    victim = sessions[0].replica_id
    for s in sessions:
        drain_stream(s.generate(tokens=[1, 2], max_new_tokens=2))
    ray.kill(server.stores[victim], no_restart=True)
    ray.kill(server.replicas[victim], no_restart=True)
    doomed = [s for s in sessions if s.replica_id == victim]
    for s in doomed:
        err = expect(Code.ABORTED, s.generate, tokens=[3], max_new_tokens=2)
        assert "open a new session" in err.details()
    # the router knows too: a second try, and GetSession, are ABORTED as well
    expect(Code.ABORTED, doomed[0].generate, tokens=[3], max_new_tokens=2)
    expect(
        Code.ABORTED,
        alice.sessions.GetSession,
        pb.GetSessionRequest(session_id=doomed[0].id),
        metadata=alice.metadata,
    )
    survivors = [r for r in server.replicas if r != victim]
    for s in sessions:
        if s.replica_id != victim:
            drain_stream(s.generate(tokens=[3], max_new_tokens=2))
        s.close()
    with SessionClient(server.address, api_key=ADMIN) as admin:
        wait_for(
            lambda: any(
                r.replica_id == victim and r.state == pb.REPLICA_STATE_DEAD
                for r in admin.replicas()
            ),
            10,
            0.2,
            "the replica to be marked DEAD",
        )
    server.wait_at_capacity(survivors)
    server.wait_at_capacity(server.wait_healed())
