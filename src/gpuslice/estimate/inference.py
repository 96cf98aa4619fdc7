"""Inference memory per GPU: weights, KV cache, activation peak, CUDA context; optional tensor parallelism.

```text
weights      = params × bytes/param(dtype) / tp                           dtype sizes; llama.cpp Q8_0/Q4_0
kv_cache     = 2 × L × kv_heads/tp × head_dim × kv_bytes × context × batch  vLLM cache layout (MLA: latent)
activations  = batch × (context·h·5 + context²·heads/tp) × act_bytes      gpu_poor src/App.js
cuda_context = 650 MiB                                                    gpu_poor src/App.js
```

Known shortcuts, each small against the total: every weight is quantised alike (real int4 checkpoints
often keep embeddings in 16 bit); norms, which tensor parallelism replicates, are divided like the
matrices; the activation peak is one layer's prefill with the attention scores materialised
(``flash_attention`` drops the context² term, as fused kernels never hold the score matrix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuslice.estimate.errors import InvalidEstimateOptions
from gpuslice.estimate.model_shapes import ModelShape
from gpuslice.estimate.result import Component, Estimate
from gpuslice.units import MiB

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "KV_DTYPES",
    "WEIGHT_DTYPES",
    "WeightDtype",
    "check_tensor_parallel",
    "estimate_inference",
    "weight_dtype",
]

# gpu_poor's fixed "cuda + other" overhead (src/App.js): CUDA context, cuBLAS workspaces, allocator slack.
CUDA_CONTEXT_BYTES = 650 * MiB


@dataclass(frozen=True, slots=True)
class WeightDtype:
    """A weight format: bytes per parameter including its quantisation scales, and where that comes from."""

    name: str
    bytes_per_param: float
    note: str


WEIGHT_DTYPES: dict[str, WeightDtype] = {
    d.name: d
    for d in (
        WeightDtype("fp32", 4.0, "4 B/param"),
        WeightDtype("bf16", 2.0, "2 B/param"),
        WeightDtype("fp16", 2.0, "2 B/param"),
        # fp8 checkpoints carry one scale per tensor (or per channel): under 0.1 % of the weights.
        WeightDtype("fp8", 1.0, "1 B/param"),
        WeightDtype("int8", 34 / 32, "34 B per 32 weights, 8-bit values + one fp16 scale (llama.cpp Q8_0)"),
        WeightDtype("int4", 18 / 32, "18 B per 32 weights, 4-bit values + one fp16 scale (llama.cpp Q4_0)"),
    )
}
# KV cache element sizes (vLLM ``--kv-cache-dtype fp8`` halves the bytes of a 16-bit cache).
KV_DTYPES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def weight_dtype(name: str) -> WeightDtype:
    """The weight format called ``name``; InvalidEstimateOptions lists the known ones."""
    try:
        return WEIGHT_DTYPES[name.lower()]
    except KeyError:
        raise InvalidEstimateOptions(
            f"--dtype {name!r} is not a weight format; known: {', '.join(WEIGHT_DTYPES)}"
        ) from None


def check_tensor_parallel(shape: ModelShape, tp: int) -> None:
    """Tensor parallelism splits attention heads across GPUs: ``tp`` must divide them.

    Key/value heads (GQA) are split when ``tp`` divides them and replicated when ``tp`` is a multiple
    of them (vLLM's rule: its cache engine sizes the cache with the key/value heads per TP rank).
    """
    if tp < 1:
        raise InvalidEstimateOptions(f"--tp {tp}: the tensor-parallel degree must be 1 or more")
    if shape.heads % tp:
        raise InvalidEstimateOptions(
            f"--tp {tp} does not divide {shape.name}'s {shape.heads} attention heads; "
            f"use a divisor such as {_divisors_text(shape.heads)}"
        )
    if shape.kv_heads % tp and tp % shape.kv_heads:
        raise InvalidEstimateOptions(
            f"--tp {tp} neither divides nor is a multiple of {shape.name}'s {shape.kv_heads} key/value heads"
        )


def estimate_inference(
    model: ModelShape | int,
    *,
    dtype: str = "bf16",
    context: int | None = None,
    batch: int = 1,
    tp: int = 1,
    kv_dtype: str | None = None,
    flash_attention: bool = False,
) -> Estimate:
    """Per-GPU inference memory of ``model`` (a shape, or a bare parameter count: weights only).

    ``context`` tokens per sequence (default: 4096, or the model's maximum when smaller), ``batch``
    sequences cached at once, ``tp`` GPUs splitting every layer. ``kv_dtype`` defaults to fp32 for fp32
    weights and bf16 otherwise (quantised models compute and cache in 16 bit).
    """
    fmt = weight_dtype(dtype)
    kv_name = (kv_dtype or ("fp32" if fmt.name == "fp32" else "bf16")).lower()
    if kv_name not in KV_DTYPES:
        raise InvalidEstimateOptions(f"--kv-dtype {kv_dtype!r} is not known; known: {', '.join(KV_DTYPES)}")
    if batch < 1:
        raise InvalidEstimateOptions(f"--batch {batch}: at least one sequence")
    if isinstance(model, int):
        return _bare(model, fmt, tp, context)
    check_tensor_parallel(model, tp)
    context = min(4_096, model.max_context) if context is None else context
    if not 1 <= context <= model.max_context:
        raise InvalidEstimateOptions(
            f"--context {context}: {model.name} takes 1 to {model.max_context} tokens"
        )
    params = model.parameter_count()
    act_bytes = 4 if fmt.name == "fp32" else 2
    kv_per_token = model.kv_cache_bytes_per_token(KV_DTYPES[kv_name])
    if model.mla is None:
        kv_per_token *= max(1, model.kv_heads // tp) / model.kv_heads  # per-rank heads; replicated if tp > kv
    # MLA's latent is shared by every head, so splitting the heads leaves each GPU the whole latent.
    tokens = context * batch
    linear = context * model.hidden * 5
    scores = 0 if flash_attention else context * context * model.heads // tp
    components = (
        Component("weights", "weights", math.ceil(params * fmt.bytes_per_param / tp),
                  f"{params / 1e9:.2f}B params × {fmt.note} / tp {tp}"),
        Component("kv_cache", "KV cache", math.ceil(kv_per_token * tokens),
                  f"{kv_name}, {context} tokens × batch {batch}: 2·layers·kv_heads·head_dim·bytes per token"
                  + _window_note(model, context)),
        Component("activations", "activation peak", batch * (linear + scores) * act_bytes,
                  "batch × (ctx·h·5 + ctx²·heads/tp) × bytes (gpu_poor)"
                  + ("; no ctx² term with flash attention" if flash_attention else "")),
        Component("cuda_context", "CUDA context + framework", CUDA_CONTEXT_BYTES,
                  "650 MiB fixed (gpu_poor)"),
    )  # fmt: skip
    settings = {"dtype": fmt.name, "kv_dtype": kv_name, "context": context, "batch": batch, "tp": tp,
                "flash_attention": flash_attention}  # fmt: skip
    return Estimate(model=model.name, mode="inference", gpus=tp, components=components, settings=settings,
                    parameters=params, active_parameters=model.active_parameter_count(),
                    parameter_source=model.parameter_source)  # fmt: skip


def _bare(params: int, fmt: WeightDtype, tp: int, context: int | None) -> Estimate:
    """A bare parameter count: the weights and the CUDA context only (no shape, so no cache)."""
    if context is not None:
        raise InvalidEstimateOptions("--context needs a model shape; --params gives model states only")
    if params < 1 or tp < 1:
        raise InvalidEstimateOptions("--params and --tp must be positive")
    components = (
        Component("weights", "weights", math.ceil(params * fmt.bytes_per_param / tp),
                  f"{params / 1e9:.2f}B params × {fmt.note} / tp {tp}"),
        Component("cuda_context", "CUDA context + framework", CUDA_CONTEXT_BYTES,
                  "650 MiB fixed (gpu_poor)"),
    )  # fmt: skip
    return Estimate(model=f"{params / 1e9:g}B parameters", mode="inference", gpus=tp,
                    components=components, settings={"dtype": fmt.name, "tp": tp}, parameters=params,
                    active_parameters=params)  # fmt: skip


def _divisors_text(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 16)


def _window_note(model: ModelShape, context: int) -> str:
    """What the KV figure leaves out for a model with sliding-window attention: it caches every token of
    the context on every layer, an upper bound that a windowed cache (vLLM, transformers) undercuts."""
    if not model.sliding_window or context <= model.sliding_window:
        return ""
    return (
        f"; every token counted, though {model.sliding_window}-token sliding-window layers need keep only "
        "that many (an upper bound)"
    )
