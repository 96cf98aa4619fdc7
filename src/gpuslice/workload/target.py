"""The target workload M of FGD: the task shapes expected to arrive, with their popularity.

Built exactly as the FGD artifact builds its "typical pods" (Weng et al., USENIX ATC '23;
``GetTypicalPods`` in hkust-adsl/kubernetes-scheduler-simulator ``pkg/utils/frag.go``): group the trace's
tasks by (CPU, #GPU, milli-GPU, GPU models) — memory is not part of the shape — sort shapes by count,
keep the most popular until they cover at least 95 % of tasks (CPU-only shapes included), renormalise.
Equal counts are ordered by shape so the cut is deterministic (the artifact's order there is Go's
unstable sort over a map, i.e. arbitrary).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpuslice.workload.request import Request

__all__ = ["TargetWorkload"]

DEFAULT_COVERAGE = 0.95  # podPopularityThreshold = 95 in the artifact's experiment config


@dataclass(frozen=True)
class TargetWorkload:
    """Shapes (as requests with memory 0) and their probabilities, most popular first."""

    shapes: tuple[Request, ...]
    probability: np.ndarray  # float64, sums to 1

    @classmethod
    def from_requests(
        cls,
        requests: Iterable[Request],
        coverage: float = DEFAULT_COVERAGE,
        include_cpu_only: bool = True,
    ) -> TargetWorkload:
        counts: Counter[Request] = Counter()
        for r in requests:
            if r.num_gpu == 0 and not include_cpu_only:
                continue
            counts[Request(r.cpu_milli, 0, r.num_gpu, r.gpu_milli, r.gpu_models)] += 1
        if not counts:
            raise ValueError("a target workload needs at least one task")
        ranked = sorted(
            counts.items(),
            key=lambda kv: (-kv[1], kv[0].cpu_milli, kv[0].num_gpu, kv[0].gpu_milli, kv[0].gpu_models),
        )
        total = sum(counts.values())
        kept: list[tuple[Request, int]] = []
        covered = 0
        for shape, count in ranked:  # step 1: add shapes until the kept ones cover `coverage`
            if covered >= coverage * total:
                break
            kept.append((shape, count))
            covered += count
        prob = np.array([c for _, c in kept], dtype=np.float64) / covered
        return cls(shapes=tuple(s for s, _ in kept), probability=prob)

    @classmethod
    def gpu_part(cls, requests: Iterable[Request], coverage: float = DEFAULT_COVERAGE) -> TargetWorkload:
        """The target of the GPU tasks with CPU left out: for a scheduler that leaves CPU to another
        (the Kubernetes extender, whose ledger holds no CPU: kube-scheduler checks it)."""
        return cls.from_requests(
            (Request(0, 0, r.num_gpu, r.gpu_milli, r.gpu_models) for r in requests if r.num_gpu),
            coverage,
            include_cpu_only=False,
        )

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def cpu_only_share(self) -> float:
        """Probability mass of CPU-only shapes: the fragmentation of an empty cluster, as a fraction."""
        return float(sum(p for s, p in zip(self.shapes, self.probability, strict=True) if s.num_gpu == 0))
