"""``nvidia-smi`` as the reference: its query output parsed, and gpuslice's NVML readings compared with it.

Only machine-readable forms are parsed: ``--query-gpu=… --format=csv,noheader,nounits`` and
``--query-compute-apps=…`` (one CSV row per GPU or process), and ``topo -m`` through gpuslice's own
parser (``hardware/topology_smi.py``). Nothing here changes a GPU setting: only query verbs are run.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

__all__ = [
    "APP_FIELDS",
    "GPU_FIELDS",
    "SmiApp",
    "SmiGpu",
    "SmiParseError",
    "compare_discovery",
    "compare_processes",
    "compare_telemetry",
    "compare_topology",
    "parse_apps",
    "parse_gpus",
]

MIB = 1 << 20
GPU_FIELDS = (
    "index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,"
    "mig.mode.current,pci.bus_id,driver_version"
)
APP_FIELDS = "pid,gpu_uuid,used_memory"
# Readings taken a moment apart through two tools: how far apart they may be and still agree.
MEMORY_USED_SLACK_BYTES = 256 * MIB  # a CUDA context alone is ~500 MiB; NVML and nvidia-smi both see it
TEMPERATURE_SLACK_C = 5.0
POWER_SLACK_FRACTION = 0.25  # power moves fast under load; both tools sample the same sensor
UTILIZATION_SLACK_POINTS = 30.0  # a percentage over the last sample period, which differs per call
PROCESS_MEMORY_SLACK_BYTES = 16 * MIB  # the same per-process counter, read twice


class SmiParseError(ValueError):
    """nvidia-smi printed something that is not the CSV asked for; the message quotes the row."""


@dataclass(frozen=True)
class SmiGpu:
    """One row of ``--query-gpu``; None where nvidia-smi prints [N/A] or [Not Supported]."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None
    utilization_percent: float | None
    temperature_c: float | None
    power_w: float | None
    mig_mode: str  # "Enabled", "Disabled" or "" (not supported)
    bus_id: str
    driver_version: str


@dataclass(frozen=True)
class SmiApp:
    """One row of ``--query-compute-apps``: a process with a CUDA context on a GPU."""

    pid: int
    gpu_uuid: str
    used_memory_bytes: int | None


def _rows(text: str, width: int) -> list[list[str]]:
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not "".join(row).strip():
            continue
        if len(row) != width:
            raise SmiParseError(f"expected {width} comma-separated fields, got {len(row)}: {','.join(row)!r}")
        rows.append([cell.strip() for cell in row])
    return rows


def _missing(cell: str) -> bool:
    return cell.startswith("[") or cell in ("N/A", "")


def _number(cell: str, row: list[str]) -> float | None:
    if _missing(cell):
        return None
    try:
        return float(cell)
    except ValueError:
        raise SmiParseError(f"expected a number, got {cell!r} in {','.join(row)!r}") from None


def parse_gpus(text: str) -> list[SmiGpu]:
    """Rows of ``nvidia-smi --query-gpu=GPU_FIELDS --format=csv,noheader,nounits``."""
    gpus = []
    for row in _rows(text, len(GPU_FIELDS.split(","))):
        index, uuid, name, total, used, util, temp, power, mig, bus, driver = row
        total_mib = _number(total, row)
        if total_mib is None or _number(index, row) is None:
            raise SmiParseError(f"index and memory.total are required: {','.join(row)!r}")
        used_mib = _number(used, row)
        gpus.append(
            SmiGpu(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_total_bytes=int(total_mib) * MIB,
                memory_used_bytes=None if used_mib is None else int(used_mib) * MIB,
                utilization_percent=_number(util, row),
                temperature_c=_number(temp, row),
                power_w=_number(power, row),
                mig_mode="" if _missing(mig) else mig,
                bus_id=bus,
                driver_version=driver,
            )
        )
    return gpus


def parse_apps(text: str) -> list[SmiApp]:
    """Rows of ``nvidia-smi --query-compute-apps=APP_FIELDS --format=csv,noheader,nounits``."""
    apps = []
    for row in _rows(text, 3):
        pid = _number(row[0], row)
        if pid is None:
            raise SmiParseError(f"pid is required: {','.join(row)!r}")
        used = _number(row[2], row)
        apps.append(SmiApp(int(pid), row[1], None if used is None else int(used) * MIB))
    return apps


def check(name: str, ok: bool, **detail: Any) -> dict[str, Any]:
    """One named yes/no comparison with the values behind it (what the JSON records)."""
    return {"name": name, "ok": bool(ok), **detail}


def compare_discovery(machine: Any, smi: list[SmiGpu], catalogue_model: Any) -> list[dict[str, Any]]:
    """gpuslice's ``discover()`` against nvidia-smi: count, and per GPU UUID, memory, model, MIG mode."""
    checks = [check("gpu count", len(machine.gpus) == len(smi), nvml=len(machine.gpus), smi=len(smi))]
    by_index = {g.index: g for g in smi}
    for gpu in machine.gpus:
        ref = by_index.get(gpu.index)
        if ref is None:
            checks.append(check(f"gpu{gpu.index} listed by nvidia-smi", False))
            continue
        checks += [
            check(f"gpu{gpu.index} uuid", gpu.uuid == ref.uuid, nvml=gpu.uuid, smi=ref.uuid),
            # nvidia-smi prints whole MiB: NVML's byte count, truncated, must give the same number
            check(
                f"gpu{gpu.index} memory total",
                gpu.memory_bytes // MIB == ref.memory_total_bytes // MIB,
                nvml_mib=gpu.memory_bytes // MIB,
                smi_mib=ref.memory_total_bytes // MIB,
            ),
            check(
                f"gpu{gpu.index} model",
                gpu.model == catalogue_model(ref.name, ref.memory_total_bytes),
                nvml=gpu.model,
                smi_name=ref.name,
            ),
            check(
                f"gpu{gpu.index} MIG mode",
                gpu.mig_enabled == (ref.mig_mode == "Enabled"),
                nvml=gpu.mig_enabled,
                smi=ref.mig_mode or "not supported",
            ),
        ]
    return checks


def _close(a: float | None, b: float | None, slack: float) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= slack)


def compare_telemetry(readings: list[Any], smi: list[SmiGpu]) -> list[dict[str, Any]]:
    """gpuslice's ``gpu_telemetry()`` against nvidia-smi, read a moment apart: within the slacks above."""
    checks = []
    by_index = {g.index: g for g in smi}
    for r in readings:
        ref = by_index.get(r.index)
        if ref is None:
            checks.append(check(f"gpu{r.index} listed by nvidia-smi", False))
            continue
        power_slack = POWER_SLACK_FRACTION * max(ref.power_w or 0.0, r.power_watts or 0.0, 1.0)
        # (what, NVML's reading, nvidia-smi's, how far apart they may be)
        pairs = [
            ("memory used", r.memory_used_bytes, ref.memory_used_bytes, MEMORY_USED_SLACK_BYTES),
            ("temperature", r.temperature_celsius, ref.temperature_c, TEMPERATURE_SLACK_C),
            ("power", r.power_watts, ref.power_w, power_slack),
            ("utilization", r.utilization_percent, ref.utilization_percent, UTILIZATION_SLACK_POINTS),
        ]
        checks += [
            check(f"gpu{r.index} {what}", _close(nvml, smi, slack), nvml=nvml, smi=smi)
            for what, nvml, smi, slack in pairs
        ]
    return checks


def compare_topology(nvml_topo: Any, smi_topo: Any) -> list[dict[str, Any]]:
    """Every GPU pair's ``topo -m`` label as gpuslice derives it from NVML, against nvidia-smi's."""
    n, m = nvml_topo.n_gpus, smi_topo.n_gpus
    checks = [check("topology gpu count", n == m, nvml=n, smi=m)]
    if n != m:
        return checks
    differ = [
        f"GPU{i}-GPU{j}: nvml {nvml_topo.label(i, j)}, smi {smi_topo.label(i, j)}"
        for i in range(n)
        for j in range(n)
        if i != j and nvml_topo.label(i, j) != smi_topo.label(i, j)
    ]
    checks.append(check("topology labels", not differ, pairs=n * (n - 1), differ=differ[:8]))
    if n > 1:  # nvidia-smi shows NVSwitch only through pairs' link counts: a lone GPU has none
        checks.append(
            check("nvswitch", nvml_topo.nvswitch == smi_topo.nvswitch, nvml=nvml_topo.nvswitch,
                  smi=smi_topo.nvswitch)
        )  # fmt: skip
    return checks


def compare_processes(
    jobs: dict[str, tuple[int | None, set[int]]], apps: list[SmiApp]
) -> list[dict[str, Any]]:
    """Per job: the GPU memory gpuslice's monitor reports for it against the sum of nvidia-smi's
    compute-apps rows for its processes. ``jobs`` maps a job name to (gpuslice's bytes, its pids)."""
    checks = []
    for name, (used, pids) in sorted(jobs.items()):
        rows = [a for a in apps if a.pid in pids]
        smi_used = sum(a.used_memory_bytes or 0 for a in rows) if rows else None
        ok = used is not None and smi_used is not None and abs(smi_used - used) <= PROCESS_MEMORY_SLACK_BYTES
        checks.append(check(f"{name} memory", ok, gpuslice=used, smi=smi_used, pids=sorted(pids)))
    return checks
