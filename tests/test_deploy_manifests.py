"""deploy/: every Kubernetes object validates offline (built-in kinds against Kubernetes' schemas,
RayCluster, PodMonitor and PrometheusRule against their vendored CRDs); the base applies where
the Prometheus Operator is absent; the Operator's objects agree with their sources; and the
manifest's parts line up: replica bounds and the GPU group, the real serve flags, ports, the
preStop drain inside its grace period, disruption budgets, the network policy."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

from router.config import ServeConfig
from router.flags import add_arguments
from tests.support.grafana import dashboard
from tests.support.k8s_schema import Loader, validation_errors

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "deploy" / "kuberay"
OPERATOR = BASE / "operator"
MANIFESTS = sorted(
    [*BASE.glob("*.yaml"), *OPERATOR.glob("*.yaml"), *REPO.glob("deploy/model/*.yaml")]
)


def documents(path: Path) -> list[dict]:
    with open(path) as f:
        return [doc for doc in yaml.load_all(f, Loader=Loader) if doc]


def objects(folder: Path) -> dict[str, dict]:
    return {
        f"{doc['kind']}/{doc['metadata']['name']}": doc
        for path in sorted(folder.glob("*.yaml"))
        for doc in documents(path)
    }


@pytest.fixture(scope="module")
def base() -> dict[str, dict]:
    return objects(BASE)


@pytest.fixture(scope="module")
def cluster(base) -> dict:
    return base["RayCluster/session-router"]


def group(cluster: dict, name: str) -> dict:
    (found,) = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == name]
    return found


def serve_command(cluster: dict) -> list[str]:
    """The words of the head script's `session-router serve` command (continuations joined)."""
    script = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["args"][0]
    script = script.replace("\\\n", " ")
    (line,) = [ln for ln in script.splitlines() if "session-router serve" in ln]
    words = shlex.split(line.split("session-router serve", 1)[1])
    return [w for w in words if w not in ('"${secure[@]}"', "${secure[@]}", "&")]


@pytest.mark.parametrize("path", MANIFESTS, ids=[str(p.relative_to(REPO)) for p in MANIFESTS])
def test_every_object_validates_offline(path):
    docs = documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        errors = validation_errors(doc)
        assert not errors, f"{path}: {doc['kind']}/{doc['metadata']['name']}:\n" + "\n".join(errors)


@pytest.mark.parametrize("breakage", ["service-port-type", "pdb-unknown-field", "rule-for"])
def test_validation_catches_mistakes(base, breakage):
    if breakage == "service-port-type":
        obj = yaml.safe_load(yaml.safe_dump(base["Service/session-router"]))
        obj["spec"]["ports"][0]["port"] = "50051"
    elif breakage == "pdb-unknown-field":
        obj = yaml.safe_load(yaml.safe_dump(base["PodDisruptionBudget/session-router-gpu"]))
        obj["spec"]["maxUnavailabel"] = 1
    else:
        (obj,) = documents(OPERATOR / "prometheusrule.yaml")
        obj["spec"]["groups"][0]["rules"][0]["for"] = "2 minutes"
    assert validation_errors(obj)


def test_base_applies_without_the_operators_crds(base):
    kinds = {doc["apiVersion"].split("/")[0] for doc in base.values()}
    assert "monitoring.coreos.com" not in kinds, "the base needs the Prometheus Operator's CRDs"
    operator = objects(OPERATOR)
    assert {key.split("/")[0] for key in operator} == {"PodMonitor", "PrometheusRule", "ConfigMap"}
    release = {doc["metadata"]["labels"].get("release") for doc in operator.values()}
    assert release == {"kube-prometheus-stack"}, "kube-prometheus-stack selects on `release`"


def test_operator_objects_agree_with_their_sources():
    spec = importlib.util.spec_from_file_location(
        "operator_objects", REPO / "scripts" / "operator_objects.py"
    )
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    for path, text in generator.generated().items():
        assert path.read_text() == text, f"{path} is stale: run python scripts/operator_objects.py"
    (rule,) = documents(OPERATOR / "prometheusrule.yaml")
    alerts = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    (board,) = documents(OPERATOR / "grafana-dashboard.yaml")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_dashboard_panels_have_distinct_ids_and_do_not_overlap():
    """Grafana keys a panel's state (links, edits, repeats) by its id, and moves panels that
    overlap: every panel has its own id and its own place."""
    panels = dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), sorted(ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        for y in range(pos["y"], pos["y"] + pos["h"]):
            for x in range(pos["x"], pos["x"] + pos["w"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[x, y]!r}"
                cells[x, y] = panel["title"]


def test_serve_flags_are_real_and_replicas_follow_the_gpu_group(cluster):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser, ServeConfig)
    args = parser.parse_args(serve_command(cluster))
    gpu = group(cluster, "gpu")
    per_worker = int(gpu["rayStartParams"]["num-gpus"])
    assert args.replica_gpus == 1
    assert args.min_replicas == gpu["minReplicas"] * per_worker
    assert args.max_replicas == gpu["maxReplicas"] * per_worker
    assert args.replicas == gpu["replicas"] * per_worker
    assert args.host == "0.0.0.0" and args.address == "auto"
    assert args.model_path and args.model_path.startswith("/models/")
    mounts = gpu["template"]["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == "/models" and m.get("readOnly") for m in mounts)
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0", "a replica could land on the head"


def test_no_port_takes_kuberays_metrics_name(cluster):
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for g in groups:
        for container in g["template"]["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            assert ports.get("metrics", 8080) == 8080, (g.get("groupName", "head"), ports)


def test_gpu_workers_drain_with_migration_inside_their_grace_period(cluster, base):
    pod = group(cluster, "gpu")["template"]["spec"]
    hook = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "session-router drain" in hook and "--this-node" in hook and "--migrate" in hook
    timeout = float(hook.split("--timeout-s", 1)[1].split()[0])
    assert timeout + 30 <= pod["terminationGracePeriodSeconds"], "no time left for Ray's stop"
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    grace = float(serve_command(cluster)[serve_command(cluster).index("--shutdown-grace-s") + 1])
    assert grace + 10 + 20 <= head["terminationGracePeriodSeconds"]  # replicas 10 s, Ray's stop
    budget = base["PodDisruptionBudget/session-router-gpu"]["spec"]
    assert budget["selector"]["matchLabels"] == {
        "ray.io/cluster": "session-router",
        "ray.io/group": "gpu",
    }
    assert budget["maxUnavailable"] == 1


def test_network_policy_keeps_rays_ports_to_the_cluster(base, cluster):
    policy = base["NetworkPolicy/session-router"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"ray.io/cluster": "session-router"}
    open_ports = set()
    for rule in policy["ingress"]:
        peers = rule.get("from", [])
        in_cluster = peers and all(
            p.get("podSelector", {}).get("matchLabels") == {"ray.io/cluster": "session-router"}
            and "namespaceSelector" not in p
            for p in peers
        )
        if not in_cluster:
            assert rule.get("ports"), f"a rule opens every port beyond the cluster: {rule}"
            open_ports |= {p["port"] for p in rule["ports"]}
    assert open_ports == {50051, 8000, 9400, 8080}, open_ports
    assert not open_ports & {6379, 8265, 10001}, "Ray's ports are open beyond the cluster"


def test_every_alert_has_a_severity_and_a_runbook_section():
    alerts = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    runbooks = (REPO / "deploy" / "runbooks.md").read_text()
    sections = {
        line[3:].strip().lower() for line in runbooks.splitlines() if line.startswith("## ")
    }
    for rule in alerts["groups"][0]["rules"]:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert name.lower() in sections, f"deploy/runbooks.md has no section for {name}"
        url = rule["annotations"]["runbook_url"]
        assert url.endswith(f"deploy/runbooks.md#{name.lower()}"), url


# CUDA variants download.pytorch.org publishes torch 2.13 wheels for (none for cu128 since 2.12)
# and Ray 2.60's GPU image tags (ray-images.json: cu12.6.3-cudnn ... cu13.0.0-cudnn).
TORCH_213_CUDA = {"cu126", "cu130", "cu132"}
RAY_260_CUDA = {"cu121", "cu123", "cu124", "cu125", "cu126", "cu128", "cu129", "cu130"}


def test_the_image_pairs_a_torch_wheel_that_exists_with_rays_image_of_its_cuda():
    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    (base,) = re.findall(r"^FROM (\S+)$", text, re.M)
    pins = dict(
        line.split("==") for line in (REPO / "constraints.txt").read_text().split() if "==" in line
    )
    cuda = args["CUDA"]
    assert base.startswith("rayproject/ray:"), base
    assert base.split(":")[1].replace("${CUDA}", cuda) == f"{pins['ray']}-py311-{cuda}"
    assert args["TORCH_VERSION"] == pins["torch"] == "2.13.0"
    assert (
        args["TORCH_INDEX"].replace("${CUDA}", cuda) == f"https://download.pytorch.org/whl/{cuda}"
    )
    assert cuda in TORCH_213_CUDA & RAY_260_CUDA, cuda


def test_the_image_copies_every_package_the_distribution_installs_and_nothing_absent():
    """What ``pip install .`` in the image packs is what pyproject.toml's package list finds in the
    copied tree: every listed package must be copied, and every copied path must exist."""
    import tomllib

    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    copied = [
        src
        for line in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M)
        for src in line.split()
    ]
    for src in copied:
        assert (REPO / src).exists(), f"the Dockerfile copies {src}, which is not in the repository"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        package = pattern.rstrip("*")
        assert (REPO / package / "__init__.py").exists(), package
        assert package in copied, f"the image does not copy {package}, which pip install . packs"


def test_the_head_restarts_on_redis_and_holds_no_replica(base, cluster):
    """GCS fault tolerance: the head's GCS is kept in the Redis that redis.yaml serves, with the
    password from the Secret the Redis reads; only head pods reach it; the head offers Ray
    neither CPU nor GPU, so no replica lands on the node that restarts."""
    options = cluster["spec"]["gcsFaultToleranceOptions"]
    redis = base["Service/session-router-redis"]
    host, port = options["redisAddress"].removeprefix("redis://").split(":")
    assert host == redis["metadata"]["name"] and int(port) == redis["spec"]["ports"][0]["port"]
    secret = options["redisPassword"]["valueFrom"]["secretKeyRef"]
    pod = base["Deployment/session-router-redis"]["spec"]["template"]["spec"]
    (auth,) = [v for v in pod["volumes"] if "secret" in v]
    assert auth["secret"]["secretName"] == secret["name"]
    assert f"/{secret['key']})" in pod["containers"][0]["args"][0]
    assert options["externalStorageNamespace"], "a restarted head reloads its namespace"
    policy = base["NetworkPolicy/session-router-redis"]["spec"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {
        "ray.io/cluster": cluster["metadata"]["name"], "ray.io/node-type": "head"}}}]  # fmt: skip
    head = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert head["num-cpus"] == "0" and head["num-gpus"] == "0"
