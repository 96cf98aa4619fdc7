"""NodeScheduler rules as named table cases: order, fair share, quotas, aging, gang, backfill, preemption,
MIG, topology, outside memory, submit-time rejection."""

from __future__ import annotations

import pytest

from gpuslice.errors import InternalError, InvalidRequest, UnknownPolicy, UserError
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.hardware.topology_profiles import profile
from gpuslice.ledger.placement import Refusal, RefusalCode
from gpuslice.scheduler.node_scheduler import (
    MigAssignment,
    NodeScheduler,
    PreemptJob,
    StartJob,
    TenantQuota,
)
from gpuslice.units import GiB
from gpuslice.workload.job import JobSpec, Priority, TopologyNeed

H100_BYTES = 80 * GiB


def machine(n: int = 8, *, mig: tuple[int, ...] = (), topology: str | None = "dgx-h100") -> Machine:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i:04d}", "H100", H100_BYTES, mig_enabled=i in mig, mig_model="h100-80gb")
        for i in range(n)
    )
    return Machine("test", gpus, profile(topology) if topology else None)


def spec(**fields) -> JobSpec:
    return JobSpec(("run",), **fields)


def started(decisions) -> dict[str, tuple[int, ...]]:
    return {d.job_id: d.gpus for d in decisions if isinstance(d, StartJob)}


def preempted(decisions) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, PreemptJob)]


# Each case: name, scheduler options, setup (list of (kind, args)), and a check on the last step's
# decisions and the scheduler. Setup kinds: submit(id, spec, now), step(now), finish(id), external(gpu, b).


def run(ops, **options):
    s = NodeScheduler(options.pop("machine", machine()), **options)
    last = []
    for kind, *args in ops:
        if kind == "submit":
            s.submit(*args)
        elif kind == "step":
            last = s.step(*args)
        elif kind == "finish":
            s.finished(*args)
        elif kind == "external":
            s.set_external_usage(*args)
        elif kind == "adopt":
            s.adopt(*args)
    return s, last


CASES = [
    (
        "strict priority: the HIGH job starts before an earlier LOW one",
        {},
        [
            ("submit", "low", spec(gpus=8, priority=Priority.LOW), 0),
            ("submit", "high", spec(gpus=8, priority=Priority.HIGH), 1),
            ("step", 2),
        ],
        lambda s, d: (
            started(d) == {"high": tuple(range(8))} and s.pending_reason("low").startswith("needs 8")
        ),
    ),
    (
        "FIFO inside a level",
        {},
        [("submit", "first", spec(gpus=8), 0), ("submit", "second", spec(gpus=8), 1), ("step", 2)],
        lambda s, d: list(started(d)) == ["first"],
    ),
    (
        "fair share: two tenants with equal weight alternate",
        {},
        [
            *(("submit", f"a{i}", spec(tenant="a"), 0) for i in range(8)),
            *(("submit", f"b{i}", spec(tenant="b"), 1) for i in range(8)),
            ("step", 2),
        ],
        lambda s, d: sorted(started(d)) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"],
    ),
    (
        "fair share: weight 3 gets three GPUs for each one",
        {"tenants": {"a": TenantQuota("a", weight=3.0)}},
        [
            *(("submit", f"a{i}", spec(tenant="a"), 0) for i in range(8)),
            *(("submit", f"b{i}", spec(tenant="b"), 1) for i in range(8)),
            ("step", 2),
        ],
        lambda s, d: sum(j.startswith("a") for j in started(d)) == 6,
    ),
    (
        "quota holds: tenant ml stops at 4 GPUs, others pass it",
        {"tenants": {"ml": TenantQuota("ml", max_gpus=4)}},
        [
            *(("submit", f"ml{i}", spec(tenant="ml"), 0) for i in range(6)),
            ("submit", "other", spec(), 1),
            ("step", 2),
        ],
        lambda s, d: (
            sorted(started(d)) == ["ml0", "ml1", "ml2", "ml3", "other"]
            and s.pending_reason("ml4").startswith("tenant ml at its quota of 4 GPUs")
        ),
    ),
    (
        "memory quota holds",
        {"tenants": {"ml": TenantQuota("ml", max_gpu_memory_bytes=50 * GiB)}},
        [
            ("submit", "a", spec(tenant="ml", gpu_memory_bytes=30 * GiB), 0),
            ("submit", "b", spec(tenant="ml", gpu_memory_bytes=30 * GiB), 0),
            ("step", 1),
        ],
        lambda s, d: list(started(d)) == ["a"] and "quota of 50 GiB GPU memory" in s.pending_reason("b"),
    ),
    (
        "aging promotes a starving LOW job over a newer NORMAL one",
        {"aging_seconds": 600.0},
        [
            ("submit", "hog", spec(gpus=8), 0),
            ("step", 0),
            ("submit", "old", spec(gpus=8, priority=Priority.LOW), 0),
            ("submit", "new", spec(gpus=8), 1000),
            ("step", 1100),
            ("finish", "hog"),
            ("step", 1300),
        ],
        lambda s, d: list(started(d)) == ["old"],
    ),
    (
        "without aging the NORMAL job goes first",
        {"aging_seconds": 0.0},
        [
            ("submit", "hog", spec(gpus=8), 0),
            ("step", 0),
            ("submit", "old", spec(gpus=8, priority=Priority.LOW), 0),
            ("submit", "new", spec(gpus=8), 1000),
            ("finish", "hog"),
            ("step", 1300),
        ],
        lambda s, d: list(started(d)) == ["new"],
    ),
    (
        "gang: a 4-GPU job does not start on 3 free GPUs",
        {},
        [("submit", "big", spec(gpus=5), 0), ("step", 1), ("submit", "gang", spec(gpus=4), 2), ("step", 3)],
        lambda s, d: d == [] and s.pending_reason("gang").startswith("needs 4 whole GPUs; 3 are free"),
    ),
    (
        "backfill: a job that would hold the head's GPUs past its reservation waits",
        {},
        [
            ("submit", "a", spec(gpus=4, max_runtime_seconds=100), 0),
            ("submit", "b", spec(gpus=2), 0),
            ("step", 0),
            ("submit", "head", spec(gpus=6), 1),
            ("submit", "forever", spec(gpus=2), 2),
            ("submit", "short", spec(gpus=2, max_runtime_seconds=50), 3),
            ("step", 4),
        ],
        lambda s, d: (
            list(started(d)) == ["short"]
            and s.pending_reason("forever") == "waiting behind earlier job head (backfill would delay it)"
        ),
    ),
    (
        "backfill: a job with a run time that ends past the reservation waits (its end is now + run time)",
        {},
        [
            ("submit", "a", spec(gpus=4, max_runtime_seconds=100), 0),
            ("submit", "b", spec(gpus=2), 0),
            ("step", 0),
            ("submit", "head", spec(gpus=6), 1),
            ("submit", "long", spec(gpus=2, max_runtime_seconds=1000), 2),  # ends at 1,004: past t=100
            ("step", 4),
        ],
        lambda s, d: (
            d == []
            and s.pending_reason("long") == "waiting behind earlier job head (backfill would delay it)"
        ),
    ),
    (
        "backfill: a job on GPUs the head does not need starts",
        {},
        [
            ("submit", "a", spec(gpus=4, max_runtime_seconds=100), 0),
            ("submit", "b", spec(gpus=2), 0),
            ("step", 0),
            ("submit", "head", spec(gpus=5, priority=Priority.HIGH, preemptible=False), 1),
            ("submit", "small", spec(gpus=1, priority=Priority.LOW), 2),
            ("step", 4),
        ],
        lambda s, d: list(started(d)) == ["small"],
    ),
    (
        "backfill off: nothing passes a blocked head",
        {"backfill": False},
        [
            ("submit", "a", spec(gpus=4, max_runtime_seconds=100), 0),
            ("submit", "b", spec(gpus=2), 0),
            ("step", 0),
            ("submit", "head", spec(gpus=6), 1),
            ("submit", "short", spec(gpus=1, max_runtime_seconds=5), 3),
            ("step", 4),
        ],
        lambda s, d: (
            d == [] and s.pending_reason("short") == "waiting behind earlier job head (backfill is off)"
        ),
    ),
    (
        "preemption picks the cheapest victim: fewest GPUs",
        {},
        [
            ("submit", "l4", spec(gpus=4, priority=Priority.LOW), 0),
            ("submit", "l1", spec(gpus=1, priority=Priority.LOW), 0),
            ("submit", "n3", spec(gpus=3), 0),
            ("step", 0),
            ("submit", "rt", spec(gpus=1, priority=Priority.REALTIME), 5),
            ("step", 6),
        ],
        lambda s, d: (
            d == [PreemptJob("l1", "rt", 30.0)]
            and "preempting lower-priority job(s) l1" in s.pending_reason("rt")
        ),
    ),
    (
        "preemption prefers LOW over NORMAL victims of the same size",
        {},
        [
            ("submit", "n", spec(gpus=4), 0),
            ("submit", "l", spec(gpus=4, priority=Priority.LOW), 0),
            ("step", 0),
            ("submit", "rt", spec(gpus=4, priority=Priority.REALTIME), 5),
            ("step", 6),
        ],
        lambda s, d: preempted(d) == ["l"],
    ),
    (
        "preemption prefers the most recently started among equals",
        {},
        [
            ("submit", "early", spec(gpus=4, priority=Priority.LOW), 0),
            ("step", 0),
            ("submit", "late", spec(gpus=4, priority=Priority.LOW), 10),
            ("step", 10),
            ("submit", "rt", spec(gpus=2, priority=Priority.HIGH), 20),
            ("step", 20),
        ],
        lambda s, d: preempted(d) == ["late"],
    ),
    (
        "preemption spares equal-priority and non-preemptible jobs",
        {},
        [
            ("submit", "n", spec(gpus=7), 0),
            ("submit", "p", spec(gpus=1, priority=Priority.LOW, preemptible=False), 0),
            ("step", 0),
            ("submit", "want", spec(gpus=1), 5),
            ("step", 6),
        ],
        lambda s, d: d == [] and s.pending_reason("want").startswith("needs 1 whole GPU; 0 are free"),
    ),
    (
        "the preempting job starts once its victim finished, and is not preempted twice",
        {},
        [
            ("submit", "l", spec(gpus=8, priority=Priority.LOW), 0),
            ("step", 0),
            ("submit", "rt", spec(gpus=8, priority=Priority.REALTIME), 5),
            ("step", 6),
            ("step", 7),
            ("finish", "l"),
            ("step", 8),
        ],
        lambda s, d: started(d) == {"rt": tuple(range(8))},
    ),
    (
        "MIG: 3g.40gb instances fill two MIG GPUs two by two",
        {"machine": machine(2, mig=(0, 1), topology=None)},
        [*(("submit", f"m{i}", spec(mig_profile="3g.40gb"), i) for i in range(5)), ("step", 9)],
        lambda s, d: (
            sorted(started(d)) == ["m0", "m1", "m2", "m3"]
            and {x.mig.gpu for x in d} == {0, 1}
            and s.pending_reason("m4").startswith("needs MIG 3g.40gb; no MIG GPU has a free slot")
        ),
    ),
    (
        "MIG by size takes the smallest profile that holds it",
        {"machine": machine(1, mig=(0,), topology=None)},
        [("submit", "m", spec(mig_profile="12GiB"), 0), ("step", 1)],
        lambda s, d: d[0].mig.profile == "1g.20gb",
    ),
    (
        "topology: PCIE_SWITCH pairs land on one PIX switch",
        {"machine": machine(8, topology="pcie-8gpu-2socket")},
        [
            ("submit", "one", spec(gpus=1), 0),
            ("step", 0),
            ("submit", "pair", spec(gpus=2, topology=TopologyNeed.PCIE_SWITCH), 1),
            ("step", 1),
        ],
        lambda s, d: started(d)["pair"] in {(0, 1), (2, 3), (4, 5), (6, 7)} and 0 not in started(d)["pair"],
    ),
    (
        "topology: a pair that needs one PCIe switch preempts the job whose GPU completes a pair",
        {"machine": machine(8, topology="pcie-8gpu-2socket")},
        [
            ("adopt", "low", spec(gpus=1, priority=Priority.LOW), (0,), 0.0),
            *(("adopt", f"s{g}", spec(gpus=1, preemptible=False), (g,), 0.0) for g in (2, 3, 4, 5, 6)),
            ("submit", "pair", spec(gpus=2, topology=TopologyNeed.PCIE_SWITCH, priority=Priority.HIGH), 1),
            ("step", 1),
        ],
        # free: GPUs 1 and 7, on different switches; freeing GPU 0 makes (0, 1), judged with the wiring
        lambda s, d: preempted(d) == ["low"],
    ),
    (
        "topology: a need no free set meets waits with a reason",
        {"machine": machine(8, topology="pcie-8gpu-2socket")},
        [
            *(("adopt", f"s{g}", spec(gpus=1), (g,), 0.0) for g in (0, 2, 3, 4, 5, 6)),
            ("submit", "pair", spec(gpus=2, topology=TopologyNeed.PCIE_SWITCH), 1),
            ("step", 1),
        ],
        lambda s, d: (
            d == []
            and s.pending_reason("pair")
            == "needs 2 GPUs all behind one PCIe switch or NVLink; the free ones (GPUs 1, 7) hold no such set"
        ),
    ),
    (
        "external usage: memory held outside gpuslice is not offered",
        {"machine": machine(1, topology=None)},
        [("external", 0, 50 * GiB), ("submit", "share", spec(gpu_memory_bytes=40 * GiB), 0), ("step", 1)],
        lambda s, d: (
            d == []
            and s.pending_reason("share")
            == "needs 40 GiB on one GPU; largest free is 30 GiB on GPU 0 "
            "(50 GiB there is used outside gpuslice)"
        ),
    ),
    (
        "external usage: a GPU someone else uses is not whole",
        {"machine": machine(2, topology=None)},
        [("external", 0, 1 * GiB), ("submit", "whole", spec(gpus=1), 0), ("step", 1)],
        lambda s, d: started(d) == {"whole": (1,)},
    ),
    (
        "external usage that goes away frees the GPU again",
        {"machine": machine(1, topology=None)},
        [
            ("external", 0, 50 * GiB),
            ("external", 0, 0),
            ("submit", "share", spec(gpu_memory_bytes=40 * GiB), 0),
            ("step", 1),
        ],
        lambda s, d: started(d) == {"share": (0,)},
    ),
    (
        "shares: best fit puts a share on the fullest GPU that holds it",
        {"machine": machine(2, topology=None)},
        [
            ("submit", "a", spec(gpu_memory_bytes=50 * GiB), 0),
            ("step", 0),
            ("submit", "b", spec(gpu_memory_bytes=20 * GiB), 1),
            ("step", 1),
        ],
        lambda s, d: started(d) == {"b": (0,)},
    ),
]


@pytest.mark.parametrize(("name", "options", "ops", "check"), CASES, ids=[c[0] for c in CASES])
def test_rule(name, options, ops, check):
    s, decisions = run(ops, **options)
    assert check(s, decisions), (decisions, s.queue())
    s.ledger.check_invariants()


REJECTIONS = [
    ("more GPUs than exist", machine(4, topology=None), spec(gpus=5), "gpus: the job needs 5 GPUs"),
    ("memory beyond any GPU", machine(), spec(gpu_memory_bytes=100 * GiB), "gpu_memory_bytes: 100 GiB"),
    (
        "model not on the machine",
        machine(),
        spec(gpu_models=("A100",)),
        "no GPU model in {A100} on this machine",
    ),
    ("every model excluded", machine(), spec(excluded_gpu_models=("H100",)), "excluded_gpu_models"),
    ("unknown MIG profile", machine(1, mig=(0,), topology=None), spec(mig_profile="9g.90gb"), "mig_profile"),
    ("MIG without MIG mode", machine(), spec(mig_profile="3g.40gb"), "mig_profile: no GPU"),
    ("whole GPU on an all-MIG machine", machine(1, mig=(0,), topology=None), spec(gpus=1), "MIG mode"),
    (
        "NVLink on a PCIe machine",
        machine(topology="pcie-8gpu-2socket"),
        spec(gpus=2, topology=TopologyNeed.NVLINK),
        "topology: no 2 GPUs",
    ),
    (
        "4 GPUs behind one PCIe switch",
        machine(topology="pcie-8gpu-2socket"),
        spec(gpus=4, topology=TopologyNeed.PCIE_SWITCH),
        "topology",
    ),
    (
        "topology need without a topology",
        machine(topology=None),
        spec(gpus=2, topology=TopologyNeed.NVLINK),
        "wiring is unknown",
    ),
]


@pytest.mark.parametrize(("name", "m", "job", "message"), REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_submit_rejects_a_job_that_can_never_run(name, m, job, message):
    s = NodeScheduler(m)
    with pytest.raises(InvalidRequest, match=None) as err:
        s.submit("j", job, 0)
    assert message in str(err.value)
    assert s.queue() == []


def test_submit_rejects_a_job_larger_than_its_tenants_quota_and_a_duplicate_id():
    s = NodeScheduler(machine(), tenants={"ml": TenantQuota("ml", max_gpus=2)})
    with pytest.raises(InvalidRequest, match="tenant ml's quota is 2"):
        s.submit("j", spec(gpus=4, tenant="ml"), 0)
    s.submit("j", spec(), 0)
    with pytest.raises(InvalidRequest, match="already pending"):
        s.submit("j", spec(), 0)


def test_unknown_queue_policy_lists_the_known_ones():
    with pytest.raises(UnknownPolicy, match="known: fifo, priority-fair"):
        NodeScheduler(machine(), queue_policy="lottery")


def test_a_new_job_has_a_reason_before_the_first_step_and_cancel_drops_it():
    s = NodeScheduler(machine())
    s.submit("j", spec(), 0)
    assert s.pending_reason("j")
    s.cancel("j")
    assert s.queue() == []
    with pytest.raises(KeyError):
        s.pending_reason("j")


def test_finished_releases_capacity_and_is_idempotent():
    s = NodeScheduler(machine(1, topology=None))
    s.submit("a", spec(gpus=1), 0)
    assert started(s.step(0)) == {"a": (0,)}
    s.finished("a")
    s.finished("a")
    s.ledger.check_invariants()
    assert s.gpu_usage()[0].compute_free_milli == 1000


def test_adopt_re_adds_a_running_job_and_refuses_a_conflict():
    s = NodeScheduler(machine(2, mig=(1,), topology=None))
    s.adopt("a", spec(gpus=1), (0,), started_at=5.0)
    s.adopt("m", spec(mig_profile="3g.40gb"), (1,), started_at=5.0, mig=MigAssignment(1, "3g.40gb", 4))
    with pytest.raises(InvalidRequest):
        s.adopt("b", spec(gpus=1), (0,), started_at=6.0)
    with pytest.raises(InvalidRequest):
        s.adopt("m2", spec(mig_profile="3g.40gb"), (1,), started_at=6.0, mig=MigAssignment(1, "3g.40gb", 4))
    usage = s.gpu_usage()
    assert usage[0].job_ids == ("a",) and usage[1].job_ids == ("m",) and usage[1].mig_slots == "....####"
    s.ledger.check_invariants()


def test_adopting_a_whole_gpu_job_onto_a_gpu_already_held_is_refused_by_the_ledgers_fit_rule():
    s = NodeScheduler(machine(2, topology=None))
    s.adopt("a", spec(gpus=1), (0,), started_at=5.0)
    with pytest.raises(InvalidRequest, match=r"cannot adopt job b on GPU \[0\]: "):
        s.adopt("b", spec(gpus=1), (0,), started_at=6.0)


def test_a_start_the_ledger_refuses_after_the_fit_check_is_an_internal_error_and_changes_nothing(monkeypatch):
    """The node scheduler only starts what it checked; a refusal then is its own bug, an HTTP 500 in
    serve, never a 400 blamed on the user's request."""
    s = NodeScheduler(machine(2, topology=None))
    s.submit("j", spec(gpus=1), 0)
    refuse = lambda node, gpus, req: Refusal(RefusalCode.INSUFFICIENT_GPU, node, gpus[0])  # noqa: E731
    monkeypatch.setattr(s.ledger, "reserve", refuse)
    with pytest.raises(InternalError, match="bug: the ledger refused to start job j") as raised:
        s.step(1)
    assert not isinstance(raised.value, UserError)
    assert [i for i, _ in s.queue()] == ["j"] and s.gpu_usage()[0].job_ids == ()


def test_same_calls_give_the_same_decisions():
    ops = [
        *(("submit", f"j{i}", spec(gpus=1 + i % 3, tenant="ab"[i % 2]), i) for i in range(12)),
        ("step", 20),
    ]
    assert run(ops)[1] == run(ops)[1]


def test_queue_lists_pending_jobs_in_start_order_with_reasons():
    s, _ = run(
        [
            ("submit", "hog", spec(gpus=8), 0),
            ("step", 0),
            ("submit", "low", spec(priority=Priority.LOW), 1),
            ("submit", "high", spec(priority=Priority.HIGH), 2),
            ("step", 3),
        ]
    )
    assert [i for i, _ in s.queue()] == ["high", "low"]
    assert all(reason for _, reason in s.queue())


class _OverlappingStart:
    """A MIG placement policy that answers a start already taken (slot 0) every time."""

    name = "overlapping"

    def choose(self, layout, profile):
        return 0


def test_a_mig_start_the_layout_refuses_falls_back_to_the_lowest_valid_one_and_is_counted():
    s = NodeScheduler(machine(1, mig=(0,), topology=None))
    s._mig_policy = _OverlappingStart()  # the one MIG policy slot of serve, swapped for a wrong one
    s.submit("a", spec(mig_profile="1g.10gb"), 0)
    s.submit("b", spec(mig_profile="1g.10gb"), 0)
    decisions = s.step(1)
    starts = sorted(d.mig.start for d in decisions if isinstance(d, StartJob))
    assert len(starts) == 2 and starts[0] != starts[1]  # never the same slot twice
    assert s.fallbacks["mig-placement: invalid"] >= 1
