"""Plain data about demand: requests and target workloads."""

from gpuslice.workload.request import MILLI_PER_GPU, Request, RequestKind
from gpuslice.workload.target import TargetWorkload

__all__ = ["MILLI_PER_GPU", "Request", "RequestKind", "TargetWorkload"]
