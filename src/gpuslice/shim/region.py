"""Read a job region written by the shim (layout: native/shim/region.h; the two must agree).

Readers take no lock: each field is an aligned 8-byte word the shim writes in one store, so a read
sees an old or a new value, never a torn one. A process slot counts only while its process lives
(same PID *and* start time), the rule the shim uses to reclaim a dead process's memory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DeviceUsage", "JobRegion", "RegionError", "read_region"]

MAGIC = 0x31454349534C5347
VERSION = 1
MAX_DEVICES = 16
MAX_PROCS = 256
_HEADER = struct.Struct("<QIIIIiIQ")  # magic, version, size, devices, compute, priority, hwm, created
_DEVICE = struct.Struct("<QqqQQQQQ")  # limit, host gpu, tokens, refill, busy, launches, throttled, 0
_PROC = struct.Struct(f"<iiQ{MAX_DEVICES}Q")  # pid, pad, start ticks, used per device
_DEVICES_AT = 128
_PROCS_AT = _DEVICES_AT + MAX_DEVICES * _DEVICE.size
SIZE = _PROCS_AT + MAX_PROCS * _PROC.size


class RegionError(ValueError):
    """The file is not a job region of this shim version."""


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One of the job's GPUs as the shim sees it."""

    host_gpu: int  # the machine's GPU index, -1 when the job was not told
    limit_bytes: int  # 0: no memory limit
    used_bytes: int  # held by the job's live processes through the shim
    busy_ns: int  # measured kernel time of the job's throttled launches
    launches: int
    throttled_ns: int  # time launches waited for tokens or for a higher-priority job


@dataclass(frozen=True, slots=True)
class JobRegion:
    compute_percent: int
    priority: int
    devices: tuple[DeviceUsage, ...]
    pids: tuple[int, ...]  # live processes that used the shim


def _start_ticks(pid: int) -> int | None:
    """starttime of a live, non-zombie process (``/proc/<pid>/stat`` field 22), else None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def read_region(path: Path) -> JobRegion:
    """The job's usage now; RegionError when ``path`` is not a region, OSError when it cannot be read."""
    data = Path(path).read_bytes()
    if len(data) < SIZE:
        raise RegionError(f"{path}: {len(data)} bytes, a job region has {SIZE}")
    magic, version, _size, devices, compute, priority, hwm, _created = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise RegionError(f"{path} is not a gpuslice shim job region (version {VERSION})")
    used = [0] * MAX_DEVICES
    pids = []
    for i in range(min(hwm, MAX_PROCS)):
        pid, _pad, ticks, *per_device = _PROC.unpack_from(data, _PROCS_AT + i * _PROC.size)
        if pid <= 0 or _start_ticks(pid) != ticks:
            continue
        pids.append(pid)
        for d, value in enumerate(per_device):
            used[d] += value
    slots = []
    for d in range(max(1, min(devices, MAX_DEVICES))):
        limit, host, _tokens, _refill, busy, launches, throttled, _ = _DEVICE.unpack_from(
            data, _DEVICES_AT + d * _DEVICE.size
        )
        slots.append(DeviceUsage(host, limit, used[d], busy, launches, throttled))
    return JobRegion(compute, priority, tuple(slots), tuple(pids))
