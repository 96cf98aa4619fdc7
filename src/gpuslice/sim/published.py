"""The FGD paper's published results, per trace, policy and seed, for side-by-side comparison.

Source: ``analysis_allo_discrete.csv`` of the artifact (hkust-adsl/kubernetes-scheduler-simulator,
``experiments/analysis/expected_results/``), shipped inside the package byte for byte. Each row is one
run; column ``100`` is the GPU allocation % at 100 % arrival, so unallocated = 100 − that value.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuslice.sim.trace import bundled_dir

__all__ = ["FGD_PAPER_POLICIES", "PUBLISHED_FILE", "PublishedResult", "published_results"]

PUBLISHED_FILE = "analysis_allo_discrete.csv"

# The six policies of the FGD paper, in its order, with the artifact's directory names.
FGD_PAPER_POLICIES: dict[str, str] = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
_POLICY_BY_DIR = {directory: name for name, directory in FGD_PAPER_POLICIES.items()}


@dataclass(frozen=True)
class PublishedResult:
    """Unallocated GPU % at an arrival level over the published seeds of one (trace, policy)."""

    trace: str
    policy: str
    seeds: tuple[int, ...]
    unallocated_pct: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.unallocated_pct))

    @property
    def sd(self) -> float:
        return float(np.std(self.unallocated_pct, ddof=1)) if len(self.unallocated_pct) > 1 else 0.0


def published_results(
    path: Path | None = None, arrival_pct: int = 100
) -> dict[tuple[str, str], PublishedResult]:
    """{(trace, policy): PublishedResult}; trace is the short name ("default"), policy ours ("fgd")."""
    path = path if path is not None else bundled_dir() / PUBLISHED_FILE
    runs: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            policy = _POLICY_BY_DIR.get(row["sc_policy"])
            value = row.get(str(arrival_pct))
            if policy is None or not value:
                continue
            trace = row["workload"].removeprefix("openb_pod_list_")
            runs.setdefault((trace, policy), []).append((int(row["seed"]), 100.0 - float(value)))
    return {
        key: PublishedResult(
            trace=key[0],
            policy=key[1],
            seeds=tuple(s for s, _ in sorted(values)),
            unallocated_pct=tuple(v for _, v in sorted(values)),
        )
        for key, values in runs.items()
    }
