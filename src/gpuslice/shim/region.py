"""Read a job region written by the shim (layout: native/shim/region.h; the two must agree).

Readers take no lock: each field is an aligned 8-byte word the shim writes in one store, so a read
sees an old or a new value, never a torn one.

A region is written by the job's own processes, so a reader trusts none of it. In Kubernetes the pod's
region folder is mounted read-write into the pod, which can put anything under the region's name: a
symbolic link to a host file, a FIFO (a plain open blocks the reader for ever), a device node, a file of
10 GB, or a file of the right size with absurd fields. ``read_region`` therefore

```text
opens    the folder O_DIRECTORY|O_NOFOLLOW, the name in it O_PATH|O_NOFOLLOW (no FIFO or driver open
         happens), then the same inode O_RDONLY|O_NONBLOCK through /proc/self/fd
refuses  a link, anything but a regular file with one name, any size but the region's
reads    exactly SIZE bytes, never more
bounds   every field it returns (``MAX_*`` below); one out of bounds refuses the whole region
```

and every refusal is a ``RegionError`` whose ``reason`` is one of ``REASONS``, a fixed code a metric
can carry. A missing file or folder is FileNotFoundError: no process of the job has used CUDA yet.

Which process slots count: a reader in the writers' PID namespace (``gpuslice serve``) counts a slot
only while its process lives (same PID *and* start time), the rule the shim uses to reclaim a dead
process's memory. A node plugin reading a pod's region sees other PIDs (the pod has its own namespace):
``pids_visible=False`` counts the slots the shim holds (PID not 0), as the shim's own sum does, and never
looks a region's PID up in /proc (a PID there may name a host process).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_BYTES", "REASONS", "DeviceUsage", "JobRegion", "RegionError", "pack_region", "read_region"]

MAGIC = 0x31454349534C5347
VERSION = 1
MAX_DEVICES = 16
MAX_PROCS = 256
MAX_HOST_GPUS = 64  # GS_MAX_HOST_GPUS: the shim refuses a larger GPU index in GPUSLICE_GPUS
PRIORITIES = 5
_HEADER = struct.Struct("<QIIIIiIQ")  # magic, version, size, devices, compute, priority, hwm, created
_DEVICE = struct.Struct("<QqqQQQQQ")  # limit, host gpu, tokens, refill, busy, launches, throttled, ooms
_PROC = struct.Struct(f"<iiQ{MAX_DEVICES}Q")  # pid, pad, start ticks, used per device
_DEVICES_AT = 128
_PROCS_AT = _DEVICES_AT + MAX_DEVICES * _DEVICE.size
SIZE = _PROCS_AT + MAX_PROCS * _PROC.size

# Bounds on what a region may say. Far above anything real, far below what would distort a sum or a
# float: 1 PiB of GPU memory (80 GiB GPUs, managed memory may oversubscribe a few times), 2^60 ns
# (36 years of kernel time) and 2^60 launches or refusals; PID_MAX_LIMIT is 2^22 on 64-bit Linux.
MAX_BYTES = 1 << 50
MAX_NS = 1 << 60
MAX_COUNT = 1 << 60
MAX_PID = 1 << 22

# Why a region was refused; a fixed set, so a metric label stays bounded.
REASONS = ("symlink", "not_regular", "wrong_size", "not_a_region", "out_of_range", "unreadable")


class RegionError(ValueError):
    """The file is not a usable job region of this shim version; ``reason`` is one of ``REASONS``."""

    def __init__(self, message: str, reason: str = "not_a_region") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One of the job's GPUs as the shim sees it."""

    host_gpu: int  # the machine's GPU index, -1 when the job was not told
    limit_bytes: int  # 0: no memory limit
    used_bytes: int  # held by the job's live processes through the shim
    busy_ns: int  # measured kernel time of the job's throttled launches
    launches: int
    throttled_ns: int  # time launches waited for tokens or for a higher-priority job
    oom_refusals: int = 0  # allocations the shim refused for the memory limit (0 in older regions)


@dataclass(frozen=True, slots=True)
class JobRegion:
    compute_percent: int
    priority: int
    devices: tuple[DeviceUsage, ...]
    pids: tuple[int, ...]  # processes whose slots counted, in the writers' PID namespace


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


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY  # O_NONBLOCK: a FIFO cannot block


def _refuse_kind(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise RegionError(f"{path} is a symbolic link; regions are read without following links", "symlink")
    if not stat.S_ISREG(info.st_mode):
        raise RegionError(f"{path} is not a regular file (a FIFO, device or folder)", "not_regular")
    if info.st_nlink != 1:
        raise RegionError(f"{path} has {info.st_nlink} names; the shim makes one", "not_regular")
    if info.st_size != SIZE:
        raise RegionError(f"{path}: {info.st_size} bytes, a job region has {SIZE}", "wrong_size")


def _read_bytes(path: Path) -> bytes:
    """Exactly SIZE bytes of the regular file ``path`` (see the module doc for how it is opened)."""
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:
        reason = "symlink" if err.errno in (errno.ELOOP, errno.ENOTDIR) else "unreadable"
        raise RegionError(f"{path.parent}: {os.strerror(err.errno or 0)}", reason) from None
    try:
        handle = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        try:
            seen = os.fstat(handle)
            _refuse_kind(path, seen)
            try:  # the same inode, now readable: no name is looked up again
                fd = os.open(f"/proc/self/fd/{handle}", _READ_FLAGS)
            except FileNotFoundError:  # no /proc: the name again, and the inode must be the one checked
                fd = os.open(path.name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=folder)
        finally:
            os.close(handle)
    except FileNotFoundError:
        raise
    except OSError as err:
        reason = "symlink" if err.errno == errno.ELOOP else "unreadable"
        raise RegionError(f"{path}: {os.strerror(err.errno or 0)}", reason) from None
    finally:
        os.close(folder)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
            raise RegionError(f"{path} was replaced while it was opened", "not_regular")
        _refuse_kind(path, now)
        chunks, got = [], 0
        while got < SIZE:
            chunk = os.pread(fd, SIZE - got, got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as err:
        raise RegionError(f"{path}: {os.strerror(err.errno or 0)}", "unreadable") from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if got != SIZE:
        raise RegionError(f"{path}: {got} bytes, a job region has {SIZE}", "wrong_size")
    return b"".join(chunks)


def _bounded(path: Path, what: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise RegionError(f"{path}: {what} is {value}, outside {low}..{high}", "out_of_range")
    return value


def read_region(path: Path, *, pids_visible: bool = True) -> JobRegion:
    """The job's usage now; RegionError (with its ``reason``) when ``path`` is not a usable region,
    FileNotFoundError when it or its folder does not exist. ``pids_visible``: see the module doc."""
    path = Path(path)
    data = _read_bytes(path)
    magic, version, size, devices, compute, priority, hwm, _created = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or size != SIZE:
        raise RegionError(f"{path} is not a gpuslice shim job region (version {VERSION})")
    _bounded(path, "the device count", devices, 1, MAX_DEVICES)
    _bounded(path, "the compute percent", compute, 1, 100)
    _bounded(path, "the priority", priority, 0, PRIORITIES - 1)
    _bounded(path, "the process high-water mark", hwm, 0, MAX_PROCS)
    used = [0] * devices
    pids = []
    for i in range(hwm):
        pid, _pad, ticks, *per_device = _PROC.unpack_from(data, _PROCS_AT + i * _PROC.size)
        _bounded(path, f"process slot {i}'s PID", pid, 0, MAX_PID)
        if pid == 0 or (pids_visible and _start_ticks(pid) != ticks):
            continue
        pids.append(pid)
        for d in range(devices):
            used[d] += _bounded(path, f"process slot {i}'s bytes on device {d}", per_device[d], 0, MAX_BYTES)
    slots = []
    for d in range(devices):
        limit, host, _tokens, _refill, busy, launches, throttled, ooms = _DEVICE.unpack_from(
            data, _DEVICES_AT + d * _DEVICE.size
        )
        slots.append(
            DeviceUsage(
                host_gpu=_bounded(path, f"device {d}'s host GPU", host, -1, MAX_HOST_GPUS - 1),
                limit_bytes=_bounded(path, f"device {d}'s limit", limit, 0, MAX_BYTES),
                used_bytes=_bounded(path, f"device {d}'s bytes in use", used[d], 0, MAX_BYTES),
                busy_ns=_bounded(path, f"device {d}'s busy time", busy, 0, MAX_NS),
                launches=_bounded(path, f"device {d}'s launches", launches, 0, MAX_COUNT),
                throttled_ns=_bounded(path, f"device {d}'s throttled time", throttled, 0, MAX_NS),
                oom_refusals=_bounded(path, f"device {d}'s refusals", ooms, 0, MAX_COUNT),
            )
        )
    return JobRegion(compute, priority, tuple(slots), tuple(pids))


def pack_region(
    devices: Sequence[DeviceUsage], *, compute_percent: int = 100, priority: int = 2, pid: int = 1,
    start_ticks: int = 0,
) -> bytearray:  # fmt: skip
    """A region's bytes as the shim lays them out, every device's ``used_bytes`` held by one process
    slot (``pid``, ``start_ticks``): regions for tests and benchmarks without running CUDA. Nothing is
    checked, so a test can write what a hostile pod would."""
    data = bytearray(SIZE)
    _HEADER.pack_into(data, 0, MAGIC, VERSION, SIZE, len(devices), compute_percent, priority, 1, 0)
    for d, dev in enumerate(devices):
        at = _DEVICES_AT + d * _DEVICE.size
        _DEVICE.pack_into(data, at, dev.limit_bytes, dev.host_gpu, 0, 0, dev.busy_ns, dev.launches,
                          dev.throttled_ns, dev.oom_refusals)  # fmt: skip
    used = [dev.used_bytes for dev in devices] + [0] * (MAX_DEVICES - len(devices))
    _PROC.pack_into(data, _PROCS_AT, pid, 0, start_ticks, *used)
    return data
