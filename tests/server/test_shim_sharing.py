"""``gpuslice serve --simulate dgx-h100 --sharing shim``: jobs run under the native shim against the
fake driver shipped in the package; the server reads their memory from the shim's regions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuslice.node.enforcement import shim_dir
from gpuslice.shim import read_region, region_path
from gpuslice.units import GiB

pytestmark = pytest.mark.slow
FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")


def job_usage(server, job_id: str) -> int | None:
    for gpu in server.http.get("/v1/gpus").json():
        for job in gpu["jobs"]:
            if job["id"] == job_id:
                return job["used_memory_bytes"]
    return None


def test_a_fake_load_under_the_shim_is_fenced_throttled_and_reported(serve):
    server = serve("--sharing", "shim", "--grace", "2s")
    load = [FAKE_LOAD, "--mem", "2GiB", "--seconds", "60"]
    steady = server.submit(load, memory="4GiB", compute_percent=30)
    server.wait(lambda: job_usage(server, steady["id"]) == 2 * GiB, 30, "the shim region to show 2 GiB")
    path = region_path(shim_dir(server.state_dir), steady["id"])
    region = read_region(path)
    assert region.devices[0].limit_bytes == 4 * GiB and region.compute_percent == 30
    assert region.devices[0].host_gpu == server.jobs()[steady["id"]]["gpus"][0]
    waited = lambda: read_region(path).devices[0].throttled_ns > 0  # noqa: E731
    server.wait(waited, 30, "the load's kernels to wait for compute tokens")
    metrics = server.http.get("/metrics").text
    used = [line for line in metrics.splitlines() if line.startswith("gpuslice_slice_memory_used_bytes{")]
    mine = [float(line.rsplit(" ", 1)[1]) for line in used if f'job_id="{steady["id"]}"' in line]
    assert mine == [2 * GiB], used

    greedy = server.submit(
        [FAKE_LOAD, "--mem", "1GiB", "--grow-to", "16GiB", "--grow-seconds", "1", "--seconds", "30"],
        memory="4GiB",
        compute_percent=20,
    )
    failed = lambda: server.jobs()[greedy["id"]]["state"] == "FAILED"  # noqa: E731
    server.wait(failed, 30, "the greedy load to hit its OOM")
    log = (server.state_dir / "jobs" / greedy["id"] / "stderr.log").read_text()
    assert "CUDA_ERROR_OUT_OF_MEMORY" in log
    assert server.jobs()[steady["id"]]["state"] == "RUNNING"  # its neighbour is untouched
