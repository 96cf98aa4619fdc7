"""The real kubelet drives gpuslice's DRA driver: ``gpuslice k8s dra-driver`` registers in the kubelet's
plugins_registry, a pod whose claim ``gpuslice k8s dra-allocator`` allocated is bound to the node by
kube-scheduler, the kubelet calls NodePrepareResources for exactly that claim before the container
starts (the CDI spec carries the slice), and NodeUnprepareResources once the pod is deleted, also after
the driver was killed with -9 in between.

What the container sees depends on the runtime: the kubelet hands the CDI device names to it in the
CRI ``CDIDevices`` field, which containerd applies from 1.7 on (``enable_cdi``). Debian 12's
containerd 1.6 does not know the field and drops it, so there the container starts without the
slice's environment; the test asserts whichever of the two this node's containerd does.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane, Process
from dra_helpers import DRA_SCHEDULER, allocator_process, claim, dra_scheduler, objects, pool
from e2e_helpers import GPUSLICE, wait_for
from kubelet_node_helpers import NODE_NAME, SIMULATE, node_pod, parse_env, pod_log, wait_phase

from gpuslice.k8s.dra.allocator import GATE
from gpuslice.k8s.dra.classes import CLASS_SHARED
from gpuslice.k8s.dra.kube import GROUP, VERSION
from gpuslice.k8s.dra.prepare import CDI_KIND, cdi_spec_path
from gpuslice.node.discovery import discover
from gpuslice.units import GiB
from node import Node

pytestmark = pytest.mark.k8s_e2e
__all__ = ["dra_scheduler"]  # the fixture, imported for pytest


def containerd_applies_cdi() -> bool:
    """containerd 1.7+ applies the CRI's CDI devices; 1.6 (Debian 12) ignores them."""
    out = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=True).stdout
    major, minor = (int(x) for x in re.search(r" v?(\d+)\.(\d+)\.", out).groups())  # type: ignore[union-attr]
    return (major, minor) >= (1, 7)


@dataclass
class KubeletDriver:
    """The DRA driver process on the real node, its folders, and the argv it was started with."""

    plane: ControlPlane
    root: Path
    argv: list[str]
    proc: Process

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def prepared(self) -> dict[str, Any]:
        path = self.root / "state" / "dra-checkpoint.json"
        return json.loads(path.read_text())["claims"] if path.exists() else {}

    def registered(self) -> bool:
        if self.proc.popen.poll() is not None:
            raise AssertionError(f"the DRA driver exited:\n{self.proc.tail()}")
        return "the kubelet registered DRA driver" in self.proc.tail(400)

    def kill_and_restart(self) -> None:
        self.proc.kill()
        self.plane.processes.remove(self.proc)
        self.proc = self.plane.spawn("dra-driver-kubelet-2", self.argv)
        wait_for(self.registered, 120, "the restarted DRA driver to be registered by the kubelet again")


@pytest.fixture(scope="module")
def driver(node: Node, plane: ControlPlane, api_client: Any, dra_scheduler: Any) -> Iterator[KubeletDriver]:
    root = Path(tempfile.mkdtemp(prefix="dra-kubelet", dir="/tmp"))
    argv = [
        GPUSLICE, "k8s", "dra-driver",
        "--simulate", SIMULATE,
        "--node-name", NODE_NAME,
        "--kubeconfig", str(plane.kubeconfig),
        "--plugins-dir", str(node.kubelet_dir / "plugins"),  # the kubelet's --root-dir layout
        "--registry-dir", str(node.kubelet_dir / "plugins_registry"),
        "--cdi-dir", str(root / "cdi"),
        "--state-dir", str(root / "state"),
    ]  # fmt: skip
    proc = plane.spawn("dra-driver-kubelet", argv)
    found = KubeletDriver(plane, root, argv, proc)
    try:
        wait_for(found.registered, 120, "the kubelet to register the DRA driver from its plugins_registry")
        wait_for(lambda: pool(api_client, NODE_NAME), 60, "the node's ResourceSlices")
        yield found
    finally:
        found.proc.stop()
        plane.forget(found.proc)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def allocator(plane: ControlPlane, driver: KubeletDriver) -> Iterator[Process]:
    yield from allocator_process(plane, "dra-allocator-kubelet", "bestfit")


def dra_pod(name: str, claim_name: str, script: str) -> dict[str, Any]:
    """The node tests' pod (tools image, host network, the node's toleration) using a claim, gated
    for gpuslice's allocator and scheduled by the plain kube-scheduler profile."""
    pod = node_pod(name, script)
    pod["spec"]["schedulerName"] = DRA_SCHEDULER
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return pod


def read_claim(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    return objects(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name)


def start_share(api_client: Any, core: Any, namespace: str, name: str) -> tuple[dict[str, Any], Any]:
    """A 4 GiB / 30-core share claim and a pod that prints its environment and sleeps, once Running."""
    body = claim(name, CLASS_SHARED, capacity={"memory": "4Gi", "cores": "30"})
    objects(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", body)
    script = 'env; echo "--- devices"; ls /dev; sleep 3600'
    core.create_namespaced_pod(namespace, dra_pod(name, name, script))
    pod = wait_phase(core, namespace, name, ("Running",), timeout_s=240)
    return read_claim(api_client, namespace, name), pod


def test_the_kubelet_prepares_the_claim_and_unprepares_it_when_the_pod_goes(
    driver: KubeletDriver, allocator: Process, node: Node, api_client: Any, core: Any, namespace: str
) -> None:
    stored, pod = start_share(api_client, core, namespace, "share")
    uid = stored["metadata"]["uid"]
    assert pod.spec.node_name == NODE_NAME
    allocation = stored["status"]["allocation"]
    (result,) = allocation["devices"]["results"]
    assert result["pool"] == NODE_NAME and result["shareID"]  # gpuslice's allocator decided it
    assert [r["uid"] for r in stored["status"]["reservedFor"]] == [pod.metadata.uid]

    # The kubelet called Prepare with this claim (the driver names what it prepared), before the start.
    assert f"prepared claim {namespace}/share" in driver.proc.tail(400)
    assert set(driver.prepared()) == {uid}
    (device,) = driver.prepared()[uid]["devices"]
    assert device["device"] == result["device"] and device["share_id"] == result["shareID"]
    assert device["cdi_id"] == f"{CDI_KIND}={uid}-{result['device']}-{result['shareID']}"
    spec = json.loads(cdi_spec_path(driver.cdi_dir, uid).read_text())
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    gpu = int(result["device"].removeprefix("gpu-"))
    machine = discover(SIMULATE)
    assert env["CUDA_VISIBLE_DEVICES"] == machine.gpus[gpu].uuid
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB) and env["GPUSLICE_COMPUTE_PERCENT"] == "30"
    (gpu_node,) = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert gpu_node["path"] == f"/dev/nvidia{gpu}" and Path(gpu_node["hostPath"]).exists()  # stand-in

    # Inside the container: the slice where the runtime applies CDI; nothing of it where it does not.
    wait_for(lambda: "--- devices" in pod_log(node, core, namespace, "share"), 60, "the pod's output")
    inside = parse_env(pod_log(node, core, namespace, "share").partition("--- devices")[0])
    if containerd_applies_cdi():
        assert inside["CUDA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
        assert inside["GPUSLICE_GPU_MEMORY_BYTES"] == env["GPUSLICE_GPU_MEMORY_BYTES"]
    else:
        assert "CUDA_VISIBLE_DEVICES" not in inside and "GPUSLICE_GPU_MEMORY_BYTES" not in inside

    # Deleted: the kubelet stops the container, then calls Unprepare; the spec and the record go.
    core.delete_namespaced_pod("share", namespace)
    wait_for(lambda: uid not in driver.prepared(), 180, "the kubelet to unprepare the claim")
    assert not cdi_spec_path(driver.cdi_dir, uid).exists()
    assert f"unprepared claim {namespace}/share" in driver.proc.tail(400)


def test_a_driver_killed_while_the_pod_runs_still_unprepares_it(
    driver: KubeletDriver, allocator: Process, api_client: Any, core: Any, namespace: str
) -> None:
    stored, _pod = start_share(api_client, core, namespace, "survivor")
    uid = stored["metadata"]["uid"]
    assert uid in driver.prepared()
    driver.kill_and_restart()  # kill -9: only the checkpoint knows the claim now
    assert uid in driver.prepared() and cdi_spec_path(driver.cdi_dir, uid).exists()
    core.delete_namespaced_pod("survivor", namespace)
    wait_for(lambda: uid not in driver.prepared(), 180, "the kubelet to unprepare through the new driver")
    assert not cdi_spec_path(driver.cdi_dir, uid).exists()


def test_a_rolling_update_with_surge_leaves_the_new_driver_serving(
    driver: KubeletDriver, allocator: Process, api_client: Any, core: Any, namespace: str
) -> None:
    """A DaemonSet with maxSurge starts the new driver before it stops the old one, on the same sockets
    and checkpoint. The old one's stop must leave the new one's sockets in place, so the kubelet still
    prepares the next claim (through the new driver) and unprepares it."""
    old = driver.proc
    new = driver.plane.spawn("dra-driver-kubelet-surge", driver.argv)
    driver.proc = new  # the fixture stops whichever runs last
    wait_for(driver.registered, 120, "the kubelet to register the new driver beside the old one")
    old.stop()  # SIGTERM: the old instance's clean stop, after the new one took the sockets
    driver.plane.forget(old)
    assert new.popen.poll() is None
    stored, pod = start_share(api_client, core, namespace, "after-surge")
    uid = stored["metadata"]["uid"]
    assert pod.status.phase == "Running" and uid in driver.prepared()
    assert f"prepared claim {namespace}/after-surge" in new.tail(400)
    core.delete_namespaced_pod("after-surge", namespace)
    wait_for(lambda: uid not in driver.prepared(), 180, "the kubelet to unprepare through the new driver")


def test_one_slow_api_read_in_a_prepare_does_not_hold_up_another_claims_prepare(
    driver: KubeletDriver, allocator: Process, api_client: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    """The driver reads each claim from the API server when the kubelet asks it to prepare it. With that
    read of one claim taking 20 s (a proxy in front of the API server holds it), the kubelet's prepare
    of another pod's claim, asked meanwhile, is answered without waiting for it."""
    import yaml
    from slow_proxy import SlowProxy

    config = yaml.safe_load(driver.plane.kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    proxy = SlowProxy(
        cluster["server"], Path(cluster["certificate-authority"]), ["/resourceclaims/slow"], 20.0
    )
    proxy.start()
    try:
        config["clusters"][0]["cluster"] = {"server": proxy.url}
        through_proxy = tmp_path / "kubeconfig"
        through_proxy.write_text(yaml.safe_dump(config))
        argv = list(driver.argv)
        argv[argv.index("--kubeconfig") + 1] = str(through_proxy)
        driver.proc.stop()
        driver.plane.forget(driver.proc)
        driver.argv, driver.proc = argv, driver.plane.spawn("dra-driver-kubelet-slow-api", argv)
        wait_for(driver.registered, 120, "the kubelet to register the driver reading through the proxy")
        for name in ("slow", "quick"):
            body = claim(name, CLASS_SHARED, capacity={"memory": "4Gi", "cores": "30"})
            objects(api_client).create_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", body
            )
            core.create_namespaced_pod(namespace, dra_pod(name, name, "sleep 3600"))
        wait_phase(core, namespace, "quick", ("Running",), timeout_s=240)
        wait_phase(core, namespace, "slow", ("Running",), timeout_s=240)
        log = driver.proc.tail(400)
        quick, slow = (log.index(f"prepared claim {namespace}/{n}") for n in ("quick", "slow"))
        assert proxy.delayed and proxy.delayed[0][0].endswith("/resourceclaims/slow")
        assert quick < slow, "the quick claim's prepare waited for the slow claim's read"
    finally:
        proxy.stop()
