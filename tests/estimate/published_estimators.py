"""Published estimators, reproduced formula for formula, so that their reference numbers are tests.

accelerate's ``estimate-memory`` (huggingface/accelerate ``commands/estimate.py``) and DeepSpeed's ZeRO-2
/ ZeRO-3 model-state estimators (``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs`` in deepspeed ``runtime/zero/``). These are not what ``gpuslice
estimate`` prints: our training figures follow the ZeRO paper (``training.model_states``), which
DeepSpeed's ZeRO-2 estimator exceeds (4Ψ + 16Ψ/N against 2Ψ + 14Ψ/N). Keeping their formulas here pins
where the two differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.estimate.errors import InvalidEstimateOptions

__all__ = [
    "DEEPSPEED_BUFFER_FACTOR",
    "AccelerateRow",
    "ZeroEstimate",
    "accelerate_estimate",
    "deepspeed_zero2",
    "deepspeed_zero3",
]

# DeepSpeed's additional_buffer_factor default (its ZeRO memory estimators).
DEEPSPEED_BUFFER_FACTOR = 1.5
# accelerate divides the fp32 size by these (``commands/estimate.py``).
_ACCELERATE_DIVISORS = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}


@dataclass(frozen=True, slots=True)
class AccelerateRow:
    """One dtype row of accelerate's table, in bytes: largest layer, total, training with Adam."""

    dtype: str
    largest_layer_bytes: float
    total_bytes: float
    training_bytes: float | None  # None where the current code prints "N/A" (int8, int4)


def accelerate_estimate(params: int, largest_layer_params: int, buffer_bytes: int = 0) -> list[AccelerateRow]:
    """accelerate ``estimate-memory``: fp32 size = 4 B/param + buffers at their own dtype, then ÷2/4/8.

    Training (accelerate's current code): fp32 → 4 × fp32 size; float16 → 2 × fp32 size (equal to the
    older docs' 4 × dtype size); int8/int4 → N/A.
    """
    fp32_total = 4 * params + buffer_bytes
    fp32_largest = 4 * largest_layer_params
    rows = []
    for dtype, div in _ACCELERATE_DIVISORS.items():
        training = {"float32": 4 * fp32_total, "float16": 2 * fp32_total}.get(dtype)
        rows.append(AccelerateRow(dtype, fp32_largest / div, fp32_total / div, training))
    return rows


@dataclass(frozen=True, slots=True)
class ZeroEstimate:
    """DeepSpeed's model-state estimate for one configuration: bytes on CPU and per GPU."""

    cpu_bytes: float
    gpu_bytes: float


def deepspeed_zero2(
    params: int, gpus_per_node: int = 1, nodes: int = 1, cpu_offload: bool = False,
    buffer_factor: float = DEEPSPEED_BUFFER_FACTOR,
) -> ZeroEstimate:  # fmt: skip
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs``."""
    total_gpus = gpus_per_node * nodes
    if cpu_offload:
        return ZeroEstimate(params * max(4 * total_gpus, 16) * buffer_factor, 2 * params)
    return ZeroEstimate(
        params * 4 * gpus_per_node * buffer_factor, 4 * params + int(16 * params / total_gpus)
    )


def deepspeed_zero3(
    params: int, largest_layer_params: int, gpus_per_node: int = 1, nodes: int = 1,
    cpu_offload: bool = True, cpu_offload_params: bool = True, zero_init: bool = True,
    buffer_factor: float = DEEPSPEED_BUFFER_FACTOR,
) -> ZeroEstimate:  # fmt: skip
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs``: LL = largest layer, gf = 1/nodes."""
    if cpu_offload_params and not cpu_offload:
        raise InvalidEstimateOptions("offloading parameters to CPU needs the optimizer offloaded too")
    total_gpus = gpus_per_node * nodes
    gathered = 4 * largest_layer_params
    gf = 1 / nodes
    if cpu_offload and cpu_offload_params:
        cpu = params * (18 * gf if zero_init else max(4 * gpus_per_node, 18 * gf)) * buffer_factor
        return ZeroEstimate(cpu, gathered)
    if cpu_offload:
        cpu = params * (16 * gf if zero_init else max(4 * gpus_per_node, 16 * gf)) * buffer_factor
        return ZeroEstimate(cpu, gathered + int(2 * params / total_gpus))
    cpu = (largest_layer_params if zero_init else params) * 4 * gpus_per_node * buffer_factor
    return ZeroEstimate(cpu, gathered + int(18 * params / total_gpus))
