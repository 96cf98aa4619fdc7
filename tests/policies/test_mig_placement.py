"""MIG placement policies: valid starts only, HAMi's order for first-free, headroom for keep-largest."""

from __future__ import annotations

import pytest

from gpuslice.errors import UnknownPolicy
from gpuslice.hardware.mig import MIG_GPUS, MigLayout, mig_gpu, parse_layout
from gpuslice.policies.mig_placement import MIG_PLACEMENT, headroom, mig_placement_policy

A100 = mig_gpu("a100-80gb")


@pytest.mark.parametrize("name", MIG_PLACEMENT)
@pytest.mark.parametrize("layout_text", ["", "1g.10gb@3", "4g.40gb@0, 2g.20gb@4", "3g.40gb@0, 3g.40gb@4"])
def test_every_policy_returns_a_valid_start_or_none(name, layout_text):
    policy = mig_placement_policy(name)()
    layout = parse_layout(A100, layout_text)
    for profile in A100.profiles:
        start = policy.choose(layout, profile)
        if layout.placements(profile):
            assert start in layout.placements(profile)
        else:
            assert start is None


def test_first_free_starts_1g_and_3g_from_the_top_and_the_rest_from_zero():
    ff, empty = mig_placement_policy("first-free")(), MigLayout(A100)
    assert ff.choose(empty, A100.profile("1g.10gb")) == 6
    assert ff.choose(empty, A100.profile("1g.20gb")) == 6
    assert ff.choose(empty, A100.profile("3g.40gb")) == 4
    assert ff.choose(empty, A100.profile("2g.20gb")) == 0
    assert ff.choose(empty, A100.profile("4g.40gb")) == 0


def test_headroom_counts_free_starts_largest_shape_first():
    assert headroom(MigLayout(A100)) == (1, 1, 2, 3, 4, 7)
    assert headroom(parse_layout(A100, "3g.40gb@4")) == (0, 1, 1, 2, 2, 4)


def test_keep_largest_keeps_the_4g_slot_open_for_a_2g_on_an_empty_gpu():
    assert mig_placement_policy("keep-largest")().choose(MigLayout(A100), A100.profile("2g.20gb")) == 4


def test_keep_largest_puts_a_1g_next_to_an_existing_instance_rather_than_splitting_free_space():
    # 3g at 0 leaves 4–7: a 1g at 4 or 5 would kill the 2g at 4; at 6 keeps one 2g.
    layout = parse_layout(A100, "3g.40gb@0")
    assert mig_placement_policy("keep-largest")().choose(layout, A100.profile("1g.10gb")) == 6


def test_keep_largest_ties_go_to_the_highest_start():
    layout = parse_layout(A100, "4g.40gb@0, 2g.20gb@4")
    assert mig_placement_policy("keep-largest")().choose(layout, A100.profile("1g.10gb")) == 6


@pytest.mark.parametrize("key", MIG_GPUS)
def test_keep_largest_fills_a_gpu_with_seven_1g_instances(key):
    gpu, policy = MIG_GPUS[key], mig_placement_policy("keep-largest")()
    layout, one_g = MigLayout(gpu), gpu.profiles[0]
    from gpuslice.hardware.mig import MigInstance

    for _ in range(7):
        layout = layout.with_instance(MigInstance(one_g, policy.choose(layout, one_g)))
    assert policy.choose(layout, one_g) is None


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(UnknownPolicy, match="known: keep-largest, first-free, lowest-free"):
        mig_placement_policy("best")
