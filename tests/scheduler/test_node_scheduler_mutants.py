"""Serve's node scheduler through its public calls: what the mutation run of node_scheduler.py found
untested. The queue policy's hooks (what they are shown, how often the queue is ordered, faults
counted), a head waiting for its victims, the words and codes of jobs behind a head, quotas judged on
the GPUs chosen, unhealthy MIG GPUs, the placement policy's target and the bookkeeping of adopted and
MIG jobs."""

from __future__ import annotations

from collections import Counter

import pytest
from test_node_scheduler import machine, preempted, spec, started

from gpuslice.errors import InternalError
from gpuslice.hardware.machine import GpuInfo, Machine
from gpuslice.ledger.placement import Refusal, RefusalCode
from gpuslice.policies.bestfit import BestFit
from gpuslice.policies.queue import JobRef, PriorityFair, QueuedJob
from gpuslice.scheduler import preemption
from gpuslice.scheduler.node_scheduler import MigAssignment, NodeScheduler, PreemptJob, TenantQuota
from gpuslice.units import GiB
from gpuslice.workload.job import Priority, TopologyNeed
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload


class Recording(PriorityFair):
    """The default queue policy, recording what the mechanism shows it."""

    name = "recording"

    def __init__(self) -> None:
        self.orders: list[list[tuple[str, int]]] = []  # per ordering: (job id, seq) of the jobs shown
        self.started: list[tuple[float, QueuedJob, dict[str, float]]] = []
        self.finished: list[tuple[float, QueuedJob, dict[str, float]]] = []
        self.questions: list[tuple[float, JobRef, JobRef, dict[str, float]]] = []

    def order_keys(self, view, jobs):  # the batch form, as a policy in a worker process answers
        self.orders.append([(j.job_id, j.seq) for j in jobs])
        return [self.order_key(view, j) for j in jobs]

    def on_started(self, view, job):
        self.started.append((view.now, job, dict(view.tenant_gpus)))

    def on_finished(self, view, job):
        self.finished.append((view.now, job, dict(view.tenant_gpus)))

    def may_preempt(self, view, preemptor, victim):
        self.questions.append((view.now, preemptor, victim, dict(view.tenant_gpus)))
        return True


class Faulty(PriorityFair):
    """A queue policy whose every hook fails: each answer is replaced by the default and counted."""

    name = "faulty"

    def priority(self, view, job):
        raise RuntimeError("priority")

    def order_key(self, view, job):
        raise RuntimeError("order_key")

    def may_preempt(self, view, preemptor, victim):
        return "yes"  # not a bool


def _two_models() -> Machine:
    return Machine(
        "mixed",
        (GpuInfo(0, "GPU-0", "A100", 40 * GiB), GpuInfo(1, "GPU-1", "H100", 80 * GiB)),
        None,
    )


# ---- the queue policy's hooks -----------------------------------------------------------------------


def test_the_queue_is_ordered_once_per_pass_and_again_only_after_a_start_that_leaves_jobs_behind():
    """A policy in a worker process pays a round trip per ordering: jobs that wait (at quota, blocked,
    behind the head) change nothing, so they cause no new ordering; a start as the last job neither."""
    s = NodeScheduler(machine(2, topology=None), tenants={"ml": TenantQuota("ml", max_gpus=1)})
    s.policy = policy = Recording()
    s.adopt("hog", spec(gpus=1, tenant="ml", preemptible=False), (0,), 0.0)
    s.submit("ml2", spec(gpus=1, tenant="ml", priority=Priority.HIGH), 1)  # at its tenant's quota
    s.submit("big", spec(gpus=2), 1)  # does not fit: the head
    s.submit("late", spec(gpus=1), 1)  # fits, never ends: would delay the head
    s.submit("tail", spec(gpus=1, priority=Priority.LOW, max_runtime_seconds=10), 1)  # backfills, last
    assert started(s.step(2)) == {"tail": (1,)}
    assert [[i for i, _ in order] for order in policy.orders] == [["ml2", "big", "late", "tail"]]
    assert s.pending_reason("ml2").startswith("tenant ml at its quota of 1 GPU")
    assert s.pending_reason("late") == "waiting behind earlier job big (backfill would delay it)"

    # a start with jobs behind it orders what is left, once
    s.finished("tail")
    s.finished("hog")
    s.cancel("big")
    policy.orders.clear()
    s.submit("after", spec(gpus=1, priority=Priority.LOW), 3)
    assert started(s.step(4)) == {"ml2": (0,), "late": (1,)}
    assert [[i for i, _ in order] for order in policy.orders] == [
        ["ml2", "late", "after"],
        ["late", "after"],
        ["after"],
    ]


def test_with_backfill_off_jobs_behind_the_head_cause_no_new_ordering():
    s = NodeScheduler(machine(2, topology=None), backfill=False)
    s.policy = policy = Recording()
    s.adopt("hog", spec(gpus=1, preemptible=False), (0,), 0.0)
    for name in ("big", "x", "y"):
        s.submit(name, spec(gpus=2 if name == "big" else 1), 1)
    assert s.step(2) == []
    assert len(policy.orders) == 1
    assert s.pending_reason("x") == "waiting behind earlier job big (backfill is off)"


def test_a_job_refused_by_its_quota_on_the_gpu_chosen_waits_with_that_reason_and_causes_no_new_ordering():
    """Memory quotas are judged on the GPU the job would get: a whole GPU of 80 GiB is more than a quota
    of 60 GiB allows, although the machine's smallest GPU (40 GiB) would have been within it."""
    s = NodeScheduler(_two_models(), tenants={"ml": TenantQuota("ml", max_gpu_memory_bytes=60 * GiB)})
    s.policy = policy = Recording()
    s.adopt("other", spec(gpus=1), (0,), 0.0)
    s.submit("whole", spec(gpus=1, tenant="ml"), 1)
    s.submit("next", spec(gpus=1, tenant="web"), 1)
    assert started(s.step(2)) == {"next": (1,)}
    assert len(policy.orders) == 1  # "whole" waits, "next" starts last: one ordering
    assert s.pending_reason("whole").startswith("tenant ml at its quota of 60 GiB GPU memory")
    assert s.pending_code("whole") is not RefusalCode.INSUFFICIENT_GPU


def test_a_job_at_its_quota_that_does_not_fit_either_waits_for_its_quota_and_is_not_the_head():
    s = NodeScheduler(machine(2, topology=None), tenants={"ml": TenantQuota("ml", max_gpus=1)})
    s.adopt("mine", spec(gpus=1, tenant="ml"), (0,), 0.0)
    s.adopt("low", spec(gpus=1, tenant="web", priority=Priority.LOW), (1,), 0.0)
    s.submit("more", spec(gpus=1, tenant="ml", priority=Priority.HIGH), 1)
    assert s.step(2) == []
    assert s.pending_reason("more").startswith("tenant ml at its quota of 1 GPU")


def test_the_policy_is_shown_each_jobs_submission_order_and_start_order():
    s = NodeScheduler(machine(4, topology=None))
    s.policy = policy = Recording()
    for i, name in enumerate(("a", "b", "c")):
        s.submit(name, spec(gpus=1), float(i))
    s.step(5)
    assert policy.orders[0] == [("a", 0), ("b", 1), ("c", 2)]
    assert list(s.running()) == ["a", "b", "c"]
    for name in ("c", "a", "b"):
        s.finished(name)
    assert [(job.job_id, job.seq, job.submitted_at) for _, job, _ in policy.finished] == [
        ("c", 2, 5.0),
        ("a", 0, 5.0),
        ("b", 1, 5.0),
    ]


def test_a_started_and_a_finished_job_are_reported_to_the_policy_with_the_view_of_that_time():
    s = NodeScheduler(machine(2, topology=None))
    s.policy = policy = Recording()
    s.adopt("early", spec(gpus=1, tenant="web"), (1,), 3.0)
    s.finished("early")  # before any step: the view of time 0
    assert policy.finished == [(0.0, QueuedJob("early", spec(gpus=1, tenant="web"), 3.0, 0), {})]
    s.submit("a", spec(gpus=1, tenant="ml"), 4)
    s.submit("b", spec(gpus=1, tenant="web"), 4)
    s.step(7)
    # each start is reported with the view after it (the job's GPU counted for its tenant)
    assert policy.started == [
        (7.0, QueuedJob("a", spec(gpus=1, tenant="ml"), 4.0, 0), {"ml": 1.0}),
        (7.0, QueuedJob("b", spec(gpus=1, tenant="web"), 4.0, 1), {"ml": 1.0, "web": 1.0}),
    ]
    s.finished("a")
    # the view after its GPUs were given back: only b's tenant holds a GPU
    assert policy.finished[-1] == (7.0, QueuedJob("a", spec(gpus=1, tenant="ml"), 7.0, 1), {"web": 1.0})


def test_the_policy_is_asked_about_each_victim_with_the_heads_tenant_and_the_view_of_now():
    s = NodeScheduler(machine(1, topology=None))
    s.policy = policy = Recording()
    s.adopt("low", spec(gpus=1, tenant="web", priority=Priority.LOW), (0,), 1.0)
    s.submit("rt", spec(gpus=1, tenant="ml", priority=Priority.REALTIME), 2)
    assert preempted(s.step(9)) == ["low"]
    assert policy.questions == [
        (9.0, JobRef("rt", int(Priority.REALTIME), "ml"), JobRef("low", int(Priority.LOW), "web", 1.0),
         {"web": 1.0}),
    ]  # fmt: skip


def test_a_faulty_queue_policy_is_replaced_by_the_default_and_each_fault_counted_once():
    s = NodeScheduler(machine(2, topology=None), backfill=False)
    s.policy = Faulty()
    s.adopt("low", spec(gpus=1, priority=Priority.LOW), (0,), 0.0)
    s.submit("head", spec(gpus=2, priority=Priority.HIGH), 1)
    s.submit("behind", spec(gpus=1), 1)
    assert s.step(2) == [PreemptJob("low", "head", 30.0)]
    # one ordering; the head's level and the level of the one job behind it; one victim asked about
    assert s.fallbacks == Counter({"order_key": 1, "priority": 2, "may_preempt": 1})


# ---- a head, its victims and the jobs behind it -----------------------------------------------------


def test_a_head_waiting_for_its_victims_says_so_preempts_no_one_twice_and_starts_when_they_ended():
    s = NodeScheduler(machine(4, topology=None))
    s.adopt("a", spec(gpus=2, priority=Priority.LOW), (0, 1), 0.0)
    s.adopt("b", spec(gpus=2, priority=Priority.LOW), (2, 3), 0.0)
    s.submit("rt", spec(gpus=4, priority=Priority.HIGH), 1)
    assert preempted(s.step(2)) == ["a", "b"]
    assert s.pending_code("rt") is RefusalCode.PREEMPTING
    assert s.pending_reason("rt") == (
        "preempting lower-priority job(s) a, b (grace 30 s); needs 4 whole GPUs; 0 are free"
    )
    assert s.step(3) == []  # no second PreemptJob for a job already stopping
    assert s.pending_code("rt") is RefusalCode.PREEMPTING
    assert s.pending_reason("rt") == "waiting for preempted job(s) a, b to stop (grace 30 s)"
    s.finished("a")
    assert s.step(4) == []
    assert s.pending_reason("rt") == "waiting for preempted job(s) b to stop (grace 30 s)"
    s.finished("b")
    assert started(s.step(5)) == {"rt": (0, 1, 2, 3)}


def test_a_job_being_stopped_is_not_preempted_again_for_a_new_head():
    s = NodeScheduler(machine(2, topology=None))
    s.adopt("low", spec(gpus=2, priority=Priority.LOW), (0, 1), 0.0)
    s.submit("high", spec(gpus=2, priority=Priority.HIGH), 1)
    assert preempted(s.step(1)) == ["low"]
    s.cancel("high")
    s.submit("rt", spec(gpus=2, priority=Priority.REALTIME), 2)
    assert s.step(2) == []
    assert s.pending_code("rt") is RefusalCode.INSUFFICIENT_GPU


def test_when_the_victim_search_is_cut_short_only_jobs_on_gpus_the_head_may_use_are_preempted(monkeypatch):
    monkeypatch.setattr(preemption, "MAX_SUBSETS", 0)  # the answer is every candidate
    s = NodeScheduler(machine(2, topology=None))
    s.adopt("sick", spec(gpus=1, priority=Priority.LOW), (0,), 5.0)
    s.adopt("well", spec(gpus=1, priority=Priority.LOW), (1,), 0.0)
    s.set_gpu_health(0, False, "Xid 79")
    s.submit("high", spec(gpus=1, priority=Priority.HIGH), 1)
    assert preempted(s.step(2)) == ["well"]


def test_a_head_that_preempts_keeps_the_unhealthy_gpu_code_when_unhealthy_gpus_are_what_it_waits_for():
    s = NodeScheduler(machine(3, topology=None))
    s.adopt("a", spec(gpus=2, priority=Priority.LOW), (0, 1), 0.0)
    s.set_gpu_health(2, False, "ECC")
    s.submit("high", spec(gpus=2, priority=Priority.HIGH), 1)
    assert preempted(s.step(2)) == ["a"]
    assert s.pending_code("high") is RefusalCode.UNHEALTHY_GPU
    assert s.pending_reason("high").startswith("preempting lower-priority job(s) a (grace 30 s); ")


def test_a_job_behind_a_head_that_aged_above_it_waits_behind_a_higher_priority_job():
    s = NodeScheduler(machine(2, topology=None), backfill=False)
    s.adopt("hog", spec(gpus=1, preemptible=False), (0,), 0.0)
    s.submit("old", spec(gpus=2, priority=Priority.LOW), 0)  # waited two periods by t=1200: HIGH
    s.submit("new", spec(gpus=1), 1199)
    assert s.step(1200) == []
    assert [i for i, _ in s.queue()] == ["old", "new"]
    assert s.pending_code("new") is RefusalCode.BEHIND_QUEUE_HEAD
    assert s.pending_reason("new") == "waiting behind higher-priority job old (backfill is off)"


@pytest.mark.parametrize(("backfill", "why"), [(False, "backfill is off"), (True, "backfill would delay it")])
def test_a_job_that_aged_to_the_heads_level_waits_behind_an_earlier_job(backfill, why):
    s = NodeScheduler(machine(2, topology=None), backfill=backfill)
    s.adopt("hog", spec(gpus=1, preemptible=False), (0,), 0.0)
    s.submit("head", spec(gpus=2, priority=Priority.HIGH), 0)
    s.submit("aged", spec(gpus=1, priority=Priority.LOW), 0)  # HIGH by t=1200, as the head
    assert s.step(1200) == []
    assert s.pending_reason("aged") == f"waiting behind earlier job head ({why})"


def test_the_default_aging_period_is_600_seconds():
    s = NodeScheduler(machine(1, topology=None))
    s.adopt("hog", spec(gpus=1, preemptible=False), (0,), 0.0)
    s.submit("low", spec(gpus=1, priority=Priority.LOW), 0)
    s.submit("normal", spec(gpus=1), 1)
    s.finished("hog")
    assert started(s.step(600)) == {"low": (0,)}  # NORMAL after 600 s, and earlier


def test_a_backfilled_job_may_run_until_a_victims_grace_ends():
    """The head's reservation starts when its victim's grace ends (preemption time + grace), so a job
    that ends before then may use the GPUs the head will get."""
    s = NodeScheduler(machine(4, topology=None))
    s.adopt("low", spec(gpus=2, priority=Priority.LOW), (0, 1), 0.0)
    s.adopt("keep", spec(gpus=1, preemptible=False), (2,), 0.0)
    s.submit("head", spec(gpus=3, priority=Priority.HIGH), 1)
    assert preempted(s.step(10)) == ["low"]  # its grace ends at 40
    s.submit("short", spec(gpus=1, max_runtime_seconds=20), 11)  # ends at 31: before 40
    assert started(s.step(11)) == {"short": (3,)}


def test_the_heads_reservation_is_judged_with_the_machines_wiring():
    """A pair that needs one PCIe switch gets GPUs 0 and 1 when the job on GPU 0 ends (t=100): a job
    that never ends may not take the free GPU 1 meanwhile."""
    s = NodeScheduler(machine(8, topology="pcie-8gpu-2socket"))
    s.adopt("s0", spec(gpus=1, preemptible=False, max_runtime_seconds=100), (0,), 0.0)  # ends at 100
    for g in range(2, 8):
        s.adopt(f"s{g}", spec(gpus=1, preemptible=False), (g,), 0.0)
    s.submit("pair", spec(gpus=2, topology=TopologyNeed.PCIE_SWITCH), 1)
    s.submit("forever", spec(gpus=1), 2)
    s.submit("short", spec(gpus=1, max_runtime_seconds=50), 2)  # ends at 53: before the reservation
    assert started(s.step(3)) == {"short": (1,)}
    assert s.pending_reason("forever") == "waiting behind earlier job pair (backfill would delay it)"


# ---- unhealthy GPUs ---------------------------------------------------------------------------------


def test_marking_a_healthy_gpu_healthy_changes_nothing():
    s = NodeScheduler(machine(2, topology=None))
    s.set_gpu_health(1, True)
    assert s.unhealthy_gpus() == {}


def test_a_mig_job_never_goes_to_an_unhealthy_mig_gpu():
    s = NodeScheduler(machine(2, mig=(0, 1), topology=None))
    s.set_gpu_health(0, False, "Xid 79")
    for i in range(3):
        s.submit(f"m{i}", spec(mig_profile="3g.40gb"), 0)
    decisions = s.step(1)
    assert sorted(d.mig.gpu for d in decisions) == [1, 1]
    assert s.pending_code("m2") is RefusalCode.UNHEALTHY_GPU


def test_the_unhealthy_gpus_a_job_lost_are_each_named():
    s = NodeScheduler(machine(3, topology=None))
    s.set_gpu_health(0, False, "Xid 79")
    s.set_gpu_health(2, False, "ECC")
    s.submit("three", spec(gpus=3), 0)
    s.submit("share", spec(gpu_memory_bytes=GiB), 0)
    s.set_gpu_health(1, False)
    s.step(1)
    lost = "GPU 0 is unhealthy (Xid 79); GPU 1 is unhealthy (marked unhealthy); GPU 2 is unhealthy (ECC)"
    assert (
        s.pending_reason("three")
        == f"needs 3 GPU(s) it may use; only 0 healthy; {lost}: no new jobs go there"
    )
    assert (
        s.pending_reason("share")
        == f"needs 1 GPU(s) it may use; only 0 healthy; {lost}: no new jobs go there"
    )


# ---- the placement policy's target ------------------------------------------------------------------


class _Built:
    """A placement factory recording the target workload each policy it builds is given."""

    def __init__(self) -> None:
        self.targets: list[TargetWorkload | None] = []

    def __call__(self, view, context):
        self.targets.append(context.target)
        return BestFit(view, context)


def test_without_a_target_the_policy_measures_against_the_shares_and_whole_gpu_jobs_known():
    built = _Built()
    s = NodeScheduler(machine(3, mig=(2,), topology=None), placement=built)
    s.adopt("mig", spec(mig_profile="3g.40gb"), (2,), 0.0, mig=MigAssignment(2, "3g.40gb", 4))
    s.adopt("cpu", spec(gpus=0), (), 0.0)
    s.adopt("whole", spec(gpus=1), (0,), 0.0)
    s.submit("mig2", spec(mig_profile="1g.10gb"), 1)
    s.submit("none", spec(gpus=0), 1)
    s.submit("share", spec(gpu_memory_bytes=GiB, compute_percent=30), 1)
    s.step(2)
    assert built.targets and built.targets[-1] is not None
    shapes = {(r.num_gpu, r.gpu_milli) for r in built.targets[-1].shapes}
    assert shapes == {(1, 1000), (1, 300)}


def test_a_given_target_is_what_the_policy_measures_against():
    built = _Built()
    target = TargetWorkload.from_requests([Request(cpu_milli=0, num_gpu=1, gpu_milli=500)])
    s = NodeScheduler(machine(2, topology=None), placement=built, target=target)
    s.submit("share", spec(gpu_memory_bytes=GiB, compute_percent=30), 1)
    s.step(2)
    assert built.targets == [target]


def test_a_mig_start_uses_serves_mig_placement_policy_without_a_fallback():
    s = NodeScheduler(machine(1, mig=(0,), topology=None))
    s.submit("m", spec(mig_profile="1g.10gb"), 0)
    assert len(s.step(1)) == 1
    assert s.fallbacks == Counter()


# ---- bookkeeping ------------------------------------------------------------------------------------


def test_an_adopted_or_started_mig_job_keeps_its_instance_in_the_running_specs():
    s = NodeScheduler(machine(2, mig=(0, 1), topology=None))
    s.adopt("m", spec(mig_profile="3g.40gb"), (1,), 5.0, mig=MigAssignment(1, "3g.40gb", 4))
    s.submit("n", spec(mig_profile="7g.80gb"), 5)
    (start,) = s.step(6)
    assert s.running_specs() == {
        "m": (spec(mig_profile="3g.40gb"), MigAssignment(1, "3g.40gb", 4)),
        "n": (spec(mig_profile="7g.80gb"), start.mig),
    }
    assert start.mig == MigAssignment(0, "7g.80gb", 0)


def test_an_adopt_the_ledger_refuses_after_the_check_is_an_internal_error_that_says_adopt(monkeypatch):
    s = NodeScheduler(machine(2, topology=None))
    refuse = lambda node, gpus, req: Refusal(RefusalCode.INSUFFICIENT_GPU, node, gpus[0])  # noqa: E731
    monkeypatch.setattr(s.ledger, "reserve", refuse)
    with pytest.raises(InternalError, match=r"^bug: the ledger refused to adopt job j on GPU \[1\]"):
        s.adopt("j", spec(gpus=1), (1,), 0.0)
    assert s.running() == {}


def test_pending_reason_of_a_job_not_pending_names_it():
    s = NodeScheduler(machine(1, topology=None))
    with pytest.raises(KeyError, match="job 'gone' is not pending"):
        s.pending_reason("gone")


def test_memory_used_outside_takes_no_cpu_from_the_machine():
    s = NodeScheduler(machine(1, topology=None))
    cpu = int(s.ledger.view.free_cpu_milli[0])
    s.set_external_usage(0, 10 * GiB)
    assert s.ledger.view.free_gpu_memory_bytes[0, 0] == 70 * GiB
    assert int(s.ledger.view.free_cpu_milli[0]) == cpu
