"""Acceptance: a real Prometheus (Debian's ``prometheus``) scrapes a running
``gpuslice serve --simulate dgx-h100`` every second, and the metrics come back through Prometheus' HTTP
API (/api/v1/query) with their labels: job_id, tenant, gpu (and Prometheus' own job and instance).

Skipped when /usr/bin/prometheus (or ``prometheus`` on PATH) is missing, unless
GPUSLICE_REQUIRE_EXTERNAL is set (CI), where a missing Prometheus fails the test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from gpuslice.units import GiB
from prometheus_server import Prometheus

FAKE_LOAD = str(Path(sys.executable).parent / "gpuslice-fake-load")
pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


@pytest.fixture
def prometheus(tmp_path, external_tool) -> Iterator[Any]:
    """start(target) -> a Prometheus scraping ``target`` (host:port) every second, stopped after."""
    binary = external_tool("prometheus", "Debian: apt install prometheus")
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        started.append(Prometheus(binary, tmp_path / f"prometheus-{len(started)}", {"gpuslice": [target]}))
        return started[-1]

    yield start
    for prom in started:
        prom.stop()


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
