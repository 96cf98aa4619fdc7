"""What ``gpuslice k8s dra-driver`` runs on one node: the pool published, the kubelet plugin served,
the pool republished on every health change (an XID takes a GPU's devices out of new allocations).

```text
start:  slices = node_slices(machine, node, generation = stored + 1)  -> DraApi.publish
        KubeletPlugin.start()                                         (DRA socket, then registration)
loop:   health.wait() -> changes -> healthy[gpu] -> publish again with generation + 1
stop:   KubeletPlugin.stop(); the slices stay (the pool is still there while the driver restarts)
forget: gpuslice leaves the node (its DaemonSet gone, ``k8s.uninstall``): the pool unpublished, the
        node's files taken back unless a claim is still prepared (``Preparer.forget``)
```
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from gpuslice.hardware.machine import Machine
from gpuslice.k8s.dra.identity import GpuIdentity, gpu_identities
from gpuslice.k8s.dra.kubelet_plugin import PLUGINS_DIR, REGISTRY_DIR, KubeletPlugin
from gpuslice.k8s.dra.prepare import ClaimSource, Preparer
from gpuslice.k8s.dra.slices import node_slices
from gpuslice.node.enforcement import SharingMode
from gpuslice.node.gpu_faults import HealthChange, HealthSource, NoHealthChecks

__all__ = ["DraDriver", "SlicePublisher"]

log = logging.getLogger(__name__)


class SlicePublisher(ClaimSource, Protocol):
    """The API side the driver needs (``DraApi`` in production)."""

    def next_generation(self, node_name: str) -> int: ...

    def publish(self, node_name: str, slices: Sequence[dict]) -> None: ...

    def unpublish(self, node_name: str) -> None: ...


class DraDriver:
    """The DRA driver of one node; ``start()``, then ``stop()``. ``generation`` is the pool's last
    published generation."""

    def __init__(
        self,
        machine: Machine,
        node_name: str,
        api: SlicePublisher,
        *,
        cdi_dir: Path,
        state_dir: Path,
        sharing: SharingMode | str = SharingMode.SOFT,
        plugins_dir: Path = PLUGINS_DIR,
        registry_dir: Path = REGISTRY_DIR,
        instance: str = "",
        health: HealthSource | None = None,
        identities: dict[int, GpuIdentity] | None = None,
        minors: Sequence[int] | None = None,
        health_poll_s: float = 1.0,
    ) -> None:
        self.machine = machine
        self.node_name = node_name
        self.api = api
        self.health = health if health is not None else NoHealthChecks()
        self.identities = identities if identities is not None else gpu_identities(machine)
        self.healthy = {g.index: True for g in machine.gpus}
        self.health_poll_s = health_poll_s
        self.generation = 0
        self.preparer = Preparer(
            machine,
            node_name,
            api,
            cdi_dir=cdi_dir,
            state_dir=state_dir,
            sharing=sharing,
            minors=minors,
            healthy=lambda gpu: self.healthy[gpu],
        )
        self.plugin = KubeletPlugin(
            self.preparer, plugins_dir=plugins_dir, registry_dir=registry_dir, instance=instance
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publish_lock = threading.Lock()

    def publish(self) -> None:
        """Publish the pool as it is now, one generation up."""
        with self._publish_lock:
            generation = max(self.generation, self.api.next_generation(self.node_name) - 1) + 1
            slices = node_slices(
                self.machine,
                self.node_name,
                generation=generation,
                identities=self.identities,
                healthy=self.healthy,
            )
            self.api.publish(self.node_name, slices)
            self.generation = generation

    def apply_health(self, changes: Sequence[HealthChange]) -> bool:
        """Record GPU health changes; True if any moved. A whole GPU goes out: its MIG placements are
        published as partitions of it, so one instance's fault is reported against the GPU by NVML."""
        by_uuid = {g.uuid: g.index for g in self.machine.gpus}
        moved = False
        for change in changes:
            gpu = by_uuid.get(change.uuid)
            if gpu is None:
                log.warning("health change for unknown device %s ignored", change.uuid)
                continue
            if self.healthy[gpu] != change.healthy:
                self.healthy[gpu] = change.healthy
                moved = True
                log.warning(
                    "GPU %d is now %s (%s)", gpu, "healthy" if change.healthy else "unhealthy", change.reason
                )
        return moved

    def _watch_health(self) -> None:
        while not self._stop.is_set():
            try:
                changes = self.health.wait(self.health_poll_s)
                if changes and self.apply_health(changes):
                    self.publish()
            except Exception:  # a broken health source or API outage must not stop prepare
                log.exception("health watch: could not apply or publish; retrying")
                self._stop.wait(self.health_poll_s)

    def start(self) -> None:
        if self.preparer.mig is not None:
            self.preparer.mig.destroy_idle()  # made for a claim, then a crash before it was recorded
        self.publish()
        self.plugin.start()
        self._thread = threading.Thread(target=self._watch_health, name="dra-health", daemon=True)
        self._thread.start()

    def forget(self) -> list[str]:
        """After ``stop``, when gpuslice is being removed: no new claim may land in a pool nobody serves,
        so the pool goes whatever happens to the files. What was kept, in words (for the log)."""
        self.api.unpublish(self.node_name)
        with contextlib.suppress(OSError):  # the folder made for the socket (gone at stop), if empty
            self.plugin.endpoint.parent.rmdir()
        return self.preparer.forget()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 + self.health_poll_s)
        self.plugin.stop()
        self.health.close()
