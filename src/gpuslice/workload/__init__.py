"""Plain data about demand: requests and target workloads."""

from gpuslice.workload.job import JobSpec, JobState, Priority, RestartPolicy, TopologyNeed
from gpuslice.workload.request import MILLI_PER_GPU, Request, RequestKind
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "MILLI_PER_GPU",
    "JobSpec",
    "JobState",
    "Priority",
    "Request",
    "RequestKind",
    "RestartPolicy",
    "TargetWorkload",
    "TopologyNeed",
]
