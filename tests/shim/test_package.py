"""gpuslice.shim's Python side: finding the built library, and reading regions safely."""

from __future__ import annotations

import pytest
from shim_helpers import ROOT

import gpuslice.shim as shim
from gpuslice.shim import ShimUnavailable, library_path, read_region
from gpuslice.shim.build import build_shim
from gpuslice.shim.region import SIZE, RegionError


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
