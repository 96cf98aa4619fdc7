"""What a timed replay measured, and its figures: JCT and queueing delay per QoS class, allocation and
fragmentation over time, makespan, preemptions, pods that never started, and the trace's own waits.

Definitions (seconds; arrivals after load compression):

- JCT = end − arrival, queueing delay (wait) = time spent pending, summed over restarts after a
  preemption; both over the pods that finished and are not censored (``timed_trace``);
- recorded wait = production's ``scheduled_time − creation_time`` of the same pods: the reference;
- makespan = last end − first arrival; allocation % = allocated milli-GPU / cluster milli-GPU, its mean
  weighted by time over the makespan; fragmentation = FGD's measure (``ledger.fragmentation``) against
  the trace's target workload, % of cluster GPU capacity;
- never started = pods that fit no node of the empty cluster, plus pods still pending when no event
  was left (a strict queue whose head can never start keeps everyone behind it).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["CSV_COLUMNS", "TimedResult", "latency_stats", "write_timed_results"]

QUANTILES = (("p50", 50.0), ("p99", 99.0))


def latency_stats(values: np.ndarray) -> dict[str, float | int | None]:
    """Count, mean, p50 and p99 of ``values`` (None for an empty set), rounded to 0.1 s."""
    if not len(values):
        return {"n": 0, "mean": None, "p50": None, "p99": None}
    stats: dict[str, float | int | None] = {"n": len(values), "mean": round(float(values.mean()), 1)}
    for name, q in QUANTILES:
        stats[name] = round(float(np.percentile(values, q)), 1)
    return stats


@dataclass
class TimedResult:
    """One (trace, placement, queue setup, load, seed) replay; per-pod arrays in trace arrival order."""

    trace: str
    placement: str
    queue: str
    load: float
    seed: int
    total_gpu_milli: int
    qos: np.ndarray
    arrival: np.ndarray
    start: np.ndarray  # first start; NaN: never started
    end: np.ndarray  # NaN: never finished
    waited: np.ndarray
    duration: np.ndarray
    recorded_wait: np.ndarray
    censored: np.ndarray
    never_fits: np.ndarray
    preempted: np.ndarray  # times each pod was preempted
    never_scheduled: int  # pods of the trace production never started (not replayed)
    sample_time: np.ndarray
    allocated_gpu_milli: np.ndarray
    pending: np.ndarray
    running: np.ndarray
    fragmentation_time: np.ndarray
    fragmented_gpu_milli: np.ndarray
    wall_seconds: float
    fallbacks: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> np.ndarray:
        """Pods that ran to their end and are not censored: the ones JCT and waits are measured on."""
        return ~np.isnan(self.end) & ~self.censored

    @property
    def jct(self) -> np.ndarray:
        return self.end - self.arrival

    @property
    def never_started(self) -> int:
        return int(np.isnan(self.start).sum())

    @property
    def makespan(self) -> float:
        ended = self.end[~np.isnan(self.end)]
        return float(ended.max() - self.arrival.min()) if len(ended) else 0.0

    @property
    def allocation_pct(self) -> np.ndarray:
        return 100.0 * self.allocated_gpu_milli / self.total_gpu_milli

    @property
    def fragmentation_pct(self) -> np.ndarray:
        return 100.0 * self.fragmented_gpu_milli / self.total_gpu_milli

    def mean_allocation_pct(self) -> float:
        """Allocation % averaged over time (each sample holds until the next)."""
        if len(self.sample_time) < 2:
            return float(self.allocation_pct[-1]) if len(self.sample_time) else 0.0
        spans = np.diff(self.sample_time)
        total = spans.sum()
        return float((self.allocation_pct[:-1] * spans).sum() / total) if total > 0 else 0.0

    def by_qos(self, values: np.ndarray) -> dict[str, dict[str, float | int | None]]:
        """``latency_stats`` of ``values`` over the finished pods, overall ("all") and per QoS class."""
        done = self.finished
        out = {"all": latency_stats(values[done])}
        for qos in sorted(set(self.qos.tolist())):
            out[qos] = latency_stats(values[done & (self.qos == qos)])
        return out

    def record(self) -> dict[str, object]:
        """The JSON record of this run (``results.json`` holds a list of these)."""
        return {
            "trace": self.trace,
            "placement": self.placement,
            "queue": self.queue,
            "load": self.load,
            "seed": self.seed,
            "pods": len(self.arrival),
            "finished": int(self.finished.sum()),
            "censored": int(self.censored.sum()),
            "never_started": self.never_started,
            "never_fits_empty_cluster": int(self.never_fits.sum()),
            "never_scheduled_in_trace": self.never_scheduled,
            "preemptions": int(self.preempted.sum()),
            "makespan_s": round(self.makespan, 1),
            "mean_allocation_pct": round(self.mean_allocation_pct(), 3),
            "mean_fragmentation_pct": round(float(self.fragmentation_pct.mean()), 3)
            if len(self.fragmented_gpu_milli)
            else None,
            "peak_pending": int(self.pending.max()) if len(self.pending) else 0,
            "jct_s": self.by_qos(self.jct),
            "wait_s": self.by_qos(self.waited),
            "recorded_wait_s": self.by_qos(self.recorded_wait),
            "wall_seconds": round(self.wall_seconds, 3),
            "policy_fallbacks": self.fallbacks,
        }


CSV_COLUMNS = (
    "trace",
    "placement",
    "queue",
    "load",
    "seed",
    "pods",
    "finished",
    "never_started",
    "preemptions",
    "makespan_s",
    "mean_allocation_pct",
    "mean_fragmentation_pct",
    "jct_mean_s",
    "jct_p50_s",
    "jct_p99_s",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p99_s",
    "recorded_wait_mean_s",
    "recorded_wait_p99_s",
    "wall_seconds",
)


def _csv_row(record: dict[str, object]) -> dict[str, object]:
    row = {k: record[k] for k in CSV_COLUMNS if k in record}
    for key, stats in (("jct", "jct_s"), ("wait", "wait_s"), ("recorded_wait", "recorded_wait_s")):
        overall = record[stats]["all"]  # type: ignore[index]
        for name in ("mean", "p50", "p99"):
            column = f"{key}_{name}_s"
            if column in CSV_COLUMNS:
                row[column] = overall[name]
    return row


def write_timed_results(results: Sequence[TimedResult], out_dir: Path) -> list[Path]:
    """``results.json`` (every record, per QoS class) and ``results.csv`` (one overall row per run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [r.record() for r in results]
    json_path, csv_path = out_dir / "results.json", out_dir / "results.csv"
    json_path.write_text(json.dumps(records, indent=1) + "\n")
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for record in records:
            writer.writerow(_csv_row(record))
    return [json_path, csv_path]
