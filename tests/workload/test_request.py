"""workload.request: what a task asks for, validated on construction."""

from __future__ import annotations

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.workload.request import MILLI_PER_GPU, Request, RequestKind


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"cpu_milli": 1000, "num_gpu": 2, "gpu_milli": 500}, "one GPU only", id="share of 2 GPUs"
        ),
        pytest.param({"cpu_milli": 1000, "num_gpu": 0, "gpu_milli": 500}, "num_gpu is 0", id="milli no GPUs"),
        pytest.param({"cpu_milli": 1000, "num_gpu": 9, "gpu_milli": 1000}, "0..8", id="nine GPUs"),
        pytest.param({"cpu_milli": 1000, "num_gpu": 1, "gpu_milli": 0}, "1..1000", id="GPU without milli"),
        pytest.param({"cpu_milli": 1000, "num_gpu": 1, "gpu_milli": 1001}, "1..1000", id="milli above 1000"),
        pytest.param({"cpu_milli": -1}, "negative", id="negative CPU"),
        pytest.param({"cpu_milli": 1, "memory_bytes": -1}, "negative", id="negative memory"),
        pytest.param({"cpu_milli": 1, "num_gpu": -1, "gpu_milli": 0}, "0..8", id="negative GPUs"),
        pytest.param({"cpu_milli": 1, "gpu_memory_bytes": 2**30}, "num_gpu is 0", id="GPU memory, no GPU"),
        pytest.param(
            {"cpu_milli": 1, "num_gpu": 1, "gpu_milli": 1000, "mig_profile": "1g.10gb"},
            "MIG instance",
            id="MIG profile with a GPU count",
        ),
        pytest.param({"cpu_milli": 1, "mig_profile": " 1g.10gb"}, "MIG instance", id="MIG profile in blanks"),
        pytest.param(
            {
                "cpu_milli": 1,
                "num_gpu": 1,
                "gpu_milli": 1000,
                "gpu_models": ("T4", "A10"),
                "excluded_gpu_models": ("T4",),
            },
            "T4",
            id="model pinned and excluded",
        ),
    ],
)
def test_request_rejects_contradictory_fields(fields: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        Request(**fields)


@pytest.mark.parametrize(
    ("request_", "kind"),
    [
        (Request(cpu_milli=1000), RequestKind.CPU_ONLY),
        (Request(cpu_milli=1000, num_gpu=1, gpu_milli=1), RequestKind.SHARING),
        (Request(cpu_milli=1000, num_gpu=1, gpu_milli=999), RequestKind.SHARING),
        (Request(cpu_milli=1000, num_gpu=1, gpu_milli=1000), RequestKind.WHOLE),
        (Request(cpu_milli=1000, num_gpu=8, gpu_milli=1000), RequestKind.WHOLE),
    ],
)
def test_request_kind_follows_gpu_count_and_share(request_: Request, kind: RequestKind) -> None:
    assert request_.kind is kind


@pytest.mark.parametrize(
    ("num_gpu", "gpu_milli", "total"), [(0, 0, 0), (1, 250, 250), (1, 1000, 1000), (4, 1000, 4000)]
)
def test_total_gpu_milli_is_gpus_times_share(num_gpu: int, gpu_milli: int, total: int) -> None:
    assert Request(cpu_milli=0, num_gpu=num_gpu, gpu_milli=gpu_milli).total_gpu_milli == total


def test_gpu_models_are_sorted_and_deduplicated() -> None:
    req = Request(
        cpu_milli=0, num_gpu=1, gpu_milli=MILLI_PER_GPU, gpu_models=("V100M32", "V100M16", "V100M32")
    )
    assert req.gpu_models == ("V100M16", "V100M32")


def test_requests_naming_the_same_models_in_any_order_are_equal_and_hash_alike() -> None:
    a = Request(cpu_milli=100, num_gpu=1, gpu_milli=500, gpu_models=("T4", "A10"))
    b = Request(cpu_milli=100, num_gpu=1, gpu_milli=500, gpu_models=("A10", "T4"))
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_request_is_frozen() -> None:
    req = Request(cpu_milli=100)
    with pytest.raises(AttributeError):
        req.cpu_milli = 200  # type: ignore[misc]


def test_request_str_names_cpu_memory_gpus_and_models() -> None:
    req = Request(cpu_milli=2000, memory_bytes=1024, num_gpu=1, gpu_milli=500, gpu_models=("T4", "A10"))
    assert str(req) == "Request(cpu=2000m, mem=1024B, 1x500m GPU on A10|T4)"
    assert str(Request(cpu_milli=10)) == "Request(cpu=10m, mem=0B, no GPU)"


def test_without_memory_keeps_the_shape_and_drops_the_memory() -> None:
    req = Request(cpu_milli=100, memory_bytes=4096, num_gpu=1, gpu_milli=500, gpu_models=("T4",))
    assert req.without_memory() == Request(cpu_milli=100, num_gpu=1, gpu_milli=500, gpu_models=("T4",))
    no_memory = Request(cpu_milli=100)
    assert no_memory.without_memory() is no_memory


def test_a_slices_milli_is_its_percent_times_ten_a_memory_only_share_one_and_neither_the_gpu() -> None:
    from gpuslice.workload.request import share_milli

    assert [share_milli(p, True) for p in (1, 30, 99, 100)] == [10, 300, 990, 1000]
    assert share_milli(0, True) == 1  # memory only: marked shared, no compute guaranteed
    assert share_milli(0, False) == 1000
    assert all(type(share_milli(p, True)) is int for p in (1, 33, 100))  # whole milli, never a float


def test_the_edges_of_a_request_are_accepted() -> None:
    """Eight GPUs (the most a node has) and a 1-milli share (what a memory-only share reserves)."""
    assert Request(cpu_milli=1, num_gpu=8, gpu_milli=1000).num_gpu == 8
    assert Request(cpu_milli=1, num_gpu=1, gpu_milli=1).gpu_milli == 1


def test_request_str_names_a_mig_profile_the_gpu_memory_and_excluded_models() -> None:
    mig = Request(cpu_milli=1, mig_profile="1g.10gb")
    assert "MIG 1g.10gb" in str(mig)
    share = Request(cpu_milli=1, num_gpu=1, gpu_milli=500, gpu_memory_bytes=1024, gpu_models=("A10",),
                    excluded_gpu_models=("T4",))  # fmt: skip
    text = str(share)
    assert "1x500m GPU with 1024B each" in text and "on A10" in text and "not on T4" in text
