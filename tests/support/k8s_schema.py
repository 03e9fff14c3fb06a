"""Offline validation of Kubernetes objects: custom resources against a vendored CRD's
openAPIV3Schema, the way the API server with strict field validation checks them (unknown fields
are errors except under x-kubernetes-preserve-unknown-fields, int-or-string and nullable are
honoured, list-type map/set items must be unique; CEL rules are not evaluated), and built-in kinds
against Kubernetes' own schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
CRDS = {  # (apiVersion group, kind) -> the vendored CRD
    ("ray.io", "RayCluster"): SCHEMAS / "ray.io_rayclusters.yaml",
    ("monitoring.coreos.com", "PodMonitor"): SCHEMAS / "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): SCHEMAS
    / "monitoring.coreos.com_prometheusrules.yaml",
}
KUBERNETES_VERSION = "1.32"


Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def served_schema(crd: dict, api_version: str) -> dict:
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group, f"CRD is for group {crd['spec']['group']}, not {group}"
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            assert v.get("served"), f"{api_version} is not served by this CRD"
            return v["schema"]["openAPIV3Schema"]
    pytest.fail(f"CRD has no version {version}")


def to_json_schema(schema):
    """Rewrites the Kubernetes dialect of OpenAPI v3 into plain JSON Schema, strictly."""
    schema = copy.deepcopy(schema)

    def fix(s):
        if not isinstance(s, dict):
            return
        if s.get("x-kubernetes-int-or-string"):
            s.pop("type", None)
            s.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        if s.get("nullable") and "type" in s:
            s["type"] = [s["type"], "null"]
        if (
            s.get("type") == "object"
            and "properties" in s
            and "additionalProperties" not in s
            and not s.get("x-kubernetes-preserve-unknown-fields")
        ):
            s["additionalProperties"] = False
        for value in s.get("properties", {}).values():
            fix(value)
        for key in ("items", "additionalProperties"):
            fix(s.get(key))
        for key in ("anyOf", "allOf", "oneOf"):
            for sub in s.get(key, []):
                fix(sub)

    fix(schema)
    return schema


def list_type(validator, value, instance, schema):
    """x-kubernetes-list-type: `map` items are unique by their keys, `set` items are unique."""
    if not isinstance(instance, list):
        return
    if value == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        props = schema.get("items", {}).get("properties", {})
        seen = set()
        for item in instance:
            key = tuple(item.get(k, props.get(k, {}).get("default")) for k in keys)
            if key in seen:
                yield jsonschema.ValidationError(f"duplicate entry for list-map keys {keys}: {key}")
            seen.add(key)
    elif value == "set":
        seen = []
        for item in instance:
            if item in seen:
                yield jsonschema.ValidationError(f"duplicate entry in list-type set: {item!r}")
            seen.append(item)


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("int32")
def _int32(value):
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@FORMATS.checks("int64")
def _int64(value):
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@FORMATS.checks("int-or-string")
def _int_or_string(value):
    return isinstance(value, (int, str))


KubeValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-type": list_type}
)


def crd_validator(api_version: str, kind: str):
    """A strict validator of ``kind`` objects from its vendored CRD."""
    group = api_version.split("/")[0]
    with open(CRDS[group, kind]) as f:
        crd = yaml.load(f, Loader=Loader)
    assert kind == crd["spec"]["names"]["kind"]
    schema = to_json_schema(served_schema(crd, api_version))
    return KubeValidator(schema, format_checker=FORMATS)


def validation_errors(obj: dict) -> list[str]:
    """Every reason ``obj`` would be refused: CRD kinds by their vendored schema, built-in
    kinds by Kubernetes' (strict: unknown fields are errors)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    if (api_version.split("/")[0], kind) in CRDS:
        errors = crd_validator(api_version, kind).iter_errors(obj)
        return [
            f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(errors, key=lambda e: list(e.absolute_path))
        ]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"no schema for {api_version} {kind}: {exc}"]
    return []
