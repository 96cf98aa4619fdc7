"""On a real NVIDIA GPU: the MPS pinned-memory limit and the soft PyTorch cap stop an allocation beyond
the slice, while the same allocation succeeds without them.

Skipped where there is no GPU (no libcuda, or cuInit/cuDeviceGetCount finds none). The MPS test also
skips when nvidia-cuda-mps-control is missing or will not start, the soft-cap test when torch is not
importable by this interpreter. Jobs go through the real launcher and ``job_env``, as serve runs them.
"""

from __future__ import annotations

import ctypes
import json
import sys
import textwrap

import pytest
from node_helpers import wait_for

from gpuslice.node import launcher
from gpuslice.node.discovery import NoGpuDriver, discover
from gpuslice.node.enforcement import MpsDaemon, MpsUnavailable, job_env
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec


def _gpu_count() -> int:
    """GPUs the CUDA driver sees (0 without a driver): a cheap check that starts no context."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU with its driver"),
]

SLICE = 2 * GiB
# Allocates FIRST bytes (inside the slice), then SECOND more (beyond it) with the CUDA driver API
# through ctypes, so no CUDA toolkit or framework is needed; prints the CUresult of each.
DRIVER_PROBE = textwrap.dedent("""
    import ctypes, json, sys
    first, second = int(sys.argv[1]), int(sys.argv[2])
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    created = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    results = {"context": created}
    if created == 0:
        a, b = ctypes.c_uint64(), ctypes.c_uint64()
        results["first"] = cuda.cuMemAlloc_v2(ctypes.byref(a), ctypes.c_size_t(first))
        results["second"] = cuda.cuMemAlloc_v2(ctypes.byref(b), ctypes.c_size_t(second))
    print(json.dumps(results), flush=True)
""")
TORCH_PROBE = textwrap.dedent("""
    import json, sys, torch
    first, second = int(sys.argv[1]), int(sys.argv[2])
    kept = torch.empty(first, dtype=torch.uint8, device="cuda")
    results = {"first": 0}
    try:
        more = torch.empty(second, dtype=torch.uint8, device="cuda")
        results["second"] = 0
    except torch.cuda.OutOfMemoryError:
        results["second"] = "oom"
    print(json.dumps(results), flush=True)
""")
CUDA_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture(scope="module")
def machine():
    try:
        return discover(None)
    except NoGpuDriver as e:
        pytest.skip(f"NVML not usable here: {e}")


def run_job(tmp_path, name: str, mode: str, probe: str, spec_fields: dict, machine) -> dict:
    spec = JobSpec(command=(sys.executable, "-c", probe, str(GiB), str(2 * GiB)), **spec_fields)
    env = job_env(mode, spec, (0,), machine, tmp_path)
    launcher.launch(name, spec, env, tmp_path)
    status = wait_for(lambda: launcher.poll(name, tmp_path), timeout=120, interval=0.2)
    out, err = launcher.log_paths(tmp_path, name)
    assert status.exit_code == 0, err.read_text()
    return json.loads(out.read_text().strip().splitlines()[-1])


def test_without_a_slice_the_same_allocations_succeed(tmp_path, machine):
    results = run_job(tmp_path, "whole", "soft", DRIVER_PROBE, {}, machine)
    assert results == {"context": 0, "first": 0, "second": 0}


def test_mps_pinned_memory_limit_stops_an_allocation_beyond_the_slice(tmp_path, machine):
    daemon = MpsDaemon(tmp_path)
    try:
        daemon.start()
    except MpsUnavailable as e:
        pytest.skip(str(e))
    try:
        fields = {"gpu_memory_bytes": SLICE, "compute_percent": 50}
        results = run_job(tmp_path, "mps", "mps", DRIVER_PROBE, fields, machine)
    finally:
        daemon.stop()
    assert results["context"] == 0 and results["first"] == 0  # 1 GiB of a 2 GiB slice
    assert results["second"] == CUDA_ERROR_OUT_OF_MEMORY  # 1 + 2 GiB > 2 GiB


def test_soft_cap_stops_a_pytorch_allocation_beyond_the_slice(tmp_path, machine):
    pytest.importorskip("torch")
    results = run_job(tmp_path, "soft", "soft", TORCH_PROBE, {"gpu_memory_bytes": SLICE}, machine)
    assert results == {"first": 0, "second": "oom"}
