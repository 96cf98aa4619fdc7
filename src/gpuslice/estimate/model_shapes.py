"""A transformer's shape, the parameter count it implies, and the bundled models.

The parameter count is computed from the shape, matrix by matrix, so that a shape read from any
config.json gets a count without downloading weights. The layout fields (norm kind and count, biases,
gated or plain MLP, learned positions, embedding and final norms, LM head bias, MoE and MLA, T5's
encoder-decoder) cover the families ``hf_config`` reads; tests/estimate keeps each within 0.5 % of the
exact count transformers makes on the meta device, which ``estimate.exact`` uses instead where
transformers and torch are installed.

Bundled shapes are six popular open models, read from their Hugging Face config.json, plus bert-base-cased
(the worked example of accelerate's model-size estimator docs). Each carries its published size so that the
1 % agreement is a test, not a claim.
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

    ``experts`` 0 means a dense model. In an MoE model ``dense_layers`` layers keep a dense MLP of
    ``intermediate``; the others hold ``experts`` routed experts (``experts_per_token`` used per token)
    plus shared ones (``shared_experts`` gated MLPs of ``moe_intermediate``, or one of
    ``shared_intermediate`` with a one-output gate, as Qwen-MoE builds it).

    The layout fields describe how a family builds a layer (defaults: Llama's): the norm kind and how many
    per layer, which projections carry biases, a gated (three-matrix) or plain (two-matrix) MLP, learned
    position rows, an embedding norm, a final norm, a bias on the LM head, and an embedding width that
    differs from the hidden size (OPT-350m projects in and out).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # GQA: key/value heads; ``heads`` for multi-head, 1 for multi-query attention
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
    encoder: bool = False  # BERT: a pooler instead of an LM head, no KV cache
    type_vocab: int = 0  # encoder token types
    buffer_bytes: int = 0  # non-parameter tensors accelerate counts (BERT: int64 position/type ids)
    published_params: float = 0.0  # the size its authors state, for the 1 % test; 0: none
    published_active_params: float = 0.0
    published_active_includes_input_embedding: bool = True  # DeepSeek publishes 36.6B without it
    source: str = field(default="", compare=False)
    # -- layout (Llama's by default) -----------------------------------------------------------------
    architecture: str = "llama"  # the config's model_type, shown with the count
    norm_bias: bool = False  # LayerNorm with a bias (2·h); False: RMSNorm or a bias-free LayerNorm (h)
    norms_per_layer: int = 2  # 1 for parallel attention+MLP (GPT-J, Falcon-7B, Phi-2), 4 for Gemma-2/3
    qk_norm: bool = False  # a norm of head_dim on queries and on keys (Qwen3, Gemma-3)
    qk_norm_full: bool = False  # OLMo-2: a norm over the whole query and the whole key projection
    sliding_window: int = 0  # tokens some or all layers attend to (Mistral, Phi-3, Gemma-2/3); 0: none
    out_bias: bool = False  # the attention output projection has a bias
    gated_mlp: bool = True  # gate, up, down (SwiGLU/GeGLU); False: up and down (GELU/ReLU)
    mlp_bias: bool = False
    position_rows: int = 0  # learned absolute positions (GPT-2, OPT, BERT); 0: rotary or ALiBi
    embedding_norm: bool = False  # a norm right after the embeddings (BLOOM, BERT)
    final_norm: bool = True
    lm_head_bias: bool = False  # GPT-J and Phi-2
    embed_dim: int = 0  # 0: hidden; OPT-350m embeds in 512 and projects to and from the hidden size
    shared_intermediate: int = 0  # Qwen-MoE's one shared expert, with a one-output gate
    decoder_layers: int = 0  # > 0: a T5 encoder-decoder with ``layers`` encoder and these decoder blocks
    relative_buckets: int = 0  # T5: relative position buckets, per head, in each stack's first block
    exact_parameters: int = 0  # set when transformers counted the model on the meta device

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def parameter_source(self) -> str:
        """Which path produced ``parameter_count()``, as the output says it."""
        if self.exact_parameters:
            return "exact count: transformers on the meta device"
        return f"gpuslice formulas for {self.architecture}"

    # -- parameter counts, one block at a time -------------------------------------------------------

    def _norm(self) -> int:
        return 2 * self.hidden if self.norm_bias else self.hidden

    def attention_params(self) -> int:
        """One layer's attention projections (and their biases and query/key norms)."""
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
        biases = (q_width + 2 * kv_width if self.qkv_bias else 0) + (h if self.out_bias else 0)
        norms = (2 * self.head_size if self.qk_norm else 0) + (q_width + kv_width if self.qk_norm_full else 0)
        return weights + biases + norms

    def dense_mlp_params(self) -> int:
        h, i = self.hidden, self.intermediate
        if self.gated_mlp:
            return 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        return 2 * h * i + (i + h if self.mlp_bias else 0)

    def moe_mlp_params(self, experts: int) -> int:
        """An MoE layer's MLP with ``experts`` routed experts present, plus shared experts and the router."""
        one = 3 * self.hidden * (self.moe_intermediate or self.intermediate)
        shared = self.shared_experts * one
        if self.shared_intermediate:
            shared += 3 * self.hidden * self.shared_intermediate + self.hidden  # expert and its gate
        return experts * one + shared + self.hidden * self.experts

    def layer_params(self, moe: bool, experts: int | None = None) -> int:
        mlp = self.moe_mlp_params(self.experts if experts is None else experts) if moe else None
        return (
            self.attention_params()
            + (mlp if mlp is not None else self.dense_mlp_params())
            + self.norms_per_layer * self._norm()
        )

    def embedding_params(self) -> int:
        """Input embeddings, learned positions (and token types), the embedding norm, OPT's projection."""
        width = self.embed_dim or self.hidden
        table = self.vocab * width + (self.position_rows + self.type_vocab) * self.hidden
        project_in = width * self.hidden if width != self.hidden else 0
        return table + project_in + (self._norm() if self.embedding_norm else 0)

    def head_params(self) -> int:
        """After the last layer: final norm and LM head (decoder) or pooler (encoder)."""
        if self.encoder:
            return self.hidden * self.hidden + self.hidden
        width = self.embed_dim or self.hidden
        project_out = self.hidden * width if width != self.hidden else 0
        head = 0 if self.tied_embeddings else self.vocab * width
        return (
            (self._norm() if self.final_norm else 0)
            + project_out
            + head
            + (self.vocab if self.lm_head_bias else 0)
        )

    def _t5_parameter_count(self) -> int:
        """T5: shared embeddings; encoder blocks (self-attention, MLP, two norms), decoder blocks (self- and
        cross-attention, MLP, three norms), relative position buckets in each stack's first block, a final
        norm per stack, and an LM head unless tied."""
        d, inner = self.hidden, self.heads * self.head_size
        attention = 4 * d * inner
        mlp = (3 if self.gated_mlp else 2) * d * self.intermediate
        encoder = self.layers * (attention + mlp + 2 * d)
        decoder = self.decoder_layers * (2 * attention + mlp + 3 * d)
        positions = 2 * self.relative_buckets * self.heads
        head = 0 if self.tied_embeddings else self.vocab * d
        return self.vocab * d + encoder + decoder + positions + 2 * d + head

    def parameter_count(self) -> int:
        """Every parameter of the model (all experts of an MoE model: they all stay resident in GPU memory).

        The exact count from transformers when one was made, else the formulas above.
        """
        if self.exact_parameters:
            return self.exact_parameters
        if self.decoder_layers:
            return self._t5_parameter_count()
        dense = self.layers - self.moe_layers
        blocks = dense * self.layer_params(False) + self.moe_layers * self.layer_params(True)
        return self.embedding_params() + blocks + self.head_params()

    def active_parameter_count(self, input_embedding: bool = True) -> int:
        """Parameters one token passes through (MoE: routed experts per token, shared ones, the router)."""
        if not self.is_moe:
            total = self.parameter_count()
            return total if input_embedding else total - self.vocab * (self.embed_dim or self.hidden)
        dense = self.layers - self.moe_layers
        blocks = dense * self.layer_params(False)
        blocks += self.moe_layers * self.layer_params(True, self.experts_per_token)
        embedding = self.embedding_params() if input_embedding else 0
        return embedding + blocks + self.head_params()

    def largest_layer_params(self) -> int:
        """The largest module that is gathered or placed whole: the embedding table or one layer.

        accelerate reports this as "largest layer" (accelerate ``estimate-memory``; for bert, its word
        embedding) and DeepSpeed's ZeRO-3 estimator needs it as LL
        (``estimate_zero3_model_states_mem_needs``).
        """
        layer = self.layer_params(self.is_moe)
        return max(self.vocab * (self.embed_dim or self.hidden), layer)

    @property
    def kv_layers(self) -> int:
        """Layers whose keys and values are cached per generated token (T5: the decoder's)."""
        return self.decoder_layers or self.layers

    def kv_cache_bytes_per_token(self, dtype_bytes: float) -> float:
        """Key/value cache per token: 2 × layers × kv_heads × head_dim × bytes (multi-query: kv_heads 1).

        MLA caches one latent per layer instead, kv_lora_rank + qk_rope_head_dim values shared by keys
        and values (DeepSeek-V2 paper, table 1; vLLM and SGLang cache it so). An encoder caches nothing.
        """
        if self.encoder:
            return 0.0
        if self.mla is not None:
            return self.layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * dtype_bytes
        return 2 * self.kv_layers * self.kv_heads * self.head_size * dtype_bytes


def _llama3(
    name: str, layers: int, hidden: int, heads: int, intermediate: int, published: float
) -> ModelShape:
    return ModelShape(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=8, intermediate=intermediate,
        vocab=128_256, max_context=8_192, published_params=published,
        source="meta-llama/Meta-Llama-3 config.json; size from the Meta model card",
    )  # fmt: skip


# Shapes: each model's Hugging Face config.json. Published sizes: the model cards and announcements;
# bert-base-cased's is the exact count of accelerate's model-size estimator docs (413.18 MiB in fp32).
BUNDLED: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _llama3("llama-3-8b", 32, 4_096, 32, 14_336, 8.0e9),
        _llama3("llama-3-70b", 80, 8_192, 64, 28_672, 70.0e9),
        ModelShape(
            name="mistral-7b", layers=32, hidden=4_096, heads=32, kv_heads=8, intermediate=14_336,
            vocab=32_000, max_context=32_768, published_params=7.3e9, architecture="mistral",
            source="mistralai/Mistral-7B-v0.1 config.json; 7.3B from Mistral's announcement",
        ),
        ModelShape(
            name="mixtral-8x7b", layers=32, hidden=4_096, heads=32, kv_heads=8, intermediate=14_336,
            vocab=32_000, max_context=32_768, experts=8, experts_per_token=2, architecture="mixtral",
            published_params=46.7e9, published_active_params=12.9e9,
            source="mistralai/Mixtral-8x7B-v0.1 config.json; Mistral's announced totals",
        ),
        ModelShape(
            name="qwen2.5-72b", layers=80, hidden=8_192, heads=64, kv_heads=8, intermediate=29_568,
            vocab=152_064, max_context=131_072, qkv_bias=True, published_params=72.7e9, architecture="qwen2",
            source="Qwen/Qwen2.5-72B config.json (QKV bias); 72.7B from the model card",
        ),
        ModelShape(
            # Main model only: the multi-token-prediction module (11.5B, DeepSeek-V3 README_WEIGHTS) is not
            # loaded for ordinary inference. Active: 37B in the README; README_WEIGHTS gives 36.6B without the
            # input embedding, which is the figure tested.
            name="deepseek-v3", layers=61, hidden=7_168, heads=128, kv_heads=128, intermediate=18_432,
            vocab=129_280, max_context=163_840, experts=256, experts_per_token=8, shared_experts=1,
            moe_intermediate=2_048, dense_layers=3, architecture="deepseek_v3",
            mla=MlaShape(kv_lora_rank=512, q_lora_rank=1_536, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128),
            published_params=671e9, published_active_params=36.6e9,
            published_active_includes_input_embedding=False,
            source="DeepSeek-V3 config.json, vLLM DeepseekV3Config, DeepSeek-V3 README and README_WEIGHTS",
        ),
        ModelShape(
            name="bert-base-cased", layers=12, hidden=768, heads=12, kv_heads=12, intermediate=3_072,
            vocab=28_996, max_context=512, encoder=True, type_vocab=2, buffer_bytes=8_192,
            architecture="bert", norm_bias=True, qkv_bias=True, out_bias=True, gated_mlp=False,
            mlp_bias=True, position_rows=512, embedding_norm=True, final_norm=False,
            published_params=108_310_272,
            source="accelerate's model-size estimator docs: 108,310,272 parameters + 8,192 B int64 buffers",
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
