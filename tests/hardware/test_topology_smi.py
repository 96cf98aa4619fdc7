"""The ``nvidia-smi topo -m`` parser on published real matrices, and on damaged input.

Fixtures (tests/hardware/fixtures): the GPU × GPU blocks are published matrices (docs/references.md)
(DGX-1 V100, DGX A100, DGX H100, 8 × PCIe variants a and b), written in nvidia-smi's tab layout with
its legend. The NIC rows/columns follow the published descriptions (A100: two HCAs per GPU pair at PXB; H100:
one NIC per GPU at PXB, same socket NODE, other SYS); NIC↔NIC cells are filled consistently with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gpuslice.errors import UserError
from gpuslice.hardware.topology import LinkType
from gpuslice.hardware.topology_profiles import profile
from gpuslice.hardware.topology_smi import TopologyParseError, parse_topo_matrix, read_topo_file

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("fixture", "system"),
    [
        ("dgx1_v100.txt", "dgx1-v100"),
        ("dgx_a100.txt", "dgx-a100"),
        ("dgx_h100.txt", "dgx-h100"),
        ("pcie_8gpu_switches.txt", "pcie-8gpu-2socket"),
    ],
)
def test_real_matrices_parse_to_the_built_in_profile(fixture, system):
    parsed, built_in = read_topo_file(FIXTURES / fixture), profile(system)
    np.testing.assert_array_equal(parsed.nvlinks, built_in.nvlinks)
    assert parsed.nvswitch == built_in.nvswitch
    n = parsed.n_gpus
    assert [[parsed.label(i, j) for j in range(n)] for i in range(n)] == [
        [built_in.label(i, j) for j in range(n)] for i in range(n)
    ]
    assert parsed.name == Path(fixture).stem


def test_affinity_columns_and_nic_columns_are_read():
    a100 = read_topo_file(FIXTURES / "dgx_a100.txt")
    assert a100.n_gpus == 8  # NIC0…NIC7 are checked, then dropped
    assert a100.numa == (3, 3, 1, 1, 7, 7, 5, 5)
    assert a100.cpu_affinity[6] == "80-95,208-223"
    h100 = read_topo_file(FIXTURES / "dgx_h100.txt")
    assert h100.numa == (0, 0, 0, 0, 1, 1, 1, 1) and h100.cpu_affinity == ("",) * 8


def test_root_port_variant_has_node_inside_a_socket_and_sys_across():
    t = read_topo_file(FIXTURES / "pcie_8gpu_rootports.txt")
    assert t.link(0, 3) is LinkType.NODE and t.link(3, 4) is LinkType.SYS
    assert not t.nvswitch and t.nvlink_groups() == [(g,) for g in range(8)]


def test_space_separated_output_and_legacy_soc_code_are_accepted():
    text = """
            GPU0    GPU1    GPU2    CPU Affinity
    GPU0     X      NV2     SOC     0-11
    GPU1    NV2      X      SOC     0-11
    GPU2    SOC     SOC      X      12-23

    Legend:
      X   = Self
      SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
    """
    t = parse_topo_matrix(text)
    assert t.nvlinks[0, 1] == 2 and t.link(0, 2) is LinkType.SYS
    assert t.cpu_affinity == ("0-11", "0-11", "12-23")


GOOD_HEADER = "\tGPU0\tGPU1\tCPU Affinity\n"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty input"),
        ("\tNIC0\tGPU0\n", "line 1 .*must start with the column GPU0"),
        ("\tGPU0\tGPU2\n", "GPU1 is missing"),
        (GOOD_HEADER + "GPU0\tX\tNV1\t0-7\n", r"no row for GPU1"),
        (GOOD_HEADER + "GPU0\tX\tNV1\n", r"line 2 .*GPU0 has 2 cells, expected 2 link cells and 1"),
        (GOOD_HEADER + "GPU0\tX\tNVZ\t0-7\nGPU1\tNVZ\tX\t0-7\n", r"line 2 .*column GPU1: 'NVZ'"),
        (GOOD_HEADER + "GPU0\tNV1\tNV1\t0-7\nGPU1\tNV1\tX\t0-7\n", r"line 2 .*X belongs on the diagonal"),
        (GOOD_HEADER + "GPU0\tX\tNV1\t0-7\nGPU1\tNV2\tX\t0-7\n", r"NV1 on line 2 but .* NV2 on line 3"),
        (GOOD_HEADER + "GPU0\tX\tNV1\t0-7\nGPU0\tX\tNV1\t0-7\n", r"line 3 .*second row"),
        (GOOD_HEADER + "GPU0\tX\tNV1\t0-7\nmlx5_0\tPIX\tPIX\n", r"line 3 .*'mlx5_0' is not a device"),
        ("\tGPU0\tGPU1\tCPU Affinity\tWeird Column\n", "unknown trailing columns"),
    ],
    ids=[
        "empty",
        "no GPU0 first",
        "gap in GPU columns",
        "missing row",
        "row too short",
        "bad code",
        "X off the diagonal",
        "asymmetric",
        "duplicate row",
        "row for a device not in the header",
        "unknown column",
    ],
)
def test_malformed_input_names_the_line_and_the_problem(text, match):
    with pytest.raises(TopologyParseError, match=match) as info:
        parse_topo_matrix(text)
    assert isinstance(info.value, UserError)


def test_unreadable_file_is_a_parse_error_naming_the_path(tmp_path):
    with pytest.raises(TopologyParseError, match="cannot read"):
        read_topo_file(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("hello world\n")
    with pytest.raises(TopologyParseError, match=r"bad.txt: line 1"):
        read_topo_file(bad)


def test_a_device_fifo_or_huge_file_is_refused_before_it_is_read(tmp_path):
    """``--from-file /dev/zero`` read for ever (and a FIFO waited for a writer); a megabyte is no
    ``nvidia-smi topo -m`` output."""
    os.mkfifo(tmp_path / "fifo")
    huge = tmp_path / "huge.txt"
    huge.write_text("GPU0\n" * 300_000)
    for path, words in (("/dev/zero", "device"), (tmp_path / "fifo", "FIFO"), (huge, "at most 1,048,576")):
        with pytest.raises(TopologyParseError, match=words):
            read_topo_file(Path(path))
