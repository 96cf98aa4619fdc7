"""The slice that holds an estimate: the --mem value and the catalogue's GPU models and MIG profiles."""

from __future__ import annotations

from gpuslice.estimate.fit import fit_slice, mem_value
from gpuslice.hardware.gpu_models import GPU_MODELS
from gpuslice.units import GiB, MiB


def test_mem_value_rounds_up_to_a_whole_gib():
    assert mem_value(17 * GiB) == ("17GiB", 17 * GiB)
    assert mem_value(17 * GiB + 1) == ("18GiB", 18 * GiB)
    assert mem_value(1) == ("1GiB", GiB)


def test_gpu_models_are_those_whose_memory_holds_the_rounded_request_smallest_first():
    fit = fit_slice(30 * GiB)
    assert fit.mem == "30GiB"
    assert fit.gpu_models[0] == "V100M32"  # 32510 MiB, the smallest that holds 30 GiB
    assert "A10" not in fit.gpu_models and "H200" in fit.gpu_models
    assert all(GPU_MODELS[m].memory_bytes >= 30 * GiB for m in fit.gpu_models)


def test_mig_profiles_are_the_smallest_per_mig_gpu():
    fit = fit_slice(18 * GiB)  # 18 GiB = 18432 MiB: an A100-80GB 1g.20gb (19968 MiB) holds it
    assert "A100-80GB 1g.20gb" in fit.mig_profiles  # spelled as the GPU model catalogue spells GPUs
    assert "A100-40GB 3g.20gb" in fit.mig_profiles
    assert "H100-PCIe-80GB 1g.20gb" in fit.mig_profiles
    assert "H200-141GB 1g.18gb" not in fit.mig_profiles  # 16384 MiB < 18 GiB


def test_nothing_holds_a_model_larger_than_every_gpu():
    fit = fit_slice(500 * GiB)
    assert fit.gpu_models == () and fit.mig_profiles == ()


def test_multi_gpu_slices_list_gpu_models_but_no_mig_profiles():
    fit = fit_slice(20 * GiB + 5 * MiB, gpus=4)
    assert fit.gpus == 4 and fit.mem == "21GiB"
    assert fit.mig_profiles == () and fit.gpu_models
