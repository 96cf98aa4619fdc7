"""What the pods on a node use of their GPUs, from its device plugin's Prometheus metrics.

```text
gpuslice_pod_memory_used_bytes{namespace,pod,container,claim,gpu}        gauge: memory the slice holds
gpuslice_pod_compute_busy_seconds_total{namespace,pod,container,claim,gpu} counter: its kernel time
```

(``observe.node_slices`` writes them, from each slice's shim region: a node without shim sharing has
none.) A pod where several containers ask has a series per container: they are summed per pod and GPU;
a DRA claim's series (no pod) are left out. Busy is a counter, so a percentage needs two reads:
``usage_between(first, second, seconds)`` gives the busy share of the time between them (100 % = one
GPU busy the whole time). A pod with only one read (it started in between) has its memory and no busy
figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "BUSY_SECONDS",
    "MEMORY_USED_BYTES",
    "GpuUsage",
    "PodGpuSample",
    "UsageKey",
    "parse_usage",
    "usage_between",
]

MEMORY_USED_BYTES = "gpuslice_pod_memory_used_bytes"
BUSY_SECONDS = "gpuslice_pod_compute_busy_seconds_total"  # the sample; its family is named without _total


@dataclass(frozen=True, slots=True, order=True)
class UsageKey:
    namespace: str
    pod: str
    gpu: int  # the GPU's index on its node


@dataclass(frozen=True, slots=True)
class PodGpuSample:
    """One read of one pod on one GPU."""

    memory_used_bytes: int | None = None
    busy_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """Memory used and compute busy (percent of one GPU) of a pod on a GPU, or summed over several."""

    memory_used_bytes: int | None
    busy_percent: float | None

    @classmethod
    def total(cls, parts: Iterable[GpuUsage | None]) -> GpuUsage | None:
        """The sum of ``parts``; None when one of them is unknown (a slice without usage series: a sum
        without it would read as the whole), and zero use for no parts at all."""
        parts = list(parts)
        if any(p is None for p in parts):
            return None
        known = [p for p in parts if p is not None]
        memory = [p.memory_used_bytes for p in known if p.memory_used_bytes is not None]
        busy = [p.busy_percent for p in known if p.busy_percent is not None]
        return cls(
            sum(memory) if len(memory) == len(known) else None, sum(busy) if len(busy) == len(known) else None
        )


def parse_usage(text: str) -> dict[UsageKey, PodGpuSample] | None:
    """The per-pod series of a metrics page, summed over a pod's containers; other series are skipped,
    and so is a sample whose labels are not a namespace, a pod (a claim's has none) and a GPU index, or
    whose value is not a finite non-negative number.
    None when the page declares neither series (a device plugin that does not export them: its pods'
    use is unknown, not zero). ValueError when the page is not Prometheus text at all."""
    memory: dict[UsageKey, int] = {}
    busy: dict[UsageKey, float] = {}
    declared = False
    for family in text_string_to_metric_families(text):
        # a counter's family is named without its _total
        declared |= family.name in (MEMORY_USED_BYTES, BUSY_SECONDS.removesuffix("_total"))
        for sample in family.samples:
            if sample.name not in (MEMORY_USED_BYTES, BUSY_SECONDS):
                continue
            labels = sample.labels
            gpu = labels.get("gpu", "")
            value = float(sample.value)
            if not (
                gpu.isdigit() and labels.get("namespace") and labels.get("pod")
            ) or not 0 <= value < float("inf"):
                continue
            key = UsageKey(labels["namespace"], labels["pod"], int(gpu))
            if sample.name == MEMORY_USED_BYTES:
                memory[key] = memory.get(key, 0) + int(value)  # one series per asking container
            else:
                busy[key] = busy.get(key, 0.0) + value
    if not declared:
        return None
    return {k: PodGpuSample(memory.get(k), busy.get(k)) for k in sorted({*memory, *busy})}


def usage_between(
    first: Mapping[UsageKey, PodGpuSample], second: Mapping[UsageKey, PodGpuSample], seconds: float
) -> dict[UsageKey, GpuUsage]:
    """Each pod's use at the ``second`` read: its memory then, and its busy seconds over the ``seconds``
    between the reads as a percent of one GPU (a counter that went down was reset: no figure)."""
    out = {}
    for key, now in second.items():
        before = first.get(key)
        busy = None
        if (
            before is not None
            and before.busy_seconds is not None
            and now.busy_seconds is not None
            and seconds > 0
        ):
            grown = now.busy_seconds - before.busy_seconds
            busy = 100 * grown / seconds if grown >= 0 else None
        out[key] = GpuUsage(now.memory_used_bytes, busy)
    return out
