"""Bundled shapes: parameter counts within 1 % of the published sizes, lookups, derived quantities."""

from __future__ import annotations

import pytest

from gpuslice.errors import UserError
from gpuslice.estimate.errors import UnknownModel
from gpuslice.estimate.model_shapes import BUNDLED, bundled_model


@pytest.mark.parametrize("shape", BUNDLED.values(), ids=lambda s: s.name)
def test_parameter_count_from_the_shape_is_within_1_percent_of_the_published_size(shape):
    assert shape.published_params > 0, "every bundled model carries its published size"
    assert abs(shape.parameter_count() / shape.published_params - 1) <= 0.01


@pytest.mark.parametrize("shape", [s for s in BUNDLED.values() if s.is_moe], ids=lambda s: s.name)
def test_active_parameters_of_moe_models_are_within_1_percent_of_the_published_figure(shape):
    active = shape.active_parameter_count(input_embedding=shape.published_active_includes_input_embedding)
    assert abs(active / shape.published_active_params - 1) <= 0.01


@pytest.mark.parametrize(
    ("name", "billions"),
    [("llama-3-8b", 8.03), ("llama-3-70b", 70.55), ("mistral-7b", 7.24), ("mixtral-8x7b", 46.70),
     ("qwen2.5-72b", 72.71), ("deepseek-v3", 671.03)],
)  # fmt: skip
def test_parameter_counts_match_the_counts_computed_from_the_config_fields(name, billions):
    # each count computed by hand from the model's config.json fields, to two decimals
    assert round(bundled_model(name).parameter_count() / 1e9, 2) == pytest.approx(billions, abs=0.011)


def test_dense_models_have_all_parameters_active():
    shape = bundled_model("llama-3-70b")
    assert shape.active_parameter_count() == shape.parameter_count()


def test_largest_layer_is_the_embedding_for_llama_and_a_block_for_deepseek():
    llama = bundled_model("llama-3-8b")
    assert llama.largest_layer_params() == 128_256 * 4_096
    deepseek = bundled_model("deepseek-v3")
    assert deepseek.largest_layer_params() == deepseek.layer_params(True)


@pytest.mark.parametrize("name", ["Llama-3-70B", "meta-llama/Meta-Llama-3-70B", "llama_3_70b"])
def test_lookup_accepts_case_underscores_and_the_hugging_face_id(name):
    assert bundled_model(name).name == "llama-3-70b"


def test_unknown_model_is_a_user_error_that_lists_the_known_names():
    with pytest.raises(UnknownModel) as err:
        bundled_model("llama-9-1t")
    assert isinstance(err.value, UserError)
    assert "llama-9-1t" in str(err.value)
    for name in BUNDLED:
        assert name in str(err.value)
