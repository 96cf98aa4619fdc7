"""The one preemption search (``scheduler.preemption.find_preemption``): who may be a victim, the
cheapest set per node and across nodes, the queue policy's ``may_preempt`` hook, and every home using it."""

from __future__ import annotations

from collections import Counter

from test_node_scheduler import machine, preempted, spec

from gpuslice.policies.queue import JobRef, QueueOps
from gpuslice.scheduler import node_scheduler
from gpuslice.scheduler.node_scheduler import NodeScheduler
from gpuslice.scheduler.preemption import Victim, find_preemption
from gpuslice.workload.job import Priority


def v(job_id: str, priority: int, node: str = "n", gpus: float = 1.0, started: float = 0.0, **kw) -> Victim:
    return Victim(job_id, priority, started, gpus, node=node, **kw)


def room_for(need: float):
    """A what-if: the preemptor fits on a node once victims freeing ``need`` GPUs there are gone."""
    return lambda node, gone: sum(x.gpus for x in gone) >= need


HIGH = JobRef("p", 100)


def ids(plan) -> tuple[str, ...]:
    return tuple(x.job_id for x in plan.victims)


def test_only_preemptible_jobs_of_strictly_lower_priority_are_victims():
    running = [v("same", 100), v("pinned", 1, preemptible=False), v("low", 1, gpus=0.5)]
    assert find_preemption(HIGH, running, room_for(1.0), now=10) is None  # "low" alone is not enough
    plan = find_preemption(HIGH, [*running, v("low2", 99, gpus=0.5)], room_for(1.0), now=10)
    assert plan is not None and sorted(ids(plan)) == ["low", "low2"]


def test_the_cheapest_set_frees_the_fewest_gpus_then_the_least_important_then_the_newest():
    running = [v("two", 1, gpus=2.0), v("old", 10, started=0), v("new", 10, started=9), v("mid", 50)]
    assert ids(find_preemption(HIGH, running, room_for(1.0), now=10)) == ("new",)


def test_across_nodes_the_node_with_the_cheapest_set_wins():
    running = [v("a-mid", 50, node="a"), v("b-low", 5, node="b"), v("c-big", 1, node="c", gpus=4.0)]
    plan = find_preemption(HIGH, running, room_for(1.0), now=0)
    assert (plan.node, ids(plan)) == ("b", ("b-low",))


def test_no_plan_when_even_every_victim_together_would_not_make_room():
    assert find_preemption(HIGH, [v("a", 1), v("b", 1)], room_for(3.0), now=0) is None


class ProtectTenant(QueueOps):
    name = "protect-prod"

    def may_preempt(self, view, preemptor, victim):
        return victim.tenant != "prod"


def test_the_queue_policy_may_protect_a_victim_the_mechanism_would_allow():
    running = [v("prod-job", 1, tenant="prod"), v("dev-job", 50, tenant="dev")]
    assert ids(find_preemption(HIGH, running, room_for(1.0), now=0)) == ("prod-job",)
    plan = find_preemption(HIGH, running, room_for(1.0), now=0, policy=ProtectTenant())
    assert ids(plan) == ("dev-job",)


class ExposeEveryone(QueueOps):
    name = "expose"

    def may_preempt(self, view, preemptor, victim):
        return True


def test_a_policy_cannot_expose_a_job_the_mechanism_protects():
    running = [v("peer", 100), v("pinned", 1, preemptible=False)]
    assert find_preemption(HIGH, running, room_for(1.0), now=0, policy=ExposeEveryone()) is None


class Broken(QueueOps):
    name = "broken"

    def may_preempt(self, view, preemptor, victim):
        return "yes" if victim.job_id == "a" else 1 / 0


def test_a_faulty_may_preempt_falls_back_to_the_default_and_is_counted():
    fallbacks: Counter[str] = Counter()
    plan = find_preemption(HIGH, [v("a", 1), v("b", 2)], room_for(2.0), now=0, policy=Broken(),
                           fallbacks=fallbacks)  # fmt: skip
    assert sorted(ids(plan)) == ["a", "b"] and fallbacks["may_preempt"] == 2


def test_serve_asks_its_queue_policy_who_may_be_preempted():
    s = NodeScheduler(machine(1, topology=None))
    s.submit("prod", spec(gpus=1, priority=Priority.LOW, tenant="prod"), 0)
    s.step(0)
    s.policy = ProtectTenant()
    s.submit("urgent", spec(gpus=1, priority=Priority.HIGH), 1)
    assert preempted(s.step(1)) == []
    s.policy = QueueOps()
    assert preempted(s.step(2)) == ["prod"]


def test_serve_preempts_through_the_one_search(monkeypatch):
    """With the one search answering "no plan", serve evicts nothing."""
    calls = []
    monkeypatch.setattr(node_scheduler, "find_preemption", lambda *a, **k: calls.append(a[0]))
    s = NodeScheduler(machine(1, topology=None))
    s.submit("low", spec(gpus=1, priority=Priority.LOW), 0)
    s.step(0)
    s.submit("high", spec(gpus=1, priority=Priority.HIGH), 1)
    assert preempted(s.step(1)) == []
    assert [c.job_id for c in calls] == ["high"]
