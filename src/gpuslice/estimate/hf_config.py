"""Read a Hugging Face ``config.json`` into a ModelShape (research §3 lists the fields).

Dense decoders (Llama, Mistral, Qwen2), MoE (Mixtral ``num_local_experts``, DeepSeek ``n_routed_experts``
with shared experts and leading dense layers, Qwen-MoE ``num_experts``), GQA (``num_key_value_heads``),
MLA (``kv_lora_rank``) and BERT-style encoders. Multimodal configs whose language model sits under
``text_config`` are read from there. Anything missing or of the wrong type raises MalformedModelConfig
naming the file and the field; nothing is guessed silently except the documented defaults below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuslice.estimate.errors import MalformedModelConfig
from gpuslice.estimate.model_shapes import MlaShape, ModelShape

__all__ = ["load_hf_config", "parse_hf_config"]

_ENCODERS = {"bert", "roberta"}  # BERT layout (model_shapes docstring)
_QKV_BIAS = {"qwen2", "qwen2_moe"}  # Qwen2 always biases q/k/v; research §3 ("QKV bias")
_DEFAULT_CONTEXT = 2_048  # when a config omits max_position_embeddings: a modest default, not a fact


def load_hf_config(path: str | Path) -> ModelShape:
    """The shape described by the config.json at ``path`` (a file, or a folder holding config.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise MalformedModelConfig(f"cannot read {path}: {err.strerror or err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise MalformedModelConfig(f"{path} is not valid JSON: {err.msg} at line {err.lineno}") from None
    return parse_hf_config(data, source=str(path))


def parse_hf_config(data: Any, source: str = "config.json") -> ModelShape:
    """A ModelShape from a parsed config.json; MalformedModelConfig names the first bad field."""
    if not isinstance(data, dict):
        raise MalformedModelConfig(f"{source}: expected a JSON object, got {type(data).__name__}")
    if "num_hidden_layers" not in data and isinstance(data.get("text_config"), dict):
        data = {**data["text_config"], "_name_or_path": data.get("_name_or_path", "")}
        source = f"{source} (text_config)"
    model_type = str(data.get("model_type", "")).lower()
    field = _Fields(data, source)
    layers = field.positive("num_hidden_layers")
    hidden = field.positive("hidden_size")
    heads = field.positive("num_attention_heads")
    kv_heads = field.positive("num_key_value_heads", default=heads)
    head_dim = field.count("head_dim")
    mla = _mla(field) if data.get("kv_lora_rank") is not None else None
    if mla is None and not head_dim and hidden % heads:
        raise MalformedModelConfig(
            f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
            "add head_dim to the config"
        )
    if heads % kv_heads:
        raise MalformedModelConfig(
            f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    experts = (
        field.count("num_local_experts") or field.count("n_routed_experts") or field.count("num_experts")
    )
    encoder = model_type in _ENCODERS
    return ModelShape(
        name=str(data.get("_name_or_path") or Path(source.split(" ")[0]).parent.name or "config.json"),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=field.positive("intermediate_size"),
        vocab=field.positive("vocab_size"),
        max_context=field.positive("max_position_embeddings", default=_DEFAULT_CONTEXT),
        head_dim=head_dim,
        # A missing tie_word_embeddings means False: the default of the Llama, Mistral, Mixtral, Qwen2
        # and DeepSeek config classes (transformers); an encoder has no LM head to tie.
        tied_embeddings=bool(data.get("tie_word_embeddings", False)),
        qkv_bias=model_type in _QKV_BIAS or bool(data.get("attention_bias", False)),
        experts=experts,
        experts_per_token=field.positive("num_experts_per_tok") if experts else 0,
        shared_experts=field.count("n_shared_experts") if experts else 0,
        moe_intermediate=field.count("moe_intermediate_size") if experts else 0,
        dense_layers=field.count("first_k_dense_replace") if experts else 0,
        mla=mla,
        encoder=encoder,
        type_vocab=field.count("type_vocab_size") if encoder else 0,
        source=source,
    )


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

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def positive(self, name: str, default: int | None = None) -> int:
        """A positive integer field; ``default`` when absent or null (0 allowed only as a default)."""
        value = self.data.get(name)
        if value is None:
            if default is None:
                raise MalformedModelConfig(
                    f"{self.source}: field {name!r} is missing; a transformer config.json needs "
                    "num_hidden_layers, hidden_size, num_attention_heads, intermediate_size and vocab_size"
                )
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MalformedModelConfig(
                f"{self.source}: field {name!r} must be a positive integer, got {value!r}"
            )
        return value

    def count(self, name: str) -> int:
        """A non-negative integer field that may be absent or null (then 0)."""
        value = self.data.get(name)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MalformedModelConfig(
                f"{self.source}: field {name!r} must be a non-negative integer, got {value!r}"
            )
        return value
