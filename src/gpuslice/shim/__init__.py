"""The native shim (``native/shim/``): a C library preloaded into a job's processes that holds every
CUDA process to the job's slice, memory and compute share, whatever framework it uses.

``library_path()`` is the library to put in LD_PRELOAD; ``environment()`` the variables that configure
it; ``region.read_region`` reads what the job's processes hold and how much GPU time they used. How it
works, and what it cannot stop: docs/shim.md.
"""

from __future__ import annotations

from pathlib import Path

from gpuslice.errors import Unavailable
from gpuslice.shim.region import DeviceUsage, JobRegion, read_region

__all__ = [
    "GPU_REGION",
    "SHIM_LIBRARY",
    "DeviceUsage",
    "JobRegion",
    "ShimUnavailable",
    "environment",
    "fake_driver_dir",
    "library_path",
    "read_region",
    "region_path",
]

_LIB_DIR = Path(__file__).resolve().parent / "lib"
SHIM_LIBRARY = "libgpuslice-shim.so"
GPU_REGION = "gpus.region"  # per node: when each priority last launched on each GPU


class ShimUnavailable(Unavailable):
    """The shim library was not built with this installation."""


def library_path() -> Path:
    """The shim shared library shipped in the package (built by ``pip install``)."""
    path = _LIB_DIR / SHIM_LIBRARY
    if not path.is_file():
        raise ShimUnavailable(
            f"the gpuslice shim is not built ({path} is missing): reinstall gpuslice with "
            "'pip install .' on a machine with a C compiler (gcc or cc)"
        )
    return path


def fake_driver_dir() -> Path:
    """The directory of the fake ``libcuda.so.1`` and ``libnvidia-ml.so.1`` (simulated machines only)."""
    path = _LIB_DIR / "fake"
    if not (path / "libcuda.so.1").is_file():
        raise ShimUnavailable(
            f"the fake CUDA driver is not built ({path}): reinstall gpuslice with 'pip install .'"
        )
    return path


def region_path(directory: Path, key: str) -> Path:
    """The job region of ``key`` (a job id, or a pod's container) in the shim directory."""
    return Path(directory) / f"{key}.region"


def environment(directory: Path, *, region: Path | None = None, simulated: bool = False) -> dict[str, str]:
    """The variables that load and place the shim (limits come from GPUSLICE_GPU_MEMORY_BYTES,
    GPUSLICE_COMPUTE_PERCENT and GPUSLICE_PRIORITY, which every job has).

    Without ``region`` the shim uses ``directory/<GPUSLICE_JOB_ID>.region`` (the launcher sets the id).
    ``simulated`` puts the fake driver first on LD_LIBRARY_PATH: a simulated machine has no libcuda."""
    env = {
        "LD_PRELOAD": str(library_path()),
        "GPUSLICE_SHIM_DIR": str(directory),
        "GPUSLICE_SHIM_GPU_REGION": str(Path(directory) / GPU_REGION),
    }
    if region is not None:
        env["GPUSLICE_SHIM_REGION"] = str(region)
    if simulated:
        env["LD_LIBRARY_PATH"] = str(fake_driver_dir())
    return env
