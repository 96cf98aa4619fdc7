"""GPU health in the daemon and the API (fake node): a GPU marked unhealthy, by hand or by a fault in
its telemetry, takes no new job, says so in the queue, and reports the jobs running on it; telemetry
fills /v1/gpus; 3-sigma excursions become anomaly events."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import pytest

from gpuslice.hardware.faults import FaultKind, GpuFault
from gpuslice.node.telemetry import GpuReading, SimulatedTelemetry, SliceLoad
from gpuslice.server.app import create_app
from gpuslice.server.errors import GpuNotFound
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, JobState

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def spec(**kw) -> JobSpec:
    return JobSpec(command=("train",), **kw)


def health_events(daemon, job_id: str | None = None):
    return [e for _, e in daemon.store.events(job_id) if e.kind == "gpu-health" and (job_id or not e.job_id)]


class ScriptedTelemetry:
    """Readings set by the test: ``values[gpu] = (util, memory, temperature)``, ``faults[gpu]``."""

    simulated = True

    def __init__(self, n: int) -> None:
        self.values = {g: (10.0, 1 * GiB, 40.0) for g in range(n)}
        self.faults: dict[int, tuple[GpuFault, ...]] = {}
        self.loads: list[SliceLoad] = []

    def read(self, loads: Sequence[SliceLoad], memory_used: Mapping[int, int]) -> list[GpuReading]:
        self.loads = list(loads)
        faults, self.faults = self.faults, {}
        return [
            GpuReading(g, u, m, t, 100.0, faults.get(g, ())) for g, (u, m, t) in sorted(self.values.items())
        ]

    def close(self) -> None:
        return None


@pytest.fixture
def api(daemon):
    with TestClient(create_app(daemon, TOKEN), headers=AUTH) as client:
        yield client


def test_marking_a_gpu_unhealthy_needs_the_token_and_an_existing_gpu(api):
    body = {"healthy": False, "reason": "XID 79"}
    assert api.post("/v1/gpus/3/health", json=body, headers={"Authorization": ""}).status_code == 401
    r = api.post("/v1/gpus/8/health", json=body, headers=AUTH)
    assert r.status_code == 404 and r.json()["type"] == "GpuNotFound" and "GPU 0–7" in r.json()["detail"]
    assert api.post("/v1/gpus/3/health", json={"healthy": "maybe"}, headers=AUTH).status_code == 422


def test_an_unhealthy_gpu_takes_no_new_job_and_its_running_jobs_are_reported(api, daemon, node):
    first = daemon.submit(spec(gpus=8))
    daemon.tick()
    r = api.post("/v1/gpus/5/health", json={"healthy": False, "reason": "XID 79"}, headers=AUTH)
    assert r.status_code == 200
    gpu = r.json()
    assert gpu["healthy"] is False and gpu["unhealthy_reason"] == "XID 79"
    assert [j["id"] for j in gpu["jobs"]] == [first.id]  # the job on it is listed, and keeps running
    assert daemon.store.get(first.id).state is JobState.RUNNING
    (event,) = health_events(daemon)
    assert event.reason == f"GPU 5 is unhealthy: XID 79; no new jobs go there; jobs running on it: {first.id}"
    assert event.detail["jobs"] == [first.id] and event.detail["kind"] == "manual"
    (job_event,) = health_events(daemon, first.id)
    assert "GPU 5, which this job runs on, is unhealthy (XID 79)" in job_event.reason
    node.exit(first.id, 0)
    daemon.tick()
    gang = daemon.submit(spec(gpus=8))
    single = daemon.submit(spec(gpus=7))
    daemon.tick()
    assert daemon.store.get(single.id).gpus == (0, 1, 2, 3, 4, 6, 7)
    (waiting,) = api.get("/v1/queue").json()
    assert waiting["id"] == gang.id and "GPU 5 is unhealthy (XID 79)" in waiting["reason"]


def test_marking_healthy_again_lets_jobs_start_there_and_is_an_event(api, daemon):
    daemon.set_gpu_health(0, False, "XID 48")
    waiting = daemon.submit(spec(gpus=8))
    daemon.tick()
    assert daemon.store.get(waiting.id).state is JobState.PENDING
    r = api.post("/v1/gpus/0/health", json={"healthy": True}, headers=AUTH)
    assert r.json()["healthy"] is True and r.json()["unhealthy_reason"] is None
    daemon.tick()
    assert daemon.store.get(waiting.id).state is JobState.RUNNING
    assert [e.detail["healthy"] for e in health_events(daemon)] == [False, True]


def test_the_same_mark_twice_records_one_event(daemon):
    daemon.set_gpu_health(2, False, "XID 79")
    daemon.set_gpu_health(2, False, "XID 79")
    assert len(health_events(daemon)) == 1
    with pytest.raises(GpuNotFound):
        daemon.set_gpu_health(-1, False, "XID 79")


def test_a_fault_in_the_telemetry_marks_the_gpu_unhealthy_as_kind_xid(make_daemon, node):
    telemetry = ScriptedTelemetry(8)
    daemon = make_daemon(telemetry=telemetry)
    telemetry.faults = {6: (GpuFault(FaultKind.XID, "XID 79"),)}
    daemon.tick()
    assert not daemon.watch.health[6].healthy and daemon.watch.health[6].kind == "xid"
    assert daemon.scheduler.unhealthy_gpus() == {6: "XID 79"}
    assert 'gpuslice_gpu_faults_total{gpu="6",kind="xid",model="H100",uuid="GPU-6"} 1.0' in (
        daemon.metrics.exposition().decode()
    )


def test_simulated_telemetry_fills_the_gpu_fields_of_the_api(make_daemon, node):
    daemon = make_daemon()
    daemon.watch.telemetry = SimulatedTelemetry(daemon.machine)
    job = daemon.submit(spec(gpu_memory_bytes=20 * GiB, compute_percent=50))
    daemon.tick()
    node.used[job.id] = {0: 12 * GiB}
    daemon.tick()
    with TestClient(create_app(daemon, TOKEN), headers=AUTH) as client:
        gpus = client.get("/v1/gpus").json()
    busy = next(g for g in gpus if g["jobs"])
    idle = next(g for g in gpus if not g["jobs"])
    assert busy["utilization_percent"] == 50.0 and busy["memory_used_bytes"] == 12 * GiB
    assert busy["temperature_celsius"] == 52.0 and busy["power_watts"] == pytest.approx(385.0)
    assert busy["jobs"][0]["tenant"] == "default"
    assert idle["utilization_percent"] == 0.0
    assert (idle["temperature_celsius"], idle["power_watts"]) == (32.0, 70.0)
    assert all(g["healthy"] for g in gpus)


def test_a_suspended_job_counts_as_idle_in_the_simulated_utilisation(make_daemon, node):
    telemetry = ScriptedTelemetry(8)
    daemon = make_daemon(telemetry=telemetry)
    job = daemon.submit(spec(gpu_memory_bytes=20 * GiB))  # memory-only share: busy = 20/80 of the GPU
    daemon.tick()
    node.used[job.id] = {0: 30 * GiB}
    node.decisions[job.id] = ("suspend", "over its slice")
    daemon.tick()
    daemon.tick()
    (load,) = telemetry.loads
    assert load.busy_share == pytest.approx(0.25) and load.active is False


def ticks(daemon, clock, n: int) -> None:
    """``n`` ticks a second apart: a monitor pass (and a telemetry reading) each."""
    for _ in range(n):
        clock.now += 1
        daemon.tick()


def test_a_telemetry_spike_on_a_steady_gpu_is_an_anomaly_event_and_a_metric(make_daemon, clock):
    telemetry = ScriptedTelemetry(8)
    daemon = make_daemon(telemetry=telemetry)
    ticks(daemon, clock, 30)
    assert [e for _, e in daemon.store.events() if e.kind == "anomaly"] == []
    telemetry.values[4] = (10.0, 1 * GiB, 95.0)  # the temperature jumps; nothing else changed
    daemon.tick()
    (anomaly,) = [e for _, e in daemon.store.events() if e.kind == "anomaly"]
    assert anomaly.detail["gpu"] == 4 and anomaly.detail["metric"] == "temperature"
    assert anomaly.reason.startswith("GPU 4 temperature 95 °C is ")
    text = daemon.metrics.exposition().decode()
    assert 'gpuslice_gpu_anomalies_total{gpu="4",metric="temperature",model="H100",uuid="GPU-4"} 1.0' in text


def test_a_job_starting_on_a_gpu_is_an_expected_change_not_an_anomaly(make_daemon, clock):
    telemetry = ScriptedTelemetry(8)
    daemon = make_daemon(telemetry=telemetry)
    ticks(daemon, clock, 30)
    job = daemon.submit(spec(gpus=1))
    daemon.tick()  # the job starts (after this tick's monitor pass)
    (gpu,) = daemon.store.get(job.id).gpus
    telemetry.values[gpu] = (100.0, 70 * GiB, 75.0)  # its load shows at the next pass
    ticks(daemon, clock, 5)
    assert [e for _, e in daemon.store.events() if e.kind == "anomaly"] == []
