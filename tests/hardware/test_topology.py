"""The topology model: link codes, bandwidth and hop models, ring bandwidth, NVLink groups, profiles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.errors import UserError
from gpuslice.hardware.topology import (
    BandwidthModel,
    CostModel,
    LinkType,
    TopologyError,
    build_topology,
    parse_link_label,
)
from gpuslice.hardware.topology_profiles import PROFILES, UnknownSystem, profile


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("X", (0, LinkType.SELF)),
        ("NV1", (1, None)),
        ("nv18", (18, None)),
        ("PIX", (0, LinkType.PIX)),
        ("PXB", (0, LinkType.PXB)),
        ("PHB", (0, LinkType.PHB)),
        ("NODE", (0, LinkType.NODE)),
        ("SYS", (0, LinkType.SYS)),
        ("SOC", (0, LinkType.SYS)),  # older drivers
    ],
)
def test_link_labels_read_as_nvidia_smi_prints_them(label, expected):
    assert parse_link_label(label) == expected


@pytest.mark.parametrize("label", ["NV0", "NV19", "NVX", "PCIE", "", "-"])
def test_unknown_link_labels_are_rejected(label):
    with pytest.raises(ValueError, match="not a topology code"):
        parse_link_label(label)


def brute_ring(bw: np.ndarray, gpus: tuple[int, ...]) -> float:
    if len(gpus) == 2:
        return float(bw[gpus[0], gpus[1]])
    first, rest = gpus[0], gpus[1:]
    return max(
        min(bw[a, b] for a, b in zip((first, *p), (*p, first), strict=True))
        for p in itertools.permutations(rest)
    )


def test_dgx1_pair_bandwidth_follows_nvlink_count_and_pcie_gen3():
    t = profile("dgx1-v100")
    bw = t.pair_bandwidth_gbps()
    assert bw[0, 3] == 50.0  # NV2 × 25 GB/s per link
    assert bw[0, 1] == 25.0  # NV1
    assert bw[0, 5] == pytest.approx(15.75 * 0.4)  # SYS over PCIe Gen3
    assert np.isinf(bw[2, 2])


def test_dgx1_eight_gpu_ring_uses_only_nv2_links():
    # The NV2 links of the hybrid cube-mesh form one 8-cycle 0-3-2-1-5-6-7-4, so a full ring gets 50 GB/s.
    t = profile("dgx1-v100")
    assert t.ring_bandwidth(range(8)) == 50.0
    assert t.ring_bandwidth((0, 1, 2, 3)) == 25.0  # no NV2 4-cycle exists
    assert t.ring_bandwidth((0, 5)) == pytest.approx(6.3)
    assert t.ring_bandwidth((6,)) == float("inf")


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(PROFILES)),
    gpus=st.sets(st.integers(0, 7), min_size=2, max_size=7),
)
def test_ring_bandwidth_equals_brute_force_over_every_ring(name, gpus):
    t = PROFILES[name]
    chosen = tuple(sorted(g for g in gpus if g < t.n_gpus))
    if len(chosen) < 2:
        return
    assert t.ring_bandwidth(chosen) == pytest.approx(brute_ring(t.pair_bandwidth_gbps(), chosen))


def test_hops_follow_the_default_cost_model():
    dgx1, a100, pcie = profile("dgx1-v100"), profile("dgx-a100"), profile("pcie-8gpu-2socket")
    assert dgx1.hops()[0, 0] == 0 and dgx1.hops()[0, 1] == 1 and dgx1.hops()[0, 5] == 3
    assert a100.hops()[0, 5] == 2  # through NVSwitch
    assert pcie.hops()[0, 1] == 3
    assert dgx1.hop_cost((0, 1, 5)) == 1 + 3 + 1  # 0–1 NV1, 0–5 SYS, 1–5 NV2


def test_cost_and_bandwidth_models_are_configurable():
    t = profile("dgx1-v100").with_models(
        bandwidth=BandwidthModel(nvlink_gbps_per_link=50.0), cost=CostModel(nvlink=5.0)
    )
    assert t.pair_bandwidth_gbps()[0, 3] == 100.0
    assert t.hops()[0, 1] == 5.0
    assert profile("dgx1-v100").hops()[0, 1] == 1.0  # the profile itself is unchanged


def test_nvswitch_is_detected_from_link_counts_beyond_what_a_gpu_has():
    assert PROFILES["dgx-a100"].nvswitch and PROFILES["dgx-h100"].nvswitch and PROFILES["hgx-h200"].nvswitch
    assert not PROFILES["dgx1-v100"].nvswitch
    # 4-GPU HGX A100 without a switch: NV4 to each of 3 peers = 12 links, within one GPU's 12.
    four = build_topology("hgx4", [["X" if i == j else "NV4" for j in range(4)] for i in range(4)])
    assert not four.nvswitch
    assert four.link(0, 1) is LinkType.NVLINK
    assert PROFILES["dgx-a100"].link(0, 7) is LinkType.NVSWITCH


def test_nvlink_groups_split_machines_without_nvlink_into_single_gpus():
    assert profile("dgx1-v100").nvlink_groups() == [tuple(range(8))]
    assert profile("pcie-4x-l4").nvlink_groups() == [(0,), (1,), (2,), (3,)]
    bridged = build_topology("bridged", [["X", "NV12", "SYS"], ["NV12", "X", "SYS"], ["SYS", "SYS", "X"]])
    assert bridged.nvlink_groups() == [(0, 1), (2,)]


def test_pcie_path_under_nvlink_is_kept_for_dgx1_and_inferred_from_numa_otherwise():
    assert profile("dgx1-v100").pcie_link(0, 1) is LinkType.PIX  # go-gpuallocator fixture
    assert profile("dgx1-v100").pcie_link(0, 2) is LinkType.PHB
    assert profile("dgx-a100").pcie_link(0, 1) is LinkType.PXB
    assert profile("dgx-h100").pcie_link(0, 3) is LinkType.NODE
    assert profile("dgx-h100").pcie_link(0, 4) is LinkType.SYS


def test_numa_and_cpu_affinity_are_per_gpu():
    a100 = profile("dgx-a100")
    assert a100.numa == (3, 3, 1, 1, 7, 7, 5, 5)
    assert a100.cpu_affinity[0] == "48-63,176-191"  # matches the published DGX A100 capture


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([["X", "NV1"], ["NV2", "X"]], "symmetric"),
        ([["X", "NV1"], ["NV1", "NV1"]], "only the diagonal is X"),
        ([["X", "PIX"], ["PIX"]], "cells, expected 2"),
        ([["X", "FOO"], ["FOO", "X"]], "not a topology code"),
    ],
    ids=["asymmetric", "self link off the diagonal", "short row", "bad code"],
)
def test_inconsistent_matrices_are_user_errors(rows, match):
    with pytest.raises(TopologyError, match=match) as info:
        build_topology("bad", rows)
    assert isinstance(info.value, UserError)


def test_every_profile_has_eight_or_four_gpus_and_a_public_source():
    assert sorted(PROFILES) == sorted(
        ["dgx1-v100", "dgx-a100", "dgx-h100", "hgx-h200", "pcie-8gpu-2socket", "pcie-4x-l4"]
    )
    for t in PROFILES.values():
        assert t.n_gpus in (4, 8)
        # the source ends with the public origin of the matrix, in parentheses
        assert t.source.endswith(")") and "(" in t.source and "research" not in t.source
        assert not t.nvlinks.flags.writeable and not t.pcie.flags.writeable


def test_unknown_system_lists_the_known_ones():
    with pytest.raises(UnknownSystem, match="known: dgx1-v100, dgx-a100"):
        profile("dgx-2")
