"""um_worker.py without a GPU: CuPy and the CUDA driver replaced by fakes that hand out real host memory,
so the worker's own flow runs: every record it prints is one the parser accepts, the sweeps launch with
the plan's permutations, and managed memory beyond the free GPU memory is refused unless allowed."""

from __future__ import annotations

import ctypes
import json
import time
import types

import acceptance_helpers  # noqa: F401  (puts scripts/ on sys.path)
import pytest

from gpu_acceptance import um, um_worker

MIB = 1 << 20
BALLOON_ADDRESS = 0x7F0000000000  # never dereferenced: the fake GPU's plain allocations hold no memory


class FakeLibcuda:
    """cuMem* calls of the driver: managed allocations are real host buffers, plain ones only count."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.buffers: dict[int, ctypes.Array] = {}
        self.plain: dict[int, int] = {}
        self.calls: list[str] = []

    def cuMemGetInfo_v2(self, free, total):
        free._obj.value, total._obj.value = self.free, 1 << 34
        return 0

    def cuMemAlloc_v2(self, ptr, size):
        address = BALLOON_ADDRESS + len(self.plain) * (1 << 36)
        self.plain[address] = size.value
        self.free -= size.value
        ptr._obj.value = address
        return 0

    def cuMemAllocManaged(self, ptr, size, flags):
        buf = ctypes.create_string_buffer(size.value)
        self.buffers[ctypes.addressof(buf)] = buf
        ptr._obj.value = ctypes.addressof(buf)
        return 0

    def cuMemFree_v2(self, ptr):
        self.buffers.pop(ptr.value, None)
        self.free += self.plain.pop(ptr.value, 0)
        return 0

    def cuMemPrefetchAsync_v2(self, ptr, size, location, flags, stream):
        self.calls.append(f"prefetch to {'host' if location.type == um_worker.LOCATION_HOST else 'gpu'}")
        return 0

    def cuMemAdvise_v2(self, ptr, size, advice, location):
        self.calls.append(f"advise {advice}")
        return 0


def fake_cupy(launches: list) -> types.ModuleType:
    class Event:
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    def kernel(name):
        def launch(grid, block, args):
            launches.append((name, grid, block, args))

        return launch

    runtime = types.SimpleNamespace(
        free=lambda ptr: None, malloc=lambda n: 1, deviceSynchronize=lambda: None,
        getDeviceProperties=lambda d: {"name": b"Fake GPU", "managedMemory": 1, "concurrentManagedAccess": 1},
        driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 13000,
    )  # fmt: skip
    cuda = types.SimpleNamespace(
        Device=lambda d: types.SimpleNamespace(use=lambda: None), runtime=runtime, Event=Event,
        get_elapsed_time=lambda a, b: max((b.t - a.t) * 1e3, 1e-6),
        UnownedMemory=lambda ptr, size, owner: (ptr, size), MemoryPointer=lambda mem, offset: mem,
    )  # fmt: skip
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    cp.cuda = cuda
    cp.int32 = cp.int64 = int
    cp.zeros = lambda n, dtype=None: "sink"
    cp.ndarray = lambda shape, dtype, memptr: memptr
    cp.RawModule = lambda code: types.SimpleNamespace(get_function=kernel)
    return cp


def run_worker(tmp_path, monkeypatch, plan, free=1 << 30):
    launches: list = []
    lib = FakeLibcuda(free)
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake_cupy(launches))
    monkeypatch.setattr(um_worker, "load_libcuda", lambda: lib)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return launches, lib, path


def test_every_record_the_worker_prints_is_accepted_by_the_parser(tmp_path, monkeypatch, capsys):
    plan = um.make_plan(capacity_bytes=16 * MIB, bench_bytes=8 * MIB, fault_pages=4, streams=16)
    launches, lib, path = run_worker(tmp_path, monkeypatch, plan)
    assert um_worker.main(str(path)) == 0
    m = um.parse_measurements(capsys.readouterr().out)
    assert not m.errors and not m.notes
    assert m.env["gpu"] == "Fake GPU" and m.faults["pages"] == 4
    assert set(m.bandwidth) == {("h2d", "fault"), ("d2h", "fault"), ("h2d", "prefetch"), ("d2h", "prefetch")}
    assert set(m.advise) == {"none", "prefetch", "preferred_location_gpu", "read_mostly",
                             "preferred_cpu_accessed_by_gpu"}  # fmt: skip
    assert len(m.sweeps) == len(plan["sweeps"])
    assert all(s["capacity_bytes"] == 16 * MIB for s in m.sweeps)  # the balloon left exactly that free
    for s in m.sweeps:  # what memsim replays must be what ran
        um.planned_sweep(plan["sweeps"], s)
    sweeps = [args for name, grid, block, args in launches if name == "sweep"]
    planned = [(o["step"], o["offset"]) for s in plan["sweeps"] for o in s["passes"]]
    assert [(a[3], a[4]) for a in sweeps[4:]] == planned  # after the resident sweep's warm-up and 3 runs
    largest = max(s["tile"] for s in plan["sweeps"] if s["pattern"] == "cyclic")
    assert m.resident["tile"] == largest and m.resident["accesses"] == largest * plan["streams"]
    assert not lib.buffers and not lib.plain  # everything freed, the balloon too
    assert "advise 3" in lib.calls and "prefetch to host" in lib.calls


def test_managed_memory_beyond_the_free_gpu_memory_is_refused_unless_allowed(tmp_path, monkeypatch, capsys):
    plan = um.make_plan(capacity_bytes=16 * MIB, bench_bytes=8 * MIB, fault_pages=4, streams=16)
    plan["sweeps"][0] = {**plan["sweeps"][0], "tile": 20 * MIB // 4096 // 16}  # 20 MiB > 16 MiB free
    _, _, path = run_worker(tmp_path, monkeypatch, plan)
    um_worker.main(str(path))
    m = um.parse_measurements(capsys.readouterr().out)
    refused = [e for e in m.errors if e["step"] == "sweep cyclic 0.25"]
    assert (
        refused
        and "refusing" in refused[0]["message"]
        and "--allow-oversubscription" in refused[0]["message"]
    )
    assert len(m.sweeps) == len(plan["sweeps"]) - 1  # the other sweeps still ran

    plan["allow_oversubscription"] = True
    _, _, path = run_worker(tmp_path, monkeypatch, plan)
    um_worker.main(str(path))
    assert not um.parse_measurements(capsys.readouterr().out).errors


@pytest.mark.parametrize("missing", ["cuMemPrefetchAsync_v2", "cuMemAdvise_v2"])
def test_drivers_without_the_v2_calls_get_the_v1_ones(missing, monkeypatch):
    calls = []

    class Old(FakeLibcuda):
        def cuMemPrefetchAsync(self, ptr, size, device, stream):
            calls.append(("prefetch", device))
            return 0

        def cuMemAdvise(self, ptr, size, advice, device):
            calls.append(("advise", device))
            return 0

    lib = Old(1 << 30)
    setattr(Old, missing, property(lambda self: (_ for _ in ()).throw(AttributeError(missing))))
    monkeypatch.setattr(um_worker, "load_libcuda", lambda: lib)
    cuda = um_worker.Cuda(0)
    cuda.prefetch(0, 4096, to_cpu=True)
    cuda.advise(0, 4096, "preferred_location", on_cpu=False)
    expected = ("prefetch", -1) if missing == "cuMemPrefetchAsync_v2" else ("advise", 0)
    assert calls == [expected]
