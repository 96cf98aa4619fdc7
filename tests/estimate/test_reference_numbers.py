"""Every published reference number (T1–T8; docs/references.md, "LLM memory estimator"), within 1 %.

Every case computes its figure with gpuslice's own estimator (``estimate_inference``, ``estimate_training``,
the model shapes) and compares it with the figure as published; where gpuslice's formula differs from the
publisher's by design, the documented difference is added explicitly. Each case names the published figure
and its unit as printed (accelerate and DeepSpeed print binary
units with decimal labels: "MB" is MiB, "GB" is GiB; the ZeRO paper uses decimal GB).
"""

from __future__ import annotations

import pytest
from published_estimators import accelerate_estimate

from gpuslice.estimate.hf_config import parse_hf_config
from gpuslice.estimate.inference import estimate_inference
from gpuslice.estimate.model_shapes import bundled_model
from gpuslice.estimate.training import activation_bytes_per_layer, estimate_training, model_states
from gpuslice.units import GiB, MiB, TiB

GB = 1e9


def close(ours: float, published: float) -> bool:
    return abs(ours - published) <= 0.01 * abs(published)


# -- T1: accelerate, bert-base-cased ---------------------------------------------------------------------

BERT = bundled_model("bert-base-cased")
BERT_ROWS = {r.dtype: r for r in accelerate_estimate(BERT.parameter_count(), BERT.largest_layer_params(),
                                                      BERT.buffer_bytes)}  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "largest_mib", "total_mib"),
    [("float32", 84.95, 413.18), ("float16", 42.47, 206.59), ("int8", 21.24, 103.29), ("int4", 10.62, 51.65)],
)
def test_t1_accelerate_bert_base_cased_largest_layer_and_total(dtype, largest_mib, total_mib):
    row = BERT_ROWS[dtype]
    assert close(row.largest_layer_bytes / MiB, largest_mib)
    assert close(row.total_bytes / MiB, total_mib)


def test_t1_bert_total_is_exactly_the_documented_byte_count():
    # accelerate's bert-base-cased example: 108,310,272 params × 4 B + 8,192 B int64 buffers = 413.18 MiB
    assert BERT.parameter_count() == 108_310_272
    assert BERT_ROWS["float32"].total_bytes == 108_310_272 * 4 + 8_192
    assert round(BERT_ROWS["float32"].total_bytes / MiB, 2) == 413.18


def test_t1_accelerate_bert_training_with_adam():
    assert close(BERT_ROWS["float32"].training_bytes / GiB, 1.61)
    assert close(BERT_ROWS["float16"].training_bytes / MiB, 826.36)
    assert BERT_ROWS["int8"].training_bytes is None  # the current code prints N/A


# -- T2: accelerate, idefics-80b-instruct, through gpuslice's estimator ------------------------------------
# accelerate divides the fp32 size by 2 / 4 / 8; gpuslice's int8 and int4 carry llama.cpp's Q8_0 / Q4_0
# block scales (34/32 and 18/32 B per weight), so they sit 6.25 % and 12.5 % above accelerate's ¼ and ⅛
# by design.

IDEFICS_PARAMS = round(297.12 * GiB / 4)  # the published fp32 total, as a parameter count


@pytest.mark.parametrize(
    ("dtype", "published_gib", "scale_overhead"),
    [("fp32", 297.12, 1.0), ("fp16", 148.56, 1.0), ("int8", 74.28, 34 / 32), ("int4", 37.14, 36 / 32)],
)
def test_t2_idefics_80b_weights_by_dtype_are_accelerates_ratios(dtype, published_gib, scale_overhead):
    weights = estimate_inference(IDEFICS_PARAMS, dtype=dtype).component("weights").bytes_per_gpu
    assert close(weights / GiB, published_gib * scale_overhead)


def test_t2_idefics_80b_fp32_adam_training_is_four_times_the_fp32_weights():
    est = estimate_training(IDEFICS_PARAMS, dtype="fp32")
    states = sum(est.component(k).bytes_per_gpu for k in ("weights", "gradients", "optimizer"))
    assert close(states / TiB, 1.16)


# -- T3, T4: DeepSpeed memory.rst, t5-3b (P = 2851e6, LL = 32e6), 1 node × 8 GPUs -------------------------
# gpuslice counts model states as the ZeRO paper does (2 + 2 + 12 bytes per parameter, split by stage);
# DeepSpeed's estimators count 2 bytes per parameter more (fp32 gradients: 4Ψ + 16Ψ/N for ZeRO-2, 18Ψ/N
# for ZeRO-3). Each GPU figure below is gpuslice's components plus exactly that documented difference.
# The doc's CPU figures are not compared: gpuslice estimates GPU memory only.

T5_3B = 2_851_000_000
T5_3B_LARGEST = 32_000_000


def _states(est) -> int:
    return sum(est.component(k).bytes_per_gpu for k in ("weights", "gradients", "optimizer"))


def test_t3_zero2_t5_3b_with_cpu_offload_keeps_only_the_16_bit_weights_on_the_gpu():
    est = estimate_training(T5_3B, gpus=8, zero=2)
    assert close(est.component("weights").bytes_per_gpu / GiB, 5.31)


def test_t3_zero2_t5_3b_without_offload_is_the_zero_paper_plus_deepspeeds_fp32_gradients():
    est = estimate_training(T5_3B, gpus=8, zero=2)
    assert close((_states(est) + 2 * T5_3B + 2 * T5_3B / 8) / GiB, 15.93)


def test_t4_zero3_t5_3b_offloading_the_optimizer_keeps_the_weight_shard_and_the_gathered_layer():
    est = estimate_training(T5_3B, gpus=8, zero=3)
    assert close((est.component("weights").bytes_per_gpu + 4 * T5_3B_LARGEST) / GiB, 0.78)


def test_t4_zero3_t5_3b_without_offload_is_the_zero_paper_plus_deepspeeds_fp32_gradients():
    est = estimate_training(T5_3B, gpus=8, zero=3)
    assert close((_states(est) + 2 * T5_3B / 8 + 4 * T5_3B_LARGEST) / GiB, 6.09)


# -- T5: DeepSpeed memory.rst, t5-large live model on 4 GPUs, printed as bytes >> 20 -------------------------
# The shape is built by gpuslice from t5-large's config.json (fields as published on the Hugging Face hub);
# its parameter count and largest layer must be the live model's, and its ZeRO-3 gathered layer is
# DeepSpeed's 4 × LL.

T5_LARGE_CONFIG = {
    "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": 32128, "d_model": 1024,
    "d_kv": 64, "d_ff": 4096, "num_layers": 24, "num_heads": 16, "relative_attention_num_buckets": 32,
    "feed_forward_proj": "relu", "tie_word_embeddings": True,
}  # fmt: skip
T5_LARGE = parse_hf_config(T5_LARGE_CONFIG, "t5-large")


def test_t5_large_shape_has_the_live_models_737_67m_parameters_and_32128x1024_largest_layer():
    assert T5_LARGE.parameter_count() == 737_668_096
    assert T5_LARGE.largest_layer_params() == 32128 * 1024


@pytest.mark.parametrize(
    ("on_gpu", "mib"),
    [(("gathered",), 125), (("gathered", "weights"), 477), (("gathered", "states", "fp32_gradients"), 3291)],
    ids=["offload-optimizer-and-params", "offload-optimizer", "no-offload"],
)
def test_t5_zero3_t5_large_on_4_gpus(on_gpu, mib):
    est = estimate_training(T5_LARGE, gpus=4, zero=3)
    parts = {
        "gathered": est.component("zero3_gathered_layer").bytes_per_gpu,
        "weights": est.component("weights").bytes_per_gpu,
        "states": _states(est),
        "fp32_gradients": 2 * T5_LARGE.parameter_count() // 4,
    }
    assert int(sum(parts[p] for p in on_gpu)) >> 20 == mib


# -- T6: ZeRO paper Fig. 1, Ψ = 7.5B, N = 64, K = 12 (decimal GB) ----------------------------------------


@pytest.mark.parametrize(("zero", "gb"), [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_t6_zero_paper_model_states_7_5b_on_64_gpus(zero, gb):
    states = model_states(7_500_000_000, zero=zero, dp=64)
    # the paper prints one decimal: 1.875 GB (1.3 % off 1.9) is the figure it rounds to 1.9
    assert close(states.total / GB, gb) or round(states.total / GB, 1) == gb


def test_t6_holds_through_the_training_estimate_of_a_bare_parameter_count():
    est = estimate_training(7_500_000_000, gpus=64, zero=2)
    states = sum(est.component(k).bytes_per_gpu for k in ("weights", "gradients", "optimizer"))
    assert round(states / GB, 2) == 16.64


# -- T7: bf16 KV cache per token (vLLM's layout: 2 × layers × kv_heads × head_dim × 2 B) -----------------


@pytest.mark.parametrize(
    ("model", "per_token"),
    [("llama-3-8b", 131_072), ("mistral-7b", 131_072), ("mixtral-8x7b", 131_072),
     ("llama-3-70b", 327_680), ("qwen2.5-72b", 327_680), ("deepseek-v3", 70_272)],
)  # fmt: skip
def test_t7_kv_cache_bytes_per_token_in_bf16(model, per_token):
    shape = bundled_model(model)
    assert shape.kv_cache_bytes_per_token(2) == per_token
    assert estimate_inference(shape, context=1).component("kv_cache").bytes_per_gpu == per_token


def test_t7_one_gib_of_llama_3_8b_cache_holds_8192_tokens():
    est = estimate_inference(bundled_model("llama-3-8b"), context=8_192)
    assert est.component("kv_cache").bytes_per_gpu == GiB


# -- T8: Korthikanti activations, s = 2048, b = 1, h = 4096, a = 32, L = 32 --------------------------------


@pytest.mark.parametrize(("recompute", "total_gib"), [("none", 28.5), ("selective", 8.5), ("full", 0.5)])
def test_t8_activation_memory_by_recomputation(recompute, total_gib):
    per_layer = activation_bytes_per_layer(2048, 1, 4096, 32, recompute=recompute)
    assert close(per_layer * 32 / GiB, total_gib)


def test_t8_one_layer_without_recomputation_is_0_891_gib():
    assert close(activation_bytes_per_layer(2048, 1, 4096, 32) / GiB, 0.891)
