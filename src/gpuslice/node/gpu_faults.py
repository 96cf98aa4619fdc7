"""GPU health for the device plugin: where "this GPU went bad" comes from.

```text
source = NvmlHealthSource(machine)      # NVML XID / ECC events (real nodes)
       | FakeHealthSource()             # tests and --simulate: changes are pushed by hand
       | NoHealthChecks()               # health checks switched off: everything stays Healthy
loop:  changes = source.wait(timeout_s) # blocks up to timeout_s; [] when nothing happened
       device plugin marks the devices of each changed UUID and resends its ListAndWatch list
end:   source.close()
```

A ``HealthChange`` names a GPU UUID (``GPU-…``: the GPU's shares and its MIG devices change with it) or a
MIG device UUID (``MIG-…``: only that device). The NVML source follows NVIDIA's device plugin
(``internal/rm/health.go``): it listens for critical XID events (and ECC events where supported),
ignores the XIDs that mean an application fault rather than a broken GPU, and when the event wait itself
fails it marks every GPU unhealthy. Like NVIDIA's plugin it never turns a GPU healthy again: an XID
that takes a GPU out needs a person (or a reset and a plugin restart) to bring it back.
"""

from __future__ import annotations

import importlib
import logging
import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.errors import UserError
from gpuslice.hardware.faults import FaultKind
from gpuslice.hardware.machine import Machine

__all__ = [
    "APPLICATION_XIDS",
    "FakeHealthSource",
    "HealthChange",
    "HealthSource",
    "NoHealthChecks",
    "NvmlHealthSource",
]

log = logging.getLogger(__name__)

# XIDs caused by the application, not the GPU: the GPU stays healthy (NVIDIA k8s-device-plugin
# internal/rm/health.go, citing docs.nvidia.com/deploy/xid-errors): 13 graphics engine exception,
# 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
# exception, 109 context switch timeout.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

_NO_INSTANCE = 0xFFFFFFFF  # NVML's gpuInstanceId / computeInstanceId for an event on a whole GPU
_NVML_ERROR_TIMEOUT = 10  # nvmlReturn_t NVML_ERROR_TIMEOUT: the wait ended with no event


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A GPU (``GPU-…``) or MIG device (``MIG-…``) became healthy or unhealthy, and why."""

    uuid: str
    healthy: bool
    reason: str = ""
    kind: FaultKind = FaultKind.NVML  # what an unhealthy change is; unused when healthy


class HealthSource(Protocol):
    """Where health changes come from. ``wait`` is called in a loop by one thread of the plugin."""

    def wait(self, timeout_s: float) -> list[HealthChange]:
        """Block up to ``timeout_s`` for changes; return them (oldest first), or [] on timeout."""
        ...

    def close(self) -> None:
        """Release what the source holds; ``wait`` is not called afterwards."""
        ...


class NoHealthChecks:
    """Health checks off: nothing ever changes, every device stays Healthy."""

    def wait(self, timeout_s: float) -> list[HealthChange]:
        time.sleep(timeout_s)
        return []

    def close(self) -> None:
        return None


class FakeHealthSource:
    """Changes pushed by hand (tests, ``--simulate``): ``set_health("GPU-…", False, "XID 79")``; an
    unhealthy change is an XID fault unless ``kind`` says otherwise."""

    def __init__(self) -> None:
        self._changes: queue.Queue[HealthChange] = queue.Queue()

    def set_health(self, uuid: str, healthy: bool, reason: str = "", kind: FaultKind = FaultKind.XID) -> None:
        change = HealthChange(uuid, healthy, reason) if healthy else HealthChange(uuid, False, reason, kind)
        self._changes.put(change)

    def wait(self, timeout_s: float) -> list[HealthChange]:
        try:
            first = self._changes.get(timeout=timeout_s)
        except queue.Empty:
            return []
        changes = [first]
        while True:
            try:
                changes.append(self._changes.get_nowait())
            except queue.Empty:
                return changes

    def close(self) -> None:
        return None


class NvmlHealthSource:
    """Critical XID (and ECC) events from NVML for every GPU of ``machine``.

    ``mig_devices`` maps (GPU UUID, GPU instance id, compute instance id) to a MIG device UUID, so an
    event inside one MIG instance marks only that device. ``nvml`` is a pynvml-like module (tests pass a
    fake); by default ``pynvml`` is imported and initialised here, and shut down by ``close``.
    """

    def __init__(
        self,
        machine: Machine,
        *,
        mig_devices: Mapping[tuple[str, int, int], str] | None = None,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
        nvml: Any | None = None,
    ) -> None:
        self.ignored_xids = ignored_xids
        self._mig_devices = dict(mig_devices or {})
        self._gpu_uuids = tuple(g.uuid for g in machine.gpus)
        self._pending: list[HealthChange] = []  # registration failures, reported by the first wait
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                raise UserError(
                    "GPU health checks need NVML: pip install 'gpuslice[nvml]', or turn them off"
                ) from None
        self._nvml = nvml
        nvml.nvmlInit()
        self._events = nvml.nvmlEventSetCreate()
        mask = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        for uuid in self._gpu_uuids:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                nvml.nvmlDeviceRegisterEvents(handle, mask & supported, self._events)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", -1):
                    log.warning("GPU %s cannot report health events (too old); assuming healthy", uuid)
                    continue
                self._pending.append(HealthChange(uuid, False, f"health events unavailable: {err}"))

    def wait(self, timeout_s: float) -> list[HealthChange]:
        if self._pending:
            pending, self._pending = self._pending, []
            return pending
        nvml = self._nvml
        try:
            event = nvml.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_TIMEOUT", _NVML_ERROR_TIMEOUT):
                return []
            # NVIDIA's plugin does the same: a wait that fails means no GPU can be trusted.
            log.error("NVML event wait failed (%s); marking every GPU unhealthy", err)
            time.sleep(timeout_s)  # do not spin on a broken event set
            return [HealthChange(u, False, f"NVML event wait failed: {err}") for u in self._gpu_uuids]
        if event.eventType != nvml.nvmlEventTypeXidCriticalError:
            # ECC events are counted by NVML; an uncorrectable one also raises XID 48/63/64 (critical).
            return []
        xid = int(event.eventData)
        if xid in self.ignored_xids:
            log.info("XID %d is an application error; GPU stays healthy", xid)
            return []
        try:
            gpu_uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
        except nvml.NVMLError as err:
            return [
                HealthChange(u, False, f"XID {xid} on an unknown GPU ({err})", FaultKind.XID)
                for u in self._gpu_uuids
            ]
        gi, ci = int(event.gpuInstanceId), int(event.computeInstanceId)
        uuid = gpu_uuid
        if gi != _NO_INSTANCE and ci != _NO_INSTANCE:
            uuid = self._mig_devices.get((gpu_uuid, gi, ci), gpu_uuid)
        log.warning("XID %d on %s: marking it unhealthy", xid, uuid)
        return [HealthChange(uuid, False, f"XID {xid}", FaultKind.XID)]

    def close(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlEventSetFree(self._events)
        finally:
            nvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
