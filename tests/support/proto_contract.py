"""The released wire contract of ``session_router.v1`` and the check that the proto keeps it.

``tests/data/session_router.v1.released.textproto`` is the ``FileDescriptorProto`` of the API as
released (docs/contract.md: field numbers are stable once released). ``contract_breaks``
lists every way the current proto breaks it: a service, method, message, field, enum or enum
value that is gone, renamed or renumbered, a field whose type, label or oneof changed, a method
whose types or streaming changed. Additions are allowed. When a new version of the API is
released, record it: ``python -m tests.support.proto_contract`` rewrites the file from the
generated modules.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2, text_format

RELEASED = Path(__file__).resolve().parents[1] / "data" / "session_router.v1.released.textproto"
Proto = descriptor_pb2.FileDescriptorProto


def current() -> Proto:
    from protos import session_router_pb2

    return Proto.FromString(session_router_pb2.DESCRIPTOR.serialized_pb)


def released() -> Proto:
    return text_format.Parse(RELEASED.read_text(), Proto())


def _field_shape(message: descriptor_pb2.DescriptorProto, field) -> tuple:
    oneof = message.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
    return (field.name, field.type, field.type_name, field.label, oneof)


def _message_breaks(path: str, old, new) -> list[str]:
    breaks = []
    fields = {f.number: f for f in new.field}
    for field in old.field:
        where = f"{path}.{field.name} = {field.number}"
        if field.number not in fields:
            breaks.append(f"field {where} is gone")
        elif _field_shape(new, fields[field.number]) != _field_shape(old, field):
            got = _field_shape(new, fields[field.number])
            breaks.append(f"field {where} changed: {_field_shape(old, field)} -> {got}")
    nested = {m.name: m for m in new.nested_type}
    for message in old.nested_type:
        if message.name not in nested:
            breaks.append(f"message {path}.{message.name} is gone")
        else:
            breaks += _message_breaks(f"{path}.{message.name}", message, nested[message.name])
    breaks += _enum_breaks(path, old.enum_type, new.enum_type)
    return breaks


def _enum_breaks(path: str, old_enums, new_enums) -> list[str]:
    breaks = []
    enums = {e.name: e for e in new_enums}
    for enum in old_enums:
        if enum.name not in enums:
            breaks.append(f"enum {path}.{enum.name} is gone")
            continue
        values = {v.number: v.name for v in enums[enum.name].value}
        for value in enum.value:
            if values.get(value.number) != value.name:
                got = values.get(value.number, "nothing")
                breaks.append(f"enum {path}.{enum.name}: {value.number} was {value.name}, is {got}")
    return breaks


def contract_breaks(old: Proto, new: Proto) -> list[str]:
    """Every way ``new`` breaks the contract that ``old`` released (empty: compatible)."""
    breaks = [] if new.package == old.package else [f"package {old.package} is now {new.package}"]
    messages = {m.name: m for m in new.message_type}
    for message in old.message_type:
        if message.name not in messages:
            breaks.append(f"message {message.name} is gone")
        else:
            breaks += _message_breaks(message.name, message, messages[message.name])
    breaks += _enum_breaks(old.package, old.enum_type, new.enum_type)
    services = {s.name: s for s in new.service}
    for service in old.service:
        if service.name not in services:
            breaks.append(f"service {service.name} is gone")
            continue
        methods = {m.name: m for m in services[service.name].method}
        for method in service.method:
            got = methods.get(method.name)
            if got is None:
                breaks.append(f"rpc {service.name}.{method.name} is gone")
            elif _rpc_shape(got) != _rpc_shape(method):
                breaks.append(
                    f"rpc {service.name}.{method.name} changed: "
                    f"{_rpc_shape(method)} -> {_rpc_shape(got)}"
                )
    return breaks


def _rpc_shape(method: descriptor_pb2.MethodDescriptorProto) -> tuple:
    return (method.input_type, method.output_type, method.client_streaming, method.server_streaming)


if __name__ == "__main__":
    RELEASED.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# The released session_router.v1 API (tests/support/proto_contract.py). Do not edit.\n"
    )
    RELEASED.write_text(header + text_format.MessageToString(current()))
    print(f"wrote {RELEASED}")
