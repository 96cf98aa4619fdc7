"""Results of a replay sweep, for people: mean ± sd over seeds per (trace, policy), and the files on disk.

``results.json`` is a list of ``ReplayResult.record()`` dicts, one per run; ``results.csv`` holds the same
rows with ``policy_fallbacks`` and ``failed_by_reason`` as JSON strings. The summary puts our
unallocated GPU % at 100 % arrival next to the FGD paper's published figure for the same trace and
policy.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuslice.sim.openb import ReplayResult
from gpuslice.sim.published import PublishedResult

__all__ = ["RESULTS_CSV", "RESULTS_JSON", "PolicySummary", "group_runs", "summarize", "write_results"]

RESULTS_CSV = "results.csv"
RESULTS_JSON = "results.json"


@dataclass(frozen=True)
class PolicySummary:
    """One (trace, policy) over its seeds. Percentages are of cluster GPU capacity; sd uses ddof=1."""

    trace: str
    policy: str
    runs: int
    unallocated_pct_mean: float  # at 100 % arrival
    unallocated_pct_sd: float
    failed_pods_mean: float
    wall_seconds_mean: float
    published: PublishedResult | None  # None where the paper has no figure (other policies or traces)
    pods: int = 0  # placement decisions over all runs
    fell_back_pods: int = 0  # of those, made in part or whole by the default policy (ReplayResult)

    @property
    def difference_pct(self) -> float | None:
        """Ours − published, in percentage points; None without a published figure."""
        return None if self.published is None else self.unallocated_pct_mean - self.published.mean


def group_runs(results: Sequence[ReplayResult]) -> dict[tuple[str, str], list[ReplayResult]]:
    """{(trace, policy): runs}, keys in the order they first appear."""
    groups: dict[tuple[str, str], list[ReplayResult]] = {}
    for result in results:
        groups.setdefault((result.trace, result.policy), []).append(result)
    return groups


def _sd(values: list[float]) -> float:
    # Sample sd, as PublishedResult.sd computes it, so the two columns compare like for like.
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def summarize(
    results: Sequence[ReplayResult], published: Mapping[tuple[str, str], PublishedResult]
) -> list[PolicySummary]:
    """One row per (trace, policy), in the order of ``results``."""
    rows = []
    for (trace, policy), runs in group_runs(results).items():
        unallocated = [r.unallocated_pct_at(100) for r in runs]
        rows.append(
            PolicySummary(
                trace=trace,
                policy=policy,
                runs=len(runs),
                unallocated_pct_mean=float(np.mean(unallocated)),
                unallocated_pct_sd=_sd(unallocated),
                failed_pods_mean=float(np.mean([r.failed_pods for r in runs])),
                wall_seconds_mean=float(np.mean([r.wall_seconds for r in runs])),
                published=published.get((trace, policy)),
                pods=sum(r.pods for r in runs),
                fell_back_pods=sum(r.fell_back_pods for r in runs),
            )
        )
    return rows


def write_results(results: Sequence[ReplayResult], out_dir: Path) -> list[Path]:
    """Write ``results.json`` and ``results.csv`` (one row per run) into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [r.record() for r in results]
    json_path = out_dir / RESULTS_JSON
    json_path.write_text(json.dumps(records, indent=2) + "\n")
    csv_path = out_dir / RESULTS_CSV
    fields = list(dict.fromkeys(key for record in records for key in record))  # "mig" only with MIG
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for record in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in record.items()})
    return [json_path, csv_path]
