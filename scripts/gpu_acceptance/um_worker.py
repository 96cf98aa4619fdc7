"""The GPU side of the unified-memory microbenchmarks: run as ``python um_worker.py PLAN.json``.

Prints one JSON object per line as each measurement finishes (``kind``: env, faults, bandwidth, advise,
resident, sweep, error), so a run stopped at its time limit still leaves what it measured. Managed
memory comes from the CUDA driver API through ctypes (``cuMemAllocManaged``, ``cuMemPrefetchAsync``,
``cuMemAdvise``); kernels are CuPy RawKernels; times are CUDA events around each launch.

Safety: a managed allocation larger than ``safe_ratio`` × the GPU memory free at that moment is refused
unless the plan says ``allow_oversubscription`` (oversubscribing managed memory can hang some GPUs).
Nothing here changes a GPU setting; the plain "balloon" allocation that leaves ``capacity_bytes`` free
for the sweeps is freed at the end.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

PAGE = 4096
BLOCK = 2 << 20
CU_MEM_ATTACH_GLOBAL = 1
CU_DEVICE_CPU = -1
ADVICE = {"read_mostly": 1, "preferred_location": 3, "accessed_by": 5}
LOCATION_DEVICE, LOCATION_HOST = 1, 2

KERNELS = r"""
extern "C" __global__ void touch_pages(const int* buf, long long npages, int* sink) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < npages && ((volatile const int*)buf)[i * 1024] == 0x7f7f7f7f) sink[0] = 1;
}
extern "C" __global__ void serial_touch(const int* buf, long long npages, long long stride_ints, int* sink) {
    int acc = 0;  // one thread: each fault waits for the one before, so every fault is its own batch
    for (long long i = 0; i < npages; ++i) acc += ((volatile const int*)buf)[i * stride_ints];
    sink[0] = acc;
}
extern "C" __global__ void sweep(const int* buf, long long tile, int streams, long long step,
                                 long long offset, int* sink) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= streams) return;
    int acc = 0;
    for (long long k = 0; k < tile; ++k) {
        long long p = (k * step + offset) % tile;
        acc += ((volatile const int*)buf)[((long long)s * tile + p) * 1024];
    }
    if (acc == 0x7f7f7f7f) sink[0] = acc;
}
"""


def emit(kind: str, **fields) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def load_libcuda():
    """The CUDA driver library (tests replace this with a fake)."""
    return ctypes.CDLL("libcuda.so.1")


class Cuda:
    """The driver calls used here, through ctypes on the context CuPy made current."""

    def __init__(self, device: int) -> None:
        self.lib = load_libcuda()
        self.device = device

    def _ok(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._ok(self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._ok(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        return ptr.value

    def alloc_managed(self, nbytes: int, allow_over: bool, safe_ratio: float) -> int:
        free, _ = self.mem_info()
        if nbytes > safe_ratio * free and not allow_over:
            raise RuntimeError(
                f"refusing {nbytes} bytes of managed memory with {free} free: that oversubscribes the GPU "
                "(rerun with --allow-oversubscription on a machine where that is allowed)"
            )
        ptr = ctypes.c_uint64()
        rc = self.lib.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(nbytes), CU_MEM_ATTACH_GLOBAL)
        self._ok(rc, "cuMemAllocManaged")
        return ptr.value

    def free(self, ptr: int) -> None:
        self.lib.cuMemFree_v2(ctypes.c_uint64(ptr))

    def _location(self, on_cpu: bool) -> _Location:
        return _Location(LOCATION_HOST, 0) if on_cpu else _Location(LOCATION_DEVICE, self.device)

    def prefetch(self, ptr: int, nbytes: int, to_cpu: bool) -> None:
        """cuMemPrefetchAsync on the default stream: the v2 call (a location; CUDA 12.2 on), else v1."""
        args = (ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes))
        if hasattr(self.lib, "cuMemPrefetchAsync_v2"):
            rc = self.lib.cuMemPrefetchAsync_v2(*args, self._location(to_cpu), 0, ctypes.c_void_p(0))
        else:
            rc = self.lib.cuMemPrefetchAsync(
                *args, CU_DEVICE_CPU if to_cpu else self.device, ctypes.c_void_p(0)
            )
        self._ok(rc, "cuMemPrefetchAsync")

    def advise(self, ptr: int, nbytes: int, advice: str, on_cpu: bool) -> None:
        """cuMemAdvise: the v2 call (a location) where the driver has it, else v1 (a device, -1 = CPU)."""
        args = (ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes), ADVICE[advice])
        if hasattr(self.lib, "cuMemAdvise_v2"):
            rc = self.lib.cuMemAdvise_v2(*args, self._location(on_cpu))
        else:
            rc = self.lib.cuMemAdvise(*args, CU_DEVICE_CPU if on_cpu else self.device)
        self._ok(rc, f"cuMemAdvise({advice})")


def main(plan_path: str) -> int:
    with open(plan_path) as fh:
        plan = json.load(fh)
    import cupy as cp

    device = 0
    cp.cuda.Device(device).use()
    cp.cuda.runtime.free(cp.cuda.runtime.malloc(1))  # the primary context exists from here on
    cuda = Cuda(device)
    props = cp.cuda.runtime.getDeviceProperties(device)
    free0, total = cuda.mem_info()
    emit(
        "env",
        gpu=props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        cupy=cp.__version__,
        cuda_driver_version=cp.cuda.runtime.driverGetVersion(),
        runtime=cp.cuda.runtime.runtimeGetVersion(),
        free_bytes=free0,
        total_bytes=total,
        managed=props.get("managedMemory"),
        concurrent_managed=props.get("concurrentManagedAccess"),
    )
    module = cp.RawModule(code=KERNELS)
    touch, serial, sweep_k = (module.get_function(n) for n in ("touch_pages", "serial_touch", "sweep"))
    sink = cp.zeros(1, dtype=cp.int32)
    allow, safe = bool(plan["allow_oversubscription"]), float(plan["safe_ratio"])

    def view(ptr: int, nbytes: int):
        mem = cp.cuda.UnownedMemory(ptr, nbytes, owner=None)
        return cp.ndarray((nbytes // 4,), dtype=cp.int32, memptr=cp.cuda.MemoryPointer(mem, 0))

    def timed(fn) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    def on_host(ptr: int, nbytes: int) -> None:
        ctypes.memset(ptr, 1, nbytes)  # the CPU writes every page: all of it resident in host memory

    def host_touch_seconds(ptr: int, nbytes: int) -> float:
        import numpy as np

        arr = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=np.uint8)
        t = time.perf_counter()
        int(arr[::PAGE].sum())  # one read per page: each page comes back to the host
        return time.perf_counter() - t

    def step(name: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # one failed measurement is recorded; the next one still runs
            emit("error", step=name, message=f"{type(e).__name__}: {e}")

    bench = int(plan["bench_bytes"])
    npages = bench // PAGE
    grid = ((npages + 255) // 256,)

    def faults() -> None:
        pages = int(plan["fault_pages"])
        ptr = cuda.alloc_managed(pages * BLOCK, allow, safe)
        try:
            on_host(ptr, pages * BLOCK)
            secs = timed(
                lambda: serial(
                    (1,), (1,), (view(ptr, pages * BLOCK), cp.int64(pages), cp.int64(BLOCK // 4), sink)
                )
            )
            emit("faults", pages=pages, seconds=secs, stride_bytes=BLOCK)
        finally:
            cuda.free(ptr)

    def bandwidth() -> None:
        ptr = cuda.alloc_managed(bench, allow, safe)
        try:
            buf = view(ptr, bench)
            on_host(ptr, bench)
            secs = timed(lambda: touch(grid, (256,), (buf, cp.int64(npages), sink)))
            emit("bandwidth", direction="h2d", method="fault", bytes=bench, seconds=secs)
            secs = host_touch_seconds(ptr, bench)
            emit("bandwidth", direction="d2h", method="fault", bytes=bench, seconds=secs)
            cuda.prefetch(ptr, bench, to_cpu=True)
            cp.cuda.runtime.deviceSynchronize()
            secs = timed(lambda: cuda.prefetch(ptr, bench, to_cpu=False))
            emit("bandwidth", direction="h2d", method="prefetch", bytes=bench, seconds=secs)
            secs = timed(lambda: cuda.prefetch(ptr, bench, to_cpu=True))
            emit("bandwidth", direction="d2h", method="prefetch", bytes=bench, seconds=secs)
        finally:
            cuda.free(ptr)

    def advise() -> None:
        variants = {
            "none": [],
            "prefetch": ["prefetch"],
            "preferred_location_gpu": [("preferred_location", False)],
            "read_mostly": [("read_mostly", False)],
            "preferred_cpu_accessed_by_gpu": [("preferred_location", True), ("accessed_by", False)],
        }
        for variant, hints in variants.items():
            ptr = cuda.alloc_managed(bench, allow, safe)
            try:
                on_host(ptr, bench)
                buf = view(ptr, bench)

                def run(hints=hints, ptr=ptr, buf=buf) -> None:
                    for hint in hints:
                        if hint == "prefetch":
                            cuda.prefetch(ptr, bench, to_cpu=False)
                        else:
                            cuda.advise(ptr, bench, hint[0], on_cpu=hint[1])
                    touch(grid, (256,), (buf, cp.int64(npages), sink))

                secs = timed(run)  # hints + first GPU touch of every page
                again = timed(lambda buf=buf: touch(grid, (256,), (buf, cp.int64(npages), sink)))
                emit("advise", variant=variant, bytes=bench, seconds=secs, second_touch_seconds=again)
            finally:
                cuda.free(ptr)

    def resident() -> None:
        # the largest cyclic sweep of the plan, already on the GPU: the per-access time of this kernel
        s = max((x for x in plan["sweeps"] if x["pattern"] == "cyclic"), key=lambda x: int(x["tile"]))
        streams, tile = int(s["streams"]), int(s["tile"])
        nbytes = streams * tile * PAGE
        ptr = cuda.alloc_managed(nbytes, allow, safe)
        try:
            buf = view(ptr, nbytes)
            cuda.prefetch(ptr, nbytes, to_cpu=False)
            cp.cuda.runtime.deviceSynchronize()
            args = (buf, cp.int64(tile), cp.int32(streams), cp.int64(1), cp.int64(0), sink)
            blocks = ((streams + 127) // 128,)
            timed(lambda: sweep_k(blocks, (128,), args))  # warm-up
            secs = min(timed(lambda: sweep_k(blocks, (128,), args)) for _ in range(3))
            emit("resident", accesses=streams * tile, seconds=secs, streams=streams, tile=tile)
        finally:
            cuda.free(ptr)

    step("faults", faults)
    step("bandwidth", bandwidth)
    step("advise", advise)
    step("resident", resident)

    # Sweeps: fill the GPU with a plain allocation so that only capacity_bytes stay free for managed memory.
    capacity = int(plan["capacity_bytes"])
    balloon = None
    free, _ = cuda.mem_info()
    if free > capacity + (256 << 20):
        balloon = cuda.alloc(free - capacity)
    try:
        capacity_free, _ = cuda.mem_info()
        for s in plan["sweeps"]:

            def run_sweep(s=s) -> None:
                streams, tile = int(s["streams"]), int(s["tile"])
                nbytes = streams * tile * PAGE
                ptr = cuda.alloc_managed(nbytes, allow, safe)
                try:
                    on_host(ptr, nbytes)  # data starts in host memory, as the simulator assumes
                    buf = view(ptr, nbytes)
                    blocks = ((streams + 127) // 128,)
                    passes = [
                        timed(
                            lambda o=o: sweep_k(
                                blocks,
                                (128,),
                                (
                                    buf,
                                    cp.int64(tile),
                                    cp.int32(streams),
                                    cp.int64(o["step"]),
                                    cp.int64(o["offset"]),
                                    sink,
                                ),
                            )
                        )
                        for o in s["passes"]
                    ]
                    emit(
                        "sweep",
                        pattern=s["pattern"],
                        ratio=s["ratio"],
                        tile=tile,
                        streams=streams,
                        buffer_bytes=nbytes,
                        capacity_bytes=capacity_free,
                        pass_seconds=passes,
                    )
                finally:
                    cuda.free(ptr)

            step(f"sweep {s['pattern']} {s['ratio']}", run_sweep)
    finally:
        if balloon is not None:
            cuda.free(balloon)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
