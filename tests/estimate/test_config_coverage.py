"""What the estimator does not know it says: an unknown model_type and impossible MoE settings are
refused, BLOOM's two spellings and OLMo-2's query/key norms are counted exactly, and a sliding window
is named in the KV cache line instead of silently ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice.estimate import exact
from gpuslice.estimate.errors import MalformedModelConfig
from gpuslice.estimate.hf_config import load_hf_config, parse_hf_config
from gpuslice.estimate.inference import estimate_inference

FAMILIES = Path(__file__).parent / "configs" / "families"
REFERENCE = json.loads((FAMILIES / "reference_counts.json").read_text())["counts"]

# OLMo-2-1124-7B's config.json (allenai), the fields that decide its size.
OLMO2_7B = {
    "model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _native_formulas(monkeypatch):
    monkeypatch.setattr(exact, "transformers_available", lambda: False)


def _config(name: str) -> dict:
    return json.loads((FAMILIES / f"{name}.json").read_text())


def test_bloom_is_counted_exactly_whichever_way_its_config_spells_heads_and_layers():
    old = _config("bloom-560m")
    new = {k: v for k, v in old.items() if k not in ("n_head", "n_layer")}
    new.update(num_attention_heads=old["n_head"], num_hidden_layers=old["n_layer"])
    assert parse_hf_config(old).parameter_count() == REFERENCE["bloom-560m"]["parameters"]
    assert parse_hf_config(new).parameter_count() == REFERENCE["bloom-560m"]["parameters"]


def test_olmo2_counts_its_query_and_key_norms_over_the_whole_projections():
    shape = parse_hf_config(OLMO2_7B)
    llama = parse_hf_config({**OLMO2_7B, "model_type": "llama"})
    # q_norm (32 heads × 128) and k_norm (32 kv heads × 128) weights on each of 32 layers
    assert shape.parameter_count() - llama.parameter_count() == 262_144
    assert shape.parameter_count() == 7_298_617_344
    assert shape.parameter_source == "gpuslice formulas for olmo2"


def test_an_unknown_model_type_is_refused_with_the_known_ones_and_the_way_out():
    with pytest.raises(MalformedModelConfig) as err:
        parse_hf_config({**_config("llama-3.1-8b"), "model_type": "banana"})
    message = str(err.value)
    assert "'banana'" in message and "olmo2" in message and "--params" in message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_local_experts": 8, "num_experts_per_tok": 9}, "more than the 8 experts"),
        ({"num_local_experts": 0, "num_experts_per_tok": 2}, "has no experts"),
        ({"num_hidden_layers": 2**63}, r"below 2\^31"),
    ],
)
def test_impossible_sizes_are_refused(change, words):
    with pytest.raises(MalformedModelConfig, match=words):
        parse_hf_config({**_config("mixtral-8x7b"), **change})


def test_a_sliding_window_is_stated_in_the_kv_cache_line_once_the_context_passes_it():
    config = {**_config("mistral-nemo-12b"), "sliding_window": 4096}
    shape = parse_hf_config(config)
    assert shape.sliding_window == 4096
    long = estimate_inference(shape, context=8192).component("kv_cache").note
    short = estimate_inference(shape, context=4096).component("kv_cache").note
    assert "4096-token sliding-window" in long and "upper bound" in long
    assert "sliding" not in short


def test_a_switched_off_window_is_no_window():
    config = {**_config("qwen2.5-7b"), "sliding_window": 4096, "use_sliding_window": False}
    assert parse_hf_config(config).sliding_window == 0


def test_a_binary_config_is_refused_by_name(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\x1f\x8b\x08\x00\xff\x00")
    with pytest.raises(MalformedModelConfig, match=r"config\.json is a binary file"):
        load_hf_config(path)
