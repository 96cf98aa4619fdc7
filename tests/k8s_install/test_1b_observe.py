"""Seeing the cluster on the real node, through the installed chart: two pods hold shim slices of one
GPU and run a load on the fake driver; a real Prometheus scrapes the device plugin's and the extender's
metrics ports at their pods' addresses, and PromQL gives back each pod's memory used and compute share;
a third pod writing garbage into its own shim region loses only its own series; the cluster dashboard,
reached through ``kubectl port-forward``, draws both pods on their GPU; ``kubectl gpuslice`` prints what
the ledger holds, and why a pod that cannot fit waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from controlplane import free_port, wait_for
from install_helpers import NAMESPACE, NODE, REPO, Cluster, running_pod, user_pod

from gpuslice.k8s.decision import Decision
from gpuslice.units import MiB

sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "server"))
from test_dashboard_browser import browser, until

from prometheus_server import Prometheus

__all__ = ["browser"]  # the fixture, imported for pytest to find
pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1200)]

HELD = 32 * MiB  # what each loaded pod holds through the shim
# a pod's load: hold HELD while kernels run (the fake driver's kernels take their time on the CPU)
LOAD = f"driver_client launch kernel 100000000 2000 >/dev/null & sleep 3600 | driver_client hold {HELD}"
LIMITS = {"gpuslice.io/gpumem": "64", "gpuslice.io/gpucores": "30"}
KUBECTL_GPUSLICE = Path(sys.executable).parent / "kubectl-gpuslice"


def _pod_ip(cluster: Cluster, app: str) -> str:
    (pod,) = cluster.core().list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items
    return str(pod.status.pod_ip)


def _one(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


@pytest.fixture
def prometheus(installed: Cluster, external_tool: Any, tmp_path: Path) -> Iterator[Prometheus]:
    """A real Prometheus scraping the device plugin (9445) and the extender (its metrics port) at their
    pods' addresses on the pod network, as a cluster's Prometheus would."""
    binary = external_tool("prometheus", "Debian: apt install prometheus")
    targets = {
        "device-plugin": [f"{_pod_ip(installed, 'gpuslice-device-plugin')}:9445"],
        "extender": [f"{_pod_ip(installed, 'gpuslice-scheduler')}:9447"],
    }
    prom = Prometheus(binary, tmp_path / "prometheus", targets)
    try:
        yield prom
    finally:
        prom.stop()


def _kubectl_gpuslice(cluster: Cluster, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(cluster.plane.kubeconfig), "COLUMNS": "120"}
    done = subprocess.run(
        [str(KUBECTL_GPUSLICE), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"kubectl gpuslice {' '.join(args)}: {done.stderr}"
    return done.stdout


def test_prometheus_the_dashboard_and_kubectl_gpuslice_see_what_each_pod_holds_and_uses(
    installed: Cluster, user_namespace: str, prometheus: Prometheus, browser: Any
) -> None:
    core = installed.core()
    for name in ("a", "b"):
        core.create_namespaced_pod(user_namespace, user_pod(name, LOAD, LIMITS))
    held = {
        n: wait_for(lambda n=n: running_pod(core, user_namespace, n), 240, f"pod {n} Running") for n in "ab"
    }
    decisions = {n: Decision.from_annotations(p.metadata.annotations) for n, p in held.items()}
    gpus = {n: d.gpu_indices for n, d in decisions.items() if d is not None}
    assert gpus["a"] == gpus["b"], gpus  # best fit: the two shares on one GPU
    gpu = str(gpus["a"][0])

    # Prometheus: each pod's memory used (what it holds through the shim), its share and its kernels
    for name in "ab":
        selector = f'namespace="{user_namespace}",pod="{name}"'
        used = prometheus.wait_for(
            f"gpuslice_pod_memory_used_bytes{{{selector}}}",
            120,
            lambda r: r and float(r[0]["value"][1]) >= HELD,
        )
        assert _one(used) == HELD and used[0]["metric"]["gpu"] == gpu
        assert _one(prometheus.query(f"gpuslice_pod_compute_limit_ratio{{{selector}}}")) == 0.3
        assert _one(prometheus.query(f"gpuslice_pod_memory_limit_bytes{{{selector}}}")) == 64 * MiB
        prometheus.wait_for(
            f"rate(gpuslice_pod_compute_busy_seconds_total{{{selector}}}[5s])", 60,
            lambda r: r and float(r[0]["value"][1]) > 0,
        )  # fmt: skip
    slices = prometheus.wait_for(f'gpuslice_gpu_slices{{gpu="{gpu}"}}', 60, lambda r: r and _one(r) >= 2)
    assert _one(slices) == 2
    # the extender's cluster series from its own metrics port: the node and its allocation
    allocated = prometheus.wait_for(f'gpuslice_cluster_node_gpus_allocated{{node="{NODE}"}}', 60)
    assert _one(allocated) == pytest.approx(0.6)  # two 30 % shares

    # A pod writes garbage into its own shim region: only its own series go, counted as an error
    vandal = 'head -c 38016 /dev/urandom > "$GPUSLICE_SHIM_REGION"; sleep 3600'
    core.create_namespaced_pod(user_namespace, user_pod("vandal", vandal, LIMITS))
    wait_for(lambda: running_pod(core, user_namespace, "vandal"), 240, "pod vandal Running")
    prometheus.wait_for(
        'sum(gpuslice_node_region_errors_total{reason=~"not_a_region|out_of_range|mismatch"})', 60,
        lambda r: r and float(r[0]["value"][1]) > 0,
    )  # fmt: skip
    assert prometheus.query('gpuslice_pod_memory_used_bytes{pod="vandal"}') == []
    for name in "ab":
        used = prometheus.query(
            f'gpuslice_pod_memory_used_bytes{{namespace="{user_namespace}",pod="{name}"}}'
        )
        assert _one(used) == HELD and used[0]["metric"]["gpu"] == gpu

    # The dashboard through kubectl port-forward (the extender listens on loopback in its pod)
    port = free_port()
    forward = subprocess.Popen(
        [str(installed.plane.bin / "kubectl"), "--kubeconfig", str(installed.plane.kubeconfig),
         "port-forward", "-n", NAMESPACE, "deploy/gpuslice-scheduler", f"{port}:8888"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:

        def forwarded() -> bool:
            assert forward.poll() is None, f"kubectl port-forward exited: {forward.stdout.read()}"
            try:
                return httpx.get(f"http://localhost:{port}/cluster/", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(forwarded, 60, "kubectl port-forward to the extender")
        browser.get(f"http://localhost:{port}/cluster/")
        until(
            "the first refresh", lambda: browser.find_element("id", "updated").text.startswith("updated"), 60
        )
        pods_on_gpu = browser.execute_script(
            "return [...document.querySelectorAll(`#map .node[data-node='" + NODE + "'] .gpu`)]"
            ".filter((g) => g.dataset.gpu === arguments[0])"
            ".flatMap((g) => [...g.querySelectorAll('.seg')].map((s) => s.dataset.pod));",
            gpu,
        )
        assert {f"{user_namespace}/a", f"{user_namespace}/b"} <= set(pods_on_gpu), pods_on_gpu
        shot = installed.plane.root / "cluster-dashboard-node.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        forward.terminate()
        forward.wait(timeout=10)

    # kubectl gpuslice, as kubectl runs it: what the ledger holds, and why a pod waits
    pods = json.loads(
        _kubectl_gpuslice(installed, "pods", "-n", user_namespace, "-o", "json", "--interval", "0")
    )
    rows = {p["name"]: p for p in (pods["pods"] if isinstance(pods, dict) else pods)}
    assert {"a", "b", "vandal"} <= set(rows), rows
    top = _kubectl_gpuslice(installed, "top", "--interval", "0")
    assert NODE in top and f"{user_namespace}/a" in top and f"{user_namespace}/b" in top, top
    # the node's four whole GPUs: admissible (an empty node holds them), but GPU 0 has three pods on it
    huge = {"gpuslice.io/gpu": "4"}
    core.create_namespaced_pod(user_namespace, user_pod("huge", "sleep 3600", huge))
    why = wait_for(
        lambda: (
            "FailedScheduling" in (out := _kubectl_gpuslice(installed, "why", "huge", "-n", user_namespace))
            and out
        ),
        120,
        "kubectl gpuslice why to show the refusal",
    )
    assert "is pending" in why and "need 4 GPU(s)" in why, why
