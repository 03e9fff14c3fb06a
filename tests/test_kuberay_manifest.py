"""deploy/kuberay: the RayCluster validates against KubeRay's CRD; serve, GPUs and scraping line up.

The CRD's openAPIV3Schema is checked the way the API server with strict field validation would:
unknown fields are errors (except under x-kubernetes-preserve-unknown-fields), int-or-string and
nullable are honoured, and list-type map/set items must be unique. CEL rules
(x-kubernetes-validations) are not evaluated.
"""

import copy
from pathlib import Path

import pytest
import yaml

from tests.support.k8s_schema import FORMATS, KubeValidator, Loader, served_schema, to_json_schema

REPO = Path(__file__).resolve().parent.parent
KUBERAY_DIR = REPO / "deploy" / "kuberay"
CRD = REPO / "tests" / "schemas" / "ray.io_rayclusters.yaml"  # KubeRay's, vendored


def load(name):
    with open(KUBERAY_DIR / name) as f:
        return yaml.load(f, Loader=Loader)


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
    assert ports["sr-metrics"] == 9400
    # `metrics` is the name KubeRay gives Ray's own metrics port: taking it for 9400 would make
    # KubeRay skip Ray's and a Ray ServiceMonitor scrape session-router's instead.
    assert ports["metrics"] == 8080
    for name in ("gcs-server", "dashboard", "client"):
        assert name in ports, f"head container lacks the usual Ray port {name}"
    assert len(set(ports.values())) == len(ports), "two head ports share a number"
    script = " ".join(head_container.get("command", []) + head_container.get("args", []))
    assert "session-router serve --address auto" in script
    assert "--grpc-port 50051" in script and "--metrics-port 9400" in script
    assert "--http-port 8000" in script
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
    assert ports["grpc"] == 50051 and ports["sr-metrics"] == 9400


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
    assert targets == {"grpc": "grpc", "http": "http", "sr-metrics": "sr-metrics"}
    assert set(targets.values()) <= port_names

    monitor = load("operator/podmonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "sr-metrics" and endpoint["port"] in port_names
    job = [r for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "job"]
    assert job and job[0]["replacement"] == "session-router", "alerts expect job=session-router"


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1}


def quantity(text) -> int:
    """Bytes of a Kubernetes binary quantity (``26Gi``) or a plain byte count."""
    text = str(text)
    digits = text.rstrip("KMGTi")
    return int(digits) * _UNITS[text[len(digits) :]]


def groups(raycluster) -> list[tuple[str, dict]]:
    spec = raycluster["spec"]
    workers = [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    return [("head", spec["headGroupSpec"]), *workers]


# Triton's kernel cache everywhere (a pod may import the kernels); on the GPU workers every JIT
# cache torch and CUDA keep, and the hub cache --model ORG/NAME downloads into.
CACHES = {"TRITON_CACHE_DIR"}
GPU_CACHES = CACHES | {
    "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "HF_HOME"
}  # fmt: skip


def test_jit_caches_are_on_writable_volumes(raycluster):
    for name, group in groups(raycluster):
        pod = group["template"]["spec"]
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"], name
        env = {e["name"]: e["value"] for e in container["env"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        writable = {
            m["mountPath"]: volumes[m["name"]]
            for m in container["volumeMounts"]
            if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]
        }
        for var in GPU_CACHES if name == "gpu" else CACHES:
            path = env.get(var)
            assert path, f"{name}: {var} is not set (the default is on the read-only root)"
            on = [m for m in writable if path.startswith(m.rstrip("/") + "/")]
            assert on and on[0] != "/dev/shm", f"{name}: {var}={path} is on no writable volume"


def test_shm_and_the_object_store_are_sized_together(raycluster):
    """Ray's object store fits in /dev/shm (else it falls back to disk), with little of /dev/shm
    left unused, and both inside the container's memory limit (a memory emptyDir counts)."""
    for name, group in groups(raycluster):
        pod = group["template"]["spec"]
        (container,) = pod["containers"]
        store = int(group["rayStartParams"]["object-store-memory"])
        (shm_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        (shm,) = [v for v in pod["volumes"] if v["name"] == shm_mount["name"]]
        assert shm["emptyDir"]["medium"] == "Memory", name
        size = quantity(shm["emptyDir"]["sizeLimit"])
        limit = quantity(container["resources"]["limits"]["memory"])
        assert store < size <= store + 2 * 2**30, (name, store, size)
        assert size <= limit // 2, (name, size, limit)
