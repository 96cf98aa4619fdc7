"""The gpuslice device plugin: the kubelet side of gpuslice on one Kubernetes node.

It speaks the kubelet device plugin API v1beta1 (``proto/deviceplugin.proto``; research
k8s_nvidia_reference.md §2) for one or more resources, each on its own unix socket:

```text
gpuslice.io/gpu              every non-MIG GPU as split_count shares "<GPU-uuid>::<n>" (n = 0..split-1)
gpuslice.io/mig-<profile>    every existing MIG instance of that profile, by its "MIG-…" UUID
```

Lifecycle (NVIDIA's plugin does the same, research §2.4):

```text
start:   publish the node inventory annotation (GPUs, memory, topology, MIG layout, health)
         for each resource: gRPC server on <socket_dir>/<endpoint>, then Register on kubelet.sock
         (version v1beta1, options: GetPreferredAllocationAvailable)
kubelet: GetDevicePluginOptions, ListAndWatch (full list now and after every health change)
admit:   GetPreferredAllocation: the extender's GPUs when a bound pod waits for them, else the
         best-connected GPUs (policies.gpuset "exact" over the machine's topology)
create:  Allocate: the pod bound to this node in bind-phase "allocating" whose decision names the
         GPUs (or the MIG instance) of the device IDs the kubelet passed, the first the kubelet admits
         if several do -> CUDA_VISIBLE_DEVICES, GPUSLICE_* and the sharing mode's limits
         (node.enforcement.job_env), the GPUs' device nodes and CDI names; bind-phase "allocated"
watch:   kubelet.sock recreated (kubelet restart) or our sockets deleted -> restart servers, register
health:  a HealthSource reports GPU / MIG changes -> devices flip Healthy/Unhealthy, list resent,
         inventory republished
```

The extender decides which GPUs a pod gets; the kubelet only counts shares (research §1.6). The
shares the kubelet hands to Allocate are therefore slots, not GPUs: the GPUs come from the pod's
decision annotations (``k8s.annotations.Decision``), HAMi's design (hami_and_peers.md §1.2 step 5).
GetPreferredAllocation steers the kubelet to shares of the decided GPUs, and Allocate then reads the
GPUs back from the device IDs it is given: the device plugin API names no pod, so the device IDs are
what tells two pods bound at the same moment apart. Two waiting pods whose decisions name the same
GPUs are told apart by the order the kubelet admits pods in (creation time, then name).

Sharing on Kubernetes is ``soft`` (the PyTorch cap, with the graded monitor): MPS needs a control
daemon outside this plugin's container, a host tmpfs at /dev/shm in the daemon and every client, and
per-GPU pipe folders (NVIDIA runs a separate DaemonSet for it); none of that is set up here, so the
plugin refuses ``--sharing mps`` instead of shipping a mode that cannot work.

The API server is reached through two small interfaces, ``PodSource`` and ``NodePublisher``, so tests
swap in fakes; ``KubeApi`` implements both with the official ``kubernetes`` client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Protocol

import grpc
from prometheus_client import start_http_server

from gpuslice.errors import UserError
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import MigLayout, mig_gpu, parse_layout
from gpuslice.k8s import kube_client
from gpuslice.k8s.annotations import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_INVENTORY,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_FAILED,
    DEFAULT_SPLIT_COUNT,
    RESOURCE_GPU,
    Decision,
    InventoryGpu,
    MigSlot,
    NodeInventory,
    mig_resource,
)
from gpuslice.k8s.proto import deviceplugin_pb2 as pb
from gpuslice.k8s.proto import deviceplugin_pb2_grpc as pb_grpc
from gpuslice.k8s.shim_mounts import container_setup
from gpuslice.node.enforcement import SharingMode, job_env, mig_device_uuid, softcap_dir
from gpuslice.node.gpu_faults import (
    FakeHealthSource,
    HealthChange,
    HealthSource,
    NoHealthChecks,
    NvmlHealthSource,
)
from gpuslice.observe.k8s_metrics import DeviceHealthRow, DevicePluginMetrics
from gpuslice.policies.gpuset import choose_gpu_set, make_gpuset_policy
from gpuslice.policies.gpuset.exact import Exact
from gpuslice.scheduler.node_scheduler import MigAssignment
from gpuslice.units import MiB
from gpuslice.workload.job import JobSpec

__all__ = [
    "API_VERSION",
    "DEVICE_PLUGIN_PATH",
    "HEALTHY",
    "K8S_SHARING",
    "KUBELET_SOCKET",
    "SHARE_SEPARATOR",
    "UNHEALTHY",
    "AllocationRefused",
    "DevicePlugin",
    "KubeApi",
    "NodePublisher",
    "PendingPod",
    "PluginDevice",
    "PodSource",
    "RegistrationFailed",
    "default_mig_layouts",
    "device_nodes",
    "gpu_minors",
    "gpu_of_share",
    "node_inventory",
    "node_labels",
    "parse_mig_layouts",
    "serve",
]

log = logging.getLogger(__name__)

# kubelet constants (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go; research §2.1)
API_VERSION = "v1beta1"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# Replica ids as NVIDIA's time-slicing builds them (research §3.3, NewAnnotatedID): "<uuid>::<k>".
SHARE_SEPARATOR = "::"
_MAX_DEVICE_ID_CHARS = 63  # Device.ID limit in api.proto
K8S_SHARING = (SharingMode.SOFT.value, SharingMode.SHIM.value)  # the sharing modes that work in pods
# GPU feature discovery's node labels (NVIDIA gpu-feature-discovery: nvidia.com/gpu.product, …), under
# our domain so they never clash with GFD running beside us.
LABEL_PRODUCT = "gpuslice.io/gpu.product"
LABEL_MEMORY = "gpuslice.io/gpu.memory"  # MiB of the first GPU, as GFD
LABEL_COUNT = "gpuslice.io/gpu.count"
LABEL_MIG_CAPABLE = "gpuslice.io/mig.capable"
# Device nodes every CUDA container needs besides its GPUs' /dev/nvidia<minor> (NVIDIA's plugin and
# container toolkit pass the same set).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CDI_KIND = "nvidia.com/gpu"  # the CDI kind nvidia-ctk generates; devices named by GPU or MIG UUID
_REGISTER_TIMEOUT_S = 5.0
_REGISTER_ATTEMPTS = 5  # after a kubelet restart its socket can appear before it answers


class RegistrationFailed(UserError):
    """The kubelet refused or never answered Register (no kubelet, wrong version, name taken)."""


class AllocationRefused(UserError):
    """Allocate cannot be answered from a scheduling decision; the pod fails with this message."""


# ---- interfaces to the API server ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod bound to this node by the extender and waiting for Allocate, with its decision."""

    namespace: str
    name: str
    decision: Decision
    created: str = ""  # metadata.creationTimestamp (RFC 3339): the kubelet admits older pods first


class PodSource(Protocol):
    """Finds the pods the extender bound to a node; marks them once Allocate used their decision."""

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        """Pods on ``node_name`` whose bind-phase is "allocating", in any order."""
        ...

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the pod's annotations."""
        ...


class NodePublisher(Protocol):
    """Writes annotations and labels on this plugin's node."""

    def annotate_node(
        self, node_name: str, annotations: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> None:
        """Merge ``annotations`` (and ``labels``) into the node's."""
        ...


class KubeApi:
    """``PodSource`` and ``NodePublisher`` over the official ``kubernetes`` client.

    Configuration: ``kubeconfig`` if given, else the in-cluster service account (the DaemonSet), else
    ~/.kube/config. Tests may pass a ready ``kubernetes.client.ApiClient``. The DaemonSet's RBAC needs
    pods: list, patch; nodes: patch.
    """

    def __init__(self, kubeconfig: str | None = None, *, api_client: Any | None = None) -> None:
        client = kube_client.kubernetes_client_module()
        if api_client is None:
            api_client = kube_client.api_client(kubeconfig)
        self._api_client = api_client
        self.core = client.CoreV1Api(api_client)

    def close(self) -> None:
        """Close the client's connection pool."""
        self._api_client.close()

    def allocating_pods(self, node_name: str) -> list[PendingPod]:
        # Pods the kubelet is admitting are still Pending; the field selector keeps the list to this node.
        listed = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name},status.phase=Pending"
        )
        pods = []
        for pod in listed.items:
            annotations = pod.metadata.annotations or {}
            if annotations.get(ANNOTATION_BIND_PHASE) != BIND_PHASE_ALLOCATING:
                continue
            try:
                decision = Decision.from_annotations(annotations)
            except UserError as err:
                log.warning("pod %s/%s: %s; skipped", pod.metadata.namespace, pod.metadata.name, err)
                continue
            if decision is not None:
                created = pod.metadata.creation_timestamp
                stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ") if created is not None else ""
                pods.append(PendingPod(pod.metadata.namespace, pod.metadata.name, decision, stamp))
        return pods

    # An object body goes out as a strategic merge patch: our annotations merge into the existing ones.
    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": dict(annotations)}})

    def annotate_node(
        self, node_name: str, annotations: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> None:
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if labels:
            metadata["labels"] = dict(labels)
        self.core.patch_node(node_name, {"metadata": metadata})


# ---- devices ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One device the kubelet sees: a share of a GPU, or one MIG instance."""

    id: str
    gpu: int  # machine index of the physical GPU
    numa: int  # -1 if unknown
    mig: MigSlot | None = None


def gpu_of_share(device_id: str) -> str:
    """``GPU-abc::3`` -> ``GPU-abc``: the physical GPU behind a share id."""
    return device_id.split(SHARE_SEPARATOR, 1)[0]


def default_mig_layouts(machine: Machine) -> dict[int, MigLayout]:
    """The layout a simulated MIG GPU starts with: its half-GPU 3g profile at slices 0 and 4.

    A real GPU's layout is read from NVML (``hardware.mig_nvml.read_layout``); gpuslice does not create
    MIG instances (that needs root), so simulated nodes need some instances to advertise."""
    layouts = {}
    for g in machine.gpus:
        if g.mig_enabled:
            table = mig_gpu(g.mig_model)
            half = next(p for p in table.profiles if p.name.startswith("3g."))
            layouts[g.index] = parse_layout(table, f"{half.name}@0/1,{half.name}@4/2")
    return layouts


def _numa(machine: Machine, gpu: int) -> int:
    return machine.topology.numa[gpu] if machine.topology is not None else -1


def node_inventory(
    machine: Machine, split_count: int, mig: Mapping[int, Sequence[MigSlot]], healthy: Mapping[int, bool]
) -> NodeInventory:
    """What the extender needs to know about this node (``annotations.NodeInventory``)."""
    topo = machine.topology
    labels: tuple[tuple[str, ...], ...] = ()
    if topo is not None:
        labels = tuple(tuple(topo.label(i, j) for j in range(topo.n_gpus)) for i in range(topo.n_gpus))
    gpus = tuple(
        InventoryGpu(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_mib=g.memory_bytes // MiB,
            healthy=healthy.get(g.index, True),
            mig=tuple(mig.get(g.index, ())),
        )
        for g in machine.gpus
    )
    return NodeInventory(gpus=gpus, topology=labels, split_count=split_count)


# ---- one resource on one socket ----------------------------------------------------------------------


@dataclass
class _Resource:
    name: str  # gpuslice.io/gpu or gpuslice.io/mig-<profile>
    endpoint: str  # socket file name inside socket_dir
    devices: list[PluginDevice]
    mig_profile: str = ""
    server: grpc.Server | None = field(default=None, repr=False)


class _Servicer(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service of one resource; the state lives in the DevicePlugin."""

    def __init__(self, plugin: DevicePlugin, resource: _Resource) -> None:
        self.plugin = plugin
        self.resource = resource

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return _OPTIONS

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        return self.plugin._list_and_watch(self.resource, context)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        return self.plugin._preferred(self.resource, request)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        try:
            return self.plugin._allocate(self.resource, request)
        except AllocationRefused as err:
            log.error("Allocate refused for %s: %s", self.resource.name, err)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            raise  # unreachable: abort raises

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()  # not registered as required; answered for completeness


_OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


# ---- the plugin ---------------------------------------------------------------------------------------


class DevicePlugin:
    """All gpuslice resources of one node: servers, registration, health, Allocate, inventory.

    ``machine`` comes from ``node.discovery.discover``; ``mig_layouts`` (GPU index -> layout) lists the
    MIG instances of MIG-mode GPUs, named by ``enforcement.mig_device_uuid`` (NVML on real GPUs, made
    up on simulated ones). ``sharing`` picks how shares are held to their slice (``K8S_SHARING``);
    ``state_dir`` is the host directory of the soft-cap file and the shim (``k8s.shim_mounts``), mounted
    into containers at the same path.
    """

    def __init__(
        self,
        machine: Machine,
        node_name: str,
        *,
        pods: PodSource,
        node: NodePublisher | None = None,
        health: HealthSource | None = None,
        split_count: int = DEFAULT_SPLIT_COUNT,
        socket_dir: str | os.PathLike[str] = DEVICE_PLUGIN_PATH,
        mig_layouts: Mapping[int, MigLayout] | None = None,
        sharing: SharingMode | str = SharingMode.SOFT,
        state_dir: str | os.PathLike[str] = "/var/lib/gpuslice",
        gpuset_policy: str = "exact",
        watch_interval_s: float = 1.0,
        health_poll_s: float = 1.0,
    ) -> None:
        if split_count < 1:
            raise UserError(f"--split-count {split_count}: each GPU needs at least 1 share")
        self.machine = machine
        self.node_name = node_name
        self.pods = pods
        self.node = node
        self.health = health if health is not None else NoHealthChecks()
        self.split_count = split_count
        self.socket_dir = Path(socket_dir)
        if str(sharing) == SharingMode.MPS.value:
            raise UserError(
                "--sharing mps is not offered on Kubernetes: MPS needs its control daemon outside the "
                "device plugin's container and a host /dev/shm shared by the daemon and every pod, which "
                "this deployment does not set up; use soft (MIG instances are hard partitions on their own)"
            )
        if str(sharing) not in K8S_SHARING:
            raise UserError(
                f"--sharing {str(sharing)!r}: use {' or '.join(K8S_SHARING)} for gpuslice.io/gpu shares "
                "(MIG instances are advertised as their own gpuslice.io/mig-<profile> resources)"
            )
        self.sharing = SharingMode(sharing)
        self.state_dir = Path(state_dir)
        self.policy = make_gpuset_policy(gpuset_policy)
        self.watch_interval_s = watch_interval_s
        self.health_poll_s = health_poll_s
        self.registrations = 0  # successful Register calls, all resources; tests and logs read it

        self._mig = self._mig_slots(mig_layouts or {})
        self.resources = self._build_resources()
        self._by_id: dict[str, PluginDevice] = {d.id: d for r in self.resources for d in r.devices}
        self._health: dict[str, bool] = dict.fromkeys(self._by_id, True)
        self._gpu_healthy: dict[int, bool] = {g.index: True for g in machine.gpus}
        self._changed = threading.Condition()
        self._version = 0  # bumped on every health change; ListAndWatch streams resend on a bump
        self._allocate_lock = threading.Lock()  # one Allocate at a time: two must not take one decision
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._kubelet_id: tuple[int, int] | None = None
        self._minors = gpu_minors(machine)  # for the device nodes Allocate passes

    # -- construction -------------------------------------------------------------------------------

    def _mig_slots(self, layouts: Mapping[int, MigLayout]) -> dict[int, tuple[MigSlot, ...]]:
        slots: dict[int, tuple[MigSlot, ...]] = {}
        for gpu in self.machine.gpus:
            if not gpu.mig_enabled:
                continue
            layout = layouts.get(gpu.index)
            instances = sorted(layout.instances, key=lambda i: i.start) if layout else []
            slots[gpu.index] = tuple(
                MigSlot(
                    profile=i.profile.name,
                    start=i.start,
                    uuid=mig_device_uuid(self.machine, gpu.index, i.profile.name, i.start),
                    gi_id=-1 if i.gi_id is None else i.gi_id,
                )
                for i in instances
            )
        return slots

    def _build_resources(self) -> list[_Resource]:
        shares = [
            PluginDevice(f"{g.uuid}{SHARE_SEPARATOR}{n}", g.index, _numa(self.machine, g.index))
            for g in self.machine.gpus
            if not g.mig_enabled
            for n in range(self.split_count)
        ]
        too_long = [d.id for d in shares if len(d.id) > _MAX_DEVICE_ID_CHARS]
        if too_long:
            raise UserError(f"device id {too_long[0]!r} is longer than the kubelet's 63 characters")
        resources = []
        if shares:
            resources.append(_Resource(RESOURCE_GPU, "gpuslice-gpu.sock", shares))
        by_profile: dict[str, list[PluginDevice]] = {}
        for gpu, slots in self._mig.items():
            for slot in slots:
                device = PluginDevice(slot.uuid, gpu, _numa(self.machine, gpu), slot)
                by_profile.setdefault(slot.profile, []).append(device)
        for profile, devices in sorted(by_profile.items()):
            resources.append(
                _Resource(mig_resource(profile), f"gpuslice-mig-{profile}.sock", devices, profile)
            )
        if not resources:
            raise UserError(
                f"machine {self.machine.name!r}: nothing to advertise (MIG GPUs without instances)"
            )
        return resources

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def kubelet_socket(self) -> Path:
        return self.socket_dir / KUBELET_SOCKET

    def start(self) -> None:
        """Publish the inventory, serve every resource, register with the kubelet, start the watchers.

        RegistrationFailed if the kubelet refuses (the caller should exit, as the API expects)."""
        self._stop.clear()
        self.publish_inventory()
        self._serve_all()
        self._kubelet_id = self._kubelet_identity()
        try:
            self.register_all()
        except RegistrationFailed:
            self._stop_servers()  # nothing half-started: no socket left for a kubelet to find
            raise
        for target, name in ((self._watch_kubelet, "kubelet-watch"), (self._watch_health, "health")):
            thread = threading.Thread(target=target, name=f"gpuslice-dp-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop the watchers and the servers and remove our sockets; safe to call twice."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=5 + self.health_poll_s)
        self._threads.clear()
        self._stop_servers()
        with contextlib.suppress(Exception):
            self.health.close()

    def __enter__(self) -> DevicePlugin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self) -> None:
        """Block until ``stop`` is called (from a signal handler, for instance)."""
        self._stop.wait()

    def _serve_all(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        for resource in self.resources:
            path = self.socket_dir / resource.endpoint
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a socket left by an earlier run would make bind fail
            # Each ListAndWatch stream holds a worker for its lifetime; the kubelet opens one per resource.
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self, resource), server)
            server.add_insecure_port(f"unix://{path}")
            server.start()
            resource.server = server
            log.info("serving %s on %s (%d devices)", resource.name, path, len(resource.devices))

    def _stop_servers(self) -> None:
        for resource in self.resources:
            if resource.server is not None:
                resource.server.stop(grace=0.5).wait()
                resource.server = None
            with contextlib.suppress(FileNotFoundError):
                (self.socket_dir / resource.endpoint).unlink()

    def register_all(self) -> None:
        """Register every resource with the kubelet (retrying while a restarted kubelet comes up)."""
        for resource in self.resources:
            self._register(resource)

    def _register(self, resource: _Resource) -> None:
        request = pb.RegisterRequest(
            version=API_VERSION, endpoint=resource.endpoint, resource_name=resource.name, options=_OPTIONS
        )
        last: Exception | None = None
        for attempt in range(_REGISTER_ATTEMPTS):
            if attempt:
                time.sleep(min(2.0, 0.2 * 2**attempt))
            try:
                with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                    grpc.channel_ready_future(channel).result(timeout=_REGISTER_TIMEOUT_S)
                    pb_grpc.RegistrationStub(channel).Register(request, timeout=_REGISTER_TIMEOUT_S)
            except grpc.RpcError as err:
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    last = err
                    continue
                raise RegistrationFailed(
                    f"the kubelet refused {resource.name} on {self.kubelet_socket}: {err.details()}"
                ) from None
            except grpc.FutureTimeoutError:
                last = TimeoutError(f"no connection within {_REGISTER_TIMEOUT_S} s")
                continue
            self.registrations += 1
            log.info("registered %s (endpoint %s) with the kubelet", resource.name, resource.endpoint)
            return
        raise RegistrationFailed(
            f"no kubelet answered on {self.kubelet_socket} after {_REGISTER_ATTEMPTS} tries ({last}); "
            "is this the kubelet's device-plugins directory (--socket-dir)?"
        )

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = self.kubelet_socket.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    def _watch_kubelet(self) -> None:
        """Re-register when kubelet.sock is recreated (a kubelet restart) or our sockets vanish.

        A restarting kubelet deletes every socket in its directory, so the servers are restarted too
        (NVIDIA's plugin restarts all its plugins on the same inotify event, research §2.4). Polling the
        socket's inode every ``watch_interval_s`` stands in for inotify: no extra dependency, and a
        second's delay is nothing next to a kubelet restart."""
        while not self._stop.wait(self.watch_interval_s):
            identity = self._kubelet_identity()
            if identity is None:
                continue  # kubelet down: wait for it to come back
            ours_gone = any(not (self.socket_dir / r.endpoint).exists() for r in self.resources)
            if identity == self._kubelet_id and not ours_gone:
                continue
            log.info("kubelet socket recreated or plugin sockets removed; restarting and re-registering")
            try:
                self._stop_servers()
                self._serve_all()
                self.register_all()
                self._kubelet_id = identity
                self.publish_inventory()
            except (RegistrationFailed, OSError, RuntimeError) as err:
                log.error("re-registration failed (%s); retrying", err)

    # -- health --------------------------------------------------------------------------------------

    def _watch_health(self) -> None:
        while not self._stop.is_set():
            try:
                changes = self.health.wait(self.health_poll_s)
            except Exception:  # a broken health source must not take Allocate down with it
                log.exception("health source failed; keeping the last known health")
                self._stop.wait(self.health_poll_s)
                continue
            if changes:
                self.apply_health(changes)

    def apply_health(self, changes: Sequence[HealthChange]) -> None:
        """Flip the devices behind each change; resend ListAndWatch lists and the inventory if any moved."""
        by_gpu_uuid = {g.uuid: g.index for g in self.machine.gpus}
        moved = False
        with self._changed:
            for change in changes:
                if change.uuid in by_gpu_uuid:
                    gpu = by_gpu_uuid[change.uuid]
                    self._gpu_healthy[gpu] = change.healthy
                    targets = [d.id for d in self._by_id.values() if d.gpu == gpu]
                else:
                    targets = [change.uuid] if change.uuid in self._by_id else []
                if not targets:
                    log.warning("health change for unknown device %s ignored", change.uuid)
                for device_id in targets:
                    if self._health[device_id] != change.healthy:
                        self._health[device_id] = change.healthy
                        moved = True
                log.warning(
                    "%s is now %s (%s)",
                    change.uuid,
                    HEALTHY if change.healthy else UNHEALTHY,
                    change.reason or "no reason given",
                )
            if moved:
                self._version += 1
                self._changed.notify_all()
        if moved:
            self.publish_inventory()

    def device_health(self) -> list[DeviceHealthRow]:
        """Every advertised device and whether it is Healthy now (the metrics endpoint reads this)."""
        with self._changed:
            return [DeviceHealthRow(r.name, d.id, d.gpu, self._health[d.id]) for r in self.resources
                    for d in r.devices]  # fmt: skip

    def gpu_health(self) -> list[tuple[int, str, str, bool]]:
        """(index, uuid, model, healthy) of each GPU."""
        with self._changed:
            return [(g.index, g.uuid, g.model, self._gpu_healthy[g.index]) for g in self.machine.gpus]

    def device_list(self, resource: _Resource) -> pb.ListAndWatchResponse:
        """The resource's devices with their current health (what ListAndWatch sends)."""
        devices = []
        for d in resource.devices:
            topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa)]) if d.numa >= 0 else None
            health = HEALTHY if self._health[d.id] else UNHEALTHY
            devices.append(pb.Device(ID=d.id, health=health, topology=topology))
        return pb.ListAndWatchResponse(devices=devices)

    def _list_and_watch(
        self, resource: _Resource, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        with self._changed:
            seen = self._version
            snapshot = self.device_list(resource)
        yield snapshot
        while context.is_active() and not self._stop.is_set():
            with self._changed:
                self._changed.wait_for(lambda s=seen: self._version != s or self._stop.is_set(), timeout=1.0)
                if self._version == seen:
                    continue
                seen = self._version
                snapshot = self.device_list(resource)
            yield snapshot

    # -- inventory -----------------------------------------------------------------------------------

    def inventory(self) -> NodeInventory:
        with self._changed:
            healthy = dict(self._gpu_healthy)
        return node_inventory(self.machine, self.split_count, self._mig, healthy)

    def publish_inventory(self) -> None:
        """Write the inventory annotation on this node (nothing when no NodePublisher was given)."""
        if self.node is None:
            return
        try:
            self.node.annotate_node(
                self.node_name,
                {ANNOTATION_NODE_INVENTORY: self.inventory().to_json()},
                node_labels(self.machine),
            )
        except Exception as err:  # the API server may be briefly away; the next change republishes
            log.error("could not publish the node inventory of %s: %s", self.node_name, err)

    # -- GetPreferredAllocation -------------------------------------------------------------------------

    def _oldest_waiting(self, fits: Callable[[Decision], bool]) -> PendingPod | None:
        try:
            pods = self.pods.allocating_pods(self.node_name)
        except Exception as err:
            log.error("could not list pods bound to %s: %s", self.node_name, err)
            return None
        waiting = [p for p in pods if p.decision.node == self.node_name and fits(p.decision)]
        return min(waiting, key=lambda p: (p.decision.bind_time, p.namespace, p.name), default=None)

    def _preferred(
        self, resource: _Resource, request: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        answers = []
        for req in request.container_requests:
            available = [d for d in resource.devices if d.id in set(req.available_deviceIDs)]
            must = [self._by_id[i] for i in req.must_include_deviceIDs if i in self._by_id]
            size = int(req.allocation_size)
            if resource.mig_profile:
                chosen = self._prefer_mig(resource, available, must, size)
            else:
                chosen = self._prefer_shares(available, must, size)
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=[d.id for d in chosen]))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def _prefer_shares(
        self, available: list[PluginDevice], must: list[PluginDevice], size: int
    ) -> list[PluginDevice]:
        """One share per GPU: the GPUs a waiting pod's decision names, else the best-connected set."""
        per_gpu: dict[int, list[PluginDevice]] = {}
        for d in available:
            per_gpu.setdefault(d.gpu, []).append(d)
        must_gpus = {d.gpu for d in must}
        pod = self._oldest_waiting(lambda dec: dec.mig is None and len(dec.gpu_indices) == size)
        gpus: tuple[int, ...] | None = None
        if pod is not None:
            decided = self._decision_gpus(pod.decision)
            if decided and set(decided) >= must_gpus and all(g in per_gpu for g in decided):
                gpus = decided
        if gpus is None and 0 < size <= len(per_gpu) and len(must_gpus) <= size:
            gpus = self._topology_choice(tuple(sorted(per_gpu)), must_gpus, size)
        chosen = list(must)
        if gpus is not None:
            for g in gpus:
                if g not in {d.gpu for d in chosen}:
                    chosen.append(per_gpu[g][0])
        # More shares than distinct GPUs (or must-includes that rule out a topology choice): fill up,
        # spreading round-robin over the GPUs. Advice only; the extender refuses such a pod anyway.
        by_rank = sorted(available, key=lambda d: (per_gpu[d.gpu].index(d), d.gpu))
        chosen += [d for d in by_rank if d not in chosen]
        return chosen[:size]

    def _topology_choice(self, free: tuple[int, ...], must: set[int], size: int) -> tuple[int, ...]:
        topology = self.machine.topology
        if topology is None:
            rest = [g for g in free if g not in must]
            return tuple(sorted(must)) + tuple(rest[: size - len(must)])
        if not must:
            return choose_gpu_set(self.policy, topology, free, size).gpus
        # Some GPUs are fixed: search the completions with the exact policy's own cost order.
        rest = [g for g in free if g not in must]
        sets = (tuple(sorted(must | set(c))) for c in combinations(rest, size - len(must)))
        return min(sets, key=lambda s: (Exact.cost(topology, s), s))

    def _prefer_mig(
        self, resource: _Resource, available: list[PluginDevice], must: list[PluginDevice], size: int
    ) -> list[PluginDevice]:
        chosen = list(must)
        pod = self._oldest_waiting(
            lambda dec: dec.mig is not None and dec.mig.profile == resource.mig_profile
        )
        if pod is not None and pod.decision.mig is not None:
            slot = self._mig_slot(pod.decision.mig.gpu_index, pod.decision.mig.start)
            wanted = next((d for d in available if slot is not None and d.id == slot.uuid), None)
            if wanted is not None and wanted not in chosen:
                chosen.append(wanted)
        chosen += [d for d in available if d not in chosen]
        return chosen[:size]

    # -- Allocate ------------------------------------------------------------------------------------

    def _decision_gpus(self, decision: Decision) -> tuple[int, ...]:
        """The decision's GPUs as machine indices; by UUID when given (robust to reordering)."""
        if decision.gpu_uuids:
            index = {g.uuid: g.index for g in self.machine.gpus}
            return tuple(index[u] for u in decision.gpu_uuids if u in index)
        return tuple(i for i in decision.gpu_indices if 0 <= i < self.machine.gpu_count)

    def _mig_slot(self, gpu: int, start: int) -> MigSlot | None:
        return next((s for s in self._mig.get(gpu, ()) if s.start == start), None)

    def _allocate(self, resource: _Resource, request: pb.AllocateRequest) -> pb.AllocateResponse:
        with self._allocate_lock:
            taken: set[tuple[str, str]] = set()
            responses = []
            for req in request.container_requests:
                pod = self._pod_for(resource, list(req.devices_ids), taken)
                taken.add((pod.namespace, pod.name))
                try:
                    response = self._container_response(resource, pod)
                except AllocationRefused as err:
                    self._mark(pod, {ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED})
                    raise AllocationRefused(f"pod {pod.namespace}/{pod.name}: {err}") from None
                self._mark(pod, {ANNOTATION_BIND_PHASE: BIND_PHASE_ALLOCATED, ANNOTATION_ALLOCATED: "true"})
                log.info("allocated %s for pod %s/%s", resource.name, pod.namespace, pod.name)
                responses.append(response)
            return pb.AllocateResponse(container_responses=responses)

    def _pod_for(self, resource: _Resource, device_ids: list[str], taken: set[tuple[str, str]]) -> PendingPod:
        """The waiting pod these device IDs are for: its decision names exactly their GPUs (shares) or
        their MIG instance. The API passes no pod, so among pods whose decisions match, the kubelet's
        admission order decides (oldest creation time first, then bind time, then name)."""
        devices = [self._by_id.get(i) for i in device_ids]
        if not devices or any(d is None for d in devices):
            unknown = next((i for i, d in zip(device_ids, devices, strict=True) if d is None), "")
            raise AllocationRefused(f"the kubelet asked for unknown device {unknown!r} of {resource.name}")
        if resource.mig_profile:
            wanted = {d.mig.uuid for d in devices if d is not None and d.mig is not None}

            def fits(dec: Decision) -> bool:
                if dec.mig is None or dec.mig.profile != resource.mig_profile:
                    return False
                slot = self._mig_slot(dec.mig.gpu_index, dec.mig.start)
                return slot is not None and {slot.uuid} == wanted
        else:
            gpus = {d.gpu for d in devices if d is not None}

            def fits(dec: Decision) -> bool:
                return (
                    dec.mig is None
                    and len(dec.gpu_indices or dec.gpu_uuids) == len(device_ids)
                    and set(self._decision_gpus(dec)) == gpus
                )

        try:
            pods = self.pods.allocating_pods(self.node_name)
        except Exception as err:
            raise AllocationRefused(f"cannot list the pods bound to node {self.node_name}: {err}") from None
        waiting = [
            p
            for p in pods
            if p.decision.node == self.node_name and fits(p.decision) and (p.namespace, p.name) not in taken
        ]
        if not waiting:
            raise AllocationRefused(
                f"no pod bound to node {self.node_name} is waiting for {resource.name} devices "
                f"{', '.join(device_ids)}: the pod was not placed by the gpuslice scheduler (check its "
                "schedulerName; the gpuslice webhook sets it), or its decision annotations were removed"
            )
        return min(waiting, key=lambda p: (p.created, p.decision.bind_time, p.namespace, p.name))

    def _mark(self, pod: PendingPod, annotations: Mapping[str, str]) -> None:
        try:
            self.pods.annotate_pod(pod.namespace, pod.name, annotations)
        except Exception as err:
            # Unmarked, the same decision could be handed to the next container: refuse instead.
            raise AllocationRefused(
                f"could not record the allocation on pod {pod.namespace}/{pod.name}: {err}"
            ) from None

    def _container_response(self, resource: _Resource, pod: PendingPod) -> pb.ContainerAllocateResponse:
        decision = pod.decision
        spec_args: dict[str, Any] = {"command": (f"pod {pod.namespace}/{pod.name}",), "tenant": pod.namespace}
        mig = None
        if decision.mig is not None:
            choice = decision.mig
            slot = self._mig_slot(choice.gpu_index, choice.start)
            if slot is None or slot.profile != choice.profile:
                raise AllocationRefused(
                    f"its decision names MIG {choice.profile} at slice {choice.start} on GPU "
                    f"{choice.gpu_index}, which this node does not have"
                )
            if not self._health[slot.uuid]:
                raise AllocationRefused(f"MIG device {slot.uuid} is unhealthy")
            gpus: tuple[int, ...] = (choice.gpu_index,)
            mig = MigAssignment(choice.gpu_index, choice.profile, choice.start)
            spec = JobSpec(**spec_args, gpus=1, mig_profile=choice.profile)
        else:
            gpus = self._decision_gpus(decision)
            wanted = len(decision.gpu_uuids or decision.gpu_indices)
            if len(gpus) != wanted or not gpus:
                raise AllocationRefused(
                    f"its decision names GPUs {','.join(decision.gpu_uuids) or decision.gpu_indices} "
                    f"but node {self.node_name} has {', '.join(g.uuid for g in self.machine.gpus)}"
                )
            sick = [self.machine.gpus[g].uuid for g in gpus if not self._gpu_healthy[g]]
            if sick:
                raise AllocationRefused(f"GPU {sick[0]} is unhealthy")
            cores = decision.cores_percent if 0 < decision.cores_percent < 100 else 0
            spec = JobSpec(
                **spec_args, gpus=len(gpus), gpu_memory_bytes=decision.memory_mib * MiB, compute_percent=cores
            )
        env = job_env(self.sharing, spec, gpus, self.machine, self.state_dir, mig=mig)
        # NVIDIA's container runtime reads NVIDIA_VISIBLE_DEVICES to mount the devices; the device nodes
        # and CDI names below do the same without it (a runtime with CDI, containerd 1.7+ / CRI-O 1.23+).
        env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
        cdi_names = (
            [mig_slot_uuid]
            if (mig_slot_uuid := self._mig_uuid(decision))
            else [self.machine.gpus[g].uuid for g in gpus]
        )
        shim_mounts = container_setup(self.state_dir, pod.namespace, pod.name, env)  # --sharing shim
        return pb.ContainerAllocateResponse(
            envs=env,
            mounts=self._mounts(env) + shim_mounts,
            devices=[
                pb.DeviceSpec(container_path=path, host_path=path, permissions="rw")
                for path in device_nodes(self._minors, gpus)
            ],
            cdi_devices=[pb.CDIDevice(name=f"{CDI_KIND}={name}") for name in cdi_names],
        )

    def _mig_uuid(self, decision: Decision) -> str:
        if decision.mig is None:
            return ""
        slot = self._mig_slot(decision.mig.gpu_index, decision.mig.start)
        return slot.uuid if slot is not None else ""

    def _mounts(self, env: Mapping[str, str]) -> list[pb.Mount]:
        """Host directories the slice's environment points at, mounted at the same path."""
        mounts = []
        if "PYTHONPATH" in env:
            cap = softcap_dir(self.state_dir)
            mounts.append(pb.Mount(container_path=str(cap), host_path=str(cap), read_only=True))
        return mounts


# ---- wiring: what ``gpuslice k8s device-plugin`` runs ----------------------------------------------


def _label_value(text: str) -> str:
    """A label value: at most 63 of [A-Za-z0-9_.-], starting and ending alphanumeric (GFD writes
    "NVIDIA-H100-80GB-HBM3" for "NVIDIA H100 80GB HBM3" the same way)."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-" for c in text)[:63]
    return cleaned.strip("_.-")


def node_labels(machine: Machine) -> dict[str, str]:
    """GPU feature discovery's labels, under gpuslice.io/: product, memory (MiB), count, MIG capable."""
    if not machine.gpus:
        return {LABEL_COUNT: "0"}
    first = machine.gpus[0]
    return {
        LABEL_PRODUCT: _label_value(first.model),
        LABEL_MEMORY: str(first.memory_bytes // MiB),
        LABEL_COUNT: str(len(machine.gpus)),
        LABEL_MIG_CAPABLE: "true" if any(g.mig_model for g in machine.gpus) else "false",
    }


def device_nodes(minors: Sequence[int], gpus: Sequence[int]) -> list[str]:
    """The device nodes a container with ``gpus`` needs: each GPU's /dev/nvidia<minor> (``minors`` by
    GPU index, from ``gpu_minors``) and the control devices."""
    return [*(f"/dev/nvidia{minors[g]}" for g in gpus), *CONTROL_DEVICES]


def gpu_minors(machine: Machine) -> tuple[int, ...]:
    """Each GPU's /dev/nvidia<minor>: NVML's minor number, which need not equal its index (read once,
    when the plugin starts); the index where NVML cannot say (a simulated machine)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML: indices are the minors there
        return tuple(g.index for g in machine.gpus)
    try:
        minors = []
        for g in machine.gpus:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(g.uuid)
                minors.append(int(pynvml.nvmlDeviceGetMinorNumber(handle)))
            except Exception:  # a GPU NVML does not know (a simulated UUID)
                minors.append(g.index)
        return tuple(minors)
    finally:
        pynvml.nvmlShutdown()


def parse_mig_layouts(machine: Machine, texts: Sequence[str]) -> dict[int, MigLayout]:
    """``["0=3g.40gb@0/1,3g.40gb@4/2", "1=7g.80gb@0/0"]`` -> layouts of those MIG-mode GPUs."""
    layouts = {}
    for text in texts:
        index, sep, layout = text.partition("=")
        if not sep or not index.strip().isdigit():
            raise UserError(f"--mig-layout {text!r}: write GPU=LAYOUT, e.g. 0=3g.40gb@0/1,3g.40gb@4/2")
        gpu = int(index)
        if gpu >= machine.gpu_count or not machine.gpus[gpu].mig_enabled:
            raise UserError(f"--mig-layout {text!r}: GPU {gpu} is not a MIG-mode GPU of {machine.name}")
        layouts[gpu] = parse_layout(mig_gpu(machine.gpus[gpu].mig_model), layout)
    return layouts


def _nvml_mig_layouts(machine: Machine) -> dict[int, MigLayout]:
    from gpuslice.hardware.mig_nvml import read_layout

    return {g.index: read_layout(g.index) for g in machine.gpus if g.mig_enabled}


def _mig_health_keys(machine: Machine, layouts: Mapping[int, MigLayout]) -> dict[tuple[str, int, int], str]:
    """(GPU UUID, GI id, CI id) -> MIG device UUID, so an XID inside one instance marks only it."""
    keys = {}
    for gpu, layout in layouts.items():
        for instance in layout.instances:
            if instance.gi_id is None:
                continue
            uuid = mig_device_uuid(machine, gpu, instance.profile.name, instance.start)
            for ci in instance.ci_ids:
                keys[(machine.gpus[gpu].uuid, instance.gi_id, ci)] = uuid
    return keys


def serve(
    machine: Machine,
    node_name: str,
    *,
    simulated: bool,
    pods: PodSource | None = None,
    node: NodePublisher | None = None,
    kubeconfig: str | None = None,
    split_count: int = DEFAULT_SPLIT_COUNT,
    socket_dir: str | os.PathLike[str] = DEVICE_PLUGIN_PATH,
    sharing: SharingMode | str = SharingMode.SOFT,
    state_dir: str | os.PathLike[str] = "/var/lib/gpuslice",
    mig_layouts: Mapping[int, MigLayout] | None = None,
    health_checks: bool = True,
    stop: threading.Event | None = None,
    on_ready: Callable[[DevicePlugin], None] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "0.0.0.0",
) -> None:
    """Run the device plugin for ``machine`` until ``stop`` is set (default: until SIGTERM or SIGINT).

    A simulated machine (``discover(simulate=…)``) gets its MIG layouts from ``default_mig_layouts``,
    no NVML health checks; a real one reads its MIG layouts and XID events through NVML. Without
    ``pods``, ``KubeApi(kubeconfig)`` serves as
    both the pod source and the node publisher. With ``metrics_port``, Prometheus metrics (device and
    GPU health, observe/k8s_metrics.py) are served at ``http://metrics_host:metrics_port/metrics``."""
    if mig_layouts is None:
        mig_layouts = default_mig_layouts(machine) if simulated else _nvml_mig_layouts(machine)
    owned: KubeApi | None = None
    if pods is None:
        pods = node = owned = KubeApi(kubeconfig)
    health: HealthSource
    if simulated:
        health = FakeHealthSource()  # nothing breaks on a simulated node
    elif health_checks:
        health = NvmlHealthSource(machine, mig_devices=_mig_health_keys(machine, mig_layouts))
    else:
        health = NoHealthChecks()
    plugin = DevicePlugin(
        machine,
        node_name,
        pods=pods,
        node=node,
        health=health,
        split_count=split_count,
        socket_dir=socket_dir,
        mig_layouts=mig_layouts,
        sharing=sharing,
        state_dir=state_dir,
    )
    done = stop if stop is not None else threading.Event()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
    metrics_server = None
    try:
        plugin.start()
        if metrics_port is not None:
            registry = DevicePluginMetrics(plugin.device_health, plugin.gpu_health).registry
            metrics_server, _thread = start_http_server(metrics_port, metrics_host, registry=registry)
        if on_ready is not None:
            on_ready(plugin)
        while not done.wait(1.0):
            pass
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        plugin.stop()
        if owned is not None:
            owned.close()
