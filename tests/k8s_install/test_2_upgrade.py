"""``helm upgrade`` of the installed chart while user pods hold slices: every Deployment and DaemonSet
rolls (a new pod annotation), no running pod is restarted or loses its slice, and the rolled components
place and allocate the next pod without over-committing the GPUs the running pods hold."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from controlplane import wait_for
from install_helpers import NAMESPACE, NODE, RELEASE, REPO, SPLIT_COUNT, Cluster, running_pod, user_pod

from gpuslice.k8s.decision import Decision

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(2400)]

RUNNING = 20  # user pods holding slices while the chart rolls
ROLLED = {
    "deployment": ("gpuslice-scheduler", "gpuslice-webhook", "gpuslice-dra-allocator"),
    "daemonset": ("gpuslice-device-plugin", "gpuslice-dra-driver"),
}


def _generations(cluster: Cluster) -> dict[str, int]:
    apps = cluster.apps()
    found = {
        f"deployment/{n}": apps.read_namespaced_deployment(n, NAMESPACE).metadata.generation
        for n in ROLLED["deployment"]
    }
    found.update(
        {
            f"daemonset/{n}": apps.read_namespaced_daemon_set(n, NAMESPACE).metadata.generation
            for n in ROLLED["daemonset"]
        }
    )
    return found


def test_an_upgrade_rolls_every_workload_and_no_running_pod_loses_its_slice(
    installed: Cluster, user_namespace: str
) -> None:
    core = installed.core()
    names = [f"p{k:02d}" for k in range(RUNNING)]
    for name in names:  # 10 % and 500 MiB each: two GPUs' worth
        limits = {"gpuslice.io/gpumem": "500", "gpuslice.io/gpucores": "10"}
        core.create_namespaced_pod(user_namespace, user_pod(name, "sleep 3600", limits))
    held = {
        n: wait_for(lambda n=n: running_pod(core, user_namespace, n), 300, f"pod {n} Running") for n in names
    }
    decisions = {n: Decision.from_annotations(p.metadata.annotations) for n, p in held.items()}
    before = _generations(installed)

    seen: list[str] = []  # the node's allocatable shares, sampled through the roll
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            seen.append((core.read_node(NODE).status.allocatable or {}).get("gpuslice.io/gpu", "0"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    installed.helm(
        "upgrade", RELEASE, str(REPO / "deploy" / "helm" / "gpuslice"), "--namespace", NAMESPACE,
        "--wait", "--timeout", "10m", *installed.set_args(),
        "--set", "podAnnotations.gpuslice\\.io/rollout=2",
    )  # fmt: skip
    for kind, names in ROLLED.items():
        for name in names:
            installed.plane.kubectl(
                "rollout", "status", f"{kind}/{name}", "-n", NAMESPACE, "--timeout", "600s"
            )
    roll_s = time.monotonic() - start
    stop.set()
    sampler.join()
    print(f"\nhelm upgrade -> every workload rolled, {RUNNING} pods running: {roll_s:.1f} s", file=sys.stderr)

    after = _generations(installed)
    # rolled with surge: the new device plugin served before the old one stopped, so the kubelet never
    # offered fewer shares than the node has (sampled every half second: a gap shorter than that, or
    # than the kubelet's 2 s status period, is not seen)
    assert seen and set(seen) == {str(4 * SPLIT_COUNT)}, seen
    assert all(after[k] > before[k] for k in before), (before, after)  # every one of them rolled
    for name, pod in held.items():
        now = core.read_namespaced_pod(name, user_namespace)
        assert now.metadata.uid == pod.metadata.uid and now.status.phase == "Running", name
        assert [s.restart_count for s in now.status.container_statuses] == [0], name
        assert Decision.from_annotations(now.metadata.annotations) == decisions[name], name
    # the rolled scheduler and device plugin know what the running pods hold: c (50 % of a GPU) is
    # placed beside them without over-committing any GPU's compute
    core.create_namespaced_pod(
        user_namespace,
        user_pod("c", "sleep 3600", {"gpuslice.io/gpumem": "1000", "gpuslice.io/gpucores": "50"}),
    )
    placed = wait_for(lambda: running_pod(core, user_namespace, "c"), 300, "pod c Running after the roll")
    decisions["c"] = Decision.from_annotations(placed.metadata.annotations)
    percent: dict[int, int] = {}
    for decision in decisions.values():
        assert decision is not None
        for gpu in decision.gpu_indices:
            percent[gpu] = percent.get(gpu, 0) + decision.cores_percent
    assert max(percent.values()) <= 100, percent
