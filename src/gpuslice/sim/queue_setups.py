"""The queue setups the timed replay compares: a queue policy of serve's family, backfill on or off, and
where each pod's declared run time comes from.

| setup | queue policy | EASY backfill | declared run time |
|---|---|---|---|
| fifo | fifo | off (a strict queue) | recorded |
| fair-share | priority-fair (serve's default) | on (serve's default) | recorded |
| sjf-oracle | sjf | off | recorded duration (the oracle) |
| sjf-predicted | sjf | off | predicted (``duration_model.cross_fitted``) |
| easy-backfill | fifo | on | recorded |

Any other name is a queue policy of the family (or a queue policy file) run as serve runs it: backfill
on, recorded run times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuslice.errors import UnknownPolicy
from gpuslice.policies.queue import QUEUE, queue_policy
from gpuslice.programs.loader import is_policy_path
from gpuslice.sim.timed_trace import TimedJob

__all__ = ["SETUPS", "QueueSetup", "estimates_for", "queue_setup"]


@dataclass(frozen=True)
class QueueSetup:
    name: str
    queue: str
    backfill: bool
    estimate: str  # "recorded" or "predicted"


SETUPS: dict[str, QueueSetup] = {
    s.name: s
    for s in (
        QueueSetup("fifo", "fifo", False, "recorded"),
        QueueSetup("fair-share", "priority-fair", True, "recorded"),
        QueueSetup("sjf-oracle", "sjf", False, "recorded"),
        QueueSetup("sjf-predicted", "sjf", False, "predicted"),
        QueueSetup("easy-backfill", "fifo", True, "recorded"),
    )
}


def queue_setup(name: str) -> QueueSetup:
    """A preset, or a queue policy name / file as serve runs it; UnknownPolicy lists the names."""
    if name in SETUPS:
        return SETUPS[name]
    if not is_policy_path(name):
        try:
            queue_policy(name)
        except UnknownPolicy:
            known = ", ".join([*SETUPS, *QUEUE])
            raise UnknownPolicy(f"{name!r} is not a queue setup or queue policy; known: {known}") from None
    return QueueSetup(name, name, True, "recorded")


def estimates_for(jobs: Sequence[TimedJob], setup: QueueSetup, seed: int = 0) -> np.ndarray:
    """Each pod's declared run time under ``setup``: its recorded duration, or a prediction."""
    if setup.estimate == "predicted":
        from gpuslice.sim.duration_model import cross_fitted  # scikit-learn: only when asked for

        return cross_fitted(jobs, seed)
    return np.fromiter((j.duration for j in jobs), dtype=np.float64, count=len(jobs))
