"""The device plugin of one node: its gRPC servers, kubelet registration, health and inventory."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from gpuslice.errors import UserError
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import MigLayout
from gpuslice.k8s import plugin_socket
from gpuslice.k8s.annotations import (
    ANNOTATION_NODE_INVENTORY,
    DEFAULT_SPLIT_COUNT,
    DEFAULT_STATE_DIR,
    RESOURCE_GPU,
    MigSlot,
    NodeInventory,
    mig_resource,
)
from gpuslice.k8s.container_slice import pod_sharing
from gpuslice.k8s.device_plugin.allocation import Allocation, AllocationRefused
from gpuslice.k8s.device_plugin.devices import (
    HEALTHY,
    MAX_DEVICE_ID_CHARS,
    SHARE_SEPARATOR,
    UNHEALTHY,
    PluginDevice,
    Resource,
    gpu_minors,
    gpu_numa,
    node_inventory,
    node_labels,
)
from gpuslice.k8s.device_plugin.kube import NodePublisher, PodSource
from gpuslice.k8s.device_plugin.record import ALLOCATION_RECORD, AllocationRecord
from gpuslice.k8s.proto import deviceplugin_pb2 as pb
from gpuslice.k8s.proto import deviceplugin_pb2_grpc as pb_grpc
from gpuslice.node.discovery import is_simulated
from gpuslice.node.enforcement import SharingMode, mig_device_uuid
from gpuslice.node.gpu_faults import (
    HealthChange,
    HealthSource,
    NoHealthChecks,
)
from gpuslice.observe.k8s_metrics import DeviceHealthRow
from gpuslice.policies.gpuset import make_gpuset_policy

__all__ = [
    "API_VERSION",
    "DEVICE_PLUGIN_PATH",
    "KUBELET_SOCKET",
    "DevicePlugin",
    "RegistrationFailed",
]

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = "kubelet.sock"
_REGISTER_TIMEOUT_S = 5.0
_REGISTER_ATTEMPTS = 5  # after a kubelet restart its socket can appear before it answers


class RegistrationFailed(UserError):
    """The kubelet refused or never answered Register (no kubelet, wrong version, name taken)."""


class _Servicer(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service of one resource; the state lives in the DevicePlugin."""

    def __init__(self, plugin: DevicePlugin, resource: Resource) -> None:
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
        answer = self.plugin._preferred(self.resource, request)
        log.info(
            "preferred allocation for %s: %s",
            self.resource.name,
            "; ".join(",".join(c.deviceIDs) for c in answer.container_responses),
        )
        return answer

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


class DevicePlugin(Allocation):
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
        state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
        gpuset_policy: str = "exact",
        watch_interval_s: float = 1.0,
        health_poll_s: float = 1.0,
        instance: str = "",
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
        self.sharing = pod_sharing(sharing)
        # In the socket names: two instances (a DaemonSet rolled with surge) serve side by side, and the
        # kubelet keeps a resource's devices while one of its endpoints remains (it keys them by path).
        self.instance = instance
        self.state_dir = Path(state_dir)
        self.policy = make_gpuset_policy(gpuset_policy)
        self.watch_interval_s = watch_interval_s
        self.health_poll_s = health_poll_s
        self.registrations = 0  # successful Register calls, all resources; tests and logs read it
        self._registered = False  # every resource registered since its servers last started
        self.record = AllocationRecord(self.state_dir / ALLOCATION_RECORD)

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
        self._own: dict[str, tuple[int, int]] = {}  # endpoint -> (device, inode) of the socket we published
        self._minors = gpu_minors(machine)  # for the device nodes Allocate passes
        self._simulated = is_simulated(machine)

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

    def _build_resources(self) -> list[Resource]:
        shares = [
            PluginDevice(f"{g.uuid}{SHARE_SEPARATOR}{n}", g.index, gpu_numa(self.machine, g.index))
            for g in self.machine.gpus
            if not g.mig_enabled
            for n in range(self.split_count)
        ]
        too_long = [d.id for d in shares if len(d.id) > MAX_DEVICE_ID_CHARS]
        if too_long:
            raise UserError(f"device id {too_long[0]!r} is longer than the kubelet's 63 characters")
        resources = []
        if shares:
            resources.append(Resource(RESOURCE_GPU, self._endpoint("gpuslice-gpu"), shares))
        by_profile: dict[str, list[PluginDevice]] = {}
        for gpu, slots in self._mig.items():
            for slot in slots:
                device = PluginDevice(slot.uuid, gpu, gpu_numa(self.machine, gpu), slot)
                by_profile.setdefault(slot.profile, []).append(device)
        for profile, devices in sorted(by_profile.items()):
            resources.append(
                Resource(mig_resource(profile), self._endpoint(f"gpuslice-mig-{profile}"), devices, profile)
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
        self._registered = True
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
        """Serve every resource on its socket, published over any socket there (a killed run's, or the
        live one of the instance this one replaces in a rolling update: ``k8s.plugin_socket``)."""
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_sockets()
        for resource in self.resources:
            path = self.socket_dir / resource.endpoint
            # Each ListAndWatch stream holds a worker for its lifetime; the kubelet opens one per resource.
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self, resource), server)
            private = plugin_socket.listen(server, path)
            server.start()
            resource.server = server
            self._own[resource.endpoint] = plugin_socket.publish(private, path)
            log.info("serving %s on %s (%d devices)", resource.name, path, len(resource.devices))

    def _endpoint(self, stem: str) -> str:
        return f"{stem}-{self.instance}.sock" if self.instance else f"{stem}.sock"

    def _remove_stale_sockets(self) -> None:
        """Remove gpuslice sockets no server listens on (left by a killed instance); a live one (the
        instance this one replaces, still serving) stays."""
        plugin_socket.remove_stale(self.socket_dir, "gpuslice-*.sock")

    @property
    def registered(self) -> bool:
        """Registered with the kubelet, and every socket still where the kubelet dials it (a restarting
        kubelet removes them; the watcher then serves and registers again)."""
        return self._registered and all((self.socket_dir / r.endpoint).exists() for r in self.resources)

    def _stop_servers(self) -> None:
        """Stop the servers; remove each socket only if it is still ours (a newer instance's stays)."""
        self._registered = False
        for resource in self.resources:
            if resource.server is not None:
                resource.server.stop(grace=0.5).wait()
                resource.server = None
            plugin_socket.unlink_own(
                self.socket_dir / resource.endpoint, self._own.pop(resource.endpoint, None)
            )

    def register_all(self) -> None:
        """Register every resource with the kubelet (retrying while a restarted kubelet comes up)."""
        for resource in self.resources:
            self._register(resource)

    def _register(self, resource: Resource) -> None:
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
        (NVIDIA's k8s-device-plugin restarts all its plugins on the same inotify event, in
        ``cmd/nvidia-device-plugin/main.go``). Polling the
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
                self._registered = True
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

    def device_list(self, resource: Resource) -> pb.ListAndWatchResponse:
        """The resource's devices with their current health (what ListAndWatch sends)."""
        devices = []
        for d in resource.devices:
            topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa)]) if d.numa >= 0 else None
            health = HEALTHY if self._health[d.id] else UNHEALTHY
            devices.append(pb.Device(ID=d.id, health=health, topology=topology))
        return pb.ListAndWatchResponse(devices=devices)

    def _list_and_watch(
        self, resource: Resource, context: grpc.ServicerContext
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
