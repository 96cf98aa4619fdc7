"""Training memory per GPU: model states under ZeRO 0–3, activations under recomputation, CUDA context.

```text
model states (ZeRO paper, Rajbhandari et al. SC 2020; Ψ params per tensor-parallel rank, N data-parallel GPUs)
  mixed precision (bf16/fp16): weights 2Ψ, gradients 2Ψ, optimizer KΨ with K = 12 (fp32 master, m, v)
  fp32:                        weights 4Ψ, gradients 4Ψ, optimizer 8Ψ (m, v)
  stage 1 divides the optimizer by N, stage 2 also the gradients, stage 3 also the weights
zero3_gathered_layer = 4 × largest layer params (DeepSpeed's ZeRO-3 estimator, stage3.py)
activations per layer (Korthikanti et al., MLSys 2023; s seq, b micro-batch, h hidden, a heads, t tp)
  none       s·b·h·(10 + 24/t + 5·a·s/(h·t))       (= s·b·h·(34 + 5·a·s/h) at t = 1)
  selective  34·s·b·h/t
  full       2·s·b·h/t
cuda_context = 650 MiB (gpu_poor, RahulSChand/gpu_poor src/App.js)
```

Our addition beyond Korthikanti et al.: with recomputation, the backward pass rebuilds one layer at a time, so
one layer's recomputed tensors are live on top of what was stored: a whole layer without recomputation (full),
or one layer's attention scores 5·a·s²·b/t (selective). It is listed as its own component.

Known shortcuts: the activation formula is derived for GPT blocks (4h GeLU MLP, full multi-head
attention, materialised scores); SwiGLU, GQA, MoE and flash-attention models differ (the paper's own caveat).
fp32 training doubles the 16-bit activation figures. Logits and the optimizer's temporary buffers
are not counted; the request margin covers them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuslice.estimate.errors import InvalidEstimateOptions
from gpuslice.estimate.inference import CUDA_CONTEXT_BYTES, check_tensor_parallel
from gpuslice.estimate.model_shapes import ModelShape
from gpuslice.estimate.result import Component, Estimate

__all__ = [
    "RECOMPUTE",
    "TRAIN_DTYPES",
    "ModelStates",
    "activation_bytes_per_layer",
    "estimate_training",
    "model_states",
]

RECOMPUTE = ("none", "selective", "full")
# bytes per parameter: (weights, gradients, optimizer) (ZeRO paper; DeepSpeed memory.rst)
TRAIN_DTYPES: dict[str, tuple[int, int, int]] = {
    "bf16": (2, 2, 12),  # mixed precision, K = 12: fp32 master 4 + momentum 4 + variance 4
    "fp16": (2, 2, 12),
    "fp32": (4, 4, 8),  # full fp32 Adam: m 4 + v 4
}


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Per-GPU model-state bytes: weights, gradients, optimizer state."""

    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def model_states(params: int, zero: int = 0, dp: int = 1, dtype: str = "bf16") -> ModelStates:
    """Model states per GPU for ``params`` parameters under ZeRO ``zero`` over ``dp`` data-parallel GPUs.

    ZeRO paper (Rajbhandari et al., figure 1): baseline (2 + 2 + K)Ψ; stage 1 2Ψ + 2Ψ + KΨ/N; stage 2 2Ψ + (2
    + K)Ψ/N; stage 3 (2 + 2 + K)Ψ/N.
    """
    if zero not in (0, 1, 2, 3):
        raise InvalidEstimateOptions(f"--zero {zero}: ZeRO stages are 0, 1, 2 and 3")
    if dtype not in TRAIN_DTYPES:
        raise InvalidEstimateOptions(
            f"--dtype {dtype} cannot be trained here; training covers {', '.join(TRAIN_DTYPES)} "
            "(fp32 or mixed precision)"
        )
    w, g, o = TRAIN_DTYPES[dtype]
    return ModelStates(
        weights=math.ceil(w * params / (dp if zero >= 3 else 1)),
        gradients=math.ceil(g * params / (dp if zero >= 2 else 1)),
        optimizer=math.ceil(o * params / (dp if zero >= 1 else 1)),
    )


def activation_bytes_per_layer(
    seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1, recompute: str = "none"
) -> float:
    """Stored 16-bit activations of one transformer layer (Korthikanti et al., MLSys 2023, table 2)."""
    sbh = seq * micro_batch * hidden
    if recompute == "none":
        return sbh * (10 + 24 / tp + 5 * heads * seq / (hidden * tp))
    if recompute == "selective":
        return 34 * sbh / tp
    if recompute == "full":
        return 2 * sbh / tp
    raise InvalidEstimateOptions(f"--recompute {recompute!r}: use one of {', '.join(RECOMPUTE)}")


def estimate_training(
    model: ModelShape | int,
    *,
    dtype: str = "bf16",
    gpus: int = 1,
    tp: int = 1,
    zero: int = 0,
    recompute: str = "none",
    micro_batch: int = 1,
    seq_len: int | None = None,
) -> Estimate:
    """Per-GPU training memory (Adam) of ``model`` on ``gpus`` GPUs: ``tp`` split each layer, the
    remaining ``gpus / tp`` are data-parallel and share model states under ZeRO ``zero``.

    A bare parameter count gives model states and the CUDA context only. ``seq_len`` defaults to 4096
    tokens, or the model's maximum when smaller.
    """
    if gpus < 1 or tp < 1 or gpus % tp:
        raise InvalidEstimateOptions(
            f"--gpus {gpus} must be a positive multiple of --tp {tp} (data-parallel degree = gpus / tp)"
        )
    if micro_batch < 1:
        raise InvalidEstimateOptions(f"--micro-batch {micro_batch}: at least one sequence")
    dp = gpus // tp
    bare = isinstance(model, int)
    if bare and (seq_len is not None or recompute != "none" or micro_batch != 1):
        raise InvalidEstimateOptions("--seq-len, --micro-batch and --recompute need a model shape; "
                                     "--params gives model states only")  # fmt: skip
    params = model if isinstance(model, int) else model.parameter_count()
    states = model_states(math.ceil(params / tp), zero, dp, dtype)
    d = f"{dtype}, ZeRO-{zero} over {dp} data-parallel GPU{'s' if dp > 1 else ''}, tp {tp} (ZeRO paper)"
    components = [
        Component("weights", "weights", states.weights, d),
        Component("gradients", "gradients", states.gradients, d),
        Component("optimizer", "Adam optimizer state", states.optimizer, d),
    ]
    settings: dict[str, object] = {"dtype": dtype, "gpus": gpus, "tp": tp, "zero": zero}
    if isinstance(model, ModelShape):
        components += _shape_components(model, dtype, tp, zero, recompute, micro_batch, seq_len, settings)
    components.append(Component("cuda_context", "CUDA context + framework", CUDA_CONTEXT_BYTES,
                                "650 MiB fixed (gpu_poor)"))  # fmt: skip
    name = f"{params / 1e9:g}B parameters" if bare else model.name  # type: ignore[union-attr]
    active = params if isinstance(model, int) else model.active_parameter_count()
    source = "given with --params" if isinstance(model, int) else model.parameter_source
    return Estimate(model=name, mode="training", gpus=gpus, components=tuple(components),
                    settings=settings, parameters=params, active_parameters=active,
                    parameter_source=source)  # fmt: skip


def _shape_components(
    model: ModelShape, dtype: str, tp: int, zero: int, recompute: str, micro_batch: int,
    seq_len: int | None, settings: dict[str, object],
) -> list[Component]:  # fmt: skip
    check_tensor_parallel(model, tp)
    seq = min(4_096, model.max_context) if seq_len is None else seq_len
    if not 1 <= seq <= model.max_context:
        raise InvalidEstimateOptions(f"--seq-len {seq}: {model.name} takes 1 to {model.max_context} tokens")
    scale = 2 if dtype == "fp32" else 1  # Korthikanti et al. count 16-bit activations
    per_layer = activation_bytes_per_layer(seq, micro_batch, model.hidden, model.heads, tp, recompute)
    h, a, b = model.hidden, model.heads, micro_batch
    if recompute == "full":
        working = activation_bytes_per_layer(seq, b, h, a, tp, "none")
    elif recompute == "selective":
        working = 5 * a * seq * seq * b / tp
    else:
        working = 0
    settings.update({"recompute": recompute, "micro_batch": micro_batch, "seq_len": seq})
    out = [
        Component("activations", "activations", math.ceil(per_layer * model.layers * scale),
                  f"{model.layers} layers, {recompute} recomputation, s {seq} × b {b} (Korthikanti et al.)"),
    ]  # fmt: skip
    if working:
        out.append(Component("recompute_working_set", "recompute working set",
                             math.ceil(working * scale),
                             "one layer rebuilt in the backward pass (ours)"))  # fmt: skip
    if zero == 3:
        largest = math.ceil(model.largest_layer_params() / tp)
        out.append(Component("zero3_gathered_layer", "ZeRO-3 gathered layer", 4 * largest,
                             "4 × largest layer params (DeepSpeed's ZeRO-3 estimator)"))  # fmt: skip
    return out
