"""``gpuslice-fake-load``: a stand-in GPU job for ``--simulate`` machines and tests.

It holds no GPU memory; it *reports* the memory a real job would hold, per visible GPU, to
``$GPUSLICE_REPORT_FILE`` (set by the launcher), and ``node/monitor.py`` reads that report where NVML
would be asked on a real machine. So sharing, over-use, suspension and killing can all be exercised
on a laptop::

    gpuslice-fake-load --mem 12GiB --seconds 30                      # steady 12 GiB per GPU, 30 s
    gpuslice-fake-load --mem 8GiB --grow-to 30GiB --seconds 60       # grows over the first half
    gpuslice-fake-load --mem 1GiB --seconds 600 --ignore-term        # needs the SIGKILL after grace

Report (JSON, replaced atomically)::

    {"pid": 4242, "memory_bytes": {"GPU-sim-…-0003": 12884901888}, "updated_at": 1760000000.0}

Keys are the entries of CUDA_VISIBLE_DEVICES (GPU or MIG UUIDs, or indices), or "0" when it is unset.
On SIGTERM it reports 0 bytes and exits with 143 (128 + SIGTERM), as a well-behaved job would.

Under ``--sharing shim`` on a simulated machine the job finds the fake driver (``native/shim/fake``,
shipped in the package) as libcuda.so.1, with the shim preloaded. The load then holds its memory for
real, through ``cuMemAlloc_v2``, and spends its time launching 1 ms fake kernels: the shim fences the
one and throttles the other, and its region is what the server reads. When the shim refuses an
allocation the load exits with 1 after "CUDA_ERROR_OUT_OF_MEMORY", as a framework would raise.
Against any other libcuda (a real GPU) it only reports, as above.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

from gpuslice.units import parse_size

__all__ = [
    "REPORT_ENV",
    "FakeDriverLoad",
    "OutOfMemory",
    "main",
    "memory_at",
    "visible_devices",
    "write_report",
]

REPORT_ENV = "GPUSLICE_REPORT_FILE"
_TERM_EXIT_CODE = 128 + signal.SIGTERM
_INTERVAL_SECONDS = 0.2
_OOM_EXIT_CODE = 1
_CUDA_ERROR_OUT_OF_MEMORY = 2
_KERNEL_MICROSECONDS = 1000  # the fake driver runs a kernel for its grid's X dimension in microseconds


class OutOfMemory(Exception):
    """The driver (the shim, under --sharing shim) refused an allocation."""


class FakeDriverLoad:
    """Memory held and kernels run through the fake libcuda.so.1, one context per visible device."""

    def __init__(self, devices: int) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self._check(self.cuda.cuInit(0), "cuInit")
        self.contexts = []
        for ordinal in range(devices):
            device, context = ctypes.c_int(), ctypes.c_void_p()
            self._check(self.cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
            self._check(self.cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate_v2")
            self.contexts.append(context)
        self.blocks: list[list[tuple[int, int]]] = [[] for _ in range(devices)]  # (pointer, bytes)

    @staticmethod
    def available() -> bool:
        """True when libcuda.so.1 is the fake driver (it exports fakeCudaUsedBytes)."""
        try:
            return hasattr(ctypes.CDLL("libcuda.so.1"), "fakeCudaUsedBytes")
        except OSError:
            return False

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code == _CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfMemory(f"{call}: CUDA_ERROR_OUT_OF_MEMORY")
        if code != 0:
            raise OSError(f"{call} failed with CUresult {code}")

    def hold(self, target_bytes: int) -> None:
        """Hold ``target_bytes`` on every device: free blocks from the newest, then allocate the rest."""
        for ordinal, blocks in enumerate(self.blocks):
            self._check(self.cuda.cuCtxSetCurrent(self.contexts[ordinal]), "cuCtxSetCurrent")
            while blocks and sum(b for _, b in blocks) > target_bytes:
                pointer, _ = blocks.pop()
                self._check(self.cuda.cuMemFree_v2(ctypes.c_ulonglong(pointer)), "cuMemFree_v2")
            missing = target_bytes - sum(b for _, b in blocks)
            if missing > 0:
                pointer = ctypes.c_ulonglong()
                code = self.cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(missing))
                self._check(code, f"cuMemAlloc_v2 of {missing} bytes on device {ordinal}")
                blocks.append((pointer.value, missing))

    def held(self) -> int:
        return max((sum(b for _, b in blocks) for blocks in self.blocks), default=0)

    def run_kernels(self, seconds: float) -> None:
        """Launch back-to-back 1 ms kernels on device 0 for ``seconds`` (the shim may make them wait)."""
        self._check(self.cuda.cuCtxSetCurrent(self.contexts[0]), "cuCtxSetCurrent")
        launch = self.cuda.cuLaunchKernel
        launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, *[ctypes.c_void_p] * 3]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            code = launch(None, _KERNEL_MICROSECONDS, 1, 1, 1, 1, 1, 0, None, None, None)
            self._check(code, "cuLaunchKernel")


def visible_devices(environ: dict[str, str] | os._Environ[str] | None = None) -> list[str]:
    """The devices this process would see: CUDA_VISIBLE_DEVICES entries, ["0"] when it is unset."""
    environ = os.environ if environ is None else environ
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return ["0"]
    return [d.strip() for d in value.split(",") if d.strip()]


def memory_at(elapsed: float, start_bytes: int, grow_to_bytes: int | None, grow_seconds: float) -> int:
    """Memory held ``elapsed`` seconds in: ``start_bytes``, rising linearly to ``grow_to_bytes``."""
    if grow_to_bytes is None or grow_seconds <= 0 or elapsed >= grow_seconds:
        return grow_to_bytes if grow_to_bytes is not None else start_bytes
    return int(start_bytes + (grow_to_bytes - start_bytes) * max(0.0, elapsed) / grow_seconds)


def write_report(path: Path, devices: list[str], memory_bytes: int) -> None:
    """Atomically replace the report at ``path`` with ``memory_bytes`` on each device."""
    data = {
        "pid": os.getpid(),
        "memory_bytes": dict.fromkeys(devices, memory_bytes),
        "updated_at": time.time(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuslice-fake-load", description=__doc__.splitlines()[0])
    parser.add_argument("--mem", required=True, type=parse_size, help="GPU memory per GPU, e.g. 12GiB")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--grow-to", type=parse_size, default=None, help="memory to grow to, e.g. 20GiB")
    parser.add_argument(
        "--grow-seconds",
        type=float,
        default=None,
        help="seconds to reach --grow-to (default: half of --seconds)",
    )
    parser.add_argument("--exit-code", type=int, default=0, help="exit status at the end (default 0)")
    parser.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (tests the SIGKILL)")
    parser.add_argument("--report-file", type=Path, default=None, help=f"default: ${REPORT_ENV}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    report = args.report_file or (Path(os.environ[REPORT_ENV]) if os.environ.get(REPORT_ENV) else None)
    devices = visible_devices()
    grow_seconds = args.grow_seconds if args.grow_seconds is not None else args.seconds / 2
    stopping: list[int] = []
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    print(f"fake-load: pid {os.getpid()}, devices {','.join(devices) or 'none'}, report {report}", flush=True)
    driver = None
    if os.environ.get("GPUSLICE_SHARING") == "shim" and FakeDriverLoad.available():
        driver = FakeDriverLoad(max(1, len(devices)))
        print("fake-load: holding memory and running kernels through the fake CUDA driver", flush=True)
    start = time.monotonic()
    while not stopping:
        elapsed = time.monotonic() - start
        target = memory_at(elapsed, args.mem, args.grow_to, grow_seconds)
        if driver is not None:
            try:
                driver.hold(target)
            except OutOfMemory as err:
                print(f"fake-load: {err}: the slice is full, exiting", file=sys.stderr, flush=True)
                if report is not None:
                    write_report(report, devices, 0)
                return _OOM_EXIT_CODE
            target = driver.held()
        if report is not None:
            write_report(report, devices, target)
        if elapsed >= args.seconds:
            break
        pause = min(_INTERVAL_SECONDS, max(0.0, args.seconds - elapsed))
        if driver is not None:
            driver.run_kernels(pause)
        else:
            time.sleep(pause)
    if stopping:
        if driver is not None:
            driver.hold(0)
        if report is not None:
            write_report(report, devices, 0)
        print("fake-load: SIGTERM, memory released, exiting", flush=True)
        return _TERM_EXIT_CODE
    print(f"fake-load: done after {args.seconds:g} s, exit {args.exit_code}", flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
