"""config.json parsing: dense, GQA, MoE, MLA and encoder configs; malformed files name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice.errors import UserError
from gpuslice.estimate.errors import MalformedModelConfig
from gpuslice.estimate.hf_config import load_hf_config, parse_hf_config
from gpuslice.estimate.model_shapes import bundled_model

CONFIGS = Path(__file__).parent / "configs"


@pytest.mark.parametrize(
    "name", ["llama-3-8b", "mixtral-8x7b", "deepseek-v3", "qwen2.5-72b", "bert-base-cased"]
)
def test_a_config_json_gives_the_same_parameter_count_as_the_bundled_shape(name):
    parsed = load_hf_config(CONFIGS / f"{name}.json")
    bundled = bundled_model(name)
    assert parsed.parameter_count() == bundled.parameter_count()
    assert parsed.active_parameter_count() == bundled.active_parameter_count()
    assert parsed.kv_cache_bytes_per_token(2) == bundled.kv_cache_bytes_per_token(2)


def test_gqa_key_value_heads_are_read_and_drive_the_kv_cache():
    shape = load_hf_config(CONFIGS / "llama-3-8b.json")
    assert (shape.heads, shape.kv_heads, shape.head_size) == (32, 8, 128)
    assert shape.kv_cache_bytes_per_token(2) == 131_072  # Llama-3-8B: 2 × 32 × 8 × 128 × 2 B


def test_missing_num_key_value_heads_means_full_multi_head_attention():
    data = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    del data["num_key_value_heads"]
    assert parse_hf_config(data).kv_heads == 32


def test_mixtral_experts_and_experts_per_token_are_read():
    shape = load_hf_config(CONFIGS / "mixtral-8x7b.json")
    assert (shape.experts, shape.experts_per_token, shape.moe_layers) == (8, 2, 32)


def test_deepseek_mla_shared_experts_and_leading_dense_layers_are_read():
    shape = load_hf_config(CONFIGS / "deepseek-v3.json")
    assert shape.mla is not None and shape.mla.kv_lora_rank == 512
    assert (shape.shared_experts, shape.dense_layers, shape.moe_layers) == (1, 3, 58)


def test_qwen2_gets_its_qkv_bias_and_the_name_comes_from_name_or_path():
    shape = load_hf_config(CONFIGS / "qwen2.5-72b.json")
    assert shape.qkv_bias and shape.name == "Qwen/Qwen2.5-72B"


def test_a_folder_holding_config_json_is_accepted(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "llama-3-8b.json").read_text())
    assert load_hf_config(tmp_path).parameter_count() == bundled_model("llama-3-8b").parameter_count()


def test_a_multimodal_config_is_read_from_its_text_config():
    text = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    shape = parse_hf_config({"model_type": "llava", "text_config": text, "vision_config": {}})
    assert shape.parameter_count() == bundled_model("llama-3-8b").parameter_count()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_size": None}, "'hidden_size' is missing"),
        ({"num_hidden_layers": "32"}, "'num_hidden_layers' must be a positive integer"),
        ({"vocab_size": -1}, "'vocab_size' must be a positive integer"),
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be a positive integer"),
        ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads 5"),
        ({"hidden_size": 4100}, "hidden_size 4100 is not a multiple of num_attention_heads 32"),
        ({"num_local_experts": 8}, "'num_experts_per_tok' is missing"),
        ({"first_k_dense_replace": True}, None),  # ignored: not an MoE config
    ],
)
def test_malformed_fields_are_user_errors_naming_the_file_and_the_field(tmp_path, change, field):
    data = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    for key, value in change.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    if field is None:
        assert load_hf_config(path).layers == 32
        return
    with pytest.raises(MalformedModelConfig) as err:
        load_hf_config(path)
    assert isinstance(err.value, UserError)
    assert field in str(err.value) and str(path) in str(err.value)


def test_invalid_json_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(MalformedModelConfig, match=r"config.json is not JSON \(line 3"):
        load_hf_config(path)


def test_a_config_nested_10000_deep_is_a_malformed_config_not_a_recursion_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": ' + "[" * 10_000 + "]" * 10_000 + "}")
    with pytest.raises(MalformedModelConfig, match="nests too deeply"):
        load_hf_config(path)


def test_a_config_with_a_5000_digit_integer_is_a_malformed_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(MalformedModelConfig, match="thousands of digits"):
        load_hf_config(path)


def test_a_json_list_and_a_missing_file_are_malformed_configs(tmp_path):
    with pytest.raises(MalformedModelConfig, match="expected a JSON object, got list"):
        parse_hf_config([1, 2])
    with pytest.raises(MalformedModelConfig, match="cannot read"):
        load_hf_config(tmp_path / "absent.json")
