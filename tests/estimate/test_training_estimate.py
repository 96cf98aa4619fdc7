"""Training components: model states under ZeRO 0–3, activations under recomputation, parallelism."""

from __future__ import annotations

import pytest

from gpuslice.estimate.errors import InvalidEstimateOptions
from gpuslice.estimate.model_shapes import bundled_model
from gpuslice.estimate.training import activation_bytes_per_layer, estimate_training, model_states

LLAMA_8B = bundled_model("llama-3-8b")
LLAMA_70B = bundled_model("llama-3-70b")


@pytest.mark.parametrize(
    ("zero", "expected"),
    [(0, (2, 2, 12)), (1, (2, 2, 12 / 8)), (2, (2, 14 / 8 - 12 / 8, 12 / 8)), (3, (2 / 8, 2 / 8, 12 / 8))],
)
def test_each_zero_stage_partitions_one_more_model_state(zero, expected):
    states = model_states(1_000_000, zero=zero, dp=8)
    got = (states.weights, states.gradients, states.optimizer)
    assert got == tuple(round(e * 1_000_000) for e in expected)


def test_mixed_precision_and_fp32_both_hold_16_bytes_per_parameter_before_zero():
    assert model_states(10, dtype="bf16").total == model_states(10, dtype="fp32").total == 160


def test_quantised_dtypes_cannot_be_trained():
    with pytest.raises(InvalidEstimateOptions, match="--dtype int4 cannot be trained"):
        estimate_training(LLAMA_8B, dtype="int4")


def test_tensor_parallel_activations_match_korthikanti_and_reduce_to_the_plain_formula_at_t1():
    s, b, h, a = 2048, 1, 4096, 32
    plain = s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, tp=1) == pytest.approx(plain)
    tp4 = s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4))
    assert activation_bytes_per_layer(s, b, h, a, tp=4) == pytest.approx(tp4)


def test_full_recomputation_stores_layer_inputs_and_counts_one_rebuilt_layer():
    est = estimate_training(LLAMA_8B, recompute="full", seq_len=2048)
    assert est.component("activations").bytes_per_gpu == 2 * 2048 * 4096 * 32
    assert est.component("recompute_working_set").bytes_per_gpu == round(
        activation_bytes_per_layer(2048, 1, 4096, 32)
    )


def test_no_recomputation_has_no_working_set_and_the_most_activations():
    none = estimate_training(LLAMA_8B)
    selective = estimate_training(LLAMA_8B, recompute="selective")
    assert "recompute_working_set" not in [c.key for c in none.components]
    assert none.component("activations").bytes_per_gpu > selective.component("activations").bytes_per_gpu


def test_micro_batch_scales_activations_linearly():
    one = estimate_training(LLAMA_8B, recompute="selective").component("activations").bytes_per_gpu
    four = estimate_training(LLAMA_8B, recompute="selective", micro_batch=4).component("activations")
    assert four.bytes_per_gpu == 4 * one


def test_zero3_adds_the_gathered_largest_layer_and_divides_states_by_data_parallel_gpus():
    est = estimate_training(LLAMA_70B, gpus=64, zero=3, recompute="full")
    params = LLAMA_70B.parameter_count()
    assert est.component("zero3_gathered_layer").bytes_per_gpu == 4 * LLAMA_70B.largest_layer_params()
    assert est.component("optimizer").bytes_per_gpu == pytest.approx(12 * params / 64, abs=1)


def test_tensor_parallel_training_splits_states_and_zero_works_over_the_rest():
    est = estimate_training(LLAMA_70B, gpus=16, tp=4, zero=1)
    params = LLAMA_70B.parameter_count()
    assert est.settings["tp"] == 4 and est.gpus == 16
    assert est.component("weights").bytes_per_gpu == pytest.approx(2 * params / 4, abs=1)
    assert est.component("optimizer").bytes_per_gpu == pytest.approx(12 * params / 4 / 4, abs=1)


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        (LLAMA_70B, {"gpus": 6, "tp": 4}, "--gpus 6 must be a positive multiple of --tp 4"),
        (LLAMA_70B, {"gpus": 3, "tp": 3}, "--tp 3 does not divide"),
        (LLAMA_70B, {"zero": 4}, "ZeRO stages are 0, 1, 2 and 3"),
        (LLAMA_70B, {"recompute": "some"}, "--recompute 'some'"),
        (LLAMA_70B, {"seq_len": 9000}, "takes 1 to 8192 tokens"),
        (LLAMA_70B, {"micro_batch": 0}, "at least one sequence"),
        (7_000_000_000, {"seq_len": 2048}, "need a model shape"),
    ],
)
def test_impossible_training_options_are_clear_user_errors(model, kwargs, message):
    with pytest.raises(InvalidEstimateOptions, match=message):
        estimate_training(model, **kwargs)
