"""MIG geometry: the profile tables match NVIDIA's published ones, the bitmask model enforces alignment."""

from __future__ import annotations

import pytest

from gpuslice.errors import UserError
from gpuslice.hardware.mig import (
    MIG_GPUS,
    InvalidMigLayout,
    MigInstance,
    MigLayout,
    MigRequestTooLarge,
    UnknownMigGpu,
    UnknownMigProfile,
    compute_slices_by_name,
    format_mask,
    mig_gpu,
    parse_layout,
    resolve_request,
    slot_mask,
    smallest_profiles,
)
from gpuslice.units import GiB, MiB

A100 = mig_gpu("a100-80gb")

# nvidia-smi mig -lgipp: (ID, allowed starts, memory slices), identical on all four GPUs
PLACEMENT_TABLE = {19: ((0, 1, 2, 3, 4, 5, 6), 1), 20: ((0, 1, 2, 3, 4, 5, 6), 1), 15: ((0, 2, 4, 6), 2),
                   14: ((0, 2, 4), 2), 9: ((0, 4), 4), 5: ((0,), 4), 0: ((0,), 8)}  # fmt: skip


@pytest.mark.parametrize("key", MIG_GPUS)
def test_every_gpu_follows_the_placement_table(key):
    gpu = MIG_GPUS[key]
    assert {p.profile_id: (p.starts, p.memory_slices) for p in gpu.profiles} == PLACEMENT_TABLE


@pytest.mark.parametrize(
    ("key", "name", "pid", "mib", "sms"),
    [
        ("a100-40gb", "1g.5gb", 19, 4864, 14),
        ("a100-40gb", "7g.40gb", 0, 40192, 98),
        ("a100-80gb", "1g.20gb", 15, 19968, 14),
        ("a100-80gb", "3g.40gb", 9, 40192, 42),
        ("h100-80gb", "1g.20gb", 15, 20096, 26),
        ("h100-80gb", "7g.80gb", 0, 81152, 132),
        ("a100-80gb", "1g.10gb", 19, 9728, 14),  # -lgip 9.50 GiB
        ("a100-80gb", "7g.80gb", 0, 80896, 98),  # -lgip 79.00 GiB
        ("h100-nvl-94gb", "1g.12gb", 19, 11008, 16),  # -lgip 10.75 GiB
        ("h100-nvl-94gb", "3g.47gb", 9, 47488, 60),  # -lgip 46.38 GiB
        ("h100-nvl-94gb", "7g.94gb", 0, 95360, 132),  # -lgip 93.12 GiB
        ("h200-141gb", "1g.18gb", 19, 16384, 16),  # -lgip 16.00 GiB
        ("h200-141gb", "3g.71gb", 9, 71168, 60),  # -lgip 69.50 GiB
        ("h200-141gb", "7g.141gb", 0, 143104, 132),  # -lgip 139.75 GiB
    ],
)
def test_profile_rows_carry_the_published_lgip_figures(key, name, pid, mib, sms):
    p = MIG_GPUS[key].profile(name)
    assert (p.profile_id, p.memory_bytes, p.sm_count) == (pid, mib * MiB, sms)


def test_h100_pcie_has_its_own_sm_counts_and_the_sxm_memory():
    pcie, sxm = mig_gpu("h100-pcie-80gb"), mig_gpu("h100-80gb")
    assert [p.sm_count for p in pcie.profiles] == [14, 14, 14, 30, 46, 62, 114]
    assert [p.sm_count for p in sxm.profiles] == [16, 16, 26, 32, 60, 64, 132]
    assert [p.memory_bytes for p in pcie.profiles] == [p.memory_bytes for p in sxm.profiles]


def test_nvml_constants_differ_from_nvidia_smi_ids():
    consts = {p.name: (p.profile_id, p.nvml_constant) for p in A100.profiles}
    assert consts["1g.10gb"] == (19, 0x0)
    assert consts["1g.10gb+me"] == (20, 0x7)
    assert consts["1g.20gb"] == (15, 0x9)
    assert consts["7g.80gb"] == (0, 0x4)


def test_lookup_accepts_aliases_ids_and_the_mig_prefix():
    assert mig_gpu("A100-80GB") is A100
    assert A100.profile("9").name == "3g.40gb"
    assert A100.profile("MIG 3g.40gb").profile_id == 9


def test_unknown_gpu_and_profile_list_the_known_names():
    with pytest.raises(UnknownMigGpu, match="known: a100-40gb"):
        mig_gpu("v100")
    with pytest.raises(UnknownMigProfile, match=r"known: 1g\.10gb"):
        A100.profile("5g.50gb")
    assert issubclass(UnknownMigProfile, UserError)


def test_slot_mask_and_format_put_slot_zero_first():
    assert slot_mask(4, 4) == 0b11110000
    assert format_mask(0b11110001) == "#...####"


def test_seven_1g_instances_leave_slice_7_idle():
    layout = MigLayout(A100)
    one_g = A100.profile("1g.10gb")
    for s in range(7):
        layout = layout.with_instance(MigInstance(one_g, s))
    assert format_mask(layout.mask) == "#######."
    assert layout.placements(one_g) == ()


def test_1g_instances_at_3_and_4_block_every_3g_and_the_4g():
    layout = parse_layout(A100, "1g.10gb@3, 1g.10gb@4")
    assert layout.placements(A100.profile("3g.40gb")) == ()
    assert layout.placements(A100.profile("4g.40gb")) == ()
    assert layout.placements(A100.profile("2g.20gb")) == (0,)


def test_4g_and_3g_combine_only_as_4g_at_0_and_3g_at_4():
    layout = parse_layout(A100, "4g.40gb@0")
    assert layout.placements(A100.profile("3g.40gb")) == (4,)
    assert parse_layout(A100, "3g.40gb@0").placements(A100.profile("4g.40gb")) == ()


def test_only_one_media_extension_instance_per_gpu():
    layout = parse_layout(A100, "1g.10gb+me@0")
    assert layout.placements(A100.profile("1g.10gb+me")) == ()
    assert layout.placements(A100.profile("1g.10gb")) == (1, 2, 3, 4, 5, 6)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("3g.40gb@2", "cannot start at slot 2"),
        ("3g.40gb@4, 2g.20gb@4", "cannot start at slot 4"),
        ("3g.40gb", "PROFILE@START"),
        ("3g.40gb@4:busy", "only ':idle'"),
        ("1g.10gb@6:idle", "needs its GPU-instance id"),
    ],
)
def test_bad_layouts_are_rejected_with_a_reason(text, match):
    with pytest.raises(InvalidMigLayout, match=match):
        parse_layout(A100, text)


def test_layout_keeps_gi_ids_and_idle_flags():
    layout = parse_layout(A100, "4g.40gb@0/1, 1g.10gb@6/13:idle")
    assert [(i.gi_id, i.idle) for i in layout.instances] == [(1, False), (13, True)]
    assert str(layout.instances[1]) == "1g.10gb@6/13:idle"


def test_smallest_profile_for_12gib_is_the_1g_with_twice_the_memory_then_the_2g():
    names = [p.name for p in smallest_profiles(A100, 12 * GiB)]
    assert names[:2] == ["1g.20gb", "2g.20gb"]
    assert names[-1] == "7g.80gb"


def test_smallest_profile_never_offers_media_extensions():
    assert all(not p.media_extensions for p in smallest_profiles(A100, 1 * GiB))
    assert smallest_profiles(A100, 1 * GiB)[0].name == "1g.10gb"


def test_a_request_above_the_largest_profile_says_so():
    with pytest.raises(MigRequestTooLarge, match=r"largest, 7g\.80gb"):
        smallest_profiles(A100, 80 * GiB)


def test_requests_resolve_by_name_id_or_size():
    assert [p.name for p in resolve_request(A100, "3g.40gb")] == ["3g.40gb"]
    assert [p.name for p in resolve_request(A100, "9")] == ["3g.40gb"]
    assert resolve_request(A100, "12GiB")[0].name == "1g.20gb"
    with pytest.raises(UnknownMigProfile, match="memory size such as 12GiB"):
        resolve_request(A100, "big")


def test_without_removes_one_instance_and_refuses_a_stranger():
    layout = parse_layout(A100, "3g.40gb@0, 3g.40gb@4")
    first = layout.instances[0]
    assert format_mask(layout.without(first).mask) == "....####"
    with pytest.raises(InvalidMigLayout):
        layout.without(MigInstance(A100.profile("1g.10gb"), 0))


@pytest.mark.parametrize(
    ("name", "slices"),
    [("1g.10gb", 1), ("3g.40gb", 3), ("7g.80gb", 7), ("1g.10gb+me", 1), ("2g.35gb", 2), ("", 7), ("19", 7),
     ("9g.1gb", 7)],
)  # fmt: skip
def test_a_profiles_compute_slices_by_name_alone_and_a_whole_gpu_when_the_name_is_not_a_profile(
    name: str, slices: int
) -> None:
    assert compute_slices_by_name(name) == slices


def test_every_known_profile_has_the_slices_its_name_says() -> None:
    for gpu in MIG_GPUS.values():
        for profile in gpu.profiles:
            assert compute_slices_by_name(profile.name) == profile.compute_slices, profile.name
