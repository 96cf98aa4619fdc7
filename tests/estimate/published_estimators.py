"""accelerate's ``estimate-memory`` (huggingface/accelerate ``commands/estimate.py``), reproduced formula
for formula, so that its table can be fed gpuslice's own model shapes (parameter count, largest layer,
buffers) and compared with the published bert-base-cased figures.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AccelerateRow", "accelerate_estimate"]

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
