"""deploy/kuberay: the RayCluster validates against KubeRay's CRD; serve, GPUs and scraping line up.

The CRD's openAPIV3Schema is checked the way the API server with strict field validation would:
unknown fields are errors (except under x-kubernetes-preserve-unknown-fields), int-or-string and
nullable are honoured, and list-type map/set items must be unique. CEL rules
(x-kubernetes-validations) are not evaluated.
"""

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
KUBERAY_DIR = REPO / "deploy" / "kuberay"
CRD = REPO / "tests" / "schemas" / "ray.io_rayclusters.yaml"  # KubeRay's, vendored


Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(name):
    with open(KUBERAY_DIR / name) as f:
        return yaml.load(f, Loader=Loader)


def served_schema(crd, api_version):
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


@pytest.fixture(scope="module")
def raycluster():
    return load("raycluster.yaml")


@pytest.fixture(scope="module")
def validator(raycluster):
    with open(CRD) as f:
        crd = yaml.load(f, Loader=Loader)
    assert raycluster["kind"] == crd["spec"]["names"]["kind"]
    schema = to_json_schema(served_schema(crd, raycluster["apiVersion"]))
    return KubeValidator(schema, format_checker=FORMATS)


@pytest.fixture(scope="module")
def head_container(raycluster):
    containers = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    return containers[0]


def test_raycluster_validates_against_crd(raycluster, validator):
    errors = sorted(validator.iter_errors(raycluster), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors
    )
    metadata = raycluster["metadata"]
    assert isinstance(metadata.get("name"), str) and metadata["name"]
    for field in ("labels", "annotations"):
        assert all(isinstance(v, str) for v in metadata.get(field, {}).values()), field


@pytest.mark.parametrize(
    "breakage",
    ["unknown-field", "bad-quantity", "duplicate-port", "wrong-type"],
)
def test_validation_catches_mistakes(raycluster, validator, breakage):
    broken = copy.deepcopy(raycluster)
    head = broken["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    if breakage == "unknown-field":
        head["portz"] = []
    elif breakage == "bad-quantity":
        head["resources"]["limits"]["memory"] = "16 GB"
    elif breakage == "duplicate-port":
        head["ports"].append({"name": "grpc2", "containerPort": 50051})
    elif breakage == "wrong-type":
        broken["spec"]["workerGroupSpecs"][0]["replicas"] = "2"
    assert not validator.is_valid(broken)


def test_head_runs_serve_with_named_ports(raycluster, head_container):
    ports = {p["name"]: p["containerPort"] for p in head_container["ports"]}
    assert ports["grpc"] == 50051
    assert ports["metrics"] == 9400
    for name in ("gcs-server", "dashboard", "client"):
        assert name in ports, f"head container lacks the usual Ray port {name}"
    assert len(set(ports.values())) == len(ports), "two head ports share a number"
    script = " ".join(head_container.get("command", []) + head_container.get("args", []))
    assert "session-router serve --address auto" in script
    assert "--grpc-port 50051" in script and "--metrics-port 9400" in script
    # KubeRay runs a user command before `ray start` unless told to leave the command alone.
    annotations = raycluster["metadata"].get("annotations", {})
    assert annotations.get("ray.io/overwrite-container-cmd") == "true"
    assert "$KUBERAY_GEN_RAY_START_CMD" in script


def test_head_listens_on_all_interfaces_with_optional_tls_and_keys(raycluster, head_container):
    script = " ".join(head_container.get("command", []) + head_container.get("args", []))
    assert "--host 0.0.0.0" in script, "serve listens on loopback unless told otherwise"
    pod = raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["name"]: m["mountPath"] for m in head_container["volumeMounts"]}
    assert secrets["tls"]["secretName"] == "session-router-tls"
    assert secrets["api-keys"]["secretName"] == "session-router-api-keys"
    tls, keys = mounts["tls"], mounts["api-keys"]
    for flag in (f"--tls-cert {tls}/tls.crt", f"--tls-key {tls}/tls.key", f"--api-keys {keys}/"):
        assert flag in script, flag
    assert f"--tls-client-ca {tls}/ca.crt" in script
    assert "grpc" not in head_container["readinessProbe"], "the kubelet's gRPC probe has no TLS"


def test_every_container_starts_ray(raycluster):
    # With ray.io/overwrite-container-cmd every group must start Ray itself.
    groups = [raycluster["spec"]["headGroupSpec"], *raycluster["spec"]["workerGroupSpecs"]]
    for group in groups:
        container = group["template"]["spec"]["containers"][0]
        script = " ".join(container.get("command", []) + container.get("args", []))
        assert "$KUBERAY_GEN_RAY_START_CMD" in script, group.get("groupName", "head")


def test_a_worker_group_has_gpus(raycluster):
    gpu_groups = []
    for group in raycluster["spec"]["workerGroupSpecs"]:
        resources = group["template"]["spec"]["containers"][0].get("resources", {})
        if int(resources.get("limits", {}).get("nvidia.com/gpu", 0)) >= 1:
            gpu_groups.append(group)
            assert group.get("rayStartParams", {}).get("num-gpus") == str(
                resources["limits"]["nvidia.com/gpu"]
            )
    assert gpu_groups, "no worker group requests nvidia.com/gpu"


def gateway_group(raycluster):
    (group,) = [g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gateway"]
    return group


def test_gateway_pods_join_the_cluster_and_offer_it_nothing(raycluster):
    group = gateway_group(raycluster)
    assert group["rayStartParams"]["num-cpus"] == "0", "actors must not land on a gateway pod"
    assert group["rayStartParams"]["num-gpus"] == "0"
    (container,) = group["template"]["spec"]["containers"]
    script = " ".join(container.get("command", []) + container.get("args", []))
    assert "session-router gateway --address auto --host 0.0.0.0" in script
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == 50051 and ports["metrics"] == 9400


def test_serve_autoscales_within_the_gpu_groups_bounds(raycluster, head_container):
    script = " ".join(head_container.get("command", []) + head_container.get("args", []))
    most = int(script.split("--max-replicas ")[1].split()[0])
    (gpu,) = [g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu"]
    assert raycluster["spec"]["enableInTreeAutoscaling"], "pending replicas must add GPU nodes"
    assert gpu["maxReplicas"] == most


def test_service_and_podmonitor_target_every_gateway(raycluster, head_container):
    cluster = raycluster["metadata"]["name"]
    selector = {"ray.io/cluster": cluster, "session-router.io/gateway": "true"}
    labelled = [raycluster["spec"]["headGroupSpec"], gateway_group(raycluster)]
    for group in labelled:
        assert group["template"]["metadata"]["labels"]["session-router.io/gateway"] == "true"
    (gateway_container,) = gateway_group(raycluster)["template"]["spec"]["containers"]
    port_names = {p["name"] for p in head_container["ports"]}
    assert port_names >= {p["name"] for p in gateway_container["ports"]}

    service = load("service.yaml")
    assert service["apiVersion"] == "v1" and service["kind"] == "Service"
    assert service["spec"]["selector"] == selector
    targets = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert targets == {"grpc": "grpc", "metrics": "metrics"}
    assert set(targets.values()) <= port_names

    monitor = load("podmonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["port"] in port_names
    job = [r for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "job"]
    assert job and job[0]["replacement"] == "session-router", "alerts expect job=session-router"
