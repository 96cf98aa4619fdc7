"""NVML MIG reader against a fake pynvml: layout, GI/CI ids, MIG-mode and missing-driver errors."""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace
from typing import ClassVar

import pytest

from gpuslice.errors import UserError
from gpuslice.hardware.mig import format_mask, mig_gpu
from gpuslice.hardware.mig_nvml import (
    MigNotEnabled,
    NvmlUnavailable,
    compare_with_table,
    load_nvml,
    read_layout,
    read_profiles,
)
from gpuslice.units import GiB


class FakeNvml:
    """The slice of pynvml the reader uses; GIs are (gi_id, profile_id, start, size, ci_ids)."""

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
    NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
    NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5  # exists in pynvml; unsupported on these GPUs
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 8
    c_nvmlGpuInstance_t = ctypes.c_void_p
    c_nvmlComputeInstance_t = ctypes.c_void_p

    class NVMLError(Exception):
        pass

    # constant -> (-lgip id, slices, count, SMs, MiB) as an A100-80GB reports them on a current driver
    # (-lgip: 9.50 / 19.50 / 39.25 / 79.00 GiB)
    PROFILES: ClassVar[dict[int, tuple[int, ...]]] = {
        0x0: (19, 1, 7, 14, 9728),
        0x7: (20, 1, 1, 14, 9728),
        0x9: (15, 1, 4, 14, 19968),
        0x1: (14, 2, 3, 28, 19968),
        0x2: (9, 3, 2, 42, 40192),
        0x3: (5, 4, 1, 56, 40192),
        0x4: (0, 7, 1, 98, 80896),
    }

    def __init__(self, gis, mig_mode=(1, 1), name="NVIDIA A100-SXM4-80GB", total=80 * GiB):
        self.gis = {100 + i: gi for i, gi in enumerate(gis)}  # handle -> GI tuple
        self.mig_mode, self.name, self.total = list(mig_mode), name, total

    def nvmlDeviceGetHandleByIndex(self, index):
        return "gpu0"

    def nvmlDeviceGetName(self, handle):
        return self.name

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=self.total)

    def nvmlDeviceGetMigMode(self, handle):
        return self.mig_mode

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, const):
        if const not in self.PROFILES:
            raise self.NVMLError("Not Supported")
        pid, slices, count, sms, mib = self.PROFILES[const]
        return SimpleNamespace(
            id=pid, sliceCount=slices, instanceCount=count, multiprocessorCount=sms, memorySizeMB=mib
        )

    def nvmlDeviceGetGpuInstances(self, handle, profile_id, array, count_ref):
        found = [h for h, gi in self.gis.items() if gi[1] == profile_id]
        for i, h in enumerate(found):
            array[i] = h
        count_ref._obj.value = len(found)

    def nvmlGpuInstanceGetInfo(self, gi):
        gi_id, pid, start, size, _ = self.gis[gi]
        return SimpleNamespace(id=gi_id, profileId=pid, placement=SimpleNamespace(start=start, size=size))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, const, eng):
        if const != 0:  # one CI profile is enough for the fake
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(id=0)

    def nvmlGpuInstanceGetComputeInstances(self, gi, profile_id, array, count_ref):
        ci_ids = self.gis[gi][4]
        for i, ci in enumerate(ci_ids):
            array[i] = gi * 100 + ci + 1
        count_ref._obj.value = len(ci_ids)

    def nvmlComputeInstanceGetInfo(self, ci):
        return SimpleNamespace(id=ci % 100 - 1)


def test_read_layout_returns_every_gpu_instance_with_its_ids():
    nvml = FakeNvml([(1, 5, 0, 4, (0,)), (2, 14, 4, 2, (0, 1)), (9, 19, 6, 1, (0,))])
    layout = read_layout(0, nvml)
    assert layout.gpu is mig_gpu("a100-80gb")
    assert format_mask(layout.mask) == "#######."
    got = sorted((str(i), i.ci_ids) for i in layout.instances)
    assert got == [("1g.10gb@6/9", (0,)), ("2g.20gb@4/2", (0, 1)), ("4g.40gb@0/1", (0,))]


def test_a_gpu_not_in_mig_mode_says_how_to_enable_it():
    with pytest.raises(MigNotEnabled, match="pending a GPU reset"):
        read_layout(0, FakeNvml([], mig_mode=(0, 1)))


@pytest.mark.parametrize(
    ("name", "total", "key"),
    [("NVIDIA A100-PCIE-40GB", 40 * GiB, "a100-40gb"), ("NVIDIA H100 80GB HBM3", 80 * GiB, "h100-80gb"),
     ("NVIDIA H100 PCIe", 80 * GiB, "h100-pcie-80gb"), ("NVIDIA H100 NVL", 94 * GiB, "h100-nvl-94gb"),
     ("NVIDIA H200", 141 * GiB, "h200-141gb")],
)  # fmt: skip
def test_the_gpu_model_is_detected_from_name_and_memory(name, total, key):
    assert read_layout(0, FakeNvml([], name=name, total=total)).gpu.key == key


def test_an_unsupported_gpu_is_a_user_error():
    with pytest.raises(UserError, match="no built-in MIG table"):
        read_layout(0, FakeNvml([], name="NVIDIA A30", total=24 * GiB))  # no table yet


def test_profiles_read_from_the_driver_agree_with_the_a100_table():
    observed = read_profiles(0, FakeNvml([]))
    assert {o.profile_id for o in observed} == {19, 20, 15, 14, 9, 5, 0}
    assert compare_with_table(mig_gpu("a100-80gb"), observed) == []


def test_a_disagreeing_driver_is_reported_field_by_field():
    nvml = FakeNvml([])
    nvml.PROFILES = {**FakeNvml.PROFILES, 0x2: (9, 3, 2, 48, 40192)}
    lines = compare_with_table(mig_gpu("a100-80gb"), read_profiles(0, nvml))
    assert lines == ["3g.40gb: SMs table 42, driver 48"]


def test_without_nvidia_ml_py_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match="install nvidia-ml-py"):
        load_nvml()


def test_without_a_driver_the_error_says_so(monkeypatch):
    class NoDriver:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            raise self.NVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", NoDriver())
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver"):
        load_nvml()
