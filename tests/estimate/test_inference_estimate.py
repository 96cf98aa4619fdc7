"""Inference components: weights by dtype with scales, KV cache, activations, tensor parallelism."""

from __future__ import annotations

import pytest

from gpuslice.estimate.errors import InvalidEstimateOptions
from gpuslice.estimate.inference import CUDA_CONTEXT_BYTES, estimate_inference
from gpuslice.estimate.model_shapes import bundled_model
from gpuslice.units import MiB

LLAMA_8B = bundled_model("llama-3-8b")
LLAMA_70B = bundled_model("llama-3-70b")


@pytest.mark.parametrize(
    ("dtype", "bytes_per_param"),
    [("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("int8", 34 / 32), ("int4", 18 / 32)],
)
def test_weights_are_params_times_bytes_per_param_with_quantisation_scales(dtype, bytes_per_param):
    est = estimate_inference(LLAMA_8B, dtype=dtype)
    assert est.component("weights").bytes_per_gpu == pytest.approx(8_030_261_248 * bytes_per_param, abs=1)


def test_components_add_up_and_include_the_cuda_context():
    est = estimate_inference(LLAMA_8B)
    assert [c.key for c in est.components] == ["weights", "kv_cache", "activations", "cuda_context"]
    assert est.total_bytes_per_gpu == sum(c.bytes_per_gpu for c in est.components)
    assert est.component("cuda_context").bytes_per_gpu == CUDA_CONTEXT_BYTES == 650 * MiB


def test_kv_cache_grows_with_context_times_batch_and_fp8_halves_it():
    one = estimate_inference(LLAMA_8B, context=2048).component("kv_cache").bytes_per_gpu
    assert estimate_inference(LLAMA_8B, context=4096, batch=4).component("kv_cache").bytes_per_gpu == 8 * one
    fp8 = estimate_inference(LLAMA_8B, context=2048, kv_dtype="fp8").component("kv_cache").bytes_per_gpu
    assert fp8 * 2 == one


def test_activation_peak_is_gpu_poors_formula_and_flash_attention_drops_the_quadratic_term():
    ctx, h, heads = 4096, 4096, 32
    est = estimate_inference(LLAMA_8B, context=ctx)
    assert est.component("activations").bytes_per_gpu == (ctx * h * 5 * 2 + ctx * ctx * heads * 2)
    flash = estimate_inference(LLAMA_8B, context=ctx, flash_attention=True)
    assert flash.component("activations").bytes_per_gpu == ctx * h * 5 * 2


def test_tensor_parallel_splits_weights_and_kv_heads_across_gpus():
    one = estimate_inference(LLAMA_70B)
    four = estimate_inference(LLAMA_70B, tp=4)
    assert four.gpus == 4
    quarter = one.component("weights").bytes_per_gpu / 4
    assert four.component("weights").bytes_per_gpu == pytest.approx(quarter, abs=1)
    assert four.component("kv_cache").bytes_per_gpu * 4 == one.component("kv_cache").bytes_per_gpu


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    # 8 KV heads on 16 GPUs: each GPU keeps one head, so the cache does not shrink below 1/8
    one = estimate_inference(LLAMA_70B).component("kv_cache").bytes_per_gpu
    assert estimate_inference(LLAMA_70B, tp=16).component("kv_cache").bytes_per_gpu * 8 == one


def test_mla_latent_cache_is_not_split_by_tensor_parallelism():
    deepseek = bundled_model("deepseek-v3")
    one = estimate_inference(deepseek).component("kv_cache").bytes_per_gpu
    assert estimate_inference(deepseek, tp=8).component("kv_cache").bytes_per_gpu == one


def test_moe_models_keep_every_expert_resident():
    mixtral = bundled_model("mixtral-8x7b")
    est = estimate_inference(mixtral)
    assert est.component("weights").bytes_per_gpu == 2 * mixtral.parameter_count()
    assert est.active_parameters < est.parameters


def test_a_bare_parameter_count_gives_weights_and_context_only():
    est = estimate_inference(7_500_000_000, dtype="int4")
    assert [c.key for c in est.components] == ["weights", "cuda_context"]
    assert est.component("weights").bytes_per_gpu == pytest.approx(7.5e9 * 18 / 32, abs=1)


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        (LLAMA_70B, {"tp": 3}, "--tp 3 does not divide llama-3-70b's 64 attention heads"),
        (bundled_model("qwen2.5-72b"), {"tp": 16}, None),  # 64 heads, 8 KV heads replicated: fine
        (LLAMA_70B, {"dtype": "int3"}, "--dtype 'int3' is not a weight format; known: fp32"),
        (LLAMA_70B, {"kv_dtype": "int4"}, "--kv-dtype 'int4' is not known"),
        (LLAMA_70B, {"context": 100_000}, "takes 1 to 8192 tokens"),
        (LLAMA_70B, {"batch": 0}, "at least one sequence"),
        (7_000_000_000, {"context": 4096}, "--context needs a model shape"),
    ],
)
def test_impossible_options_are_clear_user_errors(model, kwargs, message):
    if message is None:
        assert estimate_inference(model, **kwargs).gpus == kwargs["tp"]
        return
    with pytest.raises(InvalidEstimateOptions, match=message):
        estimate_inference(model, **kwargs)
