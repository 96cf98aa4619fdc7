"""The node's slice metrics (observe/node_slices.py): what each pod's shim region says, under the pod's
own series only, with the GPUs the node's record gives; hostile regions skipped and counted, never
followed, never blocking, never read past their size."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import gpuslice.shim.region as region_module
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.observe.node_slices import REGION_ERROR_REASONS, NodeSliceCollector, SliceHolder
from gpuslice.shim.region import MAX_BYTES, SIZE, DeviceUsage, pack_region
from gpuslice.units import GiB

MACHINE = Machine("node-a", tuple(GpuInfo(i, f"GPU-sim-n-{i}", "H100", 80 * GiB) for i in range(2)))
Samples = dict[tuple[str, frozenset], float]


def scrape(collector: NodeSliceCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def pod(namespace: str, name: str, gpu: int, **labels: str) -> frozenset:
    keys = {"namespace": namespace, "pod": name, "container": "", "claim": "", "gpu": str(gpu), **labels}
    return frozenset(keys.items())  # empty labels are in the text; Prometheus drops them on ingestion


def gpu(index: int) -> frozenset:
    return frozenset({("gpu", str(index)), ("uuid", f"GPU-sim-n-{index}"), ("model", "H100")})


def reason(name: str) -> tuple[str, frozenset]:
    return ("gpuslice_node_region_errors_total", frozenset({("reason", name)}))


class Node:
    """A node's state folder with pod regions, the record's holders, and the collector over them."""

    def __init__(self, root: Path, nvml: dict[int, int] | None = None) -> None:
        self.root = root
        self.holders: list[SliceHolder] = []
        self.registered = True
        self.nvml = nvml
        self.collector = NodeSliceCollector(
            MACHINE, lambda: list(self.holders), lambda: self.registered,
            nvml_used=None if nvml is None else (lambda: self.nvml),
        )  # fmt: skip

    def folder(self, namespace: str, name: str) -> Path:
        path = self.root / "shim" / "pods" / f"{namespace}.{name}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def give(self, namespace: str, name: str, gpus: tuple[int, ...], memory: int, compute: float) -> Path:
        region = self.folder(namespace, name) / "job.region"
        self.holders.append(SliceHolder(namespace, gpus, memory, compute, region, pod=name))
        return region

    def scrape(self) -> Samples:
        return scrape(self.collector)


def usage(gpu: int, used: int, **fields: int) -> DeviceUsage:
    defaults = {"limit_bytes": 10 * GiB, "busy_ns": 0, "launches": 0, "throttled_ns": 0, "oom_refusals": 0}
    return DeviceUsage(host_gpu=gpu, used_bytes=used, **{**defaults, **fields})


@pytest.fixture
def node(tmp_path: Path) -> Node:
    """Two pods: ml/train holds 3 GiB on GPU 0 with counters; ml/serve holds 1 and 2 GiB on GPUs 1, 0."""
    n = Node(tmp_path, nvml={0: 9 * GiB, 1: 1 * GiB})
    train = n.give("ml", "train", (0,), 10 * GiB, 0.3)
    train.write_bytes(pack_region([usage(0, 3 * GiB, busy_ns=2_500_000_000, launches=1000,
                                         throttled_ns=500_000_000, oom_refusals=4)], priority=3))  # fmt: skip
    serve = n.give("ml", "serve", (1, 0), 20 * GiB, 1.0)
    serve.write_bytes(pack_region([usage(1, 1 * GiB, limit_bytes=20 * GiB), usage(0, 2 * GiB, launches=7)]))
    return n


def test_two_pods_regions_give_their_exact_usage_and_the_record_gives_the_limits(node: Node):
    s = node.scrape()
    train, serve0, serve1 = pod("ml", "train", 0), pod("ml", "serve", 0), pod("ml", "serve", 1)
    assert s[("gpuslice_pod_memory_used_bytes", train)] == 3 * GiB
    assert s[("gpuslice_pod_memory_limit_bytes", train)] == 10 * GiB
    assert s[("gpuslice_pod_compute_limit_ratio", train)] == 0.3
    assert s[("gpuslice_pod_compute_busy_seconds_total", train)] == 2.5
    assert s[("gpuslice_pod_compute_throttled_seconds_total", train)] == 0.5
    assert s[("gpuslice_pod_kernel_launches_total", train)] == 1000
    assert s[("gpuslice_pod_oom_refusals_total", train)] == 4
    assert s[("gpuslice_pod_priority", pod("ml", "train", 0) - {("gpu", "0")})] == 3
    # the second pod's slots follow the record's GPU order (1, 0), not the index order
    assert s[("gpuslice_pod_memory_used_bytes", serve1)] == 1 * GiB
    assert s[("gpuslice_pod_memory_used_bytes", serve0)] == 2 * GiB
    assert s[("gpuslice_pod_kernel_launches_total", serve0)] == 7
    assert s[("gpuslice_pod_compute_limit_ratio", serve1)] == 1.0
    # per GPU: slices and memory from the record, the shim's count from the regions, NVML beside them
    assert s[("gpuslice_gpu_slices", gpu(0))] == 2 and s[("gpuslice_gpu_slices", gpu(1))] == 1
    assert s[("gpuslice_gpu_memory_allocated_bytes", gpu(0))] == 30 * GiB
    assert s[("gpuslice_gpu_memory_shim_used_bytes", gpu(0))] == 5 * GiB
    assert s[("gpuslice_gpu_memory_used_bytes", gpu(0))] == 9 * GiB
    assert s[("gpuslice_gpu_memory_outside_shim_bytes", gpu(0))] == 4 * GiB
    assert s[("gpuslice_gpu_memory_outside_shim_bytes", gpu(1))] == 0  # NVML may lag the shim: never < 0
    assert s[("gpuslice_node_plugin_registered", frozenset())] == 1
    assert {s[reason(r)] for r in REGION_ERROR_REASONS} == {0}  # every reason exists before its first error


def test_series_per_pod_and_gpu_are_as_documented(node: Node):
    s = node.scrape()
    per_pod = [k for k in s if ("pod", "train") in k[1]]
    assert len(per_pod) == 7 * 1 + 1  # 7 per GPU, priority once
    per_gpu = [k for k in s if k[1] == gpu(1)]
    assert len(per_gpu) == 5  # slices, allocated, shim-counted, and NVML's used and outside


def test_a_pod_that_ended_has_no_series_at_the_next_scrape(node: Node):
    node.scrape()
    node.holders = [h for h in node.holders if h.pod != "serve"]  # its region file is still on disk
    s = node.scrape()
    assert not [k for k in s if ("pod", "serve") in k[1]]
    assert s[("gpuslice_gpu_slices", gpu(1))] == 0
    assert s[("gpuslice_gpu_memory_shim_used_bytes", gpu(0))] == 3 * GiB


def test_a_pod_that_has_not_used_cuda_yet_shows_its_limits_and_no_error(node: Node):
    node.give("ml", "fresh", (1,), 5 * GiB, 0.5)
    s = node.scrape()
    assert s[("gpuslice_pod_memory_limit_bytes", pod("ml", "fresh", 1))] == 5 * GiB
    assert ("gpuslice_pod_memory_used_bytes", pod("ml", "fresh", 1)) not in s
    assert sum(s[reason(r)] for r in REGION_ERROR_REASONS) == 0


def test_a_slice_without_the_shim_counts_in_the_gpu_but_has_no_usage(node: Node):
    node.holders.append(SliceHolder("ml", (1,), 8 * GiB, 1.0, None, pod="soft"))
    s = node.scrape()
    assert s[("gpuslice_gpu_slices", gpu(1))] == 2
    assert s[("gpuslice_gpu_memory_allocated_bytes", gpu(1))] == 28 * GiB
    assert [k[0] for k in s if ("pod", "soft") in k[1]] == [
        "gpuslice_pod_memory_limit_bytes", "gpuslice_pod_compute_limit_ratio",
    ]  # fmt: skip


def test_registered_follows_the_plugin_and_nvml_failures_drop_only_nvml_series(node: Node):
    node.registered = False

    def broken() -> dict[int, int]:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    node.collector._nvml_used = broken
    s = node.scrape()
    assert s[("gpuslice_node_plugin_registered", frozenset())] == 0
    assert ("gpuslice_gpu_memory_used_bytes", gpu(0)) not in s
    assert s[("gpuslice_gpu_memory_shim_used_bytes", gpu(0))] == 5 * GiB


def test_a_simulated_node_reports_no_nvml_series(tmp_path: Path):
    n = Node(tmp_path, nvml=None)
    s = n.scrape()
    assert s[("gpuslice_gpu_slices", gpu(0))] == 0
    nvml_series = ("gpuslice_gpu_memory_used_bytes", "gpuslice_gpu_memory_outside_shim_bytes")
    assert not [k for k in s if k[0] in nvml_series]


# ---- hostile regions ----------------------------------------------------------------------------------

HOST_FILE = "host-secret.region"  # a valid region outside every pod's folder: following a link would read it


def _write(
    fields: dict[str, int] | None = None, header: dict[int, int] | None = None
) -> Callable[[Path], None]:
    """A region of the right size whose device 0 has ``fields`` and whose header words at byte offset k
    (32-bit) are ``header[k]``."""

    def write(path: Path) -> None:
        data = pack_region([usage(1, 1 * GiB, **(fields or {}))])
        for offset, value in (header or {}).items():
            data[offset : offset + 4] = value.to_bytes(4, "little", signed=value < 0)
        path.write_bytes(bytes(data))

    return write


def _symlink(path: Path) -> None:
    target = path.parents[3] / HOST_FILE
    target.write_bytes(pack_region([usage(1, 70 * GiB)]))
    path.symlink_to(target)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    with path.open("wb") as f:
        f.write(pack_region([usage(1, 1 * GiB)]))
        f.truncate(10 * GiB)  # sparse: 10 GB on paper, no disk


def _hard_link(path: Path) -> None:
    _write()(path)
    os.link(path, path.with_name("second-name"))


def _folder(path: Path) -> None:
    path.mkdir()


def _garbage(path: Path) -> None:
    path.write_bytes(b"\xff" * SIZE)


def _short(path: Path) -> None:
    path.write_bytes(bytes(pack_region([usage(1, 1 * GiB)]))[:-1])


def _too_many_processes(path: Path) -> None:
    data = pack_region([usage(1, 1 * GiB)])
    data[28:32] = (10_000).to_bytes(4, "little")  # proc_hwm
    path.write_bytes(bytes(data))


def _huge_used(path: Path) -> None:
    path.write_bytes(bytes(pack_region([usage(1, MAX_BYTES + 1)])))


def _other_gpu(path: Path) -> None:
    path.write_bytes(bytes(pack_region([usage(0, 70 * GiB)])))  # the pod holds GPU 1; GPU 0 is train's


def _two_devices(path: Path) -> None:
    path.write_bytes(bytes(pack_region([usage(1, 1 * GiB), usage(0, 70 * GiB)])))


HOSTILE = {
    "symlink to a host file": (_symlink, "symlink"),
    "fifo": (_fifo, "not_regular"),
    "folder": (_folder, "not_regular"),
    "hard link": (_hard_link, "not_regular"),
    "10 GB file": (_huge, "wrong_size"),
    "one byte short": (_short, "wrong_size"),
    "garbage of the right size": (_garbage, "not_a_region"),
    "17 devices": (_write(header={16: 17}), "out_of_range"),
    "compute 0 percent": (_write(header={20: 0}), "out_of_range"),
    "priority 99": (_write(header={24: 99}), "out_of_range"),
    "negative priority": (_write(header={24: -1}), "out_of_range"),
    "process high-water mark past the table": (_too_many_processes, "out_of_range"),
    "negative limit": (_write({"limit_bytes": 2**64 - 1}), "out_of_range"),
    "huge limit": (_write({"limit_bytes": MAX_BYTES + 1}), "out_of_range"),
    "huge memory used": (_huge_used, "out_of_range"),
    "huge busy time": (_write({"busy_ns": 2**63}), "out_of_range"),
    "huge launch count": (_write({"launches": 2**64 - 1}), "out_of_range"),
    "huge refusal count": (_write({"oom_refusals": 2**62}), "out_of_range"),
    "host_gpu of another pod's GPU": (_other_gpu, "mismatch"),
    "two GPUs where the record gives one": (_two_devices, "mismatch"),
}


@pytest.mark.parametrize(("make", "why"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_region_is_skipped_counted_and_changes_no_other_series(node: Node, make, why, monkeypatch):
    region = node.give("evil", "pod", (1,), 4 * GiB, 0.2)
    before = node.scrape()  # no region yet: the pod shows its limits only
    make(region)
    asked: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: asked.append(n) or real_pread(fd, n, at))

    done: list[Samples] = []
    worker = threading.Thread(target=lambda: done.append(node.scrape()), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert done, "the scrape blocked on the region"
    after = done[0]

    assert after[reason(why)] == before[reason(why)] + 1
    errors = [r for r in REGION_ERROR_REASONS if after[reason(r)] != before[reason(r)]]
    assert errors == [why]
    unchanged = {k: v for k, v in after.items() if k[0] != "gpuslice_node_region_errors_total"}
    assert unchanged == {k: v for k, v in before.items() if k[0] != "gpuslice_node_region_errors_total"}
    assert max(asked, default=0) <= SIZE  # no read asks for more than a region
    assert sum(asked) <= 3 * SIZE  # the two good regions, and at most one region's bytes of its own


def test_a_hostile_region_is_counted_at_every_scrape_and_logged_once(node: Node, caplog):
    region = node.give("evil", "pod", (1,), 4 * GiB, 0.2)
    _fifo(region)
    for _ in range(3):
        s = node.scrape()
    assert s[reason("not_regular")] == 3
    assert len([r for r in caplog.records if "evil/pod" in r.getMessage()]) == 1


def test_pids_in_a_pod_region_are_never_looked_up_on_the_host(node: Node, monkeypatch):
    """A pod's PIDs are in its own namespace; a region naming host PID 1 must not make the plugin read
    /proc/1 (the slot counts as the shim's own sum counts it, under the pod's series only)."""

    def no_lookup(pid: int) -> int | None:
        raise AssertionError(f"looked up PID {pid} on the host")

    monkeypatch.setattr(region_module, "_start_ticks", no_lookup)
    region = node.give("evil", "pod", (1,), 4 * GiB, 0.2)
    region.write_bytes(bytes(pack_region([usage(1, 2 * GiB)], pid=1, start_ticks=1)))
    s = node.scrape()
    assert s[("gpuslice_pod_memory_used_bytes", pod("evil", "pod", 1))] == 2 * GiB
    assert s[("gpuslice_pod_memory_used_bytes", pod("ml", "train", 0))] == 3 * GiB


def test_two_slices_whose_records_name_one_region_are_both_refused(node: Node):
    shared = node.holders[0].region
    node.holders.append(SliceHolder("ml", (0,), 1 * GiB, 1.0, shared, pod="train.x"))
    s = node.scrape()
    assert s[reason("mismatch")] == 2
    assert ("gpuslice_pod_memory_used_bytes", pod("ml", "train", 0)) not in s
