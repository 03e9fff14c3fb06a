"""The committed generated modules in protos/ are current, and carry the services of DESIGN.md."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GENERATED = ("session_router_pb2.py", "session_router_pb2.pyi", "session_router_pb2_grpc.py")


def test_generated_modules_match_proto(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(
        ["bash", str(REPO / "protos" / "regen.sh"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"protos/regen.sh failed:\n{result.stdout}\n{result.stderr}"
    stale = [
        name
        for name in GENERATED
        if (tmp_path / "protos" / name).read_bytes() != (REPO / "protos" / name).read_bytes()
    ]
    assert not stale, (
        f"out of date with protos/session_router.proto: {', '.join(stale)}; "
        "run protos/regen.sh and commit the result"
    )


def test_services_and_methods():
    from protos import session_router_pb2

    services = session_router_pb2.DESCRIPTOR.services_by_name
    assert set(services) == {"SessionService", "AdminService"}
    methods = {
        name: {
            m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
            for m in service.methods
        }
        for name, service in services.items()
    }
    assert methods["SessionService"] == {
        "OpenSession": ("OpenSessionRequest", "Session", False, False),
        "Generate": ("GenerateRequest", "GenerateChunk", False, True),
        "Converse": ("ConverseRequest", "ConverseResponse", True, True),
        "CloseSession": ("CloseSessionRequest", "CloseSessionResponse", False, False),
        "GetSession": ("GetSessionRequest", "Session", False, False),
    }
    assert methods["AdminService"] == {
        "ListReplicas": ("ListReplicasRequest", "ListReplicasResponse", False, False),
        "DrainReplica": ("DrainReplicaRequest", "DrainReplicaResponse", False, False),
        "ResumeReplica": ("ResumeReplicaRequest", "ResumeReplicaResponse", False, False),
        "MigrateSession": ("MigrateSessionRequest", "Session", False, False),
    }
    assert session_router_pb2.DESCRIPTOR.package == "session_router.v1"


def test_grpc_module_has_stubs_and_servicers():
    from protos import session_router_pb2_grpc

    for service in ("SessionService", "AdminService"):
        assert hasattr(session_router_pb2_grpc, f"{service}Stub")
        assert hasattr(session_router_pb2_grpc, f"{service}Servicer")
        assert hasattr(session_router_pb2_grpc, f"add_{service}Servicer_to_server")


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (
            "FinishReason",
            {
                "FINISH_REASON_UNSPECIFIED": 0,
                "FINISH_REASON_STOP": 1,
                "FINISH_REASON_LENGTH": 2,
                "FINISH_REASON_INTERRUPTED": 3,
            },
        ),
        (
            "ReplicaState",
            {
                "REPLICA_STATE_UNSPECIFIED": 0,
                "REPLICA_STATE_HEALTHY": 1,
                "REPLICA_STATE_DRAINING": 2,
                "REPLICA_STATE_DEAD": 3,
            },
        ),
    ],
)
def test_enum_values(enum, values):
    from protos import session_router_pb2

    descriptor = session_router_pb2.DESCRIPTOR.enum_types_by_name[enum]
    assert {v.name: v.number for v in descriptor.values} == values


def test_pool_stats_field_numbers():
    from protos import session_router_pb2

    fields = session_router_pb2.PoolStats.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in fields.items()} == {
        "pool": 1,
        "capacity": 2,
        "free": 3,
        "in_use": 4,
        "session_held": 5,
        "cached": 6,
        "leaked": 7,
    }
