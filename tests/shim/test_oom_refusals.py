"""The shim counts the allocations it refuses for the memory limit in the region (``oom_refusals``, the
device slot's word that was reserved), and the node's metrics show them under the pod's series."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from shim_helpers import CHUNK, LIMIT, parse

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.observe.node_slices import NodeSliceCollector, SliceHolder
from gpuslice.shim import read_region, region_path
from gpuslice.units import GiB


def test_each_allocation_refused_for_the_limit_is_counted_once(native, job):
    out, _ = native.run(["fill", str(CHUNK)], native.env(job))
    assert out["refused_with"] == 2  # CUDA_ERROR_OUT_OF_MEMORY, once per fill: the program fills twice
    assert read_region(region_path(native.work, job)).devices[0].oom_refusals == 2
    native.run(["fill", str(CHUNK)], native.env(job))
    assert read_region(region_path(native.work, job)).devices[0].oom_refusals == 4


def test_an_allocation_the_driver_refuses_is_not_the_shims_refusal(native, job):
    """No limit (0) on a 64 MiB fake GPU: the driver runs out, the shim refused nothing."""
    env = native.env(job, GPUSLICE_GPU_MEMORY_BYTES="0", FAKE_CUDA_MEMORY_BYTES=str(64 << 20))
    out, _ = native.run(["fill", str(CHUNK)], env)
    assert out["refused_with"] == 2 and out["held"] == 64 << 20
    assert read_region(region_path(native.work, job)).devices[0].oom_refusals == 0


def test_allocations_within_the_limit_count_no_refusal(native, job):
    holder = native.start(["hold", str(LIMIT // 2)], native.env(job))
    try:
        assert holder.stdout.readline().strip() == "held"
        assert read_region(region_path(native.work, job)).devices[0].oom_refusals == 0
    finally:
        holder.communicate("")


def test_a_pods_refusals_and_memory_reach_its_series_through_the_node_metrics(native, tmp_path: Path):
    """A pod's region as the device plugin lays it out (one folder per pod, GPUSLICE_SHIM_REGION), written
    by the real shim on the fake driver, scraped as the node plugin scrapes it."""
    folder = tmp_path / "shim" / "pods" / "ml.train"
    folder.mkdir(parents=True)
    env = native.env("unused", GPUSLICE_SHIM_REGION=str(folder / "job.region"), GPUSLICE_GPUS="1")
    del env["GPUSLICE_JOB_ID"]  # a pod has none: the region is named outright
    machine = Machine("n", tuple(GpuInfo(i, f"GPU-sim-{i}", "H100", 80 * GiB) for i in range(2)))
    holder = SliceHolder("ml", (1,), LIMIT, 1.0, folder / "job.region", pod="train")
    collector = NodeSliceCollector(machine, lambda: [holder], lambda: True)
    registry = CollectorRegistry()
    registry.register(collector)

    def series(name: str) -> float:
        text = generate_latest(registry).decode()
        labels = {"namespace": "ml", "pod": "train", "container": "", "claim": "", "gpu": "1"}
        found = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == name and s.labels == labels]  # fmt: skip
        assert len(found) == 1, name
        return found[0]

    grabber = native.start(["grab", str(CHUNK)], env)
    try:
        held = parse(grabber.stdout.readline() + grabber.stdout.readline())["held"]
        assert series("gpuslice_pod_oom_refusals_total") == 1
        assert series("gpuslice_pod_memory_used_bytes") == held > LIMIT - CHUNK
    finally:
        grabber.communicate("")  # frees everything, then exits
    assert series("gpuslice_pod_memory_used_bytes") == 0
    assert series("gpuslice_pod_oom_refusals_total") == 1  # a counter: it stays
    assert collector.region_errors() == dict.fromkeys(collector.region_errors(), 0)
