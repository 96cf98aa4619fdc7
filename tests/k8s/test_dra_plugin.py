"""The DRA kubelet plugin driven as the kubelet drives it: registration over its socket, then
NodePrepareResources / NodeUnprepareResources over the DRA socket, against claims a test source serves."""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuslice.k8s.container_slice import container_slice
from gpuslice.k8s.dra.kubelet_plugin import DRA_SERVICE, PLUGIN_TYPE, KubeletPlugin
from gpuslice.k8s.dra.prepare import CDI_KIND, Preparer, cdi_spec_path
from gpuslice.k8s.dra.proto import dra_pb2 as dra
from gpuslice.k8s.dra.proto import dra_pb2_grpc as dra_grpc
from gpuslice.k8s.dra.proto import pluginregistration_pb2 as reg
from gpuslice.k8s.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from gpuslice.k8s.dra.slices import DRIVER
from gpuslice.k8s.shim_mounts import slice_folder
from gpuslice.node.discovery import discover
from gpuslice.node.enforcement import mig_device_uuid
from gpuslice.units import GiB

NODE = "node-a"
EXCLUSIVE = {
    "source": "FromClass",
    "requests": [],
    "opaque": {
        "driver": DRIVER,
        "parameters": {"apiVersion": "gpu.gpuslice.io/v1", "kind": "GpuConfig", "exclusive": True},
    },
}


@dataclass
class Claims:
    """A ClaimSource over a dict, counting reads."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0
    broken: bool = False

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads += 1
        if self.broken:
            raise ConnectionError("API server unreachable")
        return self.objects[(namespace, name)]

    def add(
        self, name: str, uid: str, results: list[dict[str, Any]], config: list[Any] | None = None
    ) -> None:
        status = {"allocation": {"devices": {"results": results, "config": config or []}}} if results else {}
        self.objects[("team", name)] = {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "status": status,
        }


def result(device: str, request: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **extra}


@dataclass
class Harness:
    root: Path
    claims: Claims
    plugin: KubeletPlugin
    healthy: dict[int, bool]

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def channel(self, path: Path) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{path}")

    def prepare(self, *names_uids: tuple[str, str]) -> dra.NodePrepareResourcesResponse:
        with self.channel(self.plugin.endpoint) as ch:
            claims = [dra.Claim(namespace="team", name=n, uid=u) for n, u in names_uids]
            return dra_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=claims), timeout=30
            )

    def unprepare(self, *names_uids: tuple[str, str]) -> dra.NodeUnprepareResourcesResponse:
        with self.channel(self.plugin.endpoint) as ch:
            claims = [dra.Claim(namespace="team", name=n, uid=u) for n, u in names_uids]
            return dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                dra.NodeUnprepareResourcesRequest(claims=claims), timeout=30
            )

    def spec(self, uid: str) -> dict[str, Any]:
        return json.loads(cdi_spec_path(self.cdi_dir, uid).read_text())


def start(root: Path, claims: Claims, machine_spec: str = "dgx-h100", sharing: str = "soft") -> Harness:
    machine = discover(machine_spec)
    healthy = {g.index: True for g in machine.gpus}
    preparer = Preparer(
        machine,
        NODE,
        claims,
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        sharing=sharing,
        healthy=lambda g: healthy[g],
    )
    plugin = KubeletPlugin(preparer, plugins_dir=root / "plugins", registry_dir=root / "registry")
    plugin.start()
    return Harness(root, claims, plugin, healthy)


@pytest.fixture
def root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # unix socket paths: at most 107 bytes
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def node(root: Path) -> Iterator[Harness]:
    harness = start(root, Claims())
    yield harness
    harness.plugin.stop()


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


def test_registration_names_the_driver_its_socket_and_the_v1_service(node: Harness) -> None:
    with node.channel(node.plugin.registration_path) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg.InfoRequest(), timeout=30)
        assert (info.type, info.name, list(info.supported_versions)) == (PLUGIN_TYPE, DRIVER, [DRA_SERVICE])
        assert info.endpoint == str(node.plugin.endpoint) and Path(info.endpoint).is_socket()
        assert node.plugin.registered is None
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=30)
    assert node.plugin.registered is True
    assert stat.S_IMODE(node.plugin.endpoint.stat().st_mode) == 0o600


def test_a_share_gets_a_cdi_device_per_share_with_the_device_plugins_slice(node: Harness) -> None:
    share = "6a1b2c3d-0000-4000-8000-000000000001"
    node.claims.add(
        "share", "uid-1", [result("gpu-3", shareID=share, consumedCapacity={"memory": "10Gi", "cores": "30"})]
    )
    answer = node.prepare(("share", "uid-1")).claims["uid-1"]
    assert answer.error == ""
    (device,) = answer.devices
    assert (device.pool_name, device.device_name, device.share_id) == (NODE, "gpu-3", share)
    assert list(device.request_names) == ["gpu"]
    assert list(device.cdi_device_ids) == [f"{CDI_KIND}=uid-1-gpu-3-{share}"]  # the share in the CDI name
    spec = node.spec("uid-1")
    assert spec["kind"] == CDI_KIND and [d["name"] for d in spec["devices"]] == [f"uid-1-gpu-3-{share}"]
    (gpu_node,) = spec["devices"][0]["containerEdits"]["deviceNodes"]
    # a simulated node: the device node is the device plugin's stand-in, a character device
    assert gpu_node == {"path": "/dev/nvidia3", "hostPath": str(node.root / "state" / "dev" / "nvidia3")}
    assert stat.S_ISCHR(Path(gpu_node["hostPath"]).stat().st_mode)
    for control in spec["containerEdits"]["deviceNodes"]:
        assert stat.S_ISCHR(Path(control["hostPath"]).stat().st_mode), control
    assert stat.S_IMODE(cdi_spec_path(node.cdi_dir, "uid-1").stat().st_mode) == 0o600
    env = env_of(spec)
    machine = node.plugin.preparer.machine
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == machine.gpus[3].uuid
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(10 * GiB) and env["GPUSLICE_COMPUTE_PERCENT"] == "30"
    # the very slice Allocate hands out for the same GPU, memory and cores
    same = container_slice(
        machine,
        sharing="soft",
        state_dir=node.root / "state",
        minors=range(8),
        namespace="team",
        holder=slice_folder(claim="share"),
        gpus=[3],
        memory_bytes=10 * GiB,
        compute_percent=30,
    )
    assert env == same.env
    assert spec["containerEdits"]["mounts"] == [
        {"hostPath": m.host_path, "containerPath": m.container_path, "options": ["ro", "bind"]}
        for m in same.mounts
    ]


def test_shim_sharing_mounts_the_shim_into_the_claims_containers(root: Path) -> None:
    claims = Claims()
    claims.add("s", "uid-s", [result("gpu-0", consumedCapacity={"memory": "4Gi", "cores": "25"})])
    node = start(root, claims, sharing="shim")
    try:
        spec = node.spec("uid-s") if node.prepare(("s", "uid-s")).claims["uid-s"].error == "" else {}
        env = env_of(spec)
        assert env["LD_PRELOAD"].startswith(str(root / "state" / "shim" / "lib"))
        mounted = {m["containerPath"]: m["options"][0] for m in spec["containerEdits"]["mounts"]}
        assert mounted[str(root / "state" / "shim" / "lib")] == "ro"
        assert mounted[env["GPUSLICE_SHIM_DIR"]] == "rw"
    finally:
        node.plugin.stop()


def test_whole_gpus_of_one_claim_are_one_slice(node: Harness) -> None:
    node.claims.add("pair", "uid-2", [result("gpu-0"), result("gpu-1")], config=[EXCLUSIVE])
    answer = node.prepare(("pair", "uid-2")).claims["uid-2"]
    assert answer.error == "" and [d.device_name for d in answer.devices] == ["gpu-0", "gpu-1"]
    env = env_of(node.spec("uid-2"))
    machine = node.plugin.preparer.machine
    assert env["CUDA_VISIBLE_DEVICES"] == f"{machine.gpus[0].uuid},{machine.gpus[1].uuid}"
    assert env["GPUSLICE_COMPUTE_PERCENT"] == "100" and "GPUSLICE_GPU_MEMORY_BYTES" in env  # whole GPUs


def test_a_mig_claim_gets_its_instance(root: Path) -> None:
    claims = Claims()
    claims.add("mig", "uid-m", [result("gpu-2-mig-3g-40gb-4", request="mig")])
    node = start(root, claims, machine_spec="dgx-h100:mig")
    try:
        answer = node.prepare(("mig", "uid-m")).claims["uid-m"]
        assert answer.error == ""
        env = env_of(node.spec("uid-m"))
        machine = node.plugin.preparer.machine
        assert env["CUDA_VISIBLE_DEVICES"] == mig_device_uuid(machine, 2, "3g.40gb", 4)
        assert env["GPUSLICE_MIG_PROFILE"] == "3g.40gb"
    finally:
        node.plugin.stop()


def test_prepare_is_idempotent_and_survives_a_restart(root: Path) -> None:
    claims = Claims()
    claims.add("c", "uid-3", [result("gpu-5", consumedCapacity={"memory": "1Gi"})])
    node = start(root, claims)
    first = node.prepare(("c", "uid-3")).claims["uid-3"]
    again = node.prepare(("c", "uid-3")).claims["uid-3"]
    assert first == again and claims.reads == 1  # the second answer came from the checkpoint
    node.plugin.stop()  # as if killed: the checkpoint and the spec stay on disk
    claims.objects.clear()  # and the claim is gone from the API by the time the kubelet unprepares
    node = start(root, claims)
    try:
        assert node.prepare(("c", "uid-3")).claims["uid-3"] == first
        assert node.unprepare(("c", "uid-3")).claims["uid-3"].error == ""
        assert not cdi_spec_path(node.cdi_dir, "uid-3").exists()
        assert node.plugin.preparer.prepared() == {}
        assert node.unprepare(("c", "uid-3")).claims["uid-3"].error == ""  # twice: still fine
    finally:
        node.plugin.stop()
    checkpoint = json.loads((root / "state" / "dra-checkpoint.json").read_text())
    assert checkpoint["claims"] == {}
    assert stat.S_IMODE((root / "state" / "dra-checkpoint.json").stat().st_mode) == 0o600


def test_refusals_are_per_claim_errors_and_write_nothing(node: Harness) -> None:
    node.claims.add("fine", "ok", [result("gpu-0", consumedCapacity={"memory": "2Gi"})])
    node.claims.add("pending", "u-pending", [])
    node.claims.add("replaced", "new-uid", [result("gpu-0")])
    node.claims.add("elsewhere", "u-else", [{**result("gpu-0"), "pool": "node-b"}])
    node.claims.add("nosuch", "u-nosuch", [result("gpu-42")])
    node.claims.add(
        "partial", "u-partial", [result("gpu-1", consumedCapacity={"memory": "8Gi"})], [EXCLUSIVE]
    )
    node.claims.add("negative", "u-neg", [result("gpu-2", consumedCapacity={"memory": "256Mi"})])
    node.claims.objects[("team", "negative")]["spec"] = {
        "devices": {"requests": [{"name": "gpu", "exactly": {"capacity": {"requests": {"memory": "-1Gi"}}}}]}
    }
    node.healthy[6] = False
    node.claims.add("sick", "u-sick", [result("gpu-6")])
    answer = node.prepare(
        ("fine", "ok"),
        ("pending", "u-pending"),
        ("replaced", "old-uid"),
        ("elsewhere", "u-else"),
        ("nosuch", "u-nosuch"),
        ("partial", "u-partial"),
        ("sick", "u-sick"),
        ("negative", "u-neg"),
    ).claims
    assert answer["ok"].error == "" and answer["ok"].devices
    expected = {
        "u-pending": "is not allocated",
        "old-uid": "deleted and created again",
        "u-else": "is in pool node-b, not node-a",
        "u-nosuch": "gpu-42 is not a device of node node-a",
        "u-partial": "is for a whole GPU but consumes 8192 MiB",
        "u-sick": "is unhealthy",
        "u-neg": "asks for -1Gi memory; capacity requests must be positive",
    }
    for uid, text in expected.items():
        assert text in answer[uid].error, (uid, answer[uid].error)
        assert not answer[uid].devices
        assert not cdi_spec_path(node.cdi_dir, uid).exists()
    assert set(node.plugin.preparer.prepared()) == {"ok"}


def test_an_unreachable_api_server_is_an_error_on_the_claim_not_a_failed_call(node: Harness) -> None:
    node.claims.broken = True
    answer = node.prepare(("any", "u-x")).claims["u-x"]
    assert "cannot read ResourceClaim team/any" in answer.error and "unreachable" in answer.error
