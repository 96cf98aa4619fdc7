"""The device plugin against a real gRPC client playing the kubelet, over unix sockets in tmp_path.

The "kubelet" serves Registration on kubelet.sock and dials the plugin's sockets with the generated
stubs, as the real kubelet does; the API server is faked behind PodSource / NodePublisher.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuslice.errors import UserError
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import mig_gpu, parse_layout
from gpuslice.hardware.topology_profiles import profile
from gpuslice.k8s.annotations import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_INVENTORY,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_FAILED,
    RESOURCE_GPU,
    NodeInventory,
    mig_resource,
)
from gpuslice.k8s.decision import Decision, MigChoice
from gpuslice.k8s.device_plugin import (
    API_VERSION,
    HEALTHY,
    KUBELET_SOCKET,
    UNHEALTHY,
    DevicePlugin,
    PendingPod,
    gpu_of_share,
)
from gpuslice.k8s.proto import deviceplugin_pb2 as pb
from gpuslice.k8s.proto import deviceplugin_pb2_grpc as pb_grpc
from gpuslice.node.enforcement import mig_device_uuid
from gpuslice.node.gpu_faults import FakeHealthSource
from gpuslice.shim import library_path
from gpuslice.units import GiB, MiB

NODE = "gpu-node-1"
SPLIT = 4
TIMEOUT_S = 10.0


# ---- fakes ------------------------------------------------------------------------------------------


class FakeKubelet(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service on <dir>/kubelet.sock; keeps every RegisterRequest."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.requests: queue.Queue[pb.RegisterRequest] = queue.Queue()
        self.server: grpc.Server | None = None

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        self.requests.put(request)
        return pb.Empty()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket_dir / KUBELET_SOCKET}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0).wait()
            self.server = None
        with contextlib.suppress(FileNotFoundError):
            (self.socket_dir / KUBELET_SOCKET).unlink()

    def next_request(self) -> pb.RegisterRequest:
        return self.requests.get(timeout=TIMEOUT_S)

    def dial(self, endpoint: str) -> pb_grpc.DevicePluginStub:
        """Connect to a plugin endpoint as the kubelet does after Register."""
        channel = grpc.insecure_channel(f"unix://{self.socket_dir / endpoint}")
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
        return pb_grpc.DevicePluginStub(channel)


class FakeApi:
    """PodSource and NodePublisher in memory: pods with decisions, and every annotation written."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Decision] = {}
        self.pod_annotations: dict[tuple[str, str], dict[str, str]] = {}
        self.node_annotations: list[tuple[str, dict[str, str]]] = []
        self.lock_releases: list[tuple[str, str]] = []  # (node, pod uid) the plugin asked to release

    def bind(self, namespace: str, name: str, decision: Decision) -> None:
        self.pods[(namespace, name)] = decision
        self.pod_annotations[(namespace, name)] = decision.to_annotations()

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        out = []
        for (ns, name), written in self.pod_annotations.items():
            decision = Decision.from_annotations(written)
            if decision is not None and decision.node == node_name and decision.phase == "allocating":
                out.append(PendingPod(ns, name, decision, uid=f"uid-{name}"))
        return out

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.pod_annotations[(namespace, name)].update(annotations)

    def release_node_lock(self, node_name: str, uid: str) -> bool:
        self.lock_releases.append((node_name, uid))
        return True

    def annotate_node(
        self, node_name: str, annotations: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> None:
        self.node_annotations.append((node_name, dict(annotations)))
        self.node_labels = dict(labels or {})

    def inventory(self) -> NodeInventory:
        return NodeInventory.from_json(self.node_annotations[-1][1][ANNOTATION_NODE_INVENTORY])


# ---- fixtures ---------------------------------------------------------------------------------------


def dgx1_machine() -> Machine:
    """8 × V100 wired as DGX-1's hybrid cube mesh: pairs differ (NV2, NV1, SYS), so topology matters."""
    gpus = tuple(GpuInfo(i, f"GPU-sim-dgx1-{i:04d}", "V100M16", 16 * GiB) for i in range(8))
    return Machine("dgx1", gpus, topology=profile("dgx1-v100"))


def mig_machine() -> Machine:
    """2 × A100-80GB in MIG mode (simulated UUIDs, so MIG device UUIDs are made up deterministically)."""
    gpus = tuple(
        GpuInfo(i, f"GPU-sim-a100-{i:04d}", "A100-80GB", 80 * GiB, mig_enabled=True, mig_model="a100-80gb")
        for i in range(2)
    )
    return Machine("a100-mig", gpus)


def wait_until(predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def socket_dir(tmp_path: Path) -> Path:
    path = tmp_path / "dp"
    path.mkdir()
    return path


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(socket_dir)
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def health() -> FakeHealthSource:
    return FakeHealthSource()


@pytest.fixture
def make_plugin(
    socket_dir: Path, tmp_path: Path, api: FakeApi, health: FakeHealthSource, kubelet: FakeKubelet
) -> Iterator[Callable[..., DevicePlugin]]:
    """Start plugins against the fake kubelet (which must listen before Register); stop them after."""
    started: list[DevicePlugin] = []

    def make(machine: Machine | None = None, **kwargs: object) -> DevicePlugin:
        options: dict[str, object] = {
            "pods": api,
            "node": api,
            "health": health,
            "split_count": SPLIT,
            "socket_dir": socket_dir,
            "state_dir": tmp_path / "state",
            "watch_interval_s": 0.05,
            "health_poll_s": 0.05,
            **kwargs,
        }
        plugin = DevicePlugin(machine or dgx1_machine(), NODE, **options)  # type: ignore[arg-type]
        plugin.start()
        started.append(plugin)
        return plugin

    yield make
    for plugin in started:
        plugin.stop()


def share(machine: Machine, gpu: int, n: int = 0) -> str:
    return f"{machine.gpus[gpu].uuid}::{n}"


def all_shares(machine: Machine) -> list[str]:
    return [share(machine, g, n) for g in range(machine.gpu_count) for n in range(SPLIT)]


def preferred(
    stub: pb_grpc.DevicePluginStub, available: list[str], size: int, must: list[str] = ()
) -> list[str]:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=list(must), allocation_size=size
            )
        ]
    )
    return list(stub.GetPreferredAllocation(request, timeout=TIMEOUT_S).container_responses[0].deviceIDs)


def allocate(stub: pb_grpc.DevicePluginStub, *device_lists: list[str]) -> pb.AllocateResponse:
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in device_lists]
    )
    return stub.Allocate(request, timeout=TIMEOUT_S)


# ---- registration and ListAndWatch ------------------------------------------------------------------


def test_plugin_registers_gpu_shares_with_the_kubelet_as_v1beta1(make_plugin, kubelet):
    make_plugin()
    request = kubelet.next_request()
    assert request.version == API_VERSION == "v1beta1"
    assert request.resource_name == RESOURCE_GPU == "gpuslice.io/gpu"
    assert request.endpoint == "gpuslice-gpu.sock"
    assert request.options.get_preferred_allocation_available is True
    assert request.options.pre_start_required is False
    assert kubelet.requests.empty()  # no MIG GPUs: one resource only


def test_kubelet_reads_options_and_every_share_healthy_with_its_numa_node(make_plugin, kubelet):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    options = stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT_S)
    assert options.get_preferred_allocation_available
    stream = stub.ListAndWatch(pb.Empty(), timeout=TIMEOUT_S)
    first = next(stream)
    assert [d.ID for d in first.devices] == all_shares(machine)  # 8 GPUs × 4 shares, "<uuid>::<n>"
    assert {d.health for d in first.devices} == {HEALTHY}
    numa = {d.ID: d.topology.nodes[0].ID for d in first.devices}
    assert numa[share(machine, 0)] == 0 and numa[share(machine, 7, 3)] == 1
    stream.cancel()


def test_health_change_arrives_as_a_new_list_with_that_gpus_shares_unhealthy(
    make_plugin, kubelet, health, api
):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    stream = stub.ListAndWatch(pb.Empty(), timeout=TIMEOUT_S)
    assert {d.health for d in next(stream).devices} == {HEALTHY}

    health.set_health(machine.gpus[3].uuid, False, "XID 79")
    second = next(stream)
    sick = {d.ID for d in second.devices if d.health == UNHEALTHY}
    assert sick == {share(machine, 3, n) for n in range(SPLIT)}
    assert len(second.devices) == 8 * SPLIT  # the full list again, not a delta
    assert wait_until(lambda: not api.inventory().gpus[3].healthy)  # the extender learns it too

    health.set_health(machine.gpus[3].uuid, True, "reset")
    assert {d.health for d in next(stream).devices} == {HEALTHY}
    stream.cancel()


def test_inventory_is_published_on_the_node_at_start(make_plugin, api):
    machine = dgx1_machine()
    make_plugin(machine)
    node, annotations = api.node_annotations[0]
    inventory = NodeInventory.from_json(annotations[ANNOTATION_NODE_INVENTORY])
    assert node == NODE
    assert inventory.split_count == SPLIT
    assert [g.uuid for g in inventory.gpus] == [g.uuid for g in machine.gpus]
    assert inventory.gpus[0].memory_mib == 16 * 1024 and inventory.gpus[0].model == "V100M16"
    assert inventory.topology[0][3] == "NV2" and inventory.topology[0][5] == "SYS"
    assert all(g.healthy and not g.mig for g in inventory.gpus)


# ---- GetPreferredAllocation ------------------------------------------------------------------------


def test_preferred_allocation_takes_the_best_connected_gpus_not_the_lowest(make_plugin, kubelet):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    # DGX-1: GPU0–GPU3 are joined by two NVLinks (50 GB/s), GPU0–GPU1 by one: exact picks {0, 3}.
    pair = preferred(stub, all_shares(machine), 2)
    assert sorted(gpu_of_share(d) for d in pair) == [machine.gpus[0].uuid, machine.gpus[3].uuid]
    # A 4-GPU request gets one NVLink quad, one share on each GPU.
    quad = preferred(stub, all_shares(machine), 4)
    assert sorted(gpu_of_share(d) for d in quad) == [machine.gpus[g].uuid for g in (0, 1, 2, 3)]


def test_preferred_allocation_keeps_must_include_and_completes_it_by_topology(make_plugin, kubelet):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    # GPU5's NV2 partners are GPU1 (other socket) and GPU6 (same socket): NUMA breaks the tie.
    got = preferred(stub, all_shares(machine), 2, must=[share(machine, 5, 2)])
    assert got[0] == share(machine, 5, 2)
    assert gpu_of_share(got[1]) == machine.gpus[6].uuid


def test_preferred_allocation_only_uses_available_shares(make_plugin, kubelet):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    available = [d for d in all_shares(machine) if gpu_of_share(d) != machine.gpus[0].uuid]
    got = preferred(stub, available, 2)
    assert set(got) <= set(available) and len({gpu_of_share(d) for d in got}) == 2


def test_preferred_allocation_steers_the_kubelet_to_the_extenders_gpus(make_plugin, kubelet, api):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    api.bind("ml", "trainer", Decision(NODE, "main", (2, 6), (machine.gpus[2].uuid, machine.gpus[6].uuid)))
    got = preferred(stub, all_shares(machine), 2)
    assert sorted(got) == [share(machine, 2), share(machine, 6)]


def test_preferred_allocation_without_topology_or_enough_gpus_still_answers_the_size(make_plugin, kubelet):
    gpus = tuple(GpuInfo(i, f"GPU-sim-pcie-{i:04d}", "A10", 24 * GiB) for i in range(2))
    machine = Machine("two-a10", gpus)  # no topology known: lowest GPUs, one share each, then fill
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    assert preferred(stub, all_shares(machine), 2) == [share(machine, 0), share(machine, 1)]
    got = preferred(stub, all_shares(machine), 3)
    assert len(set(got)) == 3 and {gpu_of_share(d) for d in got} == {g.uuid for g in gpus}


# ---- Allocate --------------------------------------------------------------------------------------


def test_allocate_turns_a_share_decision_into_cuda_limits_device_nodes_and_cdi(make_plugin, kubelet, api):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuid = machine.gpus[1].uuid
    api.bind("ml", "notebook", Decision(NODE, "main", (1,), (uuid,), memory_mib=8192, cores_percent=30))

    response = allocate(stub, [share(machine, 1, 1)])  # a share of the decided GPU, as preferred

    (container,) = response.container_responses
    env = dict(container.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["GPUSLICE_SHARING"] == "soft"
    assert env["GPUSLICE_GPUS"] == "1" and env["GPUSLICE_GPU_UUIDS"] == uuid
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(8192 * MiB)
    assert env["GPUSLICE_COMPUTE_PERCENT"] == "30"
    assert env["GPUSLICE_TENANT"] == "ml"
    assert not any(k.startswith("CUDA_MPS_") for k in env)
    # the GPU reaches the container without the NVIDIA runtime's environment variable too
    assert [d.container_path for d in container.devices] == [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert all(d.permissions == "rw" for d in container.devices)
    # a simulated node has no /dev/nvidia*: each host path is a stand-in the runtime can pass in
    for device in container.devices:
        host = Path(device.host_path)
        assert host.name == Path(device.container_path).name and host.parent.name == "dev"
        assert stat.S_ISCHR(host.stat().st_mode)
    assert [c.name for c in container.cdi_devices] == [f"nvidia.com/gpu={uuid}"]
    assert api.pod_annotations[("ml", "notebook")][ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED
    assert api.pod_annotations[("ml", "notebook")][ANNOTATION_ALLOCATED] == "true"


def test_allocate_under_shim_preloads_the_library_and_mounts_it_with_the_pods_region(
    make_plugin, kubelet, api, tmp_path
):
    machine = dgx1_machine()
    make_plugin(machine, sharing="shim")
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuid = machine.gpus[2].uuid
    api.bind("ml", "serving", Decision(NODE, "main", (2,), (uuid,), memory_mib=4096, cores_percent=40))

    (container,) = allocate(stub, [share(machine, 2)]).container_responses

    env, base = dict(container.envs), tmp_path / "state" / "shim"
    library = base / "lib" / "libgpuslice-shim.so"
    assert env["GPUSLICE_SHARING"] == "shim" and env["GPUSLICE_COMPUTE_PERCENT"] == "40"
    assert env["LD_PRELOAD"] == str(library) and library.read_bytes() == library_path().read_bytes()
    assert env["GPUSLICE_SHIM_REGION"] == str(base / "pods" / "ml.serving" / "job.region")
    assert env["GPUSLICE_SHIM_GPU_REGION"] == str(base / "gpus.region")
    assert env["LD_LIBRARY_PATH"] == str(base / "lib" / "fake")  # simulated node: the fake driver
    mounts = {m.host_path: (m.container_path, m.read_only) for m in container.mounts}
    assert mounts == {
        str(base / "lib"): (str(base / "lib"), True),  # nobody in a pod may change the library
        str(base / "pods" / "ml.serving"): (str(base / "pods" / "ml.serving"), False),
        str(base / "gpus.region"): (str(base / "gpus.region"), False),
    }


def test_allocate_goes_by_the_decisions_gpu_uuids_when_its_indices_disagree(make_plugin, kubelet, api):
    """GPU indices can change (a reboot, a driver reload); UUIDs do not. A decision whose index says GPU 5
    and whose UUID says GPU 2 gives the container GPU 2."""
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuid = machine.gpus[2].uuid
    api.bind("ml", "moved", Decision(NODE, "main", (5,), (uuid,), memory_mib=1024, cores_percent=20))
    container = allocate(stub, [share(machine, 2)]).container_responses[0]
    env = dict(container.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["GPUSLICE_GPUS"] == "2"
    assert [c.name for c in container.cdi_devices] == [f"nvidia.com/gpu={uuid}"]


def test_allocate_whole_gpus_sets_every_uuid_and_no_mps_limits(make_plugin, kubelet, api):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuids = (machine.gpus[0].uuid, machine.gpus[3].uuid)
    api.bind("ml", "ddp", Decision(NODE, "main", (0, 3), uuids))
    container = allocate(stub, [share(machine, 0), share(machine, 3)]).container_responses[0]
    env = dict(container.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["GPUSLICE_GPUS"] == "0,3" and env["GPUSLICE_COMPUTE_PERCENT"] == "100"
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(16 * GiB)
    assert not any(k.startswith("CUDA_MPS_") for k in env)
    assert [c.name for c in container.cdi_devices] == [f"nvidia.com/gpu={u}" for u in uuids]


def test_allocate_releases_the_node_lock_of_the_pod_it_answered(make_plugin, kubelet, api):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    api.bind("a", "first", Decision(NODE, "main", (2,), (machine.gpus[2].uuid,)))
    allocate(stub, [share(machine, 2, 1)])
    assert api.lock_releases == [(NODE, "uid-first")]
    assert api.pod_annotations[("a", "first")][ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED


@pytest.mark.parametrize("second_gpu", [2, 5], ids=["same-gpu", "other-gpu"])
def test_allocate_while_two_pods_wait_on_the_node_refuses_and_gives_neither_slice(
    make_plugin, kubelet, api, second_gpu
):
    """The API names no pod: with two waiting (the node lock bypassed or expired), whichever pod the
    kubelet admits could get the other's slice, on the same GPU or (steered by GetPreferredAllocation)
    on another: refused, both left waiting, no lock released."""
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuid2, other = machine.gpus[2].uuid, machine.gpus[second_gpu].uuid
    api.bind("a", "thirty", Decision(NODE, "main", (2,), (uuid2,), memory_mib=1000, cores_percent=30))
    api.bind("b", "seventy", Decision(NODE, "main", (second_gpu,), (other,), cores_percent=70))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 2, 0)])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "2 pods wait for an allocation" in caught.value.details()
    assert "a/thirty, b/seventy" in caught.value.details()
    for key in (("a", "thirty"), ("b", "seventy")):
        assert api.pod_annotations[key][ANNOTATION_BIND_PHASE] == "allocating"
    assert api.lock_releases == []
    # the preference does not pretend to know either
    assert preferred(stub, all_shares(machine), 1) != []


def test_pods_waiting_for_different_allocate_keys_each_get_their_own_slice(make_plugin, kubelet, api):
    """A 1-GPU share pod and a 2-GPU pod wait together (the node lock lets one pod per allocate key
    through): an Allocate call's device count tells them apart, so each call answers its own pod, the
    preference steers the kubelet to that pod's GPUs, and each pod's lock entry is released."""
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuids = [g.uuid for g in machine.gpus]
    api.bind("a", "share", Decision(NODE, "main", (2,), (uuids[2],), memory_mib=1000, cores_percent=30))
    api.bind("b", "pair", Decision(NODE, "main", (4, 5), (uuids[4], uuids[5])))
    assert sorted(preferred(stub, all_shares(machine), 2)) == sorted(
        [share(machine, 4, 0), share(machine, 5, 0)]
    )
    assert [d.split("::")[0] for d in preferred(stub, all_shares(machine), 1)] == [uuids[2]]
    (pair,) = allocate(stub, [share(machine, 4, 0), share(machine, 5, 0)]).container_responses
    assert api.pod_annotations[("b", "pair")][ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED
    assert api.pod_annotations[("a", "share")][ANNOTATION_BIND_PHASE] == "allocating"
    (single,) = allocate(stub, [share(machine, 2, 3)]).container_responses
    assert api.pod_annotations[("a", "share")][ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED
    assert api.lock_releases == [(NODE, "uid-pair"), (NODE, "uid-share")]
    visible = [dict(r.envs).get("NVIDIA_VISIBLE_DEVICES", "") for r in (pair, single)]
    assert uuids[4] in visible[0] and uuids[5] in visible[0] and uuids[2] not in visible[0]
    assert visible[1] == uuids[2]


def test_two_pods_with_one_allocate_key_still_refuse_beside_a_pod_of_another_key(make_plugin, kubelet, api):
    """Pods of another key do not make the call ambiguous, but two of the call's own key still do."""
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    uuids = [g.uuid for g in machine.gpus]
    api.bind("a", "one", Decision(NODE, "main", (2,), (uuids[2],), cores_percent=30))
    api.bind("a", "two", Decision(NODE, "main", (3,), (uuids[3],), cores_percent=30))
    api.bind("b", "pair", Decision(NODE, "main", (4, 5), (uuids[4], uuids[5])))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 2, 0)])
    assert "2 pods wait for an allocation of gpuslice.io/gpu*1" in caught.value.details()
    assert "b/pair" not in caught.value.details()
    allocate(stub, [share(machine, 4, 0), share(machine, 5, 0)])  # the pair's call is not ambiguous
    assert api.pod_annotations[("b", "pair")][ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED


def test_allocate_counts_a_waiting_pod_without_a_decision(make_plugin, kubelet, api):
    """A pod that reached the node without the extender (nodeName set by hand) also waits for an
    allocation: the decided pod's slice must not go to it."""
    machine = dgx1_machine()
    plugin = make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    api.bind("a", "decided", Decision(NODE, "main", (2,), (machine.gpus[2].uuid,)))
    plugin.pods = _WithStray(api, PendingPod("b", "by-hand", None, uid="uid-by-hand"))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 2, 0)])
    assert "2 pods wait" in caught.value.details() and "b/by-hand" in caught.value.details()
    api.pods.clear()
    api.pod_annotations.clear()
    plugin.pods = _WithStray(api, PendingPod("b", "by-hand", None, uid="uid-by-hand"))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 2, 0)])
    assert "no gpuslice decision" in caught.value.details() and "schedulerName" in caught.value.details()


def test_allocate_for_devices_not_of_the_waiting_pods_decision_fails_that_pod(make_plugin, kubelet, api):
    """One pod waits, so the kubelet admits that one; shares of another GPU are not its decision."""
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    api.bind("a", "on-two", Decision(NODE, "main", (2,), (machine.gpus[2].uuid,)))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 6)])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not of its decision's GPUs (2,)" in caught.value.details()
    assert api.pod_annotations[("a", "on-two")][ANNOTATION_BIND_PHASE] == BIND_PHASE_FAILED
    assert api.lock_releases == [(NODE, "uid-on-two")]


def test_mps_sharing_is_refused_on_kubernetes_with_the_reason(socket_dir, api, tmp_path):
    with pytest.raises(UserError) as refused:
        DevicePlugin(dgx1_machine(), NODE, pods=api, node=api, sharing="mps", socket_dir=socket_dir)
    assert "--sharing mps is not offered on Kubernetes" in str(refused.value)
    assert "/dev/shm" in str(refused.value)


def test_node_labels_follow_gpu_feature_discovery(make_plugin, api):
    make_plugin(dgx1_machine())
    assert api.node_labels == {
        "gpuslice.io/gpu.product": "V100M16",
        "gpuslice.io/gpu.memory": str(16 * 1024),
        "gpuslice.io/gpu.count": "8",
        "gpuslice.io/mig.capable": "false",
    }


def test_node_labels_say_mig_capable_for_a_mig_gpu_with_mig_off_and_clean_product_names():
    from gpuslice.k8s.device_plugin import node_labels

    gpus = (GpuInfo(0, "GPU-x", "NVIDIA A100 80GB PCIe (rev/2)", 80 * GiB, mig_model="a100-80gb"),)
    labels = node_labels(Machine("m", gpus))
    assert labels["gpuslice.io/mig.capable"] == "true"
    assert labels["gpuslice.io/gpu.product"] == "NVIDIA-A100-80GB-PCIe--rev-2"


class _WithStray:
    """The fake API's pods plus ``stray``, a pod without a decision waiting on the node."""

    def __init__(self, api: FakeApi, stray: PendingPod | None) -> None:
        self.api, self.stray = api, stray

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        return [*self.api.allocating_pods(node_name), *([self.stray] if self.stray else [])]

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        if self.stray is not None and (namespace, name) == (self.stray.namespace, self.stray.name):
            return
        self.api.annotate_pod(namespace, name, annotations)

    def release_node_lock(self, node_name: str, uid: str) -> bool:
        return self.api.release_node_lock(node_name, uid)


def test_allocate_without_a_decision_fails_and_says_why(make_plugin, kubelet):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 0)])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "schedulerName" in caught.value.details() and NODE in caught.value.details()


def test_allocate_on_an_unhealthy_gpu_fails_and_marks_the_pod_failed(make_plugin, kubelet, api, health):
    machine = dgx1_machine()
    plugin = make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    health.set_health(machine.gpus[4].uuid, False, "XID 79")
    assert wait_until(lambda: not plugin.inventory().gpus[4].healthy)
    api.bind("ml", "unlucky", Decision(NODE, "main", (4,), (machine.gpus[4].uuid,)))
    with pytest.raises(grpc.RpcError) as caught:
        allocate(stub, [share(machine, 4)])
    assert "unhealthy" in caught.value.details()
    assert api.pod_annotations[("ml", "unlucky")][ANNOTATION_BIND_PHASE] == BIND_PHASE_FAILED
    assert api.lock_releases == [(NODE, "uid-unlucky")]  # the kubelet fails the pod: the next may bind


# ---- MIG ---------------------------------------------------------------------------------------------


def test_mig_instances_are_their_own_resource_and_allocate_gives_the_mig_uuid(make_plugin, kubelet, api):
    machine = mig_machine()
    table = mig_gpu("a100-80gb")
    layouts = {0: parse_layout(table, "3g.40gb@0/1,3g.40gb@4/2"), 1: parse_layout(table, "1g.10gb@6/13")}
    make_plugin(machine, mig_layouts=layouts)
    registered = {r.resource_name: r.endpoint for r in (kubelet.next_request(), kubelet.next_request())}
    assert set(registered) == {mig_resource("1g.10gb"), mig_resource("3g.40gb")}  # no whole-GPU shares
    stub = kubelet.dial(registered[mig_resource("3g.40gb")])
    stream = stub.ListAndWatch(pb.Empty(), timeout=TIMEOUT_S)
    ids = [d.ID for d in next(stream).devices]
    stream.cancel()
    expected = [mig_device_uuid(machine, 0, "3g.40gb", 0), mig_device_uuid(machine, 0, "3g.40gb", 4)]
    assert ids == expected

    api.bind("ml", "infer", Decision(NODE, "main", mig=MigChoice(0, "3g.40gb", 4, expected[1])))
    assert preferred(stub, ids, 1) == [expected[1]]  # the extender's instance, not the first free one
    env = dict(allocate(stub, [expected[1]]).container_responses[0].envs)
    assert env["CUDA_VISIBLE_DEVICES"] == expected[1]
    assert env["GPUSLICE_MIG_PROFILE"] == "3g.40gb"
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(table.profile("3g.40gb").memory_bytes)


def test_mig_layout_is_in_the_published_inventory(make_plugin, api):
    machine = mig_machine()
    layouts = {
        0: parse_layout(mig_gpu("a100-80gb"), "7g.80gb@0/0"),
        1: parse_layout(mig_gpu("a100-80gb"), ""),
    }
    make_plugin(machine, mig_layouts=layouts)
    gpus = api.inventory().gpus
    assert [(s.profile, s.start, s.gi_id) for s in gpus[0].mig] == [("7g.80gb", 0, 0)]
    assert gpus[0].mig[0].uuid == mig_device_uuid(machine, 0, "7g.80gb", 0)
    assert gpus[1].mig == ()


# ---- kubelet restart ---------------------------------------------------------------------------------


def test_kubelet_restart_that_wipes_the_sockets_triggers_re_registration(make_plugin, kubelet, socket_dir):
    machine = dgx1_machine()
    plugin = make_plugin(machine)
    endpoint = kubelet.next_request().endpoint
    kubelet.stop()  # the kubelet goes away: kubelet.sock is deleted ...
    (socket_dir / endpoint).unlink()  # ... and a starting kubelet removes every plugin socket
    kubelet.start()
    again = kubelet.next_request()
    assert again.resource_name == RESOURCE_GPU and again.endpoint == endpoint
    assert wait_until(lambda: plugin.registrations == 2)
    stream = kubelet.dial(endpoint).ListAndWatch(pb.Empty(), timeout=TIMEOUT_S)
    assert len(next(stream).devices) == 8 * SPLIT  # the recreated socket serves
    stream.cancel()


def test_recreated_kubelet_socket_alone_triggers_re_registration(make_plugin, kubelet):
    plugin = make_plugin()
    kubelet.next_request()
    kubelet.stop()
    time.sleep(0.2)  # the watcher sees the kubelet gone, then back with a new socket file
    kubelet.start()
    assert kubelet.next_request().resource_name == RESOURCE_GPU
    assert wait_until(lambda: plugin.registrations == 2)


def test_start_fails_clearly_when_no_kubelet_listens(socket_dir, api, tmp_path, monkeypatch):
    from gpuslice.k8s.device_plugin import plugin as dp

    monkeypatch.setattr(dp, "_REGISTER_TIMEOUT_S", 0.2)
    monkeypatch.setattr(dp, "_REGISTER_ATTEMPTS", 2)
    plugin = DevicePlugin(dgx1_machine(), NODE, pods=api, socket_dir=socket_dir, state_dir=tmp_path / "s")
    with pytest.raises(dp.RegistrationFailed, match="no kubelet answered"):
        plugin.start()
    plugin.stop()
    assert not (socket_dir / "gpuslice-gpu.sock").exists()


def test_an_old_instance_stopping_after_a_new_one_started_leaves_the_new_one_serving(
    make_plugin, kubelet, socket_dir
):
    """A DaemonSet rolled with surge: each instance serves on a socket of its own name (the kubelet keeps
    a resource's devices while one of its endpoints remains), so the old one's stop leaves the new one
    registered and reachable; each removes only its own socket."""
    old = make_plugin(instance="0ld")
    assert kubelet.next_request().endpoint == "gpuslice-gpu-0ld.sock"
    new = make_plugin(instance="n3w")
    assert kubelet.next_request().endpoint == "gpuslice-gpu-n3w.sock"
    old.stop()
    assert sorted(p.name for p in socket_dir.glob("gpuslice-*")) == ["gpuslice-gpu-n3w.sock"]
    options = kubelet.dial("gpuslice-gpu-n3w.sock").GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT_S)
    assert options.get_preferred_allocation_available  # served, by the new instance
    new.stop()
    assert not list(socket_dir.glob("gpuslice-*"))


def test_a_socket_left_by_a_killed_instance_is_removed_at_start_and_a_live_one_is_not(
    make_plugin, kubelet, socket_dir
):
    dead = socket_dir / "gpuslice-gpu-dead.sock"
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(dead))  # bound, never listening, closed without unlink: what SIGKILL leaves
    live = make_plugin(instance="live")
    kubelet.next_request()
    assert not dead.exists()
    make_plugin(instance="next")
    kubelet.next_request()
    assert (socket_dir / "gpuslice-gpu-live.sock").exists() and live.registrations == 1
