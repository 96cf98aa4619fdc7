"""The node's slice metrics, measured: one node with ``--pods`` pods holding shim slices, scraped.

Setup, in one process: a ``DevicePlugin`` for a simulated ``--machine`` (not started: no kubelet is
needed to be scraped) whose allocation record holds ``--pods`` slices, each the environment Allocate
gives (``container_slice`` under ``--sharing shim``): 80 % one-GPU shares, 20 % two-GPU shares, spread
round-robin over the GPUs. Each slice's region file is written at the path its environment names, in
the shim's layout (``shim.region.pack_region``), with 1 to 8 process slots in use. ``--hostile`` of the
regions are then replaced by what a hostile pod leaves (a FIFO, a symlink to a host file, a 10 GB
sparse file, absurd fields), in turn. The pods are listed live by a fake API (at most once per 5 s, as
in production). The registry is the one the device plugin serves (``DevicePluginMetrics`` plus
``device_plugin_collector``), served by prometheus_client's HTTP server on a free port.

Measured: ``--scrapes`` sequential ``GET /metrics`` over HTTP (wall time per scrape, median / p99 /
max), ``generate_latest`` of the registry alone (same statistics), the exposition's size and its
series (samples) by kind.

Usage: ``.venv/bin/python benchmarks/node_metrics.py [--pods 100] [--scrapes 500] [--hostile 0]
[--markdown FILE]`` (FILE defaults to benchmarks/out/node_metrics.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.k8s.container_slice import container_slice, slice_holder
from gpuslice.k8s.device_plugin import DevicePlugin
from gpuslice.k8s.node_metrics import device_plugin_collector, start_metrics
from gpuslice.node.discovery import discover
from gpuslice.observe.k8s_metrics import DevicePluginMetrics
from gpuslice.shim.region import DeviceUsage, pack_region
from gpuslice.units import GiB, MiB


class Pods:
    """The API server's pod list, as the plugin's ``live_pod_uids`` reads it."""

    def __init__(self, uids: set[str]) -> None:
        self.uids = uids

    def live_pod_uids(self, node_name: str) -> set[str]:
        return set(self.uids)

    def allocating_pods(self, node_name: str) -> list:
        return []


def hostile(path: Path, kind: int) -> None:
    """Replace the region at ``path`` by one of four things a hostile pod leaves there."""
    path.unlink()
    if kind == 0:
        os.mkfifo(path)
    elif kind == 1:
        path.symlink_to("/etc/passwd")
    elif kind == 2:
        with path.open("wb") as f:
            f.truncate(10 * GiB)
    else:
        path.write_bytes(bytes(pack_region([DeviceUsage(0, 2**64 - 1, 0, 0, 0, 0, 0)])))


def build(root: Path, machine_name: str, pods: int, hostile_count: int) -> tuple[DevicePlugin, Pods]:
    machine = discover(machine_name)
    plugin = DevicePlugin(machine, "node-bench", pods=Pods(set()), state_dir=root, sharing="shim",
                          socket_dir=root / "dp")  # fmt: skip
    uids = set()
    for i in range(pods):
        width = 2 if i % 5 == 4 else 1
        gpus = [(i + k) % machine.gpu_count for k in range(width)]
        setup = container_slice(
            machine, sharing="shim", state_dir=root, minors=range(machine.gpu_count),
            namespace=f"team-{i % 7}", pod=f"pod-{i:03d}", gpus=gpus, memory_bytes=(1 + i % 8) * GiB,
            compute_percent=10 + i % 60,
        )  # fmt: skip
        uid = f"uid-{i}"
        uids.add(uid)
        plugin.record.add(uid, slice_holder(setup.env, f"team-{i % 7}", pod=f"pod-{i:03d}"))
        devices = [
            DeviceUsage(g, (1 + i % 8) * GiB, (i % 8) * 100 * MiB, i * 10**9, i * 1000, i * 10**8, i % 3)
            for g in gpus
        ]
        data = pack_region(devices, compute_percent=10 + i % 60, priority=i % 5)
        data[28:32] = (1 + i % 8).to_bytes(4, "little")  # 1..8 process slots to walk
        Path(setup.env["GPUSLICE_SHIM_REGION"]).write_bytes(bytes(data))
    for i in range(hostile_count):
        hostile(Path(plugin.record.held(None)[i * pods // max(1, hostile_count)].region), i % 4)
    return plugin, Pods(uids)


def timed(call, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return times


def stats(ms: list[float]) -> str:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ms):.2f} / {p99:.2f} / {max(ms):.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--machine", default="dgx-h100")
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--hostile", type=int, default=0, help="regions replaced by a hostile pod's file")
    parser.add_argument("--markdown", type=Path, default=Path(__file__).parent / "out" / "node_metrics.md")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="node-metrics-") as folder:
        plugin, pods = build(Path(folder), args.machine, args.pods, args.hostile)
        registry = DevicePluginMetrics(plugin.device_health, plugin.gpu_health).registry
        collector = device_plugin_collector(plugin, pods, simulated=True)
        registry.register(collector)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        stop = start_metrics(collector, port, "127.0.0.1")  # the node series alone, over HTTP
        try:
            url = f"http://127.0.0.1:{port}/metrics"

            def scrape() -> bytes:
                with urllib.request.urlopen(url, timeout=10) as reply:
                    return reply.read()

            scrape()  # warm
            http_ms = timed(scrape, args.scrapes)
            text = scrape().decode()
        finally:
            stop()
        local_ms = timed(lambda: generate_latest(registry), args.scrapes)
        full = generate_latest(registry).decode()
        errors = collector.region_errors()

    kinds = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kinds["pod" if "pod" in sample.labels else "gpu" if "gpu" in sample.labels else "node"] += 1
    series = sum(kinds.values())
    full_series = sum(len(f.samples) for f in text_string_to_metric_families(full))
    rows = [
        ("pods holding slices (shim), GPUs", f"{args.pods} ({args.pods - args.pods // 5} x 1 GPU, "
         f"{args.pods // 5} x 2 GPUs), {plugin.machine.gpu_count} simulated GPUs ({args.machine})"),
        ("hostile regions", f"{args.hostile}; skipped: {sum(errors.values())} "
         f"({', '.join(f'{k} {v}' for k, v in errors.items() if v) or 'none'}) over all scrapes"),
        ("node series (GET /metrics of the collector)", f"{series}: {kinds['pod']} per-slice, {kinds['gpu']} "
         f"per-GPU, {kinds['node']} node"),
        ("exposition size", f"{len(text):,} bytes"),
        ("GET /metrics over HTTP, median / p99 / max", stats(http_ms)),
        ("device plugin registry (health + node series)", f"{full_series} series, {len(full):,} bytes"),
        ("generate_latest of that registry, median / p99 / max", stats(local_ms)),
    ]  # fmt: skip
    lines = [
        f"Command: `.venv/bin/python benchmarks/node_metrics.py --pods {args.pods} --scrapes {args.scrapes} "
        f"--hostile {args.hostile}`; {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}.",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
    ]
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
