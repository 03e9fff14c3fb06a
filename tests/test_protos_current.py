"""The proto keeps its contract: the committed generated modules in protos/ are current, and the
proto still has everything of the released API (tests/data/session_router.v1.released.textproto:
every service, method, message, field number, type and enum value, unchanged; additions are
allowed). The check itself is shown to catch each kind of break."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests.support.proto_contract import Proto, contract_breaks, current, released

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


def test_the_proto_keeps_the_released_contract():
    breaks = contract_breaks(released(), current())
    assert not breaks, "protos/session_router.proto breaks the released API:\n" + "\n".join(breaks)


def test_every_released_service_has_stubs_and_servicers():
    from protos import session_router_pb2_grpc

    for service in released().service:
        assert hasattr(session_router_pb2_grpc, f"{service.name}Stub")
        assert hasattr(session_router_pb2_grpc, f"{service.name}Servicer")
        assert hasattr(session_router_pb2_grpc, f"add_{service.name}Servicer_to_server")


def message(proto: Proto, name: str):
    return next(m for m in proto.message_type if m.name == name)


def field(proto: Proto, message_name: str, field_name: str):
    return next(f for f in message(proto, message_name).field if f.name == field_name)


def renumber(p):
    field(p, "PoolStats", "leaked").number = 17


def retype(p):
    field(p, "PoolStats", "leaked").type = descriptor_pb2.FieldDescriptorProto.TYPE_UINT64


def rename_field(p):
    field(p, "Session", "committed_tokens").name = "committed"


def leave_oneof(p):
    field(p, "GenerateRequest", "text").ClearField("oneof_index")


def drop_message(p):
    p.message_type.remove(message(p, "Interrupt"))


def renumber_enum_value(p):
    next(e for e in p.enum_type if e.name == "FinishReason").value[3].number = 9


def stop_streaming(p):
    next(m for m in p.service[0].method if m.name == "Generate").server_streaming = False


def drop_method(p):
    methods = next(s for s in p.service if s.name == "AdminService").method
    methods.remove(next(m for m in methods if m.name == "DrainReplica"))


def drop_service(p):
    p.service.remove(next(s for s in p.service if s.name == "AdminService"))


def add_things(p):
    """Additions are allowed: a field, a message, an enum value, a method."""
    message(p, "Session").field.add(
        name="note", number=99, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    )
    p.message_type.add(name="Extra")
    next(e for e in p.enum_type if e.name == "FinishReason").value.add(name="FINISH_X", number=9)
    p.service[0].method.add(
        name="Ping", input_type=".session_router.v1.Extra", output_type=".session_router.v1.Extra"
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (renumber, "field PoolStats.leaked = 7 is gone"),
        (retype, "field PoolStats.leaked = 7 changed"),
        (rename_field, "field Session.committed_tokens = 3 changed"),
        (leave_oneof, "field GenerateRequest.text = 2 changed"),
        (drop_message, "message Interrupt is gone"),
        (renumber_enum_value, "FinishReason: 3 was FINISH_REASON_INTERRUPTED, is nothing"),
        (stop_streaming, "rpc SessionService.Generate changed"),
        (drop_method, "rpc AdminService.DrainReplica is gone"),
        (drop_service, "service AdminService is gone"),
        (add_things, None),
    ],
    ids=lambda v: v.__name__ if callable(v) else "",
)
def test_the_contract_check_catches_each_kind_of_break(change, expected):
    changed = Proto()
    changed.CopyFrom(released())
    change(changed)
    breaks = contract_breaks(released(), changed)
    if expected is None:
        assert breaks == []
    else:
        assert any(expected in b for b in breaks), breaks
