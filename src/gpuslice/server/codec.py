"""JobSpec to and from plain JSON, the form it takes in the store and on the wire.

Enums travel as the words users type: priority "high", restart "on-failure", topology "nvlink".
"""

from __future__ import annotations

from typing import Any

from gpuslice.workload.job import JobSpec, Priority, RestartPolicy, TopologyNeed

__all__ = ["spec_from_json", "spec_to_json"]


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {
        "command": list(spec.command),
        "gpus": spec.gpus,
        "gpu_memory_bytes": spec.gpu_memory_bytes,
        "compute_percent": spec.compute_percent,
        "mig_profile": spec.mig_profile,
        "gpu_models": list(spec.gpu_models),
        "excluded_gpu_models": list(spec.excluded_gpu_models),
        "exclusive": spec.exclusive,
        "topology": spec.topology.value,
        "priority": spec.priority.name.lower(),
        "tenant": spec.tenant,
        "preemptible": spec.preemptible,
        "max_runtime_seconds": spec.max_runtime_seconds,
        "restart": spec.restart.value,
        "max_restarts": spec.max_restarts,
        "user": spec.user,
        "cwd": spec.cwd,
        "env": {k: v for k, v in spec.env},
        "host_memory_bytes": spec.host_memory_bytes,
        "cpus": spec.cpus,
    }


def spec_from_json(data: dict[str, Any]) -> JobSpec:
    """The JobSpec for a dict written by ``spec_to_json``; JobSpec's own checks run again."""
    return JobSpec(
        command=tuple(data["command"]),
        gpus=int(data["gpus"]),
        gpu_memory_bytes=int(data["gpu_memory_bytes"]),
        compute_percent=int(data["compute_percent"]),
        mig_profile=data["mig_profile"],
        gpu_models=tuple(data["gpu_models"]),
        excluded_gpu_models=tuple(data["excluded_gpu_models"]),
        exclusive=bool(data["exclusive"]),
        topology=TopologyNeed(data["topology"]),
        priority=Priority.parse(data["priority"]),
        tenant=data["tenant"],
        preemptible=bool(data["preemptible"]),
        max_runtime_seconds=data["max_runtime_seconds"],
        restart=RestartPolicy(data["restart"]),
        max_restarts=int(data["max_restarts"]),
        user=data["user"],
        cwd=data["cwd"],
        env=tuple(sorted(data["env"].items())),
        host_memory_bytes=int(data.get("host_memory_bytes", 0)),  # absent in records made before limits
        cpus=float(data.get("cpus", 0.0)),
    )
