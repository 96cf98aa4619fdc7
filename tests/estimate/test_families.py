"""Every common architecture family: gpuslice's own parameter count within 0.5 % of the exact count
transformers makes on the meta device (recorded in configs/families/reference_counts.json by
scripts/make_estimator_reference.py), and KV bytes per token = 2 × layers × kv_heads × head_dim × bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpuslice.estimate import exact
from gpuslice.estimate.hf_config import load_hf_config, parse_hf_config

FAMILIES = Path(__file__).parent / "configs" / "families"
REFERENCE = json.loads((FAMILIES / "reference_counts.json").read_text())["counts"]


@pytest.fixture(autouse=True)
def _native_formulas(monkeypatch):
    """The formulas under test, even where transformers happens to be installed."""
    monkeypatch.setattr(exact, "transformers_available", lambda: False)


def test_the_reference_covers_every_family_the_estimator_claims():
    model_types = {r["model_type"] for r in REFERENCE.values()}
    assert model_types >= {
        "llama", "mistral", "qwen2", "qwen3", "phi3", "phi", "gemma", "gemma2", "gemma3_text", "gpt2",
        "gptj", "gpt_neox", "opt", "bloom", "falcon", "mpt", "starcoder2", "t5", "bert", "roberta",
        "mixtral", "qwen2_moe", "deepseek_v2", "deepseek_v3",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_parameter_count_is_within_half_a_percent_of_transformers(name):
    shape = load_hf_config(FAMILIES / f"{name}.json")
    exact_count = REFERENCE[name]["parameters"]
    assert abs(shape.parameter_count() - exact_count) <= 0.005 * exact_count
    assert shape.parameter_source == f"gpuslice formulas for {REFERENCE[name]['model_type']}"


KV = {  # name: (layers, kv_heads, head_dim) as the config defines them
    "llama-3.1-8b": (32, 8, 128),
    "mistral-nemo-12b": (40, 8, 128),
    "gemma-2-9b": (42, 8, 256),
    "gpt2": (12, 12, 64),
    "gpt-j-6b": (28, 16, 256),
    "opt-350m": (24, 16, 64),
    "bloom-560m": (24, 16, 64),
    "falcon-7b": (32, 1, 64),  # multi-query: one key/value head
    "falcon-40b": (60, 8, 64),
    "mpt-7b": (32, 32, 128),
    "starcoder2-3b": (30, 2, 128),
    "t5-small": (6, 8, 64),  # the decoder's self-attention
    "qwen1.5-moe-a2.7b": (24, 16, 128),
}


@pytest.mark.parametrize("name", sorted(KV))
def test_kv_bytes_per_token_is_two_layers_kv_heads_head_dim_bytes(name):
    layers, kv_heads, head_dim = KV[name]
    shape = load_hf_config(FAMILIES / f"{name}.json")
    assert shape.kv_cache_bytes_per_token(2) == 2 * layers * kv_heads * head_dim * 2


def test_mla_caches_the_latent_and_the_rope_key_per_layer():
    shape = load_hf_config(FAMILIES / "deepseek-v2-lite.json")
    assert shape.kv_cache_bytes_per_token(2) == 27 * (512 + 64) * 2


def test_an_encoder_caches_nothing():
    assert load_hf_config(FAMILIES / "roberta-base.json").kv_cache_bytes_per_token(2) == 0


def test_an_absent_tie_word_embeddings_takes_the_family_default():
    gemma2 = json.loads((FAMILIES / "gemma-2-9b.json").read_text())
    assert "tie_word_embeddings" not in gemma2
    assert parse_hf_config(gemma2).tied_embeddings  # Gemma2Config's default
    llama = json.loads((FAMILIES / "llama-3.1-8b.json").read_text())
    del llama["tie_word_embeddings"]
    assert not parse_hf_config(llama).tied_embeddings  # LlamaConfig's default


def test_family_field_names_are_read():
    gpt2 = parse_hf_config(json.loads((FAMILIES / "gpt2.json").read_text()))
    assert (gpt2.layers, gpt2.hidden, gpt2.heads, gpt2.intermediate) == (12, 768, 12, 3072)
    mpt = parse_hf_config(json.loads((FAMILIES / "mpt-7b.json").read_text()))
    assert (mpt.layers, mpt.hidden, mpt.max_context) == (32, 4096, 2048)


def test_the_exact_count_is_used_and_named_when_transformers_counts(monkeypatch):
    monkeypatch.setattr("gpuslice.estimate.hf_config.exact_parameter_count", lambda data: 123_456_789)
    shape = load_hf_config(FAMILIES / "gpt2.json")
    assert shape.parameter_count() == 123_456_789
    assert shape.parameter_source == "exact count: transformers on the meta device"
    assert replace(shape, exact_parameters=0).parameter_count() == REFERENCE["gpt2"]["parameters"]


def test_without_transformers_the_exact_path_declines(monkeypatch):
    monkeypatch.undo()  # the real availability check, with torch made unimportable
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    assert exact.exact_parameter_count({"model_type": "gpt2"}) is None
