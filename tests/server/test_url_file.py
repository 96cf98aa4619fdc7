"""A server writes its URL into its state dir, and clients that find the state dir find the server:
the ``try:`` line ``gpuslice serve`` prints works on any port. Two simulated servers on one host keep
their fake loads apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuslice.server.client import DEFAULT_URL, ServeClient
from gpuslice.server.url_file import read_url, write_url

GPUSLICE = str(Path(sys.executable).parent / "gpuslice")
FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")


def test_the_url_file_is_read_back_and_ignored_when_it_is_not_a_url(tmp_path):
    assert read_url(tmp_path) is None
    write_url(tmp_path, "http://127.0.0.1:9123")
    assert read_url(tmp_path) == "http://127.0.0.1:9123"
    assert (tmp_path / "url").stat().st_mode & 0o777 == 0o600
    (tmp_path / "url").write_text("rm -rf /\n")
    assert read_url(tmp_path) is None


def test_the_client_prefers_the_flag_then_the_environment_then_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSLICE_URL", raising=False)
    assert ServeClient(state_dir=tmp_path).url == DEFAULT_URL
    write_url(tmp_path, "http://127.0.0.1:9123")
    assert ServeClient(state_dir=tmp_path).url == "http://127.0.0.1:9123"
    monkeypatch.setenv("GPUSLICE_URL", "http://127.0.0.1:9200")
    assert ServeClient(state_dir=tmp_path).url == "http://127.0.0.1:9200"
    assert ServeClient(url="http://127.0.0.1:9300", state_dir=tmp_path).url == "http://127.0.0.1:9300"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
    return subprocess.run([GPUSLICE, *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_printed_try_line_works_on_a_non_default_port_and_servers_keep_their_loads_apart(serve, tmp_path):
    first = serve(state_dir=tmp_path / "a")
    second = serve(state_dir=tmp_path / "b")
    assert first.port != 8787
    submitted = _cli("submit", "--state-dir", str(first.state_dir), "--mem", "8GiB", "--",
                     FAKE_LOAD, "--mem", "6GiB", "--seconds", "60")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted" in submitted.stdout

    def reported() -> bool:
        return any(j["used_memory_bytes"] for g in first.http.get("/v1/gpus").json() for j in g["jobs"])

    first.wait(reported, timeout=30, what="the fake load's report")
    listed = _cli("ps", "--state-dir", str(first.state_dir))
    assert listed.returncode == 0 and "RUNNING" in listed.stdout, listed.stderr
    assert all(g["external_memory_bytes"] == 0 for g in second.http.get("/v1/gpus").json())
