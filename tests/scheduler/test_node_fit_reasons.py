"""Serve's fit rule on its one machine (``scheduler.node_fit``), asked directly: the demand a job
resolves to and the words of a job that can never run here, a job found running after a restart, and
the refusal record and sentence of a job that does not fit now."""

from __future__ import annotations

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.mig import mig_gpu
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger import Ledger
from gpuslice.ledger.placement import Refusal, RefusalCode, Unit
from gpuslice.scheduler.node_decisions import MigAssignment
from gpuslice.scheduler.node_fit import (
    DemandKind,
    Holding,
    MachineWhatIf,
    adopted_holding,
    demand_for,
    refusal,
    why_not,
)
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, TopologyNeed
from gpuslice.workload.request import Request

DGX1 = profile("dgx1-v100")


def machine(*sizes_gib: int, mig: tuple[int, ...] = (), topology=None, model: str = "A100-80GB") -> Machine:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", model, size * GiB, mig_enabled=i in mig, mig_model="a100-80gb")
        for i, size in enumerate(sizes_gib)
    )
    return Machine("test", gpus, topology)


def ledger_of(m: Machine) -> Ledger:
    return Ledger([m.node_spec()], mig={(0, g.index): mig_gpu(g.mig_model) for g in m.gpus if g.mig_enabled})


def spec(**fields) -> JobSpec:
    return JobSpec(("run",), **fields)


def whole(*gpus: int) -> Request:
    return Request(cpu_milli=0, num_gpu=len(gpus), gpu_milli=1000)


# ---- demand_for --------------------------------------------------------------------------------------


def test_a_job_resolves_to_a_demand_with_its_request_and_the_gpus_it_may_use():
    m = machine(40, 80, 80, mig=(2,))
    assert demand_for(spec(gpus=0), m).kind is DemandKind.NONE
    share = demand_for(spec(gpu_memory_bytes=10 * GiB, compute_percent=30), m)
    assert (share.kind, share.count, share.milli, share.memory_bytes, share.eligible) == (
        DemandKind.SHARE,
        1,
        300,
        10 * GiB,
        (0, 1),
    )
    assert share.request == Request(cpu_milli=0, num_gpu=1, gpu_milli=300, gpu_memory_bytes=10 * GiB)
    two = demand_for(spec(gpus=2), m)
    assert (two.kind, two.count, two.milli, two.eligible) == (DemandKind.WHOLE, 2, 1000, (0, 1))
    assert two.request == Request(cpu_milli=0, num_gpu=2, gpu_milli=1000)
    instance = demand_for(spec(mig_profile="1g.10gb"), m)
    assert (instance.kind, instance.count, instance.eligible, instance.mig_text) == (
        DemandKind.MIG,
        1,
        (2,),
        "1g.10gb",
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"gpu_models": ("H100", "L4")},
            "gpu_models: no GPU model in {H100, L4} on this machine (it has A100-80GB)",
        ),
        (
            {"excluded_gpu_models": ("A100-80GB",)},
            "excluded_gpu_models: every GPU model on this machine (A100-80GB) is excluded",
        ),
        ({"gpus": 3}, "gpus: the job needs 3 GPUs but this machine has 2 it may use (GPU 0, 1)"),
        (
            {"gpu_memory_bytes": 41 * GiB},
            "gpu_memory_bytes: 41 GiB per GPU is more than any GPU it may use has (largest: 40 GiB on GPU 0)",
        ),
        (
            {"gpus": 2, "topology": TopologyNeed.NVLINK},
            "topology: this machine's GPU wiring is unknown, so nvlink cannot be guaranteed; "
            "drop the topology need",
        ),
    ],
)
def test_a_job_that_can_never_run_here_names_the_field_and_what_the_machine_has(fields, message):
    m = machine(40, 40, 80, mig=(2,))  # the two plain GPUs are equal: the lower one is named
    with pytest.raises(InvalidRequest) as err:
        demand_for(spec(**fields), m)
    assert str(err.value) == message


def test_a_job_asking_for_exactly_the_largest_gpus_memory_fits_it():
    assert demand_for(spec(gpu_memory_bytes=80 * GiB), machine(40, 80)).memory_bytes == 80 * GiB


def test_the_words_for_mig_mode_and_a_wiring_that_has_no_such_set():
    with pytest.raises(InvalidRequest) as err:
        demand_for(spec(gpus=1), machine(80, mig=(0,)))
    assert str(err.value) == (
        "gpus: every GPU this job may use is in MIG mode; ask for a MIG profile (mig_profile) instead"
    )
    with pytest.raises(InvalidRequest) as err:
        demand_for(spec(mig_profile="1g.10gb"), machine(80))
    assert str(err.value) == (
        "mig_profile: no GPU this job may use has MIG mode enabled; ask for memory or whole GPUs"
    )
    with pytest.raises(InvalidRequest) as err:
        demand_for(spec(mig_profile="5g.50gb"), machine(80, mig=(0,)))
    assert str(err.value).startswith("mig_profile: ") and "5g.50gb" in str(err.value)
    with pytest.raises(InvalidRequest) as err:
        demand_for(
            spec(gpus=5, topology=TopologyNeed.NVLINK), machine(*(16,) * 8, topology=DGX1, model="V100")
        )
    assert str(err.value) == "topology: no 5 GPUs of this machine are all joined by NVLink"


def test_a_mig_demand_lists_only_the_mig_gpus_of_an_allowed_model():
    gpus = (
        GpuInfo(0, "GPU-0", "A100-80GB", 80 * GiB, mig_enabled=True, mig_model="a100-80gb"),
        GpuInfo(1, "GPU-1", "H100", 80 * GiB, mig_enabled=True, mig_model="h100-80gb"),
    )
    m = Machine("test", gpus, None)
    assert demand_for(spec(mig_profile="1g.10gb", gpu_models=("H100",)), m).eligible == (1,)


# ---- adopted_holding ---------------------------------------------------------------------------------


def adopt_error(m: Machine, fields: dict, gpus: tuple[int, ...], mig: MigAssignment | None = None) -> str:
    with pytest.raises(InvalidRequest) as err:
        adopted_holding("j", demand_for(spec(**fields), m), gpus, mig, ledger_of(m), m)
    return str(err.value)


def test_a_job_found_running_holds_what_it_asked_on_the_gpus_it_has():
    m = machine(80, 80, 80)
    demand = demand_for(spec(gpu_memory_bytes=10 * GiB, compute_percent=30), m)
    assert adopted_holding("j", demand, (2,), None, ledger_of(m), m) == Holding((2,), 300, 10 * GiB)
    m = machine(80, 80, mig=(1,))
    held = adopted_holding(
        "j", demand_for(spec(mig_profile="3g.40gb"), m), (1,), MigAssignment(1, "3g.40gb", 4), ledger_of(m), m
    )
    assert held.mig is not None and (held.gpus, held.mig.profile.name, held.mig.start) == ((1,), "3g.40gb", 4)


def test_a_job_found_running_on_gpus_it_cannot_have_is_refused_with_the_reason():
    m = machine(80, 80)
    assert adopt_error(m, {"gpus": 1}, (2,)) == "gpus: GPU 2 does not exist (this machine has 0–1)"
    assert adopt_error(m, {"gpus": 1}, (0, 3, 5)) == "gpus: GPU 3 does not exist (this machine has 0–1)"
    assert adopt_error(m, {"gpus": 2}, (0,)) == "gpus: job j needs 2 of GPU [0, 1], got [0]"
    m = machine(80, 80, mig=(1,))
    assert adopt_error(m, {"gpus": 1}, (1,)) == "gpus: job j needs 1 of GPU [0], got [1]"
    assert adopt_error(m, {"mig_profile": "3g.40gb"}, (1,)) == (
        "mig: job j is a MIG job; give its MIG GPU, profile and start"
    )
    assert adopt_error(m, {"mig_profile": "3g.40gb"}, (0,), MigAssignment(1, "3g.40gb", 4)) == (
        "mig: job j is a MIG job; give its MIG GPU, profile and start"
    )
    assert adopt_error(m, {"mig_profile": "3g.40gb"}, (1,), MigAssignment(1, "3g.40gb", 2)) == (
        "mig: 3g.40gb@2 does not fit GPU 1 (slots ........)"
    )
    assert adopt_error(m, {"mig_profile": "3g.40gb"}, (1,), MigAssignment(1, "9g.90gb", 0)).startswith(
        "mig: "
    )


# ---- refusal and why_not -----------------------------------------------------------------------------


def cap_of(m: Machine, held: list[tuple[tuple[int, ...], Request]] = (), external=()) -> MachineWhatIf:
    led = ledger_of(m)
    for gpus, req in held:
        led.reserve(0, gpus, req)
    return MachineWhatIf(led.row(0), external)


def test_whole_gpus_that_are_not_free_are_counted_and_named_with_memory_used_outside():
    m = machine(80, 80, 80)
    demand = demand_for(spec(gpus=2), m)
    cap = cap_of(
        m,
        [((0,), whole(0)), ((1,), Request(cpu_milli=0, num_gpu=1, gpu_milli=1, gpu_memory_bytes=GiB))],
        external=(0, 5 * GiB, 0),
    )
    reason = why_not(demand, cap, None)
    assert reason.refusal == Refusal(
        RefusalCode.INSUFFICIENT_GPU, 0, need=2, free=1, capacity=3, unit=Unit.GPUS
    )
    assert reason.text == "needs 2 whole GPUs; 1 is free (GPU 2); used outside gpuslice: GPU 1 has 5 GiB"
    none_free = cap_of(m, [((0, 1, 2), whole(0, 1, 2))])
    assert why_not(demand_for(spec(gpus=1), m), none_free, None).text == "needs 1 whole GPU; 0 are free"
    two_free = cap_of(m, [((0,), whole(0))], external=(0, 0, 0))
    assert (
        why_not(demand_for(spec(gpus=3), m), two_free, None).text
        == "needs 3 whole GPUs; 2 are free (GPUs 1, 2)"
    )


def test_a_set_without_the_needed_links_is_named_with_the_free_gpus():
    m = machine(*(16,) * 8, topology=DGX1, model="V100")
    cap = cap_of(m, [((0, 1, 2, 3, 5, 6), whole(0, 1, 2, 3, 5, 6))])  # 4 and 7 are free: NV2-linked
    demand = demand_for(spec(gpus=2, topology=TopologyNeed.NVLINK), m)
    assert refusal(demand, cap, DGX1) is None
    cap = cap_of(m, [((0, 1, 2, 4, 5, 7), whole(0, 1, 2, 4, 5, 7))])  # 3 and 6: no NVLink between them
    reason = why_not(demand, cap, DGX1)
    assert reason.refusal.code is RefusalCode.NO_GPU_SET
    assert reason.text == "needs 2 GPUs all joined by NVLink; the free ones (GPUs 3, 6) hold no such set"


def test_a_share_is_judged_on_the_gpus_it_may_use_only():
    m = machine(80, 80, mig=(1,))
    demand = demand_for(spec(gpu_memory_bytes=50 * GiB), m)
    cap = cap_of(m, [((0,), Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=40 * GiB))])
    reason = why_not(demand, cap, None)  # GPU 1 is empty but in MIG mode
    assert reason.refusal == Refusal(
        RefusalCode.INSUFFICIENT_GPU_MEMORY,
        0,
        need=50 * GiB,
        free=40 * GiB,
        capacity=80 * GiB,
        unit=Unit.GPU_MEMORY,
    )
    assert reason.text == "needs 50 GiB on one GPU; largest free is 40 GiB on GPU 0"


def test_a_shares_sentence_names_the_best_gpu_the_lowest_on_a_tie_and_memory_used_outside():
    m = machine(80, 80, 80)
    used = Request(cpu_milli=0, num_gpu=1, gpu_milli=500, gpu_memory_bytes=60 * GiB)
    cap = cap_of(m, [((0,), used), ((1,), used), ((2,), used)], external=(0, 0, 0))
    memory = why_not(demand_for(spec(gpu_memory_bytes=30 * GiB), m), cap, None)
    assert memory.text == "needs 30 GiB on one GPU; largest free is 20 GiB on GPU 0"
    compute = why_not(demand_for(spec(gpu_memory_bytes=10 * GiB, compute_percent=60), m), cap, None)
    assert compute.text == "needs 60 % compute on one GPU; most free is 50 % on GPU 0"
    cap = cap_of(m, [((0,), used), ((1,), used), ((2,), used)], external=(10 * GiB, 0, 0))
    assert why_not(demand_for(spec(gpu_memory_bytes=30 * GiB), m), cap, None).text == (
        "needs 30 GiB on one GPU; largest free is 20 GiB on GPU 0 (10 GiB there is used outside gpuslice)"
    )


def test_a_share_blocked_on_both_resources_at_once_and_a_memory_only_share_blocked_by_whole_gpus():
    m = machine(80, 80)
    cap = cap_of(
        m,
        [
            ((0,), Request(cpu_milli=0, num_gpu=1, gpu_milli=900, gpu_memory_bytes=10 * GiB)),
            ((1,), Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=70 * GiB)),
        ],
    )
    both = why_not(demand_for(spec(gpu_memory_bytes=20 * GiB, compute_percent=50), m), cap, None)
    assert both.text == "needs 20 GiB and 50 % compute on one GPU; no GPU has both free"
    exact = why_not(demand_for(spec(gpu_memory_bytes=80 * GiB, compute_percent=10), m), cap, None)
    assert exact.text.startswith("needs 80 GiB on one GPU")
    held_whole = cap_of(m, [((0, 1), whole(0, 1))])
    assert why_not(demand_for(spec(gpu_memory_bytes=GiB), m), held_whole, None).text == (
        "needs a share of one GPU; every GPU it may use (GPUs 0, 1) is held whole"
    )
    one = machine(80)
    assert why_not(
        demand_for(spec(gpu_memory_bytes=GiB), one), cap_of(one, [((0,), whole(0))]), None
    ).text == ("needs a share of one GPU; every GPU it may use (GPU 0) is held whole")


def test_a_mig_job_without_a_free_slot_names_every_gpus_slots():
    m = machine(80, 80, mig=(0, 1))
    led = ledger_of(m)
    from gpuslice.hardware.mig import MigInstance

    a100 = mig_gpu("a100-80gb")
    led.reserve_mig(0, 0, MigInstance(a100.profile("7g.80gb"), 0), Request(cpu_milli=0))
    led.reserve_mig(0, 1, MigInstance(a100.profile("4g.40gb"), 0), Request(cpu_milli=0))
    reason = why_not(demand_for(spec(mig_profile="4g.40gb"), m), MachineWhatIf(led.row(0)), None)
    assert reason.refusal == Refusal(RefusalCode.NO_MIG_SLOT, 0)
    assert reason.text == (
        "needs MIG 4g.40gb; no MIG GPU has a free slot for it (GPU 0 slots ########; GPU 1 slots ####....)"
    )
    assert refusal(demand_for(spec(mig_profile="3g.40gb"), m), MachineWhatIf(led.row(0)), None) is None


def test_the_sentence_names_every_gpu_used_outside_and_no_negative_free_memory():
    m = machine(80, 80, 80)
    cap = MachineWhatIf(cap_of(m, [((0, 1, 2), whole(0, 1, 2))]).row, (0, 5 * GiB, 3 * GiB))
    assert why_not(demand_for(spec(gpus=1), m), cap, None).text == (
        "needs 1 whole GPU; 0 are free; used outside gpuslice: GPU 1 has 5 GiB, GPU 2 has 3 GiB"
    )
    full = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=80 * GiB)
    cap = cap_of(m, [((0,), full), ((1,), full), ((2,), full)])
    assert why_not(demand_for(spec(gpu_memory_bytes=GiB), m), cap, None).text == (
        "needs 1 GiB on one GPU; largest free is 0 B on GPU 0"
    )


def test_compute_exactly_free_on_a_gpu_without_the_memory_is_blocked_on_both():
    m = machine(80, 80)
    cap = cap_of(
        m,
        [
            ((0,), Request(cpu_milli=0, num_gpu=1, gpu_milli=500, gpu_memory_bytes=70 * GiB)),
            ((1,), Request(cpu_milli=0, num_gpu=1, gpu_milli=600, gpu_memory_bytes=10 * GiB)),
        ],
    )
    reason = why_not(demand_for(spec(gpu_memory_bytes=20 * GiB, compute_percent=50), m), cap, None)
    assert reason.text == "needs 20 GiB and 50 % compute on one GPU; no GPU has both free"


def test_a_what_if_copy_keeps_the_memory_used_outside():
    m = machine(80, 80)
    cap = cap_of(m, external=(GiB, 2 * GiB))
    assert cap.copy().external == (GiB, 2 * GiB)
    assert cap_of(m).external == (0, 0)


def test_a_job_without_gpus_found_running_holds_nothing():
    m = machine(80, 80)
    assert adopted_holding("j", demand_for(spec(gpus=0), m), (), None, ledger_of(m), m) == Holding(())


def test_every_model_of_the_machine_is_named_when_none_is_allowed():
    gpus = (GpuInfo(0, "GPU-0", "A100-80GB", 80 * GiB), GpuInfo(1, "GPU-1", "H100", 80 * GiB))
    m = Machine("test", gpus, None)
    with pytest.raises(InvalidRequest) as err:
        demand_for(spec(gpu_models=("L4",)), m)
    assert (
        str(err.value) == f"gpu_models: no GPU model in {{L4}} on this machine (it has {', '.join(m.models)})"
    )
    with pytest.raises(InvalidRequest) as err:
        demand_for(spec(excluded_gpu_models=("A100-80GB", "H100")), m)
    assert str(err.value) == (
        f"excluded_gpu_models: every GPU model on this machine ({', '.join(m.models)}) is excluded"
    )
    assert len(m.models) == 2
