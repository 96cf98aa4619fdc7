"""discover(): real machines through a fake pynvml, simulated ones from the built-in profiles, and the
error that points to --simulate when there is neither."""

from __future__ import annotations

import sys

import pytest
from node_helpers import fake_pynvml

from gpuslice.errors import UserError
from gpuslice.hardware.topology_profiles import PROFILES
from gpuslice.node.discovery import NoGpuDriver, catalogue_model, discover, gpu_processes, is_simulated
from gpuslice.units import GiB, MiB


def test_nvml_machine_has_uuids_catalogue_models_memory_and_topology(two_gpu_nvml):
    machine = discover(nvml=two_gpu_nvml)
    assert [g.uuid for g in machine.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert {g.model for g in machine.gpus} == {"H100"}
    assert machine.gpus[0].memory_bytes == 81559 * MiB
    assert machine.gpus[0].mig_model == "h100-80gb" and not machine.gpus[0].mig_enabled
    assert machine.topology is not None and machine.topology.n_gpus == 2
    assert not is_simulated(machine)
    assert two_gpu_nvml.calls["init"] == two_gpu_nvml.calls["shutdown"]  # every session closed


def test_mig_mode_and_gpus_without_mig_support_are_read():
    nvml = fake_pynvml(
        [
            {"name": "NVIDIA A100-SXM4-80GB", "total": 80 * GiB, "uuid": "GPU-a", "mig": 1},
            {"name": "NVIDIA L4", "total": 23034 * MiB, "uuid": "GPU-l"},  # MIG mode: NOT_SUPPORTED
        ]
    )
    a100, l4 = discover(nvml=nvml).gpus
    assert (a100.model, a100.mig_enabled, a100.mig_model) == ("A100-80GB", True, "a100-80gb")
    assert (l4.model, l4.mig_enabled, l4.mig_model) == ("L4", False, "")


@pytest.mark.parametrize(
    ("product", "memory", "model"),
    [
        ("NVIDIA H100 80GB HBM3", 81559 * MiB, "H100"),
        ("NVIDIA H100 NVL", 95830 * MiB, "H100 NVL"),  # memory disagrees with the catalogue's H100
        ("NVIDIA A100-SXM4-40GB", 40960 * MiB, "A100-40GB"),
        ("NVIDIA A10", 22731 * MiB, "A10"),  # not mistaken for an A100
        ("Tesla V100-SXM2-32GB", 32510 * MiB, "V100M32"),
        ("Tesla T4", 15109 * MiB, "T4"),
        ("NVIDIA GeForce RTX 4090", 24 * GiB, "GeForce RTX 4090"),
    ],
)
def test_product_names_map_to_the_catalogue_when_memory_agrees(product, memory, model):
    assert catalogue_model(product, memory) == model


def test_no_driver_is_a_user_error_that_suggests_simulate():
    with pytest.raises(NoGpuDriver, match="--simulate dgx-h100"):
        discover(nvml=fake_pynvml([], init_fails=True))


def test_without_nvidia_ml_py_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(NoGpuDriver, match=r"no NVIDIA driver/NVML found.*--simulate"):
        discover(None)


def test_nvml_with_no_gpus_is_refused_clearly():
    with pytest.raises(NoGpuDriver, match="no GPUs"):
        discover(nvml=fake_pynvml([]))


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_builtin_profile_simulates_with_deterministic_fake_uuids(name):
    machine = discover(name)
    assert machine.gpu_count == PROFILES[name].n_gpus and machine.topology is PROFILES[name]
    assert all(g.uuid.startswith("GPU-sim-") for g in machine.gpus)
    assert len({g.uuid for g in machine.gpus}) == machine.gpu_count
    assert [g.uuid for g in discover(name).gpus] == [g.uuid for g in machine.gpus]  # stable across restarts
    assert is_simulated(machine)


def test_simulated_models_and_options():
    assert discover("dgx-h100").gpus[0].model == "H100"
    assert discover("pcie-4x-l4").gpus[0].model == "L4"
    assert discover("pcie-8gpu-2socket@L4").gpus[0].model == "L4"
    mig = discover("dgx-a100:mig")
    assert all(g.mig_enabled and g.mig_model == "a100-80gb" for g in mig.gpus)


@pytest.mark.parametrize("spec", ["dgx-h200", "pcie-4x-l4:mig", "dgx-h100@B300", "dgx-h100:fast"])
def test_bad_simulate_names_list_what_is_known(spec):
    with pytest.raises(UserError):
        discover(spec)


def test_gpu_processes_lists_pids_with_their_memory():
    nvml = fake_pynvml(
        [
            {
                "name": "NVIDIA L4",
                "total": 23034 * MiB,
                "uuid": "GPU-0",
                "processes": [(100, GiB), (101, None)],
            },
            {"name": "NVIDIA L4", "total": 23034 * MiB, "uuid": "GPU-1", "processes": []},
        ]
    )
    assert gpu_processes(nvml) == {0: {100: GiB, 101: 0}, 1: {}}
