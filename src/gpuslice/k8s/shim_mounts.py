"""What a container needs to run under the native shim on a Kubernetes node (``--sharing shim``).

``node.enforcement.job_env`` already gives a share the shim's variables, with paths that are right for
``gpuslice serve`` on the host. In a pod those paths must be host paths the kubelet can mount, so the
device plugin calls ``container_setup`` in Allocate, which rewrites them and returns the mounts:

```text
<state_dir>/shim/lib/                   read-only   the shim (and, on simulated nodes, the fake driver),
                                                    copied out of the plugin's package when it changed
<state_dir>/shim/pods/<ns>.<holder>/    read-write  the slice's job region: one budget for all its processes
<state_dir>/shim/gpus.region            read-write  the node's GPU region, where priorities meet
```

``<holder>`` is ``slice_folder``'s name for the slice: the pod's name, ``<pod>_<container>`` where several
containers of the pod ask, or ``_claim_<name>`` for a DRA claim. Kubernetes names never hold ``_`` and
never start with it, so no two slices of a namespace share a folder (with '.' as the container's
separator, pod ``x``'s container ``y`` and a pod named ``x.y`` did).

LD_PRELOAD points at the library copy, GPUSLICE_SHIM_REGION at the pod's region (a pod has no
GPUSLICE_JOB_ID), and LD_LIBRARY_PATH, when set, at the fake driver copy. The state dir is a hostPath
mounted into the plugin's pod at the same path, as for the MPS pipes and the soft-cap file.

A new slice starts from a new region: a region left in the folder (a pod of the same name that ended,
as a StatefulSet's pods come back) is removed, or the new pod would inherit its limits and counters (the
shim initialises a region only when it makes it). The node's metrics (``observe.node_slices``) read the
region, never trusting it: the pod can write anything there.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpuslice import shim

__all__ = ["REGION_NAME", "HostMount", "container_setup", "slice_folder"]

REGION_NAME = "job.region"  # in the pod's folder


@dataclass(frozen=True, slots=True)
class HostMount:
    """A host path bind-mounted into the container at ``container_path``."""

    container_path: str
    host_path: str
    read_only: bool


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _copy_if_changed(source: Path, target: Path) -> None:
    """Replace ``target`` atomically when its bytes differ: a running pod keeps the file it mapped."""
    if target.exists() and target.read_bytes() == source.read_bytes():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)


def slice_folder(pod: str = "", container: str = "", claim: str = "") -> str:
    """The name of one slice's shim folder in its namespace (module docstring): ``claim`` for a DRA
    claim's slice, else ``pod`` with its ``container`` where the pod's containers have one each."""
    if claim:
        return f"_claim_{claim}"
    return f"{pod}_{container}" if container else pod


def container_setup(state_dir: Path, namespace: str, holder: str, env: dict[str, str]) -> list[HostMount]:
    """Rewrite the shim variables in ``env`` (in place) for a container of the slice ``holder``
    (``slice_folder``) in ``namespace``; the mounts it needs. ``env`` without GPUSLICE_SHIM_DIR (not a
    shim share) is left alone: no mounts."""
    if "GPUSLICE_SHIM_DIR" not in env:
        return []
    base = Path(state_dir) / "shim"
    lib = base / "lib"
    _copy_if_changed(shim.library_path(), lib / shim.library_path().name)
    env["LD_PRELOAD"] = str(lib / shim.library_path().name)
    if "LD_LIBRARY_PATH" in env:  # a simulated node: the fake driver, copied beside the shim
        for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
            _copy_if_changed(shim.fake_driver_dir() / name, lib / "fake" / name)
        env["LD_LIBRARY_PATH"] = str(lib / "fake")
    pod_dir = base / "pods" / _UNSAFE.sub("_", f"{namespace}.{holder}")
    pod_dir.mkdir(parents=True, exist_ok=True)
    stale = pod_dir / REGION_NAME  # removed by name: a link left there is not followed
    if stale.is_dir() and not stale.is_symlink():
        shutil.rmtree(stale)
    else:
        stale.unlink(missing_ok=True)
    gpu_region = base / shim.GPU_REGION
    gpu_region.touch(exist_ok=True)  # a file bind mount needs the file; the shim initialises it
    env["GPUSLICE_SHIM_DIR"] = str(pod_dir)
    env["GPUSLICE_SHIM_REGION"] = str(pod_dir / REGION_NAME)
    env["GPUSLICE_SHIM_GPU_REGION"] = str(gpu_region)
    return [
        HostMount(str(lib), str(lib), read_only=True),
        HostMount(str(pod_dir), str(pod_dir), read_only=False),
        HostMount(str(gpu_region), str(gpu_region), read_only=False),
    ]
