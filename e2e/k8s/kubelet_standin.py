"""The kubelet's admission for registered nodes that have no kubelet (the control-plane e2e tests and
the full-cluster benchmark).

A kubelet calls its device plugin's Allocate for each pod bound to its node; without one, a bound pod
would wait for its allocation for ever and hold its node's lock (``gpuslice.k8s.node_lock``) until the
timeout. ``KubeletStandIn`` plays that one part, as each node's kubelet would:

* it watches the Pending pods bound to a node (a LIST, then a WATCH from its resourceVersion; a broken
  or expired watch lists again), so it hears of a bind as a kubelet does, within milliseconds;
* every pod on a registered node whose decision is in bind-phase "allocating" gets Allocate from that
  node's real device plugin (``DevicePlugin._allocate``, the code the gRPC server runs), with one share
  of each decided GPU (or its MIG instance) as the device IDs;
* one pod at a time per node, in the order heard (a kubelet admits its pods one by one), nodes side by
  side (every node has its own kubelet), after ``admission_delay_s``: the time a real kubelet takes from
  seeing the bound pod to its Allocate call;
* an Allocate refused fails the pod, as the kubelet's admission does (phase Failed,
  UnexpectedAdmissionError).

Its Allocate releases the node lock, as on a real node. The tests on the real kubelet do not use it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuslice.k8s.annotations import (
    BIND_PHASE_ALLOCATING,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.device_plugin import DevicePlugin
from gpuslice.k8s.device_plugin.allocation import AllocationRefused
from gpuslice.k8s.proto import deviceplugin_pb2 as pb

__all__ = ["KubeletStandIn"]

log = logging.getLogger(__name__)

# Bound, not yet running: what a kubelet admits. "spec.nodeName!=" keeps unbound pods off the stream.
FIELD_SELECTOR = "status.phase=Pending,spec.nodeName!="
WATCH_TIMEOUT_S = 60  # the server closes the watch after this; the loop opens the next one
RETRY_S = 0.5


class KubeletStandIn:
    """Allocate for the pods bound to ``plugins``' nodes (node name -> that node's device plugin)."""

    def __init__(
        self,
        core: Any,
        plugins: Mapping[str, DevicePlugin],
        *,
        admission_delay_s: float = 0.0,
        workers: int = 8,
    ) -> None:
        self.core = core
        self.plugins = dict(plugins)
        self.admission_delay_s = admission_delay_s
        # what happened, for the tests and the benchmark to read (list.append is atomic)
        self.allocated: list[tuple[str, str]] = []  # (namespace, name), in the order Allocate answered
        self.refused: list[str] = []
        self.heard: list[tuple[str, str]] = []  # (namespace, name), in the order their binds were heard
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards the three below
        self._queues: dict[str, deque[tuple[Any, Decision]]] = {}
        self._draining: set[str] = set()  # nodes with a worker on their queue
        self._admitted: set[str] = set()  # pod UIDs queued or allocated: each is admitted once
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kubelet-stand-in")
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="kubelet-stand-in-watch")
        self._watch_handle: Any = None

    def start(self) -> KubeletStandIn:
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        handle = self._watch_handle
        if handle is not None:
            handle.stop()
        self._watcher.join(timeout=WATCH_TIMEOUT_S + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- hearing of binds ------------------------------------------------------------------------------

    def _watch(self) -> None:
        from kubernetes import watch

        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self.core.list_pod_for_all_namespaces(field_selector=FIELD_SELECTOR)
                    for pod in listed.items:
                        self._heard(pod)
                    version = listed.metadata.resource_version
                self._watch_handle = watch.Watch()
                for event in self._watch_handle.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=FIELD_SELECTOR,
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                ):
                    if self._stop.is_set():
                        return
                    if event["type"] == "ERROR":  # 410 Gone: the version expired; list again
                        version = ""
                        break
                    pod = event["object"]
                    version = pod.metadata.resource_version or version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._heard(pod)
            except Exception:
                if self._stop.is_set():
                    return
                log.warning("stand-in: the pod watch broke; listing again", exc_info=True)
                version = ""
                self._stop.wait(RETRY_S)

    def _heard(self, pod: Any) -> None:
        node = pod.spec.node_name or ""
        if node not in self.plugins or pod.metadata.deletion_timestamp is not None:
            return
        try:
            decision = Decision.from_annotations(pod.metadata.annotations or {})
        except Exception:  # a malformed decision is the device plugin's to refuse, not the stand-in's
            decision = None
        if decision is None or decision.phase != BIND_PHASE_ALLOCATING:
            return
        uid = str(pod.metadata.uid)
        with self._lock:
            if uid in self._admitted:
                return
            self._admitted.add(uid)
            self.heard.append((pod.metadata.namespace, pod.metadata.name))
            self._queues.setdefault(node, deque()).append((pod, decision))
            if node in self._draining:
                return
            self._draining.add(node)
        self._pool.submit(self._drain, node)

    # -- admitting, one pod at a time per node -----------------------------------------------------------

    def _drain(self, node: str) -> None:
        while not self._stop.is_set():
            with self._lock:
                queue = self._queues[node]
                if not queue:
                    self._draining.discard(node)
                    return
                pod, decision = queue.popleft()
            if self.admission_delay_s:
                time.sleep(self.admission_delay_s)
            try:
                self._admit(self.plugins[node], pod, decision)
            except Exception:
                log.exception("stand-in: admitting %s/%s failed", pod.metadata.namespace, pod.metadata.name)

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
