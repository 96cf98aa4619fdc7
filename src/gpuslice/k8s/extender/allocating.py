"""Pods bound but not yet allocated by the device plugin, and which of them a new bind must wait for.

The device plugin API tells ``Allocate`` which devices, never which pod. The plugin matches the devices'
GPUs to the waiting pod whose decision names them; when two waiting pods on one node name the same
GPUs, it takes the older one, and the kubelet need not admit them in that order. Pods with the same
slice (namespace, memory, compute share) may be swapped without harm; pods with different slices may
not: one would run with the other's limits (the real kubelet showed it: a 30 % and a 70 % pod bound
together measured 70 % and 30 %). So a pod whose decision would be a second, different slice on GPUs
that another pod of the node is still waiting on is not bound yet: the bind answers an error and
kube-scheduler retries it, as HAMi's node lock makes pods on one node allocate one at a time.

A pod counts as waiting from its bind until its bind-phase annotation leaves ``allocating`` or it goes
away, and at most ``WAIT_S``: a pod the kubelet never admits must not hold its GPUs' other pods forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuslice.k8s.annotations import BIND_PHASE_ALLOCATING, Decision

__all__ = ["REASON_ALLOCATION_ORDER", "WAIT_S", "AllocatingPods"]

REASON_ALLOCATION_ORDER = "waiting for the device plugin to allocate the pod bound before it; retried"
WAIT_S = 60.0  # longer than a kubelet takes to admit a bound pod; then the order is no longer at stake


@dataclass(frozen=True, slots=True)
class _Waiting:
    node: str
    gpus: tuple[int, ...]
    slice: tuple[str, int, int]  # namespace, memory MiB, compute %
    name: str
    since: float


def _key(decision: Decision) -> tuple[int, ...]:
    return tuple(sorted(decision.gpu_indices))


class AllocatingPods:
    """Bound share pods waiting for Allocate, by pod uid (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}

    def observe(self, uid: str, namespace: str, name: str, decision: Decision | None) -> None:
        """A pod as the API shows it now: waiting while its decision is a share still allocating."""
        with self._lock:
            if decision is None or decision.mig is not None or decision.phase != BIND_PHASE_ALLOCATING:
                self._waiting.pop(uid, None)
            elif uid not in self._waiting:
                self._waiting[uid] = self._entry(namespace, name, decision)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._waiting.pop(uid, None)

    def claim(self, uid: str, namespace: str, name: str, decision: Decision) -> str:
        """Before binding ``decision``: '' and the pod counts as waiting, or the pod it must wait for."""
        if decision.mig is not None:  # an exact instance: Allocate cannot confuse it with another
            return ""
        entry = self._entry(namespace, name, decision)
        with self._lock:
            now = self._clock()
            for other_uid, other in list(self._waiting.items()):
                if now - other.since > WAIT_S:
                    del self._waiting[other_uid]
                elif (
                    other_uid != uid
                    and other.node == entry.node
                    and other.gpus == entry.gpus
                    and other.slice != entry.slice
                ):
                    return other.name
            self._waiting[uid] = entry
            return ""

    def _entry(self, namespace: str, name: str, decision: Decision) -> _Waiting:
        return _Waiting(
            decision.node,
            _key(decision),
            (namespace, decision.memory_mib, decision.cores_percent),
            f"{namespace}/{name}",
            self._clock(),
        )
