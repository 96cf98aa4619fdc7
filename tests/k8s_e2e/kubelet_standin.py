"""The kubelet's admission for the registered nodes that have no kubelet (the control-plane e2e).

A kubelet calls the device plugin's Allocate for each pod bound to its node; without one, a bound pod
would wait for its allocation for ever and hold its node's lock (k8s/node_lock.py) until the timeout.
``KubeletStandIn`` plays that one part: every pod Pending on a registered node in bind-phase
"allocating" gets Allocate from the node's real device plugin, with one share of each decided GPU (or
its MIG instance) as the device IDs, one pod at a time. Its Allocate releases the node lock, as on a
real node. The tests on the real kubelet (test_node_*.py) do not use it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gpuslice.k8s.annotations import BIND_PHASE_ALLOCATING, Decision
from gpuslice.k8s.device_plugin import DevicePlugin
from gpuslice.k8s.device_plugin.allocation import AllocationRefused
from gpuslice.k8s.proto import deviceplugin_pb2 as pb

log = logging.getLogger(__name__)

POLL_S = 0.3


class KubeletStandIn:
    """Allocate for the pods bound to ``plugins``' nodes, polled from the API server every POLL_S."""

    def __init__(self, core: Any, plugins: dict[str, DevicePlugin]) -> None:
        self.core = core
        self.plugins = plugins
        self.allocated: list[tuple[str, str]] = []  # (namespace, name) in the order they were allocated
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kubelet-stand-in")

    def start(self) -> KubeletStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                pods = self.core.list_pod_for_all_namespaces(field_selector="status.phase=Pending").items
            except Exception:
                log.warning("stand-in: listing pods failed", exc_info=True)
                continue
            for pod in pods:
                plugin = self.plugins.get(pod.spec.node_name or "")
                if plugin is None or pod.metadata.deletion_timestamp is not None:
                    continue
                decision = Decision.from_annotations(pod.metadata.annotations or {})
                if decision is None or decision.phase != BIND_PHASE_ALLOCATING:
                    continue
                self._admit(plugin, pod, decision)

    def _admit(self, plugin: DevicePlugin, pod: Any, decision: Decision) -> None:
        if decision.mig is not None:
            resource = next(r for r in plugin.resources if r.mig_profile == decision.mig.profile)
            slot = plugin._mig_slot(decision.mig.gpu_index, decision.mig.start)
            ids = [d.id for d in resource.devices if slot is not None and d.id == slot.uuid]
        else:
            resource = next(r for r in plugin.resources if not r.mig_profile)
            ids = [
                next(d.id for d in resource.devices if d.gpu == g) for g in plugin._decision_gpus(decision)
            ]
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        try:
            plugin._allocate(resource, request)
        except AllocationRefused as err:  # the kubelet fails the pod it was admitting
            self.refused.append(str(err))
            log.warning("stand-in: Allocate refused: %s", err)
            status = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": str(err)[:1000]}
            self.core.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": status}
            )
            return
        self.allocated.append((pod.metadata.namespace, pod.metadata.name))
