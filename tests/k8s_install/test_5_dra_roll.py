"""The chart's DRA path through a roll and an uninstall, after ``test_4_dra`` installed it on a node
labelled for DRA: ``helm upgrade`` rolls the driver DaemonSet (with surge) and the allocator while pods
hold claims and new claims keep coming, and none of them fails to prepare; then ``helm uninstall`` takes
the pool, the sockets, the CDI specs, the checkpoint and the state files off the node."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from controlplane import wait_for
from install_helpers import (
    NAMESPACE,
    NODE,
    RELEASE,
    REPO,
    Cluster,
    create_claim_pod,
    gpuslice_keys,
    pool_slices,
    release_objects,
    running_pod,
)

from gpuslice.k8s.dra.slices import DRIVER

pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1800)]

HOLDING = 6  # pods holding claims before the roll
ARRIVING = 30  # at most, one every 2 s while it rolls: with the held ones, 36 of the node's 40 shares
MEMORY, CORES = "1Gi", "10"  # a small share: the node's four GPUs take 40 of them


def _failed_prepares(core: Any, namespace: str) -> list[str]:
    """The kubelet's events for pods whose claims it could not have prepared (FailedPrepareDynamicResources:
    no driver registered, or the driver refused). kube-scheduler's own retries are not counted: when it
    sees a claim before its cache has gpuslice's allocation, its PreBind finds the claim "allocated
    elsewhere in the meantime" and schedules the pod again."""
    return [
        f"{e.involved_object.name}: {e.reason} {e.message}"
        for e in core.list_namespaced_event(namespace).items
        if "Prepare" in (e.reason or "") or "prepare dynamic resources" in (e.message or "")
    ]


def _ready_driver_pods(cluster: Cluster) -> int:
    return sum(
        1
        for p in cluster.core().list_namespaced_pod(NAMESPACE, label_selector="app=gpuslice-dra-driver").items
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    )


def test_an_upgrade_rolls_the_dra_driver_and_no_claim_fails_to_prepare(
    installed: Cluster, user_namespace: str
) -> None:
    core = installed.core()
    assert pool_slices(installed), "test_4_dra installs the chart on a node labelled for DRA"
    names = [f"h{k}" for k in range(HOLDING)]
    for name in names:
        create_claim_pod(installed, user_namespace, name, MEMORY, CORES)
    held = {
        n: wait_for(lambda n=n: running_pod(core, user_namespace, n), 300, f"pod {n} Running") for n in names
    }
    generation = (
        installed.apps().read_namespaced_daemon_set("gpuslice-dra-driver", NAMESPACE).metadata.generation
    )

    rolling = threading.Event()
    arrived: list[str] = []  # claims made while the chart rolls

    def arrive() -> None:
        while not rolling.wait(2.0) and len(arrived) < ARRIVING:
            name = f"r{len(arrived)}"
            create_claim_pod(installed, user_namespace, name, MEMORY, CORES)
            arrived.append(name)

    arrivals = threading.Thread(target=arrive, daemon=True)
    arrivals.start()
    start = time.monotonic()
    try:
        installed.helm(
            "upgrade", RELEASE, str(REPO / "deploy" / "helm" / "gpuslice"), "--namespace", NAMESPACE,
            "--wait", "--timeout", "10m", *installed.set_args(),
            "--set", "podAnnotations.gpuslice\\.io/rollout=dra",
        )  # fmt: skip
        for workload in ("daemonset/gpuslice-dra-driver", "deployment/gpuslice-dra-allocator"):
            installed.plane.kubectl("rollout", "status", workload, "-n", NAMESPACE, "--timeout", "600s")
    finally:
        rolling.set()
        arrivals.join()
    roll_s = time.monotonic() - start
    print(f"\nhelm upgrade (DRA) -> driver and allocator rolled, {len(arrived)} claims made meanwhile: "
          f"{roll_s:.1f} s", file=sys.stderr)  # fmt: skip

    daemon = installed.apps().read_namespaced_daemon_set("gpuslice-dra-driver", NAMESPACE)
    assert daemon.metadata.generation > generation and _ready_driver_pods(installed) == 1
    assert arrived, "no claim was made during the roll"
    for name in arrived:  # every claim made during the roll is prepared: its pod runs
        wait_for(
            lambda n=name: running_pod(core, user_namespace, n), 300, f"pod {name} Running after the roll"
        )
    for name, pod in held.items():  # the pods that held claims through the roll kept running, untouched
        now = core.read_namespaced_pod(name, user_namespace)
        assert now.metadata.uid == pod.metadata.uid and now.status.phase == "Running", name
        assert [s.restart_count for s in now.status.container_statuses] == [0], name
    assert _failed_prepares(core, user_namespace) == []


def test_uninstall_takes_the_dra_driver_off_the_node(installed: Cluster) -> None:
    core = installed.core()
    plugins = Path(installed.values["dra.kubeletPluginsDir"])
    registry = Path(installed.values["dra.kubeletRegistryDir"])
    cdi = Path(installed.values["dra.cdiDir"])
    state = Path(installed.values["dra.stateDir"])
    # the roll's pods are gone (the namespace fixture): the kubelet unprepared their claims
    wait_for(
        lambda: not list(cdi.glob("gpuslice.io-claim_*.json")), 120, "the kubelet to unprepare the claims"
    )
    # one instance's sockets, named by its pod (the roll's old instance removed its own)
    assert pool_slices(installed) and len(list((plugins / DRIVER).glob("dra-*.sock"))) == 1
    assert len(list(registry.glob(f"{DRIVER}-*.sock"))) == 1 and (state / "dra-checkpoint.json").exists()

    start = time.monotonic()
    done = installed.helm(
        "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m", check=False
    )
    assert done.returncode == 0, f"{done.stderr}\n{installed.describe()}"
    wait_for(lambda: not core.list_namespaced_pod(NAMESPACE).items, 120, "gpuslice's pods to be gone")
    print(f"\nhelm uninstall (DRA) -> every pod gone: {time.monotonic() - start:.1f} s", file=sys.stderr)

    assert pool_slices(installed) == []
    assert not (plugins / DRIVER).exists()  # the folder the driver made for its socket
    assert not list(registry.glob(f"{DRIVER}*"))
    assert not list(cdi.glob("gpuslice.io-*"))
    assert not state.exists() or not list(state.iterdir()), sorted(str(p) for p in state.rglob("*"))
    node = core.read_node(NODE)
    assert gpuslice_keys(node.metadata.annotations) == set()
    assert gpuslice_keys(node.metadata.labels) == {"gpuslice.io/dra-node"}  # only the admin's own label
    assert release_objects(installed) == []
