"""The kustomize base on the real node, after the chart was uninstalled: applied through an overlay
that says only what differs on this test node (where pods reach the API server, the simulated machine
and the state folder), the webhook certificate made by docs/kubernetes.md's own commands, a user's pod
mutated, scheduled and allocated by the base's components, and the uninstall the docs give for
kustomize leaving nothing of gpuslice behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import wait_for
from install_helpers import NODE, REPO, SIMULATE, SPLIT_COUNT, Cluster, gpuslice_keys, running_pod, user_pod

from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY, LABEL_GPU_NODE
from gpuslice.k8s.decision import Decision
from node import DEVICE_PLUGIN_DIR

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1500)]

BASE = REPO / "deploy" / "kubernetes"
NAMESPACE = "gpuslice"  # the base's own
DOCS = REPO / "docs" / "kubernetes.md"
WORKLOADS = (
    "deployment/gpuslice-scheduler",
    "deployment/gpuslice-webhook",
    "deployment/gpuslice-dra-allocator",
    "daemonset/gpuslice-device-plugin",
)


def docs_block(after: str) -> str:
    """The first ``sh`` block of docs/kubernetes.md after the line ``after``: the commands a reader runs."""
    text = DOCS.read_text()
    start = text.index(after)
    found = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert found, f"no sh block after {after!r} in {DOCS}"
    return found.group(1)


def run_docs(cluster: Cluster, script: str, cwd: Path) -> str:
    """Run ``script`` as a reader would: kubectl on PATH, their kubeconfig in KUBECONFIG."""
    env = {
        **os.environ,
        "PATH": f"{cluster.plane.bin}:{os.environ['PATH']}",
        "KUBECONFIG": str(cluster.plane.kubeconfig),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"the docs' commands failed ({done.returncode}):\n{script}\n{done.stderr}"
    return done.stdout


def _env(cluster: Cluster) -> list[dict[str, str]]:
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": cluster.values["kubernetesService.host"]},
        {"name": "KUBERNETES_SERVICE_PORT", "value": cluster.values["kubernetesService.port"]},
    ]


def _patch(kind: str, name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"template": {"spec": {"containers": containers, **spec}}},
    }


def overlay(cluster: Cluster, folder: Path) -> Path:
    """What this node needs beyond the base, as strategic-merge patches: pods reach the API server at the
    bridge's address (no kube-proxy here), the device plugin runs the simulated machine with the shim,
    and its state folder is the node's own (the same path inside and outside, as the shim's mounts need)."""
    state = cluster.values["devicePlugin.stateDir"]
    env = _env(cluster)
    command = [
        "gpuslice", "k8s", "device-plugin", "--split-count", str(SPLIT_COUNT),
        "--socket-dir", str(DEVICE_PLUGIN_DIR), "--state-dir", state, "--sharing", "shim",
        "--metrics-port", "9445", "--simulate", SIMULATE,
    ]  # fmt: skip
    patches = [
        _patch("Deployment", "gpuslice-scheduler",
               [{"name": "kube-scheduler", "env": env}, {"name": "extender", "env": env}]),
        _patch("Deployment", "gpuslice-dra-allocator", [{"name": "dra-allocator", "env": env}]),
        _patch(
            "DaemonSet", "gpuslice-device-plugin",
            [{"name": "device-plugin", "env": env, "command": command,
              "volumeMounts": [{"name": "state", "mountPath": state}]}],
            volumes=[{"name": "state", "hostPath": {"path": state, "type": "DirectoryOrCreate"}}],
        ),
        _patch("DaemonSet", "gpuslice-dra-driver", [{"name": "dra-driver", "env": env}]),
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "patches.yaml").write_text(yaml.safe_dump_all(patches, sort_keys=False))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, folder)],
        "patches": [{"path": "patches.yaml"}],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


def test_the_kustomize_base_runs_on_the_node_and_its_uninstall_leaves_nothing(
    cluster: Cluster, user_namespace: str
) -> None:
    core = cluster.core()
    assert not core.list_namespaced_pod("gpuslice-system").items, "the chart is uninstalled first"
    core.patch_node(NODE, {"metadata": {"labels": {"gpuslice.io/dra-node": None, LABEL_GPU_NODE: "true"}}})
    work = cluster.plane.root / "kustomize"
    folder = overlay(cluster, work / "overlay")
    # the base's webhook patch needs its configuration: apply first, then the docs' certificate steps
    start = time.monotonic()
    cluster.plane.kubectl("apply", "-k", str(folder))
    run_docs(cluster, docs_block("## Webhook certificate"), work)
    for workload in WORKLOADS:
        cluster.plane.kubectl("rollout", "status", workload, "-n", NAMESPACE, "--timeout", "600s")
    print(
        f"\nkubectl apply -k + certificate -> every workload Ready: {time.monotonic() - start:.1f} s",
        file=sys.stderr,
    )

    limits = {"gpuslice.io/gpumem": "64", "gpuslice.io/gpucores": "20"}
    core.create_namespaced_pod(user_namespace, user_pod("k", "sleep 3600", limits))
    pod = wait_for(lambda: running_pod(core, user_namespace, "k"), 240, "the user's pod Running")
    assert pod.spec.scheduler_name == "gpuslice-scheduler"  # the base's webhook mutated it
    decision = Decision.from_annotations(pod.metadata.annotations)  # the base's extender decided it
    assert decision is not None and decision.cores_percent == 20 and pod.spec.node_name == NODE
    core.delete_namespaced_pod("k", user_namespace)
    wait_for(lambda: not core.list_namespaced_pod(user_namespace).items, 120, "the user's pod gone")

    start = time.monotonic()
    run_docs(cluster, docs_block("With kustomize, delete the DaemonSets first"), REPO)
    wait_for(lambda: not core.list_namespaced_pod(NAMESPACE).items, 180, "the base's pods to be gone")
    print(
        f"\nkustomize uninstall (the docs' commands) -> every pod gone: {time.monotonic() - start:.1f} s",
        file=sys.stderr,
    )
    node = core.read_node(NODE)
    assert ANNOTATION_NODE_INVENTORY not in (node.metadata.annotations or {})
    assert gpuslice_keys(node.metadata.annotations) == set()
    assert gpuslice_keys(node.metadata.labels) == {LABEL_GPU_NODE}  # only the admin's own label
    assert not list(DEVICE_PLUGIN_DIR.glob("gpuslice-*"))
    state = Path(cluster.values["devicePlugin.stateDir"])
    assert not state.exists() or not list(state.iterdir()), sorted(str(p) for p in state.rglob("*"))
    left = cluster.plane.kubectl("get", "-k", str(folder), "-o", "name", "--ignore-not-found").stdout.split()
    assert left == []
