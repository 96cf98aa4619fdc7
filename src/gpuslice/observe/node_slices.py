"""What each slice on a Kubernetes node really uses, read from the shim's regions at every scrape (as
HAMi's per-container ``hami_*`` metrics do), next to what the node gave it.

```text
scrape -> holders()   the slices this node gave that are still held, from the giver's own record (the
                      device plugin's allocation record, the DRA driver's checkpoint): who, which GPUs,
                      memory and compute given, where the region is (shim sharing only)
       -> read_region(holder.region, pids_visible=False), one per holder; a bad one is skipped and
          counted in gpuslice_node_region_errors_total{reason}
       -> per slice and GPU: usage from the region, limits from the record, the GPU from the record
       -> per GPU: sums over the record (slices, memory given) and over the good regions (memory the
          shim counts); NVML's used memory and what lies outside the shim's count (real GPUs only)
```

**Trust.** A region is written by the pod, which can put anything there (``shim.region`` says how it
is read). So nothing a region says reaches another series than its own slice's: the GPU of a slot is
the record's GPU at that position, never the region's ``host_gpu``; the limits shown are the ones
given (the shim enforces the region's copy: a pod that rewrote it shows used above limit); a region
whose device count or host GPUs are not the record's is refused (``mismatch``), and so are two slices
whose records name one region file. Only holders are read: a folder on disk that no live slice owns is
never looked at, and a slice that ended has no series at the next scrape.

**Series.** A slice is a pod's (``container`` empty), a container's when several containers of the pod
ask (each has its own slice and region; ``container`` names it), or a DRA claim's (``pod`` empty,
``claim`` names it; a claim may serve several pods). Prometheus drops empty labels, so each kind keeps
only the labels it fills. Per slice on k GPUs: 7k + 1 series under the shim (memory used and limit,
compute limit, busy and throttled seconds, launches, OOM refusals per GPU; priority once), 2k without
it (the two limits: the record's). Per GPU: 3 (slices, memory given, memory the shim counts), 5 on a
real GPU (NVML's memory used, and memory outside the shim's count). Per node: 1 + one per error reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuslice.hardware.machine import Machine
from gpuslice.observe.metrics import GPU_LABELS
from gpuslice.shim.region import REASONS, JobRegion, RegionError, read_region

__all__ = ["POD_LABELS", "REGION_ERROR_REASONS", "NodeSliceCollector", "SliceHolder"]

log = logging.getLogger(__name__)

POD_LABELS = ("namespace", "pod", "container", "claim", "gpu")
# Why a region was skipped: the reader's reasons, and "mismatch" (not the slice the record describes).
REGION_ERROR_REASONS = (*REASONS, "mismatch")

# (key, type, name, help). Per slice and GPU: the first two from the giver's record, the rest from the
# slice's shim region (shim sharing only).
_POD = (
    ("limit", "gauge", "gpuslice_pod_memory_limit_bytes", "GPU memory the slice was given on the GPU"),
    ("compute", "gauge", "gpuslice_pod_compute_limit_ratio", "compute share given, 0-1 (1: no cap)"),
    ("used", "gauge", "gpuslice_pod_memory_used_bytes", "GPU memory the slice holds through the shim"),
    ("busy", "counter", "gpuslice_pod_compute_busy_seconds", "kernel time the shim measured"),
    ("throttled", "counter", "gpuslice_pod_compute_throttled_seconds",
     "time launches waited for the slice's compute share or for a higher priority"),
    ("launches", "counter", "gpuslice_pod_kernel_launches", "kernel and graph launches the shim saw"),
    ("ooms", "counter", "gpuslice_pod_oom_refusals", "allocations the shim refused for the memory limit"),
)  # fmt: skip
_PRIORITY = ("gpuslice_pod_priority", "the slice's priority: 0 idle, 1 low, 2 normal, 3 high, 4 realtime")
# Per GPU: the first three always, the last two where NVML reads the GPU.
_GPU = (
    ("slices", "gpuslice_gpu_slices", "slices given on the GPU and still held"),
    ("given", "gpuslice_gpu_memory_allocated_bytes", "GPU memory given to running slices (a whole GPU: all)"),
    ("counted", "gpuslice_gpu_memory_shim_used_bytes", "GPU memory the shim counts for the GPU's slices"),
    ("used", "gpuslice_gpu_memory_used_bytes", "GPU memory in use by any process"),
    ("outside", "gpuslice_gpu_memory_outside_shim_bytes", "NVML's used memory less the shim's count, >= 0"),
)
_FAMILY = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
Regions = Sequence[JobRegion | None]


@dataclass(frozen=True, slots=True)
class SliceHolder:
    """One slice the node gave, as the giver recorded it (never as its region says)."""

    namespace: str
    gpus: tuple[int, ...]  # machine indices, in the order the slice's environment listed them
    memory_bytes: int  # per GPU: the slice's memory (a whole GPU's or a MIG instance's when not a share)
    compute_ratio: float  # 0-1 of each GPU's compute (1: no cap)
    region: Path | None  # the shim's job region for this slice; None without shim sharing
    pod: str = ""
    container: str = ""  # set when several containers of the pod ask
    claim: str = ""  # a DRA claim's name
    inside: bool = False  # an init container inside the pod's first slice: its use counts, not its grant

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.namespace, self.pod, self.container, self.claim)


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class NodeSliceCollector(Collector):
    """The collector; every argument is read at scrape time.

    ``holders()``: the slices held now; ``registered()``: whether the node component is registered with
    the kubelet and serves its socket; ``nvml_used()`` (real GPUs; None on a simulated node): NVML's
    used memory by GPU index, which may raise (the NVML series are then left out of that scrape)."""

    def __init__(
        self,
        machine: Machine,
        holders: Callable[[], Sequence[SliceHolder]],
        registered: Callable[[], bool],
        nvml_used: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        self.machine = machine
        self._holders = holders
        self._registered = registered
        self._nvml_used = nvml_used
        self._lock = threading.Lock()  # the HTTP server scrapes from several threads
        self._errors = dict.fromkeys(REGION_ERROR_REASONS, 0)
        # (slice, reason) pairs logged once while the slice lasts
        self._warned: set[tuple[tuple[str, str, str, str], str]] = set()

    def region_errors(self) -> dict[str, int]:
        with self._lock:
            return dict(self._errors)

    def _read(self, holder: SliceHolder, shared: set[Path]) -> JobRegion | None:
        """The holder's region if it is usable and is this slice's; None (counted, logged once) if not."""
        if holder.region is None:
            return None
        try:
            if holder.region in shared:
                raise RegionError(f"{holder.region} is named by more than one slice", "mismatch")
            region = read_region(holder.region, pids_visible=False)
            hosts = [d.host_gpu for d in region.devices]
            if len(hosts) != len(holder.gpus) or any(
                h not in (-1, g) for h, g in zip(hosts, holder.gpus, strict=True)
            ):
                raise RegionError(f"{holder.region} says GPUs {hosts}, the slice has {list(holder.gpus)}",
                                  "mismatch")  # fmt: skip
            return region
        except FileNotFoundError:
            return None  # no process of the slice has used CUDA yet
        except RegionError as err:
            self._count(holder, err.reason, str(err))
            return None

    def _count(self, holder: SliceHolder, reason: str, message: str) -> None:
        with self._lock:
            self._errors[reason] += 1
            first = (holder.key, reason) not in self._warned
            self._warned.add((holder.key, reason))
        if first:
            who = "/".join(x for x in holder.key if x)
            log.warning("slice %s: its shim region is skipped (%s): %s", who, reason, message)

    def collect(self) -> Iterator[Metric]:
        holders = list(self._holders())
        paths = [h.region for h in holders if h.region is not None]
        shared = {p for p in paths if paths.count(p) > 1} if len(set(paths)) != len(paths) else set()
        regions = [self._read(h, shared) for h in holders]
        with self._lock:  # a slice that ended is forgotten: the set stays as small as the node's slices
            live = {h.key for h in holders}
            self._warned = {w for w in self._warned if w[0] in live}
        yield from self._pod_families(holders, regions)
        yield from self._gpu_families(holders, regions)
        registered = _gauge("gpuslice_node_plugin_registered",
                            "1 if the node's device plugin (or DRA driver) is registered with the kubelet "
                            "and serves its socket, else 0", ())  # fmt: skip
        registered.add_metric([], 1.0 if self._registered() else 0.0)
        yield registered
        errors = CounterMetricFamily(
            "gpuslice_node_region_errors", "shim regions skipped at a scrape, by reason", labels=["reason"]
        )
        for reason, count in self.region_errors().items():
            errors.add_metric([reason], count)
        yield errors

    def _pod_families(self, holders: Sequence[SliceHolder], regions: Regions) -> Iterator[Metric]:
        families = {key: _FAMILY[kind](name, doc, labels=POD_LABELS) for key, kind, name, doc in _POD}
        priority = _gauge(*_PRIORITY, POD_LABELS[:-1])
        for holder, region in zip(holders, regions, strict=True):
            who = [holder.namespace, holder.pod, holder.container, holder.claim]
            for slot, gpu in enumerate(holder.gpus):
                labels = [*who, str(gpu)]
                families["limit"].add_metric(labels, holder.memory_bytes)
                families["compute"].add_metric(labels, holder.compute_ratio)
                if region is None:
                    continue
                device = region.devices[slot]
                families["used"].add_metric(labels, device.used_bytes)
                families["busy"].add_metric(labels, device.busy_ns / 1e9)
                families["throttled"].add_metric(labels, device.throttled_ns / 1e9)
                families["launches"].add_metric(labels, device.launches)
                families["ooms"].add_metric(labels, device.oom_refusals)
            if region is not None:
                priority.add_metric(who, region.priority)
        yield from (*families.values(), priority)

    def _gpu_families(self, holders: Sequence[SliceHolder], regions: Regions) -> Iterator[Metric]:
        summed = ("slices", "given", "counted")
        totals = {key: dict.fromkeys(range(self.machine.gpu_count), 0) for key in summed}
        for holder, region in zip(holders, regions, strict=True):
            for slot, gpu in enumerate(holder.gpus):
                if gpu not in totals["slices"]:
                    continue  # the record names a GPU this machine does not have: its own series only
                if not holder.inside:
                    totals["slices"][gpu] += 1
                    totals["given"][gpu] += holder.memory_bytes
                if region is not None:
                    totals["counted"][gpu] += region.devices[slot].used_bytes
        nvml = self._nvml()
        families = {key: _gauge(name, doc, GPU_LABELS) for key, name, doc in _GPU}
        for info in self.machine.gpus:
            labels = [str(info.index), info.uuid, info.model]
            for key in summed:
                families[key].add_metric(labels, totals[key][info.index])
            if nvml is not None and info.index in nvml:
                outside = max(0, nvml[info.index] - totals["counted"][info.index])
                families["used"].add_metric(labels, nvml[info.index])
                families["outside"].add_metric(labels, outside)
        yield from families.values()

    def _nvml(self) -> Mapping[int, int] | None:
        if self._nvml_used is None:
            return None
        try:
            return self._nvml_used()
        except Exception as err:  # NVML away for a moment: that scrape has no NVML series
            log.warning("NVML memory could not be read for the node metrics: %s", err)
            return None
