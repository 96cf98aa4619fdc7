"""``gpuslice gpus --mark-unhealthy / --mark-healthy`` against the real app in-process (fake node)."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from gpuslice.cli import jobs
from gpuslice.cli.main import app
from gpuslice.errors import GpusliceError, exit_code
from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TOKEN = "cli-token"


@pytest.fixture
def cli(daemon, monkeypatch):
    http = TestClient(create_app(daemon, TOKEN))
    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: ServeClient(token=TOKEN, http=http))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        if isinstance(result.exception, GpusliceError):
            return exit_code(result.exception), f"error: {result.exception}"
        return result.exit_code, result.output

    yield run
    http.close()


def test_mark_unhealthy_then_healthy_and_the_table_shows_it(cli, daemon):
    code, out = cli("gpus", "--mark-unhealthy", "2", "--reason", "XID 79")
    assert code == 0
    line = next(x for x in out.splitlines() if x.strip().startswith("2 "))
    assert "unhealthy: XID 79" in line
    assert not daemon.health[2].healthy and daemon.health[2].kind == "manual"
    code, out = cli("gpus", "--mark-healthy", "2")
    assert code == 0 and "unhealthy" not in out and daemon.health[2].healthy


def test_an_unknown_gpu_or_both_options_are_user_errors(cli, daemon):
    code, out = cli("gpus", "--mark-unhealthy", "12")
    assert code == 2 and "no GPU 12" in out
    code, out = cli("gpus", "--mark-unhealthy", "1", "--mark-healthy", "1")
    assert code == 2 and "not both" in out
    assert daemon.health.unhealthy() == {}
