"""The kubelet side of the DRA driver: plugin registration and the ``v1.DRAPlugin`` gRPC service.

```text
<plugins_registry>/gpu.gpuslice.io-<instance>.sock   Registration: GetInfo -> type, name, endpoint
<plugins>/gpu.gpuslice.io/dra-<instance>.sock        DRAPlugin: NodePrepareResources, Unprepare
```

``<instance>`` is the pod's (the first 8 characters of its UID; without one the names are
``gpu.gpuslice.io-reg.sock`` and ``dra.sock``): in a roll with surge the old and the new pod serve side
by side, the kubelet keeps both registered and calls the newest, and each removes only its own sockets
(``k8s.plugin_socket``). Both may be called at once: the checkpoint they share is read and written
under a lock across processes (``Preparer``).

The kubelet watches its plugins_registry directory, calls GetInfo on a new socket, then talks to the
named endpoint. Every claim of a request gets an entry in the answer; a claim that cannot be prepared
gets its reason in ``error`` (the kubelet puts it on the pod's events), never a failed RPC, and a bug
in one claim is reported as such without taking the others or the server down.
"""

from __future__ import annotations

import logging
from concurrent import futures
from pathlib import Path

import grpc

from gpuslice.errors import UserError
from gpuslice.k8s import plugin_socket
from gpuslice.k8s.dra.prepare import ClaimRef, Preparer
from gpuslice.k8s.dra.proto import dra_pb2 as dra
from gpuslice.k8s.dra.proto import dra_pb2_grpc as dra_grpc
from gpuslice.k8s.dra.proto import pluginregistration_pb2 as reg
from gpuslice.k8s.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from gpuslice.k8s.dra.slices import DRIVER

__all__ = [
    "DRA_SERVICE",
    "PLUGINS_DIR",
    "PLUGIN_TYPE",
    "REGISTRY_DIR",
    "KubeletPlugin",
    "dra_socket",
    "registration_socket",
]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICE = "v1.DRAPlugin"  # the kubelet's name for the v1 gRPC service (kubelet pkg/apis/dra/v1)
REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
PLUGINS_DIR = Path("/var/lib/kubelet/plugins")


def dra_socket(plugins_dir: Path, instance: str = "") -> Path:
    return Path(plugins_dir) / DRIVER / (f"dra-{instance}.sock" if instance else "dra.sock")


def registration_socket(registry_dir: Path, instance: str = "") -> Path:
    # not <driver>-<instance>-reg.sock: four characters fewer under gRPC's socket path limit
    return Path(registry_dir) / (f"{DRIVER}-{instance}.sock" if instance else f"{DRIVER}-reg.sock")


class _DraServicer(dra_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        answer = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            entry = answer.claims[claim.uid]
            try:
                for d in self.preparer.prepare(ClaimRef(claim.namespace, claim.uid, claim.name)):
                    device = entry.devices.add(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=[d.cdi_id],
                    )
                    if d.share_id:
                        device.share_id = d.share_id
            except UserError as err:
                log.warning("prepare %s/%s refused: %s", claim.namespace, claim.name, err)
                entry.error = str(err)
            except Exception as err:  # a bug: report it on this claim, keep serving the others
                log.exception("prepare %s/%s failed", claim.namespace, claim.name)
                entry.error = f"internal error in the gpuslice DRA driver (a bug; see its log): {err}"
        return answer

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = answer.claims[claim.uid]
            try:
                self.preparer.unprepare(claim.uid)
            except Exception as err:
                log.exception("unprepare %s/%s failed", claim.namespace, claim.name)
                entry.error = f"could not unprepare claim {claim.namespace}/{claim.name}: {err}"
        return answer


class _RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered: bool | None = None
        self.error = ""

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint), supported_versions=[DRA_SERVICE]
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        self.registered, self.error = request.plugin_registered, request.error
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s", DRIVER)
        else:
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error)
        return reg.RegistrationStatusResponse()


class KubeletPlugin:
    """The two gRPC servers of the driver: start(), then stop(). ``registered`` reports what the
    kubelet last said (None: not asked yet)."""

    def __init__(
        self,
        preparer: Preparer,
        *,
        plugins_dir: Path = PLUGINS_DIR,
        registry_dir: Path = REGISTRY_DIR,
        instance: str = "",
    ):
        self.preparer = preparer
        self.endpoint = dra_socket(plugins_dir, instance)
        self.registration_path = registration_socket(registry_dir, instance)
        self._registration = _RegistrationServicer(self.endpoint)
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self._own: dict[Path, tuple[int, int]] = {}  # socket path -> (device, inode) published

    @property
    def registered(self) -> bool | None:
        return self._registration.registered

    def start(self) -> None:
        plugin_socket.remove_stale(self.endpoint.parent, "dra*.sock")
        plugin_socket.remove_stale(self.registration_path.parent, f"{DRIVER}-*.sock")
        dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_grpc.add_DRAPluginServicer_to_server(_DraServicer(self.preparer), dra_server)
        private = plugin_socket.listen(dra_server, self.endpoint)
        dra_server.start()
        self._own[self.endpoint] = plugin_socket.publish(private, self.endpoint)
        # Registration last: the kubelet may call the endpoint as soon as it sees this socket.
        reg_server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        reg_grpc.add_RegistrationServicer_to_server(self._registration, reg_server)
        private = plugin_socket.listen(reg_server, self.registration_path)
        reg_server.start()
        self._own[self.registration_path] = plugin_socket.publish(private, self.registration_path)
        self._dra_server, self._reg_server = dra_server, reg_server
        log.info(
            "DRA driver %s serving %s, registration at %s", DRIVER, self.endpoint, self.registration_path
        )

    def stop(self) -> None:
        for server in (self._reg_server, self._dra_server):
            if server is not None:
                server.stop(grace=2).wait()
        self._dra_server = self._reg_server = None
        for path in (self.registration_path, self.endpoint):
            plugin_socket.unlink_own(path, self._own.pop(path, None))
