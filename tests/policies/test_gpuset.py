"""GPU-set policies: the mechanism's validation, each policy's documented choice, and exactness."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.errors import UnknownPolicy
from gpuslice.hardware.topology import build_topology
from gpuslice.hardware.topology_profiles import PROFILES, profile
from gpuslice.policies.gpuset import (
    GPUSET,
    GpuSetOps,
    GpuSetUnavailable,
    GpuSetView,
    choose_gpu_set,
    gpuset_policy,
    make_gpuset_policy,
)

ALL = range(8)


def pick(name: str, system: str, free: Sequence[int], k: int) -> tuple[int, ...]:
    choice = choose_gpu_set(make_gpuset_policy(name), profile(system), free, k)
    assert choice.fallback is None
    return choice.gpus


def test_registry_holds_ours_and_the_three_baselines():
    assert set(GPUSET) == {"exact", "besteffort", "hami", "random"}
    with pytest.raises(UnknownPolicy, match="known: besteffort, exact, hami, random"):
        gpuset_policy("best-effort")


class OnlyAName(GpuSetOps):
    name = "only-a-name"


class Raises(GpuSetOps):
    name = "raises"

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        raise RuntimeError("bug")


class TakesBusy(GpuSetOps):
    name = "takes-busy"

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        return (0,) * k


def test_a_policy_with_only_a_name_gets_the_lowest_free_gpus():
    choice = choose_gpu_set(OnlyAName(), profile("dgx1-v100"), [5, 2, 7], 2)
    assert choice.gpus == (2, 5) and choice.fallback is None


@pytest.mark.parametrize(
    ("policy", "reason"), [(Raises(), "raised RuntimeError"), (TakesBusy(), "not 2 distinct")]
)
def test_bad_advice_falls_back_to_the_lowest_free_gpus_and_says_why(policy, reason):
    choice = choose_gpu_set(policy, profile("dgx1-v100"), [3, 4, 6], 2)
    assert choice.gpus == (3, 4)
    assert reason in choice.fallback


@pytest.mark.parametrize(
    ("free", "k", "match"),
    [
        ([0, 1], 3, "asked for 3 GPUs .* 2 are free"),
        ([], 1, "every GPU of .* is busy"),
        ([0, 9], 1, "GPU 9 does not exist"),
    ],
)
def test_impossible_requests_are_user_errors(free, k, match):
    with pytest.raises(GpuSetUnavailable, match=match):
        choose_gpu_set(make_gpuset_policy("exact"), profile("dgx1-v100"), free, k)


@settings(max_examples=80, deadline=None)
@given(
    system=st.sampled_from(sorted(PROFILES)),
    busy=st.sets(st.integers(0, 7), max_size=6),
    k=st.sampled_from([1, 2, 3, 4, 8]),
    policy=st.sampled_from(sorted(GPUSET)),
)
def test_every_policy_returns_k_distinct_free_gpus_and_exact_matches_the_brute_force_optimum(
    system, busy, k, policy
):
    t = PROFILES[system]
    free = [g for g in range(t.n_gpus) if g not in busy]
    if k > len(free):
        return
    choice = choose_gpu_set(make_gpuset_policy(policy, seed=3), t, free, k)
    assert choice.fallback is None and len(choice.gpus) == k and set(choice.gpus) <= set(free)
    if policy == "exact" and k >= 2:
        assert choice.ring_bandwidth_gbps == max(t.ring_bandwidth(c) for c in combinations(free, k))


def test_exact_takes_an_nv2_pair_on_dgx1():
    gpus = pick("exact", "dgx1-v100", ALL, 2)
    assert profile("dgx1-v100").label(*gpus) == "NV2"


def test_exact_gives_a_lone_gpu_to_a_one_gpu_job_and_keeps_the_switch_quad():
    # pcie-8gpu-2socket: GPU4 is alone on socket 1; taking any of 0–3 would break the PXB quad.
    assert pick("exact", "pcie-8gpu-2socket", [0, 1, 2, 3, 4], 1) == (4,)
    assert pick("besteffort", "pcie-8gpu-2socket", [0, 1, 2, 3, 4], 1) == (0,)  # first free (§5.4)
    assert pick("hami", "pcie-8gpu-2socket", [0, 1, 2, 3, 4], 1) == (4,)  # least connected (§3.3)


def test_exact_keeps_a_job_on_one_numa_node_when_bandwidth_ties():
    assert pick("exact", "dgx-h100", ALL, 4) == (0, 1, 2, 3)
    assert pick("exact", "dgx-h100", [1, 2, 3, 4, 5, 6, 7], 4) == (4, 5, 6, 7)


# Pair points: 0–1 NV3 (310), 0–2 and 1–3 NV2 (210), the rest SYS (10). Best pair: (0, 1). Best
# partition into pairs: {0,2},{1,3} = 420 > {0,1},{2,3} = 320, so besteffort hands out (0, 2).
_SKEWED = build_topology(
    "skewed",
    [
        ["X", "NV3", "NV2", "SYS"],
        ["NV3", "X", "SYS", "NV2"],
        ["NV2", "SYS", "X", "SYS"],
        ["SYS", "NV2", "SYS", "X"],
    ],
)


def test_besteffort_returns_a_set_of_the_best_partition_not_the_best_set():
    view = GpuSetView(_SKEWED, (0, 1, 2, 3))
    assert tuple(make_gpuset_policy("besteffort").pick(view, 2)) == (0, 2)
    assert tuple(make_gpuset_policy("exact").pick(view, 2)) == (0, 1)
    assert _SKEWED.ring_bandwidth((0, 1)) == 75.0 and _SKEWED.ring_bandwidth((0, 2)) == 50.0


def test_besteffort_is_blind_to_nvswitch_and_falls_back_to_pcie_points():
    # dgx-a100: only the PCIe record scores, so a PXB pair (same switch tree) wins (§5.4).
    assert pick("besteffort", "dgx-a100", ALL, 2) == (0, 1)
    assert pick("besteffort", "dgx-a100", [1, 2, 3, 5, 6], 2) == (2, 3)


def test_besteffort_pads_when_free_gpus_do_not_divide_into_sets():
    # 5 free, sets of 2: one set is padding-only-plus-one-GPU, never half-padded sets.
    gpus = pick("besteffort", "dgx1-v100", [0, 1, 2, 3, 4], 2)
    assert profile("dgx1-v100").label(*gpus) == "NV2"


def test_hami_takes_the_highest_point_sum_and_all_gpus_when_exactly_k_are_free():
    assert pick("hami", "dgx1-v100", ALL, 2) == (2, 3)  # NV2 + PIX = 250, the best pair
    assert pick("hami", "dgx1-v100", [1, 6, 7], 3) == (1, 6, 7)


def test_random_is_reproducible_by_seed():
    t, free = profile("dgx1-v100"), list(ALL)
    a = [choose_gpu_set(make_gpuset_policy("random", seed=5), t, free, 3).gpus for _ in range(3)]
    b = [choose_gpu_set(make_gpuset_policy("random", seed=5), t, free, 3).gpus for _ in range(3)]
    assert a == b
    assert len({choose_gpu_set(make_gpuset_policy("random", seed=s), t, free, 3).gpus for s in range(20)}) > 1
