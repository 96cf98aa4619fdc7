"""What a timed replay measured, and its figures: JCT and queueing delay per QoS class, allocation and
fragmentation over time, makespan, preemptions, pods that never started, and the trace's own waits.

Definitions (seconds; arrivals after load compression):

- JCT = end − arrival, queueing delay (wait) = time spent pending, summed over restarts after a
  preemption; both over the pods that finished and are not censored (``timed_trace``);
- recorded wait = production's ``scheduled_time − creation_time`` of the same pods: the reference;
- makespan = last end − first arrival; allocation % = allocated milli-GPU / cluster milli-GPU, its mean
  weighted by time over the makespan, and over the busy window (the first event to the time 99 % of the
  finished pods had ended: a few long pods can stretch the makespan to months at near-zero allocation);
  fragmentation = FGD's measure (``ledger.fragmentation``) against
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

from gpuslice.sim.cluster_ledger import capacity_pct
from gpuslice.sim.timed_trace import TimedJob

__all__ = ["CSV_COLUMNS", "PodArrays", "SampleLog", "TimedResult", "latency_stats", "write_timed_results"]

QUANTILES = (("p50", 50.0), ("p99", 99.0))
SAMPLES_KEPT = 4096  # at most this many (time, allocation, pending, running) samples are kept for plots


class PodArrays:
    """Per-pod results as flat numeric arrays (about 60 bytes a pod), filled as pods arrive and run;
    the QoS class is a one-byte code into ``qos_names``."""

    def __init__(self, n: int) -> None:
        self.arrival = np.full(n, np.nan)
        self.start = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.waited = np.zeros(n)
        self.duration = np.zeros(n)
        self.recorded_wait = np.zeros(n)
        self.preempted = np.zeros(n, dtype=np.int32)
        self.never_fits = np.zeros(n, dtype=bool)
        self.censored = np.zeros(n, dtype=bool)
        self.qos_code = np.zeros(n, dtype=np.uint8)
        self.mig = np.zeros(n, dtype=bool)  # asks for a MIG instance
        self.codes: dict[str, int] = {}

    def arrived(self, index: int, job: TimedJob, at: float) -> None:
        code = self.codes.setdefault(job.qos, len(self.codes))
        if code > 255:
            raise ValueError("more than 256 QoS classes in one trace")
        self.arrival[index], self.duration[index] = at, job.duration
        self.recorded_wait[index], self.censored[index] = job.recorded_wait, job.censored
        self.qos_code[index] = code
        self.mig[index] = bool(job.request.mig_profile)

    def fields(self) -> dict[str, object]:
        """The ``TimedResult`` fields these arrays make."""
        names = ("arrival", "start", "end", "waited", "duration", "recorded_wait", "censored", "never_fits")
        return {
            **{name: getattr(self, name) for name in names},
            "preempted": self.preempted,
            "qos_code": self.qos_code,
            "qos_names": tuple(self.codes),
            "mig": self.mig,
        }


class SampleLog:
    """The cluster's state after each event: the time-weighted mean allocation and the peak of pending
    pods exactly, and at most ``limit`` samples evenly spaced over the events for plots (each time the
    store fills, every other sample is dropped and only every other event is kept from then on)."""

    def __init__(self, limit: int = SAMPLES_KEPT) -> None:
        self.limit, self.stride, self.count = limit, 1, 0
        self.rows: list[tuple[float, int, int, int]] = []
        self.areas: list[float] = []  # per kept row: allocated milli-GPU × seconds up to its time
        self.last: tuple[float, int, int, int] | None = None
        self.first_time = 0.0
        self.area = 0.0  # allocated milli-GPU × seconds
        self.peak_pending = 0

    def add(self, now: float, allocated: int, pending: int, running: int) -> None:
        row = (now, allocated, pending, running)
        if self.last is None:
            self.first_time = now
        else:
            self.area += self.last[1] * (now - self.last[0])
        self.peak_pending = max(self.peak_pending, pending)
        if self.count % self.stride == 0:
            self.rows.append(row)
            self.areas.append(self.area)
            if len(self.rows) >= self.limit:
                del self.rows[1::2]
                del self.areas[1::2]
                self.stride *= 2
        self.count += 1
        self.last = row

    def fields(self) -> dict[str, object]:
        """The ``TimedResult`` fields of the samples (the last state always among them)."""
        tail = bool(self.rows) and self.rows[-1] is not self.last
        rows = [*self.rows, self.last] if tail else self.rows
        areas = [*self.areas, self.area] if tail else self.areas
        samples = np.array(rows, dtype=np.float64).reshape(-1, 4)
        span = self.last[0] - self.first_time if self.last is not None else 0.0
        if self.count < 2:
            mean = float(samples[-1, 1]) if self.count else 0.0
        else:
            mean = self.area / span if span > 0 else 0.0
        return {
            "sample_time": samples[:, 0],
            "allocated_gpu_milli": samples[:, 1],
            "pending": samples[:, 2],
            "running": samples[:, 3],
            "sample_area": np.array(areas, dtype=np.float64),
            "mean_allocated_gpu_milli": mean,
            "peak_pending": self.peak_pending,
        }


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
    """One (trace, placement, queue setup, load, seed) replay; per-pod arrays in trace arrival order.
    The samples are a bounded subset for plots (``SampleLog``); the mean allocation and the peak of
    pending pods are over every event."""

    trace: str
    placement: str
    queue: str
    load: float
    seed: int
    total_gpu_milli: int
    qos_code: np.ndarray  # index into qos_names
    qos_names: tuple[str, ...]
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
    mean_allocated_gpu_milli: float
    peak_pending: int
    sample_area: np.ndarray  # per sample: allocated milli-GPU × seconds from the first event to its time
    fallbacks: dict[str, int] = field(default_factory=dict)
    mig: np.ndarray | None = None  # per pod: asks for a MIG instance (None: no pod does)

    @property
    def qos(self) -> np.ndarray:
        """Each pod's QoS class name."""
        return np.array(self.qos_names, dtype=object)[self.qos_code]

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
        return self._pct(self.allocated_gpu_milli)

    @property
    def fragmentation_pct(self) -> np.ndarray:
        return self._pct(self.fragmented_gpu_milli)

    def mean_allocation_pct(self) -> float:
        """Allocation % averaged over time (each state holds until the next event)."""
        return float(self._pct(np.float64(self.mean_allocated_gpu_milli)))

    def busy_window(self) -> tuple[float, float]:
        """From the first event to the sample at which 99 % of the pods that finished had ended: the
        part of the run where pods ran, without the long tail a few pods make (one pod running alone
        for months would make a mean over the whole makespan read near 0)."""
        times = self.sample_time
        ended = self.end[self.finished]
        if not len(times) or not len(ended):
            return (float(times[0]) if len(times) else 0.0, float(times[-1]) if len(times) else 0.0)
        k = min(len(ended) - 1, int(np.ceil(0.99 * len(ended))) - 1)
        until = float(np.partition(ended, k)[k])  # the k-th smallest end, without sorting them all
        last = max(1, int(np.searchsorted(times, until, side="right")) - 1) if len(times) > 1 else 0
        return float(times[0]), float(times[last])

    def busy_allocation_pct(self, window: tuple[float, float] | None = None) -> float:
        """Allocation % averaged over time inside ``window`` (default: ``busy_window``), exact between
        kept samples."""
        start, end = self.busy_window() if window is None else window
        if end <= start:
            return self.mean_allocation_pct()
        i, j = (int(np.searchsorted(self.sample_time, t)) for t in (start, end))
        area = float(self.sample_area[j] - self.sample_area[i])
        return float(self._pct(np.float64(area / (end - start))))

    def _pct(self, milli: np.ndarray) -> np.ndarray:
        return capacity_pct(milli, self.total_gpu_milli)

    def by_qos(self, values: np.ndarray) -> dict[str, dict[str, float | int | None]]:
        """``latency_stats`` of ``values`` over the finished pods, overall ("all") and per QoS class."""
        done = self.finished
        out = {"all": latency_stats(values[done])}
        present = set(np.unique(self.qos_code).tolist())
        for qos, code in sorted((q, c) for c, q in enumerate(self.qos_names) if c in present):
            out[qos] = latency_stats(values[done & (self.qos_code == code)])
        return out

    def record(self) -> dict[str, object]:
        """The JSON record of this run (``results.json`` holds a list of these)."""
        busy = self.busy_window()
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
            # None on a cluster whose every GPU is in MIG mode (no GPU figures; see "mig")
            "mean_allocation_pct": round(self.mean_allocation_pct(), 3) if self.total_gpu_milli else None,
            # the same over the busy window (first event to 99 % of finished pods ended), and the window
            "busy_allocation_pct": round(self.busy_allocation_pct(busy), 3) if self.total_gpu_milli else None,
            "busy_window_s": [round(t, 1) for t in busy],
            "mean_fragmentation_pct": round(float(self.fragmentation_pct.mean()), 3)
            if len(self.fragmented_gpu_milli) and self.total_gpu_milli
            else None,
            "peak_pending": self.peak_pending,
            "jct_s": self.by_qos(self.jct),
            "wait_s": self.by_qos(self.waited),
            "recorded_wait_s": self.by_qos(self.recorded_wait),
            "wall_seconds": round(self.wall_seconds, 3),
            "policy_fallbacks": self.fallbacks,
        } | self._mig_record()

    def _mig_record(self) -> dict[str, object]:
        """With MIG pods: how many, how many started, their JCT and wait (the GPU figures above leave
        the MIG-mode GPUs out)."""
        if self.mig is None or not self.mig.any():
            return {}
        done = self.finished & self.mig
        return {
            "mig": {
                "pods": int(self.mig.sum()),
                "started": int((~np.isnan(self.start) & self.mig).sum()),
                "jct_s": latency_stats(self.jct[done]),
                "wait_s": latency_stats(self.waited[done]),
            }
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
    "busy_allocation_pct",
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
