"""deploy/ passes the linters an SRE would run: hadolint on the Dockerfile, and checkov's
Kubernetes and Dockerfile checks (deploy/checkov.yaml lists each skipped check with its reason)
on every manifest and on the RayCluster's pod templates, written out as Pods (checkov does not
look inside the RayCluster CRD). The Dockerfile is linted, not built (no Docker engine here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
# scripts/setup.sh --dev installs checkov in a venv of its own inside the project's
CHECKOV = Path(sys.prefix) / "checkov" / "bin" / "checkov"
HINT = "run scripts/setup.sh --dev (it installs the deploy linters)"


def tool(path: Path | str | None, name: str) -> str:
    if path is None or not Path(path).exists():
        pytest.fail(f"{name} not found: {HINT}", pytrace=False)
    return str(path)


def test_hadolint_passes_the_dockerfile():
    hadolint = tool(shutil.which("hadolint", path=str(Path(sys.executable).parent)), "hadolint")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DEPLOY / "docker" / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def raycluster_pods() -> list[dict]:
    """Each group of the RayCluster as the Pod KubeRay makes of it (labels KubeRay adds too)."""
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    name = cluster["metadata"]["name"]
    groups = [("head", cluster["spec"]["headGroupSpec"])]
    groups += [(g["groupName"], g) for g in cluster["spec"]["workerGroupSpecs"]]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{group_name}",
                "labels": {
                    **group["template"]["metadata"].get("labels", {}),
                    "ray.io/cluster": name,
                    "ray.io/group": group_name,
                },
            },
            "spec": group["template"]["spec"],
        }
        for group_name, group in groups
    ]


def test_checkov_passes_every_manifest_and_the_ray_pods(tmp_path):
    checkov = tool(CHECKOV, "checkov")
    pods = tmp_path / "raycluster-pods"
    pods.mkdir()
    for pod in raycluster_pods():
        (pods / f"{pod['metadata']['name']}.yaml").write_text(yaml.safe_dump(pod))
    # the pods beside the policies that select them (checkov's NetworkPolicy check)
    shutil.copy(DEPLOY / "kuberay" / "networkpolicy.yaml", pods)
    result = subprocess.run(
        [
            checkov,
            "--config-file",
            str(DEPLOY / "checkov.yaml"),
            "-d",
            str(DEPLOY),
            "-d",
            str(pods),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    reports = []  # one JSON document per directory, each a report or a list of them
    decoder, text, at = json.JSONDecoder(), result.stdout.strip(), 0
    while at < len(text):
        found, at = decoder.raw_decode(text, at)
        reports += found if isinstance(found, list) else [found]
        while at < len(text) and text[at].isspace():
            at += 1
    failed = [
        f"{check['check_id']} {check['check_name']}: {check['resource']} ({check['file_path']})"
        for report in reports
        for check in report.get("results", {}).get("failed_checks", [])
    ]
    passed = sum(r.get("summary", {}).get("passed", 0) for r in reports)
    assert not failed, "checkov:\n" + "\n".join(failed)
    assert {r.get("check_type") for r in reports} >= {"kubernetes", "dockerfile"}, reports
    assert passed >= 50, f"checkov passed only {passed} checks: did it see the manifests?"
    assert result.returncode == 0, result.stderr[-2000:]
