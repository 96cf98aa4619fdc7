"""The one GPU-equivalent: what a slice denies others, as named cases."""

from __future__ import annotations

import pytest

from gpuslice.units import GiB
from gpuslice.workload.equivalent import gpu_equivalent

H100 = 80 * GiB


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "expected"),
    [
        ("two whole GPUs count 2", (2, 1000), {}, 2.0),
        ("a memory-only share counts its memory fraction, not its 1 milli", (1, 1, 60 * GiB, H100), {}, 0.75),
        ("compute counts when it is the larger fraction", (1, 600, 8 * GiB, H100), {}, 0.6),
        ("memory counts when it is the larger fraction", (1, 250, 40 * GiB, H100), {}, 0.5),
        ("a compute-only share counts its compute", (1, 300, 0, 0), {}, 0.3),
        ("the same memory counts more on a smaller GPU", (1, 1, 30 * GiB, 40 * GiB), {}, 0.75),
        ("a share never counts more than its GPU", (1, 1, 2 * H100, H100), {}, 1.0),
        ("a MIG instance counts its compute slices / 7", (1,), {"mig_slices": 3}, 3 / 7),
        ("no GPU counts nothing", (0, 0), {}, 0.0),
        ("no GPU counts nothing, whatever memory it names", (0, 500, 8 * GiB, 0), {}, 0.0),
        ("whole GPUs by default", (3,), {}, 3.0),
        ("whole GPUs that name memory need no GPU size", (2, 1000, 8 * GiB, 0), {}, 2.0),
        ("a share that names only its compute counts it", (1, 300), {}, 0.3),
    ],
    ids=lambda case: case if isinstance(case, str) else "",
)
def test_gpu_equivalent(name, args, kwargs, expected):
    assert gpu_equivalent(*args, **kwargs) == pytest.approx(expected)


def test_a_share_with_memory_but_no_gpu_size_is_a_bug_not_zero():
    with pytest.raises(ValueError, match="needs its GPU's memory size"):
        gpu_equivalent(1, 1, 60 * GiB, 0)
    with pytest.raises(ValueError, match="needs its GPU's memory size"):
        gpu_equivalent(1, 1, 60 * GiB)  # no GPU size given: none assumed
    with pytest.raises(ValueError, match="needs its GPU's memory size"):
        gpu_equivalent(1, 1, 1, 0)  # one byte is memory too
