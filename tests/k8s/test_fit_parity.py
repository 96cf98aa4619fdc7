"""One fit rule in every home: on the same GPUs holding the same jobs, sim's ledger, serve's node
scheduler and the Kubernetes extender give the same verdict for the same request, and when it does not
fit, the same ledger code with the same amounts (each home then says it in its own words)."""

from __future__ import annotations

import random

import pytest
from test_extender import FakeApi, _bound_pod, inventory, make_state, pod_json

from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.node import NodeSpec
from gpuslice.k8s.annotations import pod_gpu_request
from gpuslice.k8s.extender import WatchEvent
from gpuslice.k8s.extender.verdicts import verdict_texts
from gpuslice.ledger import Ledger, Placement, Refusal, RefusalCode, code_number
from gpuslice.scheduler.node_fit import refusal
from gpuslice.scheduler.node_scheduler import NodeScheduler, StartJob
from gpuslice.units import MiB
from gpuslice.workload.job import JobSpec

MODEL, GPUS, MIB = "A100-80GB", 4, 16384


def resources(cores: int, mib: int, gpus: int = 1) -> dict[str, str]:
    out = {"gpuslice.io/gpu": str(gpus)}
    if cores:
        out["gpuslice.io/gpucores"] = str(cores)
    if mib:
        out["gpuslice.io/gpumem"] = str(mib)
    return out


def job(cores: int, mib: int, gpus: int = 1) -> JobSpec:
    return JobSpec(("run",), gpus=gpus, compute_percent=cores, gpu_memory_bytes=mib * MiB)


ASKS = [  # (cores %, MiB, GPUs): 0 cores and 0 MiB = whole GPUs
    (30, 4000, 1),
    (50, 12000, 1),
    (0, 9000, 1),
    (90, 0, 1),
    (90, 15000, 1),  # both short on a busy GPU: the order of the checks shows
    (0, 0, 1),
    (0, 0, 2),
]


def holdings(seed: int) -> list[tuple[int, int, int]]:
    """(GPU, cores %, MiB) per job held, whole GPUs as (GPU, 0, 0); kept only where they fit."""
    rng = random.Random(seed)
    ledger = Ledger([NodeSpec("n", 0, 0, GPUS, MODEL, gpu_memory_bytes=MIB * MiB)])
    out = []
    for _ in range(rng.randint(0, 24)):
        g = rng.randrange(GPUS)
        cores, mib = (
            (0, 0) if rng.random() < 0.15 else (rng.choice([10, 30, 60]), rng.choice([2000, 6000, 9000]))
        )
        req = pod_gpu_request(pod_json("x", resources(cores, mib))).to_request()
        if isinstance(ledger.reserve(0, (g,), req), Placement):
            out.append((g, cores, mib))
    return out


def sim_refusal(held, req) -> Refusal | None:
    ledger = Ledger([NodeSpec("n", 0, 0, GPUS, MODEL, gpu_memory_bytes=MIB * MiB)])
    for g, cores, mib in held:
        assert isinstance(
            ledger.reserve(0, (g,), pod_gpu_request(pod_json("x", resources(cores, mib))).to_request()),
            Placement,
        )
    refused = ledger.refusal(0, req)
    assert bool(ledger.fits(req)[0]) == (refused is None)
    return refused


def serve_verdict(held, ask) -> tuple[Refusal | None, bool]:
    gpus = tuple(GpuInfo(i, f"GPU-{i}", MODEL, MIB * MiB) for i in range(GPUS))
    sched = NodeScheduler(Machine("m", gpus, None))
    for k, (g, cores, mib) in enumerate(held):
        sched.adopt(f"held-{k}", job(cores, mib), (g,), 0.0)
    sched.submit("new", job(*ask), 1.0)
    demand = sched._pending["new"].demand
    refused = refusal(demand, sched._capacity(), None)
    started = any(isinstance(d, StartJob) and d.job_id == "new" for d in sched.step(1.0))
    if not started:  # the record behind the reason serve gives the job is the fit rule's, amounts and all
        assert sched.pending_refusal("new") == refused
    return refused, started


def extender_verdict(held, ask) -> tuple[bool, str]:
    state = make_state(FakeApi(), {"n": inventory(MODEL, gpus=GPUS, memory_mib=MIB, split=10)})
    for k, (g, cores, mib) in enumerate(held):
        state.apply(WatchEvent("Pod", "ADDED", _bound_pod(f"held-{k}", "n", str(g), resources(cores, mib))))
    result = state.filter(pod_json("new", resources(*ask)), ["n"])
    return result.passed == ["n"], result.failed.get("n", "")


@pytest.mark.parametrize("ask", ASKS, ids=[f"{c}pct-{m}MiB-x{n}" for c, m, n in ASKS])
def test_sim_serve_and_extender_give_one_verdict_and_one_code(ask):
    seen: set[RefusalCode | None] = set()
    for seed in range(30):
        held = holdings(seed)
        pod_ask = pod_gpu_request(pod_json("new", resources(*ask)))
        expected = sim_refusal(held, pod_ask.to_request())
        record, started = serve_verdict(held, ask)
        assert record == expected, (seed, held)
        assert started == (expected is None), (seed, held)
        passed, reason = extender_verdict(held, ask)
        assert passed == (expected is None), (seed, held)
        if expected is not None:
            assert expected.amounts, expected  # every GPU refusal here names its resource and amounts
            assert reason == verdict_texts(pod_ask, (MODEL,))[code_number(expected.code)], (seed, held)
        seen.add(None if expected is None else expected.code)
    assert None in seen and len(seen) >= 2, seen  # every ask fits on some states and not on others
