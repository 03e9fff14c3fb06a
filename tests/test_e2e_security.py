"""End to end: the security defaults (docs/security.md). Issue 8: gRPC bound every
interface by default while the start-up line printed 127.0.0.1, there was no TLS, any tenant key
could drain every replica and a drain could not be undone.

The module's server runs with the defaults for --host, TLS with client certificates required
(--tls-cert/--tls-key/--tls-client-ca, certificates made here) and API keys (a tenant and an
admin from the keys file, one more tenant from ``SESSION_ROUTER_API_KEYS``).
"""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import session_router_pb2 as pb
from router.client import SessionClient, tls_credentials
from router.config import ServeConfig
from router.ops import cli
from tests.support.cluster import ServerThread, drain_stream, rpc_error, wait_for
from tests.support.servers import api_keys_file
from tests.support.tls import module_pki

TENANT, ADMIN = "tenant-key-1234567890", "admin-key-0987654321"
FROM_ENV = "globex-key-4444444444"
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return module_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(ray_cluster, pki, tmp_path_factory):
    keys = api_keys_file(tmp_path_factory.mktemp("keys"), {TENANT: "acme", ADMIN: "ops admin"})
    with pytest.MonkeyPatch.context() as env:  # read once, when the server is made
        env.setenv("SESSION_ROUTER_API_KEYS", f"{FROM_ENV}:globex")
        srv = ServerThread(
            api_keys=keys,
            tls_cert=pki["server"].cert,
            tls_key=pki["server"].key,
            tls_client_ca=pki["ca"],
        )
    srv.start()
    yield srv
    srv.stop()


def client(server, pki, key: str | None, cert: str = "client") -> SessionClient:
    issued = pki[cert]
    creds = tls_credentials(pki["ca"], issued.cert, issued.key)
    return SessionClient(server.address, api_key=key, credentials=creds)


def health_check(channel: grpc.Channel) -> None:
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)


def listeners(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.split(":")
                if state != "0A" or int(hexport, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(addr)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words).removeprefix("::ffff:"))
    return found


def test_gRPC_and_metrics_listen_on_loopback_by_default(server):
    assert ServeConfig().gateway.host == "127.0.0.1"
    assert server.config.gateway.host == "127.0.0.1"  # the module did not set --host
    grpc_port, metrics_port = server.server.grpc.bound_port, server.server.metrics.port
    assert listeners(grpc_port) == {"127.0.0.1"}
    assert listeners(metrics_port) == {"127.0.0.1"}
    lines = server.server.listening()
    assert lines[0] == f"gRPC listening on 127.0.0.1:{grpc_port}"
    assert lines[1] == f"metrics on http://127.0.0.1:{metrics_port}/metrics"
    http_port = server.server.front.http.port
    assert listeners(http_port) == {"127.0.0.1"}
    assert lines[2] == f"OpenAI-compatible API on https://127.0.0.1:{http_port}/v1"
    assert lines[4] == "security: 127.0.0.1 only; TLS with client certificates; API keys on"


def test_plaintext_is_refused(server):
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            health_check(channel)
    assert err.value.code() == Code.UNAVAILABLE


def test_tls_without_a_trusted_client_certificate_is_refused(server, pki):
    with grpc.secure_channel(server.address, tls_credentials(pki["ca"])) as channel:
        with pytest.raises(grpc.RpcError) as err:
            health_check(channel)
    assert err.value.code() == Code.UNAVAILABLE
    with client(server, pki, TENANT, cert="rogue") as rogue:
        assert rpc_error(rogue.open).code() == Code.UNAVAILABLE


def test_mutual_tls_serves_sessions(server, pki):
    with client(server, pki, TENANT) as tenant, tenant.open() as s:
        ids, reason, committed = drain_stream(s.generate(tokens=[1, 2, 3], max_new_tokens=4))
        assert (len(ids), reason, committed) == (4, pb.FINISH_REASON_LENGTH, 7)
    server.wait_at_capacity()


ADMIN_CALLS = {
    "ListReplicas": pb.ListReplicasRequest(),
    "DrainReplica": pb.DrainReplicaRequest(replica_id="replica-0"),
    "ResumeReplica": pb.ResumeReplicaRequest(replica_id="replica-0"),
    "MigrateSession": pb.MigrateSessionRequest(session_id="0" * 32),
}


@pytest.mark.parametrize("method", sorted(ADMIN_CALLS))
def test_admin_service_answers_admin_keys_only(server, pki, method):
    request = ADMIN_CALLS[method]
    with client(server, pki, None) as anonymous, client(server, pki, TENANT) as tenant:
        err = rpc_error(getattr(anonymous.admin, method), request)
        assert err.code() == Code.UNAUTHENTICATED, err
        err = rpc_error(getattr(tenant.admin, method), request, metadata=tenant.metadata)
        assert err.code() == Code.PERMISSION_DENIED and "admin" in err.details(), err
    with client(server, pki, ADMIN) as admin:
        call = getattr(admin.admin, method)
        if method == "MigrateSession":  # past the key check: there is no such session
            err = rpc_error(call, request, metadata=admin.metadata)
            assert err.code() == Code.NOT_FOUND and err.details()
        else:
            call(request, metadata=admin.metadata, timeout=30)
            admin.admin.ResumeReplica(ADMIN_CALLS["ResumeReplica"], metadata=admin.metadata)
    assert {r.state for r in admin_replicas(server, pki)} == {pb.REPLICA_STATE_HEALTHY}


def admin_replicas(server, pki) -> list[pb.ReplicaInfo]:
    with client(server, pki, ADMIN) as admin:
        return admin.replicas()


def test_resume_replica_undoes_a_drain(server, pki):
    with client(server, pki, ADMIN) as admin, client(server, pki, TENANT) as tenant:
        meta = admin.metadata
        target, other = sorted(r.replica_id for r in admin.replicas())
        reply = admin.admin.DrainReplica(pb.DrainReplicaRequest(replica_id=target), metadata=meta)
        assert reply.replica.state == pb.REPLICA_STATE_DRAINING
        held = [tenant.open() for _ in range(3)]
        assert {s.replica_id for s in held} == {other}
        reply = admin.admin.ResumeReplica(pb.ResumeReplicaRequest(replica_id=target), metadata=meta)
        assert reply.replica.replica_id == target
        assert reply.replica.state == pb.REPLICA_STATE_HEALTHY
        # placement takes it again: it has the most free slots now
        again = tenant.open()
        assert again.replica_id == target
        for s in [*held, again]:
            assert s.close() is True

        err = rpc_error(
            admin.admin.ResumeReplica, pb.ResumeReplicaRequest(replica_id="nope"), metadata=meta
        )
        assert err.code() == Code.NOT_FOUND and err.details()
        err = rpc_error(
            admin.admin.DrainReplica,
            pb.DrainReplicaRequest(replica_id="nope", migrate=True),
            metadata=meta,
        )
        assert err.code() == Code.NOT_FOUND and err.details()
    server.wait_at_capacity()


def test_the_drain_and_resume_commands_present_a_client_certificate(server, pki, capsys):
    """What a worker's preStop hook runs when the gateway requires client certificates."""
    target = sorted(r.replica_id for r in admin_replicas(server, pki))[0]
    tls = ["--tls-ca", pki["ca"], "--api-key", ADMIN]
    without = ["drain", "--grpc", server.address, "--replica", target, *tls]
    assert cli.main(without) == 2  # refused at the handshake: no client certificate
    assert "drain failed: UNAVAILABLE" in capsys.readouterr().out
    mine = ["--tls-cert", pki["client"].cert, "--tls-key", pki["client"].key]
    assert cli.main([*without, *mine]) == 0
    states = {r.replica_id: r.state for r in admin_replicas(server, pki)}
    assert states[target] == pb.REPLICA_STATE_DRAINING
    resume = ["resume", "--grpc", server.address, "--replica", target, *tls, *mine]
    assert cli.main(resume) == 0
    states = {r.replica_id: r.state for r in admin_replicas(server, pki)}
    assert states[target] == pb.REPLICA_STATE_HEALTHY
    with pytest.raises(SystemExit, match="go together"):
        cli.main([*without, "--tls-cert", pki["client"].cert])


def test_a_dead_replica_cannot_be_resumed(server, pki):
    """Runs last: it declares a replica dead (the serve process then replaces it)."""
    import ray

    victim = sorted(server.replicas)[0]
    ray.get(server.server.router.replica_failed.remote(victim, "declared dead by a test"))
    with client(server, pki, ADMIN) as admin:
        err = rpc_error(
            admin.admin.ResumeReplica,
            pb.ResumeReplicaRequest(replica_id=victim),
            metadata=admin.metadata,
        )
        assert err.code() == Code.FAILED_PRECONDITION and "dead" in err.details()
    live = server.wait_healed()
    wait_for(lambda: victim not in server.replicas, 10, 0.1, "the dead replica to be removed")
    server.wait_at_capacity(live)


def test_keys_from_the_environment_and_the_x_api_key_header(server, pki):
    """globex's key comes from SESSION_ROUTER_API_KEYS (acme's from the file); either kind of
    key works as ``authorization: Bearer KEY`` and as ``x-api-key: KEY``."""
    with (
        client(server, pki, FROM_ENV) as globex,
        client(server, pki, TENANT) as acme,
        globex.open() as g,
        acme.open() as a,
    ):
        drain_stream(g.generate(tokens=[1], max_new_tokens=2))
        for key, session in ((FROM_ENV, g), (TENANT, a)):
            header = (("x-api-key", key),)
            got = globex.sessions.GetSession(
                pb.GetSessionRequest(session_id=session.id), metadata=header
            )
            assert got.session_id == session.id
        err = rpc_error(acme.generate, g.id, tokens=[1], max_new_tokens=2)
        assert err.code() == Code.PERMISSION_DENIED, err
        err = rpc_error(
            globex.sessions.GetSession,
            pb.GetSessionRequest(session_id=g.id),
            metadata=(("x-api-key", "not-a-key"),),
        )
        assert err.code() == Code.UNAUTHENTICATED, err
    server.wait_at_capacity()
