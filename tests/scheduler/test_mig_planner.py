"""MIG planner: placements in request order, exact nvidia-smi commands, reuse/destroy of idle instances."""

from __future__ import annotations

import pytest

from gpuslice.hardware.mig import (
    MigInstance,
    MigLayout,
    MigRequestTooLarge,
    UnknownMigProfile,
    format_mask,
    mig_gpu,
    parse_layout,
)
from gpuslice.ledger import RefusalCode
from gpuslice.policies.mig_placement import MigPlacementOps, mig_placement_policy
from gpuslice.scheduler.mig_planner import PlacedRequest, Rejection, plan

A100 = mig_gpu("a100-80gb")
KEEP_LARGEST = mig_placement_policy("keep-largest")()


def test_an_empty_gpu_gets_one_pinned_create_per_request():
    result = plan(A100, ["3g.40gb", "1g.10gb"], KEEP_LARGEST, gpu_index=2)
    assert result.commands == ("nvidia-smi mig -i 2 -cgi 9:4 -C", "nvidia-smi mig -i 2 -cgi 19:3 -C")
    assert format_mask(result.after.mask) == "...#####"
    assert result.rejected == ()


def test_a_memory_request_gets_the_smallest_profile_that_fits():
    result = plan(A100, ["12GiB"], KEEP_LARGEST)
    assert result.placed[0].instance.profile.name == "1g.20gb"


def test_a_memory_request_falls_back_to_the_next_profile_when_the_smallest_cannot_be_placed():
    # 1g.20gb is capped at 4 instances; the fifth 12GiB request takes a larger profile if one fits.
    layout = parse_layout(A100, "1g.20gb@0, 1g.20gb@2")
    result = plan(A100, ["12GiB"], KEEP_LARGEST, layout)
    assert result.placed[0].instance.profile.name == "1g.20gb"
    full = parse_layout(A100, "1g.20gb@0, 1g.20gb@2, 1g.20gb@4, 1g.20gb@6")
    (rejection,) = plan(A100, ["12GiB"], KEEP_LARGEST, full).rejected
    assert rejection.code is RefusalCode.NO_MIG_SLOT and rejection.reason.startswith("no free aligned slots")


def test_what_cannot_fit_is_rejected_with_a_reason_and_leaves_the_layout_unchanged():
    result = plan(A100, ["4g.40gb", "4g.40gb"], KEEP_LARGEST)
    assert len(result.placed) == 1
    (rejection,) = result.rejected
    assert rejection.code is RefusalCode.NO_MIG_SLOT and "occupied slots ####...." in rejection.reason
    assert len(result.commands) == 1


def test_the_media_extension_cap_is_named_in_the_rejection():
    result = plan(A100, ["1g.10gb+me", "1g.10gb+me"], KEEP_LARGEST)
    (rejection,) = result.rejected
    assert rejection.code is RefusalCode.NO_MIG_SLOT and rejection.reason == "1g.10gb+me: at most 1 per GPU"


def test_an_idle_instance_of_the_right_profile_is_reused_without_commands():
    layout = parse_layout(A100, "3g.40gb@4/2:idle")
    result = plan(A100, ["3g.40gb"], KEEP_LARGEST, layout)
    assert result.placed[0].reused and result.commands == ()
    assert not result.after.instances[0].idle


def test_idle_instances_in_the_way_are_destroyed_cis_first_then_the_gpu_instance():
    layout = parse_layout(A100, "1g.10gb@2/7:idle, 1g.10gb@5/8:idle, 1g.10gb@6/9")
    result = plan(A100, ["4g.40gb"], KEEP_LARGEST, layout)
    assert result.commands == (
        "nvidia-smi mig -i 0 -dci -ci 0 -gi 7",
        "nvidia-smi mig -i 0 -dgi -gi 7",
        "nvidia-smi mig -i 0 -cgi 5:0 -C",
    )
    assert [str(i) for i in result.after.instances] == ["1g.10gb@5/8:idle", "1g.10gb@6/9", "4g.40gb@0"]


def test_busy_instances_are_never_destroyed():
    layout = parse_layout(A100, "1g.10gb@2/7")
    result = plan(A100, ["4g.40gb"], KEEP_LARGEST, layout)
    assert result.rejected and result.commands == ()


def test_a_bad_request_fails_the_whole_plan_before_anything_is_planned():
    with pytest.raises(UnknownMigProfile):
        plan(A100, ["3g.40gb", "5g.50gb"], KEEP_LARGEST)
    with pytest.raises(MigRequestTooLarge):
        plan(A100, ["1g.10gb", "200GiB"], KEEP_LARGEST)


def test_first_free_and_keep_largest_differ_where_the_docs_say_they_do():
    ff = plan(A100, ["2g.20gb"], mig_placement_policy("first-free")())
    ours = plan(A100, ["2g.20gb"], KEEP_LARGEST)
    assert ff.commands == ("nvidia-smi mig -i 0 -cgi 14:0 -C",)
    assert ours.commands == ("nvidia-smi mig -i 0 -cgi 14:4 -C",)


class _OverlappingStart(MigPlacementOps):
    name = "overlapping"

    def choose(self, layout, profile):
        return 0  # valid on an empty GPU, overlapping once slot 0 is taken


class _Crashing(MigPlacementOps):
    name = "crashing"

    def choose(self, layout, profile):
        raise RuntimeError("policy bug")


def test_a_start_that_overlaps_is_replaced_by_the_lowest_valid_start_and_counted():
    result = plan(A100, ["1g.10gb", "1g.10gb"], _OverlappingStart())
    assert [str(p.instance) for p in result.placed] == ["1g.10gb@0", "1g.10gb@1"]
    assert result.rejected == () and result.fallbacks == {"invalid": 1}


def test_a_policy_that_raises_falls_back_to_the_lowest_valid_start_and_is_counted():
    result = plan(A100, ["2g.20gb", "12GiB"], _Crashing())
    assert [str(p.instance) for p in result.placed] == ["2g.20gb@0", "1g.20gb@2"]
    assert result.fallbacks == {"exception": 2}


def test_a_policy_whose_advice_is_valid_has_no_fallbacks():
    assert plan(A100, ["3g.40gb", "1g.10gb"], KEEP_LARGEST).fallbacks == {}


def test_a_reused_instance_keeps_its_ids_and_the_next_request_is_planned_too():
    p3g = A100.profile("3g.40gb")
    idle = MigInstance(p3g, 4, gi_id=2, ci_ids=(1, 2), idle=True)
    result = plan(A100, ["3g.40gb", "1g.10gb"], KEEP_LARGEST, MigLayout(A100, (idle,)), gpu_index=3)
    busy = MigInstance(p3g, 4, gi_id=2, ci_ids=(1, 2), idle=False)
    assert result.placed[0] == PlacedRequest("3g.40gb", busy, reused=True)
    assert result.placed[1] == PlacedRequest("1g.10gb", MigInstance(A100.profile("1g.10gb"), 3))
    assert busy in result.after.instances and result.after.instances[0].idle is False
    assert (result.gpu_index, result.policy, result.before) == (3, "keep-largest", MigLayout(A100, (idle,)))


def test_a_rejected_request_names_itself_and_every_candidate_and_the_next_request_is_planned_too():
    full = parse_layout(A100, "1g.20gb@0, 1g.20gb@2, 1g.20gb@4, 1g.20gb@6")
    result = plan(A100, ["12GiB", "1g.10gb+me"], KEEP_LARGEST, full)
    assert result.rejected == (
        Rejection(
            "12GiB",
            RefusalCode.NO_MIG_SLOT,
            "no free aligned slots for 1g.20gb (starts [0, 2, 4, 6]), 2g.20gb (starts [0, 2, 4]), "
            "3g.40gb (starts [0, 4]), 4g.40gb (starts [0]), 7g.80gb (starts [0]); "
            "occupied slots ######## (slot 0 first)",
        ),
        Rejection("1g.10gb+me", RefusalCode.NO_MIG_SLOT, result.rejected[1].reason),
    )
    capped = plan(A100, ["1g.10gb+me", "1g.10gb+me", "1g.10gb"], KEEP_LARGEST)
    assert capped.rejected == (
        Rejection("1g.10gb+me", RefusalCode.NO_MIG_SLOT, "1g.10gb+me: at most 1 per GPU"),
    )
    assert [p.request for p in capped.placed] == ["1g.10gb+me", "1g.10gb"]


def test_making_room_asks_the_policy_and_counts_its_faults_once_per_question():
    layout = parse_layout(A100, "1g.10gb@2/7:idle, 1g.10gb@5/8:idle, 1g.10gb@6/9")
    assert plan(A100, ["4g.40gb"], KEEP_LARGEST, layout).fallbacks == {}
    made = plan(A100, ["4g.40gb"], _Crashing(), layout)
    # once on the layout as it is, once with the first idle instance gone (which makes room)
    assert made.fallbacks == {"exception": 2}
    assert made.placed == (PlacedRequest("4g.40gb", MigInstance(A100.profile("4g.40gb"), 0)),)
