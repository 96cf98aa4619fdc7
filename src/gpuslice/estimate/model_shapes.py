"""A transformer's shape, the parameter count it implies, and the bundled models.

The parameter count is computed from the shape, matrix by matrix, so that a shape read from any
config.json gets a count without downloading weights (what accelerate's ``estimate-memory`` does on the
``meta`` device, research §2.4). Three layouts are covered:

- decoder (Llama, Mistral, Qwen2, Mixtral, DeepSeek): RMSNorm, gated (SwiGLU) MLP with three matrices,
  rotary positions (no position table), optional QKV bias (Qwen2), optional MoE layers, optional
  multi-head latent attention (MLA, DeepSeek-V3), an LM head unless the embeddings are tied;
- encoder (BERT, as ``AutoModel`` builds it for accelerate): learned positions and token types, LayerNorm
  with bias, biases on every linear layer, a plain two-matrix GeLU MLP, a pooler and no LM head.

Bundled shapes are the six models of research §3 plus bert-base-cased (the accelerate reference of §2.9
T1). Each carries its published size so that the 1 % agreement is a test, not a claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.estimate.errors import UnknownModel

__all__ = ["BUNDLED", "MlaShape", "ModelShape", "bundled_model"]


@dataclass(frozen=True, slots=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V3): queries and keys/values go through low-rank latents.

    ``q_lora_rank`` 0 means queries are projected directly from the hidden state (no query latent).
    """

    kv_lora_rank: int
    q_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The architecture facts that decide memory: sizes from config.json, counts derived below.

    ``experts`` 0 means a dense model. In an MoE model the first ``dense_layers`` layers keep a dense MLP
    of ``intermediate``; the others hold ``experts`` routed experts (``experts_per_token`` used per token)
    plus ``shared_experts`` always-used ones, each a gated MLP of ``moe_intermediate``.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # GQA: key/value heads, equal to ``heads`` for full multi-head attention
    intermediate: int
    vocab: int
    max_context: int  # tokens (max_position_embeddings)
    head_dim: int = 0  # 0: hidden // heads
    tied_embeddings: bool = False
    qkv_bias: bool = False
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0  # 0: ``intermediate``
    dense_layers: int = 0
    mla: MlaShape | None = None
    encoder: bool = False  # BERT layout, see the module docstring
    type_vocab: int = 0  # encoder token types
    buffer_bytes: int = 0  # non-parameter tensors accelerate counts (BERT: int64 position/type ids)
    published_params: float = 0.0  # the size its authors state, for the 1 % test; 0: none
    published_active_params: float = 0.0
    published_active_includes_input_embedding: bool = True  # DeepSeek publishes 36.6B without it
    source: str = field(default="", compare=False)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    # -- parameter counts, one block at a time -------------------------------------------------------

    def _norm(self) -> int:
        return 2 * self.hidden if self.encoder else self.hidden  # LayerNorm has a bias; RMSNorm does not

    def attention_params(self) -> int:
        """One layer's attention projections (and their biases)."""
        h = self.hidden
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.heads * qk  # down, norm, up
            else:
                q = h * self.heads * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # down (+ shared rope key), norm
            kv += m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim)  # up to keys and values
            return q + kv + self.heads * m.v_head_dim * h
        q_width = self.heads * self.head_size
        kv_width = self.kv_heads * self.head_size
        weights = h * q_width + 2 * h * kv_width + q_width * h
        if self.encoder:
            return weights + q_width + 2 * kv_width + h  # every projection has a bias
        return weights + (q_width + 2 * kv_width if self.qkv_bias else 0)

    def dense_mlp_params(self) -> int:
        h, i = self.hidden, self.intermediate
        if self.encoder:
            return 2 * h * i + i + h  # up and down, with biases
        return 3 * h * i  # gate, up, down (SwiGLU), no biases

    def moe_mlp_params(self, experts: int) -> int:
        """An MoE layer's MLP with ``experts`` routed experts present, plus shared experts and the router."""
        one = 3 * self.hidden * (self.moe_intermediate or self.intermediate)
        return (experts + self.shared_experts) * one + self.hidden * self.experts

    def layer_params(self, moe: bool, experts: int | None = None) -> int:
        mlp = self.moe_mlp_params(self.experts if experts is None else experts) if moe else None
        return (
            self.attention_params() + (mlp if mlp is not None else self.dense_mlp_params()) + 2 * self._norm()
        )

    def embedding_params(self) -> int:
        """Input embeddings (and, for an encoder, positions, token types and the embedding LayerNorm)."""
        table = self.vocab * self.hidden
        if self.encoder:
            return table + (self.max_context + self.type_vocab) * self.hidden + self._norm()
        return table

    def head_params(self) -> int:
        """After the last layer: final norm and LM head (decoder) or pooler (encoder)."""
        if self.encoder:
            return self.hidden * self.hidden + self.hidden
        return self.hidden + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def parameter_count(self) -> int:
        """Every parameter of the model (all experts of an MoE model: they all stay resident, research §3)."""
        dense = self.layers - self.moe_layers
        blocks = dense * self.layer_params(False) + self.moe_layers * self.layer_params(True)
        return self.embedding_params() + blocks + self.head_params()

    def active_parameter_count(self, input_embedding: bool = True) -> int:
        """Parameters one token passes through (MoE: routed experts per token, shared ones, the router)."""
        dense = self.layers - self.moe_layers
        blocks = dense * self.layer_params(False)
        blocks += self.moe_layers * self.layer_params(True, self.experts_per_token)
        embedding = self.embedding_params() if input_embedding else 0
        return embedding + blocks + self.head_params()

    def largest_layer_params(self) -> int:
        """The largest module that is gathered or placed whole: the embedding table or one layer.

        accelerate reports this as "largest layer" (research §2.4, T1: bert's word embedding) and
        DeepSpeed's ZeRO-3 estimator needs it as LL (research §2.3).
        """
        layer = self.layer_params(self.is_moe)
        return max(self.vocab * self.hidden, layer)

    def kv_cache_bytes_per_token(self, dtype_bytes: float) -> float:
        """Key/value cache per token (research §2.8); MLA caches the latent; an encoder caches nothing."""
        if self.encoder:
            return 0.0
        if self.mla is not None:
            return self.layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_size * dtype_bytes


def _llama3(
    name: str, layers: int, hidden: int, heads: int, intermediate: int, published: float
) -> ModelShape:
    return ModelShape(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=8, intermediate=intermediate,
        vocab=128_256, max_context=8_192, published_params=published,
        source="research §3; meta-llama/Meta-Llama-3 config.json; size from the Meta model card",
    )  # fmt: skip


# research §3 (config.json fields) and §2.9 T1 (bert-base-cased). Published sizes: the model cards and
# announcements the research cites; bert-base-cased's is accelerate's exact count (research §2.9 T1).
BUNDLED: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _llama3("llama-3-8b", 32, 4_096, 32, 14_336, 8.0e9),
        _llama3("llama-3-70b", 80, 8_192, 64, 28_672, 70.0e9),
        ModelShape(
            name="mistral-7b", layers=32, hidden=4_096, heads=32, kv_heads=8, intermediate=14_336,
            vocab=32_000, max_context=32_768, published_params=7.3e9,
            source="research §3; mistralai/Mistral-7B-v0.1 config.json; 7.3B from Mistral's announcement",
        ),
        ModelShape(
            name="mixtral-8x7b", layers=32, hidden=4_096, heads=32, kv_heads=8, intermediate=14_336,
            vocab=32_000, max_context=32_768, experts=8, experts_per_token=2,
            published_params=46.7e9, published_active_params=12.9e9,
            source="research §3; mistralai/Mixtral-8x7B-v0.1 config.json; Mistral's announced totals",
        ),
        ModelShape(
            name="qwen2.5-72b", layers=80, hidden=8_192, heads=64, kv_heads=8, intermediate=29_568,
            vocab=152_064, max_context=131_072, qkv_bias=True, published_params=72.7e9,
            source="research §3; Qwen/Qwen2.5-72B config.json (QKV bias); 72.7B from the model card",
        ),
        ModelShape(
            # Main model only: the multi-token-prediction module (11.5B, research §3) is not loaded
            # for ordinary inference. Active: 37B in the README; README_WEIGHTS gives 36.6B without
            # the input embedding, which is the figure tested.
            name="deepseek-v3", layers=61, hidden=7_168, heads=128, kv_heads=128, intermediate=18_432,
            vocab=129_280, max_context=163_840, experts=256, experts_per_token=8, shared_experts=1,
            moe_intermediate=2_048, dense_layers=3,
            mla=MlaShape(kv_lora_rank=512, q_lora_rank=1_536, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128),
            published_params=671e9, published_active_params=36.6e9,
            published_active_includes_input_embedding=False,
            source="research §3; vLLM DeepseekV3Config, DeepSeek-V3 README and README_WEIGHTS",
        ),
        ModelShape(
            name="bert-base-cased", layers=12, hidden=768, heads=12, kv_heads=12, intermediate=3_072,
            vocab=28_996, max_context=512, encoder=True, type_vocab=2, buffer_bytes=8_192,
            published_params=108_310_272,
            source="research §2.9 T1: accelerate's count, 108,310,272 parameters + 8,192 B int64 buffers",
        ),
    )
}  # fmt: skip

# Hugging Face repository ids and other spellings people type.
_ALIASES = {
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
    "meta-llama-3-8b": "llama-3-8b",
    "meta-llama/meta-llama-3-70b": "llama-3-70b",
    "meta-llama-3-70b": "llama-3-70b",
    "mistralai/mistral-7b-v0.1": "mistral-7b",
    "mistral-7b-v0.1": "mistral-7b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "qwen/qwen2.5-72b": "qwen2.5-72b",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
}


def bundled_model(name: str) -> ModelShape:
    """The bundled shape called ``name`` (case-insensitive, HF ids accepted); UnknownModel lists them."""
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key in BUNDLED:
        return BUNDLED[key]
    raise UnknownModel(
        f"{name!r} is not a bundled model; known: {', '.join(BUNDLED)}. "
        "Or give a path to a Hugging Face config.json, or --params for a bare parameter count"
    )
