"""gpuslice.shim's Python side: finding the built library, and reading regions safely."""

from __future__ import annotations

import os

import pytest
from shim_helpers import ROOT

import gpuslice.shim as shim
from gpuslice.shim import ShimUnavailable, library_path, read_region
from gpuslice.shim.build import build_shim
from gpuslice.shim.region import SIZE, DeviceUsage, RegionError, pack_region


def test_the_installed_package_ships_the_built_shim_and_fake_driver():
    assert library_path().is_file() and library_path().name == "libgpuslice-shim.so"
    assert (shim.fake_driver_dir() / "libcuda.so.1").is_file()
    assert (shim.fake_driver_dir() / "libnvidia-ml.so.1").is_file()


def test_the_installed_shim_is_the_one_the_sources_build_now(tmp_path):
    """The shim tests preload the installed library: after an edit to native/shim they would test the old
    one, green, until someone reinstalls. A build of the sources as they are must give the same bytes
    (gcc is deterministic for the same source and flags, and the build has no debug paths)."""
    built = build_shim(ROOT / "native" / "shim", tmp_path)
    assert built.read_bytes() == library_path().read_bytes(), (
        "the installed shim is not built from native/shim as it is now: reinstall (pip install -e .)"
    )


def test_a_missing_library_is_a_user_error_that_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setattr(shim, "_LIB_DIR", tmp_path)
    with pytest.raises(ShimUnavailable, match=r"'pip install \.' on a machine with a C compiler"):
        library_path()


@pytest.mark.parametrize("content", [b"", b"\x00" * SIZE, b"\xff" * SIZE], ids=["empty", "zeros", "garbage"])
def test_a_file_that_is_not_a_region_is_refused_clearly(tmp_path, content):
    path = tmp_path / "job.region"
    path.write_bytes(content)
    with pytest.raises(RegionError, match=r"job\.region"):
        read_region(path)


def test_serves_reader_too_refuses_a_fifo_a_link_and_a_round_trip_of_the_layout_reads_back(tmp_path):
    """``gpuslice serve``'s monitor reads job regions through the same reader: a job that puts a FIFO or
    a link in its region's place cannot block or redirect it."""
    fifo, link, good = tmp_path / "fifo.region", tmp_path / "link.region", tmp_path / "good.region"
    os.mkfifo(fifo)
    device = DeviceUsage(3, 100, 60, 7, 2, 1, 4)
    good.write_bytes(bytes(pack_region([device], compute_percent=40, priority=1)))
    link.symlink_to(good)
    with pytest.raises(RegionError) as refused:
        read_region(fifo)
    assert refused.value.reason == "not_regular"
    with pytest.raises(RegionError) as refused:
        read_region(link)
    assert refused.value.reason == "symlink"
    region = read_region(good, pids_visible=False)
    assert (region.compute_percent, region.priority, region.pids) == (40, 1, (1,))
    assert region.devices == (device,)
