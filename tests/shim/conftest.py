"""Fixtures for the shim tests: the fake driver and the C test programs, compiled once per session
(helpers in shim_helpers.py)."""

from __future__ import annotations

import pytest
from shim_helpers import C_DIR, ROOT, Native, compile_program

from gpuslice.shim.build import build_fake_driver


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> Native:
    base = tmp_path_factory.mktemp("shim")
    fake_dir = base / "fake"
    build_fake_driver(ROOT / "native" / "shim", fake_dir)
    client = compile_program(base / "driver_client", [C_DIR / "driver_client.c"], fake_dir)
    (base / "regions").mkdir()
    return Native(fake_dir=fake_dir, client=client, work=base / "regions")


@pytest.fixture
def job(request: pytest.FixtureRequest) -> str:
    """A job id of its own for each test (a region is per job)."""
    return "".join(c if c.isalnum() else "-" for c in request.node.name)[:100]
