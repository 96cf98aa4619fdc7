"""Read a Hugging Face ``config.json`` into a ModelShape, one reader per architecture family.

Families (by ``model_type``): Llama, Mistral, Mixtral, Qwen2/Qwen3 and their MoE, Phi-3, Gemma 1/2/3,
DeepSeek V2/V3 (MoE with shared experts and leading dense layers, MLA), GPT-2, GPT-J, GPT-NeoX/Pythia,
OPT, BLOOM, Falcon (multi-query and the new decoder architecture), MPT, StarCoder2, Phi-1/2, T5,
BERT/RoBERTa and OLMo-2; a config without ``model_type`` is read as Llama's, and an unknown
``model_type`` is refused (its layout would be a guess; ``--params`` estimates from a bare count).
Multimodal configs whose language model sits under ``text_config`` are read from there. Anything
missing or of the wrong type raises MalformedModelConfig naming the file and the field; an absent
flag takes its family's default (the transformers config class's).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuslice.estimate.errors import MalformedModelConfig
from gpuslice.estimate.exact import exact_parameter_count
from gpuslice.estimate.model_shapes import MlaShape, ModelShape
from gpuslice.inputs import InvalidInput, file_kind, read_json

__all__ = ["load_hf_config", "parse_hf_config"]

_MAX_FIELD = 2**31  # no real config has a size, count or length this large; 2^63 layers is a typo
_DEFAULT_CONTEXT = 2_048  # when a config omits max_position_embeddings: a modest default, not a fact


def load_hf_config(path: str | Path) -> ModelShape:
    """The shape described by the config.json at ``path`` (a file, or a folder holding config.json).

    Where transformers and torch are installed, the parameter count is the exact one they make on the
    meta device (``estimate.exact``); the shape's ``parameter_source`` says which path was used.
    """
    path = Path(path)
    if file_kind(path) == "a folder":
        path = path / "config.json"
    try:  # binary, non-UTF-8, empty, not JSON, too deep, a number of thousands of digits: refused
        data = read_json(path, "model config", max_bytes=16 * 1024**2)
    except InvalidInput as err:
        raise MalformedModelConfig(str(err)) from None
    shape = parse_hf_config(data, source=str(path))
    exact = exact_parameter_count(data) if isinstance(data, dict) else None
    return replace(shape, exact_parameters=exact) if exact else shape


def parse_hf_config(data: Any, source: str = "config.json") -> ModelShape:
    """A ModelShape from a parsed config.json; MalformedModelConfig names the first bad field."""
    if not isinstance(data, dict):
        raise MalformedModelConfig(f"{source}: expected a JSON object, got {type(data).__name__}")
    if not _has_layers(data) and isinstance(data.get("text_config"), dict):
        data = {**data["text_config"], "_name_or_path": data.get("_name_or_path", "")}
        source = f"{source} (text_config)"
    model_type = str(data.get("model_type", "")).lower()
    if model_type and model_type not in _FAMILIES and model_type not in _LLAMA_LIKE:
        known = ", ".join(sorted({*_FAMILIES, *_LLAMA_LIKE}))
        raise MalformedModelConfig(
            f"{source}: model_type {model_type!r} is not an architecture gpuslice can count (known: "
            f"{known}); estimate from its parameter count with --params instead"
        )
    family = _FAMILIES.get(model_type, _llama_like)
    field = _Fields(data, source, _DEFAULTS.get(model_type, {}))
    layout = family(field)
    shape = ModelShape(
        name=str(data.get("_name_or_path") or _name_of(Path(source.split(" ")[0]))),
        source=source,
        architecture=model_type or "llama",
        **layout,
    )
    if shape.mla is None and not shape.head_dim and shape.hidden % shape.heads:
        raise MalformedModelConfig(
            f"{source}: hidden_size {shape.hidden} is not a multiple of num_attention_heads {shape.heads}; "
            "add head_dim to the config"
        )
    if shape.heads % shape.kv_heads:
        raise MalformedModelConfig(
            f"{source}: num_attention_heads {shape.heads} is not a multiple of num_key_value_heads "
            f"{shape.kv_heads}"
        )
    return shape


def _name_of(path: Path) -> str:
    """``models/gemma-2-9b/config.json`` → gemma-2-9b; ``configs/gemma-2-9b.json`` → gemma-2-9b."""
    return (path.parent.name if path.name == "config.json" else path.stem) or "config.json"


def _has_layers(data: dict[str, Any]) -> bool:
    return any(k in data for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"))


# -- one reader per architecture family ------------------------------------------------------------
# Each returns the ModelShape fields of a config of that family, reading the family's own field names
# and, where a field is absent, the default of its transformers config class (``_DEFAULTS``). Layouts
# follow the transformers modelling code of each family; tests/estimate compares the counts with exact
# counts made by transformers itself (scripts/make_estimator_reference.py).


def _sizes(
    f: _Fields,
    layers: str = "num_hidden_layers",
    hidden: str = "hidden_size",
    heads: str = "num_attention_heads",
) -> dict[str, Any]:
    return {
        "layers": f.positive(layers),
        "hidden": f.positive(hidden),
        "heads": f.positive(heads),
        "vocab": f.positive("vocab_size"),
        "max_context": f.positive("max_position_embeddings", default=_DEFAULT_CONTEXT),
    }


def _llama_like(f: _Fields) -> dict[str, Any]:
    """Llama, Mistral, Mixtral, Qwen2/3 (and their MoE), Phi-3, Gemma 1/2/3, DeepSeek V2/V3: RMSNorm, a
    gated MLP, rotary positions; per family a few switches (QKV bias, query/key norms, norms per layer)."""
    model_type = str(f.data.get("model_type", "")).lower()
    out = _sizes(f)
    heads = out["heads"]
    mla = _mla(f) if f.data.get("kv_lora_rank") is not None else None
    experts = f.count("num_local_experts") or f.count("n_routed_experts") or f.count("num_experts")
    layers = out["layers"]
    attention_bias = f.flag("attention_bias")
    out.update(
        kv_heads=f.positive("num_key_value_heads", default=heads),
        intermediate=f.positive("intermediate_size"),
        head_dim=0 if mla else f.count("head_dim"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        qkv_bias=model_type in _QKV_BIAS or attention_bias,
        out_bias=attention_bias and model_type not in _QKV_BIAS,
        mlp_bias=f.flag("mlp_bias"),
        norms_per_layer=4 if model_type in _FOUR_NORMS else 2,
        qk_norm=model_type in _QK_NORM,
        qk_norm_full=model_type == "olmo2",
        mla=mla,
        experts=experts,
        sliding_window=_sliding_window(f, model_type),
    )
    top_k = f.count("num_experts_per_tok")
    if top_k and not experts:
        raise MalformedModelConfig(
            f"{f.source}: num_experts_per_tok is {top_k} but the config has no experts "
            "(num_local_experts, n_routed_experts or num_experts)"
        )
    if experts and top_k > experts:
        raise MalformedModelConfig(
            f"{f.source}: num_experts_per_tok {top_k} is more than the {experts} experts a token can use"
        )
    if experts:
        out.update(
            experts_per_token=f.positive("num_experts_per_tok"),
            shared_experts=f.count("n_shared_experts"),
            moe_intermediate=f.count("moe_intermediate_size"),
            shared_intermediate=f.count("shared_expert_intermediate_size"),
            dense_layers=layers - _moe_layer_count(f, layers),
        )
    return out


def _sliding_window(f: _Fields, model_type: str) -> int:
    """The attention window of Mistral, Phi-3, Gemma-2/3 (``sliding_window``); 0 without one, or where
    the config switches it off (Qwen2's ``use_sliding_window: false``)."""
    if f.data.get("use_sliding_window") is False:
        return 0
    return f.count("sliding_window")


def _moe_layer_count(f: _Fields, layers: int) -> int:
    """How many layers hold experts: DeepSeek's first_k_dense_replace / moe_layer_freq, Qwen-MoE's
    decoder_sparse_step / mlp_only_layers; every layer otherwise (Mixtral)."""
    if "first_k_dense_replace" in f.data or "moe_layer_freq" in f.data:
        first, every = f.count("first_k_dense_replace"), f.positive("moe_layer_freq", default=1)
        return sum(1 for i in range(first, layers) if i % every == 0)
    step = f.positive("decoder_sparse_step", default=1)
    dense_only = f.data.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
        raise MalformedModelConfig(f"{f.source}: field 'mlp_only_layers' must be a list of layer numbers")
    return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)


def _gpt2(f: _Fields) -> dict[str, Any]:
    """GPT-2: learned positions, LayerNorm with bias, biases everywhere, a plain 4·h GELU MLP, tied head."""
    out = _sizes(f, "n_layer", "n_embd", "n_head")
    h = out["hidden"]
    positions = f.positive("n_positions", default=1024)
    out.update(
        kv_heads=out["heads"],
        intermediate=f.positive("n_inner", default=4 * h),
        max_context=positions,
        tied_embeddings=f.flag("tie_word_embeddings"),
        position_rows=positions,
        **_BIASED_PLAIN,
    )
    return out


def _gptj(f: _Fields) -> dict[str, Any]:
    """GPT-J: one LayerNorm per layer (attention and MLP in parallel), bias-free attention, a biased plain
    MLP, rotary positions, an untied LM head with a bias."""
    out = _sizes(f, "n_layer", "n_embd", "n_head")
    h = out["hidden"]
    out.update(
        kv_heads=out["heads"],
        intermediate=f.positive("n_inner", default=4 * h),
        max_context=f.positive("n_positions", default=2048),
        tied_embeddings=f.flag("tie_word_embeddings"),
        norm_bias=True,
        norms_per_layer=1,
        gated_mlp=False,
        mlp_bias=True,
        lm_head_bias=True,
    )
    return out


def _gpt_neox(f: _Fields) -> dict[str, Any]:
    """GPT-NeoX / Pythia: two LayerNorms, biased fused QKV and output (attention_bias), a biased plain MLP,
    rotary positions, an untied output embedding."""
    out = _sizes(f)
    bias = f.flag("attention_bias")
    out.update(
        kv_heads=out["heads"],
        intermediate=f.positive("intermediate_size"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        norm_bias=True,
        qkv_bias=bias,
        out_bias=bias,
        gated_mlp=False,
        mlp_bias=True,
    )
    return out


def _opt(f: _Fields) -> dict[str, Any]:
    """OPT: learned positions with an offset of 2 rows, biases everywhere, a plain ReLU MLP of ffn_dim,
    a final LayerNorm only with pre-norm, and (OPT-350m) an embedding narrower than the hidden size."""
    out = _sizes(f)
    h = out["hidden"]
    bias = f.flag("enable_bias")
    out.update(
        kv_heads=out["heads"],
        intermediate=f.positive("ffn_dim"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        position_rows=out["max_context"] + 2,
        norm_bias=f.flag("layer_norm_elementwise_affine"),
        qkv_bias=bias,
        out_bias=bias,
        gated_mlp=False,
        mlp_bias=bias,
        final_norm=f.flag("do_layer_norm_before"),
        embed_dim=f.positive("word_embed_proj_dim", default=h),
    )
    return out


def _bloom(f: _Fields) -> dict[str, Any]:
    """BLOOM: ALiBi (no position table), a LayerNorm on the embeddings, biases everywhere, a plain 4·h
    MLP, tied head."""
    hidden = "hidden_size" if "hidden_size" in f.data else "n_embed"
    layers = "num_hidden_layers" if "num_hidden_layers" in f.data else "n_layer"
    heads = "num_attention_heads" if "num_attention_heads" in f.data else "n_head"
    out = _sizes(f, layers, hidden, heads)
    out.update(
        kv_heads=out["heads"],
        intermediate=4 * out["hidden"],
        embedding_norm=True,
        tied_embeddings=f.flag("tie_word_embeddings"),
        **_BIASED_PLAIN,
    )
    return out


def _falcon(f: _Fields) -> dict[str, Any]:
    """Falcon: multi-query attention (Falcon-7B, one key/value head) or grouped (new decoder architecture,
    num_kv_heads); attention and MLP in parallel under one LayerNorm, or two with the new architecture."""
    layers = "num_hidden_layers" if "num_hidden_layers" in f.data else "n_layer"
    heads = "num_attention_heads" if "num_attention_heads" in f.data else "n_head"
    hidden = "hidden_size" if "hidden_size" in f.data or "n_embed" not in f.data else "n_embed"
    out = _sizes(f, layers, hidden, heads)
    new = f.flag("new_decoder_architecture")
    if new:
        kv_heads = f.positive("num_kv_heads", default=out["heads"])
        norms = f.positive("num_ln_in_parallel_attn", default=2)
    else:
        kv_heads = 1 if f.flag("multi_query") else out["heads"]
        norms = 1 if f.flag("parallel_attn") else 2
    bias = f.flag("bias")
    out.update(
        kv_heads=kv_heads,
        intermediate=f.positive("ffn_hidden_size", default=4 * out["hidden"]),
        tied_embeddings=f.flag("tie_word_embeddings"),
        norm_bias=True,
        norms_per_layer=norms,
        qkv_bias=bias,
        out_bias=bias,
        gated_mlp=False,
        mlp_bias=bias,
    )
    return out


def _mpt(f: _Fields) -> dict[str, Any]:
    """MPT: ALiBi, bias-free LayerNorms and projections (no_bias), a plain MLP of expansion_ratio·d_model."""
    out = _sizes(f, "n_layers", "d_model", "n_heads")
    bias = not f.flag("no_bias")
    out.update(
        kv_heads=out["heads"],
        intermediate=f.positive("expansion_ratio", default=4) * out["hidden"],
        max_context=f.positive("max_seq_len", default=2048),
        tied_embeddings=f.flag("tie_word_embeddings"),
        norm_bias=bias,
        qkv_bias=bias,
        out_bias=bias,
        gated_mlp=False,
        mlp_bias=bias,
    )
    return out


def _starcoder2(f: _Fields) -> dict[str, Any]:
    """StarCoder2: grouped-query attention, LayerNorms and projections with biases (use_bias), a plain
    GELU MLP, rotary positions."""
    out = _sizes(f)
    bias = f.flag("use_bias")
    out.update(
        kv_heads=f.positive("num_key_value_heads", default=out["heads"]),
        intermediate=f.positive("intermediate_size"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        norm_bias=True,
        qkv_bias=bias,
        out_bias=bias,
        gated_mlp=False,
        mlp_bias=bias,
    )
    return out


def _phi(f: _Fields) -> dict[str, Any]:
    """Phi-1/1.5/2: one LayerNorm per layer (parallel attention and MLP), biases everywhere, a plain GELU
    MLP, an untied LM head with a bias."""
    out = _sizes(f)
    out.update(
        kv_heads=f.positive("num_key_value_heads", default=out["heads"]),
        intermediate=f.positive("intermediate_size"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        norm_bias=True,
        norms_per_layer=1,
        qkv_bias=True,
        out_bias=True,
        gated_mlp=False,
        mlp_bias=True,
        lm_head_bias=True,
    )
    return out


def _t5(f: _Fields) -> dict[str, Any]:
    """T5: an encoder-decoder of bias-free projections, RMS-style norms, relative position buckets, and a
    ReLU MLP or (v1.1, Flan) a gated GELU one. transformers 5 always ties the LM head to the shared
    embeddings (T5 v1.1's ``tie_word_embeddings: false`` only turns off output scaling there), so the
    head is counted once, as it builds the model."""
    layers = f.positive("num_layers")
    projection = str(f.data.get("feed_forward_proj", "relu"))
    heads = f.positive("num_heads")
    return {
        "layers": layers,
        "hidden": f.positive("d_model"),
        "heads": heads,
        "kv_heads": heads,
        "head_dim": f.positive("d_kv"),
        "intermediate": f.positive("d_ff"),
        "vocab": f.positive("vocab_size"),
        "max_context": f.positive("n_positions", default=512),
        "tied_embeddings": True,
        "gated_mlp": projection.startswith("gated"),
        "decoder_layers": f.positive("num_decoder_layers", default=layers),
        "relative_buckets": f.positive("relative_attention_num_buckets", default=32),
    }


def _bert(f: _Fields) -> dict[str, Any]:
    """BERT and RoBERTa as AutoModel builds them: learned positions and token types, an embedding
    LayerNorm, biases everywhere, a plain GELU MLP, a pooler and no LM head."""
    out = _sizes(f)
    out.update(
        kv_heads=out["heads"],
        intermediate=f.positive("intermediate_size"),
        encoder=True,
        type_vocab=f.count("type_vocab_size"),
        position_rows=out["max_context"],
        embedding_norm=True,
        final_norm=False,
        **_BIASED_PLAIN,
    )
    return out


_BIASED_PLAIN = {"norm_bias": True, "qkv_bias": True, "out_bias": True, "gated_mlp": False, "mlp_bias": True}
_FAMILIES = {
    "gpt2": _gpt2,
    "gptj": _gptj,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "bloom": _bloom,
    "falcon": _falcon,
    "refinedweb": _falcon,
    "refinedwebmodel": _falcon,
    "mpt": _mpt,
    "starcoder2": _starcoder2,
    "phi": _phi,
    "t5": _t5,
    "bert": _bert,
    "roberta": _bert,
}
# Read by _llama_like: RMSNorm, gated MLP, rotary positions, with the per-family switches below.
_LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma", "gemma2",
    "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "olmo2",
}  # fmt: skip
_QKV_BIAS = {"qwen2", "qwen2_moe"}  # Qwen2 biases q/k/v (not the output projection)
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
_FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}  # pre and post norms around attention and the MLP
# Defaults of the transformers config classes (transformers 5.24) for the flags a config.json may leave
# out (Gemma-2's config.json omits tie_word_embeddings, whose default there is true).
_TIED = {
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gpt2",
    "opt",
    "bloom",
    "falcon",
    "mpt",
    "starcoder2",
    "t5",
}
_DEFAULTS: dict[str, dict[str, Any]] = {
    **{t: {"tie_word_embeddings": True} for t in _TIED},
    "gpt_neox": {"attention_bias": True},
    "opt": {
        "tie_word_embeddings": True,
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "do_layer_norm_before": True,
    },
    "falcon": {"tie_word_embeddings": True, "multi_query": True, "parallel_attn": True},
    "mpt": {"tie_word_embeddings": True, "no_bias": True},
    "starcoder2": {"tie_word_embeddings": True, "use_bias": True},
}


def _mla(field: _Fields) -> MlaShape:
    return MlaShape(
        kv_lora_rank=field.positive("kv_lora_rank"),
        q_lora_rank=field.count("q_lora_rank"),
        qk_nope_head_dim=field.positive("qk_nope_head_dim"),
        qk_rope_head_dim=field.positive("qk_rope_head_dim"),
        v_head_dim=field.positive("v_head_dim"),
    )


class _Fields:
    """Typed reads of config fields; every failure names the file and the field."""

    def __init__(self, data: dict[str, Any], source: str, defaults: dict[str, Any] | None = None) -> None:
        self.data = data
        self.source = source
        self.defaults = defaults or {}

    def flag(self, name: str) -> bool:
        """A boolean field; the family's default when absent or null, else False."""
        value = self.data.get(name)
        if value is None:
            return bool(self.defaults.get(name, False))
        if not isinstance(value, bool):
            raise MalformedModelConfig(f"{self.source}: field {name!r} must be true or false, got {value!r}")
        return value

    def positive(self, name: str, default: int | None = None) -> int:
        """A positive integer field; ``default`` when absent or null (0 allowed only as a default)."""
        value = self.data.get(name)
        if value is None:
            if default is None:
                raise MalformedModelConfig(
                    f"{self.source}: field {name!r} is missing; a config.json of this architecture "
                    f"({self.data.get('model_type') or 'no model_type'}) needs it"
                )
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < _MAX_FIELD:
            raise MalformedModelConfig(
                f"{self.source}: field {name!r} must be a positive integer below 2^31, got {value!r}"
            )
        return value

    def count(self, name: str) -> int:
        """A non-negative integer field that may be absent or null (then 0)."""
        value = self.data.get(name)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_FIELD:
            raise MalformedModelConfig(
                f"{self.source}: field {name!r} must be a non-negative integer, got {value!r}"
            )
        return value
