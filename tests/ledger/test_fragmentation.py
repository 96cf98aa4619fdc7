"""ledger.fragmentation: FGD's F_n(M), checked against hand-computed values.

Models here are ("T4", "V100M16"), so node_model 0 = T4, 1 = V100M16, 2 = CPU-only node.
Free GPU rows are padded to the ledger's 8 slots with zeros.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.ledger.fragmentation import FragmentationMeasure, node_fragmentation
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

MODELS = ("T4", "V100M16")
T4_NODE, V100_NODE, CPU_NODE = 0, 1, 2

SHARE_500 = Request(cpu_milli=4000, num_gpu=1, gpu_milli=500)
SHARE_500_V100 = Request(cpu_milli=4000, num_gpu=1, gpu_milli=500, gpu_models=("V100M16",))
WHOLE_1 = Request(cpu_milli=4000, num_gpu=1, gpu_milli=1000)
WHOLE_2 = Request(cpu_milli=8000, num_gpu=2, gpu_milli=1000)
CPU_ONLY = Request(cpu_milli=2000)


def row(*free: int) -> np.ndarray:
    return np.array(list(free) + [0] * (MAX_GPUS_PER_NODE - len(free)), dtype=np.int64)


def frag(shapes: list[Request], free: np.ndarray, cpu: int, model: int) -> float:
    target = TargetWorkload.from_requests(shapes)
    value = node_fragmentation(target, MODELS, free, np.int64(cpu), np.int64(model))
    return float(value)


@pytest.mark.parametrize(
    ("shape", "free", "cpu", "model", "expected"),
    [
        pytest.param(SHARE_500, row(1000, 300), 3000, V100_NODE, 1300, id="CPU short: all free counts"),
        pytest.param(WHOLE_2, row(1000, 300), 16000, V100_NODE, 1300, id="too few big GPUs: all free counts"),
        pytest.param(CPU_ONLY, row(1000, 300), 16000, V100_NODE, 1300, id="CPU-only shape: all free counts"),
        pytest.param(
            SHARE_500, row(1000, 300, 700), 16000, V100_NODE, 300, id="share fits: the 300 is too small"
        ),
        pytest.param(
            WHOLE_1, row(1000, 300, 700), 16000, V100_NODE, 1000, id="whole fits: 300 and 700 too small"
        ),
        pytest.param(SHARE_500, row(500, 200), 16000, V100_NODE, 200, id="exactly enough is not a fragment"),
        pytest.param(SHARE_500, row(1000, 300), 4000, V100_NODE, 300, id="exactly enough CPU: it runs"),
        pytest.param(SHARE_500_V100, row(1000, 300), 16000, T4_NODE, 1300, id="model not allowed: all free"),
        pytest.param(
            SHARE_500_V100, row(1000, 300), 16000, V100_NODE, 300, id="model allowed: too small only"
        ),
        pytest.param(SHARE_500, row(), 16000, CPU_NODE, 0, id="CPU-only node has no GPU to fragment"),
        pytest.param(SHARE_500, row(0, 0, 0, 0), 16000, V100_NODE, 0, id="full node has nothing to fragment"),
    ],
)
def test_fragmentation_of_one_shape_matches_the_hand_computed_value(
    shape: Request, free: np.ndarray, cpu: int, model: int, expected: float
) -> None:
    assert frag([shape], free, cpu, model) == pytest.approx(expected)


# Three-shape target: SHARE_500_V100 twice, WHOLE_2 once, CPU_ONLY once -> p = 0.5, 0.25, 0.25.
THREE = [SHARE_500_V100, SHARE_500_V100, WHOLE_2, CPU_ONLY]


@pytest.mark.parametrize(
    ("free", "cpu", "model", "expected"),
    [
        # share: 300 too small; 2 whole: cannot run -> 1300; CPU-only: 1300
        pytest.param(
            row(1000, 300), 16000, V100_NODE, 0.5 * 300 + 0.25 * 1300 + 0.25 * 1300, id="V100 one full"
        ),
        # share: nothing too small; 2 whole: the 700 is too small; CPU-only: 2700
        pytest.param(
            row(1000, 1000, 700), 16000, V100_NODE, 0.5 * 0 + 0.25 * 700 + 0.25 * 2700, id="V100 two full"
        ),
        # share: T4 not allowed -> 2000; 2 whole fits with nothing left over; CPU-only: 2000
        pytest.param(row(1000, 1000), 16000, T4_NODE, 0.5 * 2000 + 0.25 * 0 + 0.25 * 2000, id="T4 idle"),
        # CPU below both GPU shapes' needs: everything is a fragment for them
        pytest.param(row(1000, 1000, 700), 3000, V100_NODE, 2700, id="V100 without CPU"),
    ],
)
def test_fragmentation_of_a_target_is_the_probability_weighted_sum(
    free: np.ndarray, cpu: int, model: int, expected: float
) -> None:
    target = TargetWorkload.from_requests(THREE)
    np.testing.assert_allclose(sorted(target.probability), [0.25, 0.25, 0.5])
    assert frag(THREE, free, cpu, model) == pytest.approx(expected)


def test_an_empty_cluster_is_fragmented_by_exactly_the_cpu_only_share() -> None:
    target = TargetWorkload.from_requests(THREE)
    free = row(1000, 1000, 1000, 1000)
    value = float(node_fragmentation(target, MODELS, free, np.int64(32000), np.int64(V100_NODE)))
    assert value == pytest.approx(target.cpu_only_share * 4000)


def _random_states(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    model = rng.integers(0, 3, size=k)
    gpus = np.where(model == CPU_NODE, 0, rng.integers(1, MAX_GPUS_PER_NODE + 1, size=k))
    free = rng.choice([0, 100, 300, 500, 700, 1000], size=(k, MAX_GPUS_PER_NODE))
    free = np.where(np.arange(MAX_GPUS_PER_NODE)[None, :] < gpus[:, None], free, 0)
    cpu = rng.choice([0, 2000, 4000, 8000, 16000], size=k)
    return free.astype(np.int64), cpu.astype(np.int64), model.astype(np.int64)


def test_a_batch_of_states_gives_the_same_as_one_state_at_a_time() -> None:
    measure = FragmentationMeasure(TargetWorkload.from_requests([*THREE, SHARE_500, WHOLE_1]), MODELS)
    free, cpu, model = _random_states(np.random.default_rng(7), 40)
    batch = measure(free, cpu, model)
    assert batch.shape == (40,)
    one_by_one = [float(measure(free[k], cpu[k], model[k])) for k in range(40)]
    np.testing.assert_allclose(batch, one_by_one)
    assert len(set(one_by_one)) > 5  # the states really differ


def test_a_batch_of_variants_per_node_gives_the_same_as_one_state_at_a_time() -> None:
    measure = FragmentationMeasure(TargetWorkload.from_requests([*THREE, SHARE_500, WHOLE_1]), MODELS)
    rng = np.random.default_rng(11)
    k, v = 6, 5
    free, cpu, model = _random_states(rng, k * v)
    free, cpu, model = free.reshape(k, v, -1), cpu.reshape(k, v), model.reshape(k, v)
    batch = measure(free, cpu, model)
    assert batch.shape == (k, v)
    for i in range(k):
        for j in range(v):
            assert batch[i, j] == pytest.approx(float(measure(free[i, j], cpu[i, j], model[i, j])))


def test_node_fragmentation_is_the_one_off_form_of_the_measure() -> None:
    target = TargetWorkload.from_requests(THREE)
    assert FragmentationMeasure(target, MODELS).target is target  # what a policy file reads it by
    free, cpu, model = _random_states(np.random.default_rng(3), 10)
    np.testing.assert_allclose(
        node_fragmentation(target, MODELS, free, cpu, model),
        FragmentationMeasure(target, MODELS)(free, cpu, model),
    )


def test_a_state_measures_the_same_to_the_last_bit_whatever_is_measured_beside_it() -> None:
    """FGD floors its score: a gain of -1e-12 scores 49 where 0 scores 50. A state's F(M) that moved in
    its last bits with the batch's size made a decision depend on which other nodes were scored in the
    same call (the DRA allocator, which rebuilds its ledger every pass, parted from its offline replay)."""
    from gpuslice.sim.trace import bundled_dir, load_target_workload

    target = load_target_workload(bundled_dir() / "openb_pod_list_default.csv")  # 30 uneven shapes
    measure = FragmentationMeasure(
        target, [*MODELS, *sorted({m for s in target.shapes for m in s.gpu_models})]
    )
    free, cpu, model = _random_states(np.random.default_rng(5), 257)
    cpu = cpu * 100  # openb's shapes ask for up to 96 cores
    batch = measure(free, cpu, model)
    for k in range(257):
        assert batch[k] == measure(free[k : k + 1], cpu[k : k + 1], model[k : k + 1])[0], k
        assert batch[k] == measure(free[: k + 1], cpu[: k + 1], model[: k + 1])[k], k
