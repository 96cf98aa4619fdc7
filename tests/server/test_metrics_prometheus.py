"""Acceptance: a real Prometheus (Debian's ``prometheus``) scrapes a running
``gpuslice serve --simulate dgx-h100`` every second, and the metrics come back through Prometheus' HTTP
API (/api/v1/query) with their labels: job_id, tenant, gpu (and Prometheus' own job and instance).

Skipped when /usr/bin/prometheus (or ``prometheus`` on PATH) is missing, unless
GPUSLICE_REQUIRE_EXTERNAL is set (CI), where a missing Prometheus fails the test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import free_port

from gpuslice.units import GiB

FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")
pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=10)

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = self.http.get("/api/v1/query", params={"query": promql})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, timeout: float, ok=lambda result: bool(result)) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if ok(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql!r} still gave {result} after {timeout} s")
            time.sleep(0.5)


@pytest.fixture
def prometheus(tmp_path, external_tool) -> Iterator[Any]:
    """start(target) -> a Prometheus scraping ``target`` (host:port) every second, stopped after."""
    binary = external_tool("prometheus", "Debian: apt install prometheus")
    procs: list[tuple[subprocess.Popen[bytes], Any]] = []
    clients: list[Prometheus] = []

    def start(target: str) -> Prometheus:

        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            f"  - job_name: gpuslice\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed after the process)
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        procs.append((proc, log))
        prom = Prometheus(f"http://127.0.0.1:{port}")
        clients.append(prom)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if prom.http.get("/-/ready").status_code == 200:
                    return prom
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready in 30 s")

    yield start
    for prom in clients:
        prom.http.close()
    for proc, log in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in result}


def test_prometheus_scrapes_serve_and_answers_with_job_id_tenant_and_gpu_labels(serve, prometheus):
    server = serve("--grace", "1s")
    ml = server.submit([FAKE_LOAD, "--mem", "6GiB", "--seconds", "120"], memory="16GiB", compute_percent=50,
                       tenant="ml")  # fmt: skip
    cv = server.submit([FAKE_LOAD, "--mem", "2GiB", "--seconds", "120"], gpus=2, tenant="cv")
    blocked = server.submit(["sleep", "1"], gpus=8, tenant="ml", priority="low")
    server.wait(lambda: all(server.jobs()[j["id"]]["state"] == "RUNNING" for j in (ml, cv)), 15, "two jobs")
    prom = prometheus(f"127.0.0.1:{server.port}")

    up = prom.wait_for('up{job="gpuslice"}', 20, lambda r: r and float(r[0]["value"][1]) == 1)
    assert up[0]["metric"]["instance"] == f"127.0.0.1:{server.port}"
    assert prom.query("count(gpuslice_slice_memory_allocated_bytes{exported_job!=''})") == []

    allocated = prom.wait_for("gpuslice_slice_memory_allocated_bytes", 20, lambda r: len(r) == 3)
    rows = {(r["metric"]["job_id"], r["metric"]["gpu"]): r["metric"] for r in allocated}
    ml_gpu = str(server.jobs()[ml["id"]]["gpus"][0])
    assert rows[(ml["id"], ml_gpu)]["tenant"] == "ml"
    assert {g for j, g in rows if j == cv["id"]} == {str(g) for g in server.jobs()[cv["id"]]["gpus"]}
    assert all(m["tenant"] == "cv" for (j, _), m in rows.items() if j == cv["id"])
    assert by(prom.query(f'gpuslice_slice_memory_allocated_bytes{{job_id="{ml["id"]}"}}'), "gpu") == {
        ml_gpu: 16 * GiB
    }

    # memory really used comes from the fake load's reports; the GPU's utilisation from the model
    used = prom.wait_for(f'gpuslice_slice_memory_used_bytes{{job_id="{ml["id"]}"}}', 20,
                         lambda r: r and float(r[0]["value"][1]) == 6 * GiB)  # fmt: skip
    assert used[0]["metric"]["gpu"] == ml_gpu
    util = by(prom.query("gpuslice_gpu_utilization_ratio"), "gpu")
    assert len(util) == 8 and util[ml_gpu] == 0.5
    assert by(prom.query('gpuslice_gpu_healthy{model="H100"}'), "gpu") == {str(g): 1.0 for g in range(8)}

    pending = prom.wait_for("gpuslice_pending_jobs", 10)
    assert [(r["metric"]["tenant"], r["metric"]["priority"], r["value"][1]) for r in pending] == [
        ("ml", "low", "1")
    ]
    starts = prom.query('gpuslice_scheduler_decisions_total{decision="start"}')
    assert float(starts[0]["value"][1]) == 2
    latency = prom.query("sum(gpuslice_scheduling_latency_seconds_count)")
    assert float(latency[0]["value"][1]) == 2
    assert blocked["id"] not in {r["metric"]["job_id"] for r in allocated}
