"""The node's slice metrics (``observe.node_slices``) wired to the two node components.

```text
device plugin   holders: its allocation record (``device_plugin.record``), limited to the pods on the
                node that have not ended (``live_pod_uids``, listed at most every LIVE_TTL_S)
                registered: every resource registered with the kubelet, every socket in place
DRA driver      holders: its checkpoint's prepared claims, each read back from the CDI spec the driver
                wrote for it (the container's environment: GPUs, limits, the shim region)
                registered: the kubelet's last NotifyRegistrationStatus said yes, both sockets in place
both            NVML's used memory per GPU on a real node (``node.discovery.gpu_telemetry``); none on a
                simulated one, where only the record and the shim (on the fake driver) speak
```
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuslice.k8s.container_slice import slice_holder
from gpuslice.observe.node_slices import NodeSliceCollector, SliceHolder

if TYPE_CHECKING:
    from gpuslice.hardware.machine import Machine
    from gpuslice.k8s.device_plugin.plugin import DevicePlugin
    from gpuslice.k8s.dra.kubelet_plugin import KubeletPlugin
    from gpuslice.k8s.dra.prepare import Preparer

__all__ = [
    "LIVE_TTL_S",
    "DraSlices",
    "LivePods",
    "device_plugin_collector",
    "dra_collector",
    "nvml_memory_used",
]

log = logging.getLogger(__name__)

# Two Prometheus replicas scraping every 15 s cost one pod list per node every 5 s at most, served from
# the API server's watch cache.
LIVE_TTL_S = 5.0


def nvml_memory_used() -> dict[int, int]:
    """NVML's used memory per GPU index (the reading the serve monitor takes)."""
    from gpuslice.node.discovery import gpu_telemetry

    return {r.index: r.memory_used_bytes for r in gpu_telemetry() if r.memory_used_bytes is not None}


class LivePods:
    """The UIDs of the node's pods that have not ended, listed at most every ``ttl_s``; the last good
    list while the API server does not answer (None before the first: then every record counts)."""

    def __init__(
        self, list_uids: Callable[[str], set[str]], node_name: str, *, ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._list = list_uids
        self._node = node_name
        self._ttl_s = LIVE_TTL_S if ttl_s is None else ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._uids: set[str] | None = None
        self._at = float("-inf")

    def __call__(self) -> set[str] | None:
        with self._lock:
            if self._clock() - self._at < self._ttl_s:
                return self._uids
            self._at = self._clock()  # a failed list is not retried sooner either
            try:
                self._uids = set(self._list(self._node))
            except Exception as err:  # the API server away: the last list stands until it answers
                log.warning("pods on %s not listed (%s); the last list stands", self._node, err)
            return self._uids


def device_plugin_collector(plugin: DevicePlugin, pods: Any, *, simulated: bool) -> NodeSliceCollector:
    """The collector of a ``DevicePlugin``; ``pods`` lists the node's live pods when it has
    ``live_pod_uids`` (``NodeKubeClient``), else every recorded slice counts as held."""
    lister = getattr(pods, "live_pod_uids", None)
    live = LivePods(lister, plugin.node_name) if lister is not None else None
    return NodeSliceCollector(
        plugin.machine,
        lambda: plugin.record.held(live() if live is not None else None),
        lambda: plugin.registered,
        nvml_used=None if simulated else nvml_memory_used,
    )


class DraSlices:
    """The slices of the claims a DRA ``Preparer`` has prepared now. A claim's CDI spec is the driver's
    own file (in the runtime's CDI folder, which no pod mounts) and never changes once written, so each
    is read once and kept while its claim stays prepared."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer
        self._known: dict[str, SliceHolder | None] = {}  # claim uid -> its slice (None: spec unreadable)

    def __call__(self) -> list[SliceHolder]:
        claims = self.preparer.prepared_claims()
        self._known = {uid: self._known.get(uid) or self._read(*claim) for uid, *claim in claims}
        return [h for h in self._known.values() if h is not None]

    @staticmethod
    def _read(namespace: str, name: str, spec_path: str) -> SliceHolder | None:
        try:
            spec = json.loads(Path(spec_path).read_text())
            lines = spec["containerEdits"]["env"]
            env = dict(line.partition("=")[::2] for line in lines)
            return slice_holder(env, namespace, claim=name)
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("claim %s/%s: CDI spec %s unreadable (%s)", namespace, name, spec_path, err)
            return None


def dra_collector(
    machine: Machine, preparer: Preparer, plugin: KubeletPlugin, *, simulated: bool
) -> NodeSliceCollector:
    """The collector of a DRA driver (``DraDriver``'s machine, preparer and kubelet plugin): the claims
    it prepared."""

    def registered() -> bool:
        return plugin.registered is True and plugin.endpoint.exists() and plugin.registration_path.exists()

    nvml = None if simulated else nvml_memory_used
    return NodeSliceCollector(machine, DraSlices(preparer), registered, nvml_used=nvml)
