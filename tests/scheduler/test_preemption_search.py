"""The preemption search's answer is the cheapest fitting victim set, the one an exhaustive search finds.

The search prunes (a subset freeing more GPUs than the best so far is not costed; nodes are searched
below the best node's cost); these checks compare it with every subset costed and tried.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.scheduler.preemption import Victim, find_preemption, victim_set_cost

NOW = 1000.0

victims = st.lists(
    st.builds(
        lambda i, prio, start, gpus, node: Victim(f"j{i}", prio, start, gpus, node=node),
        st.integers(0, 10**6),
        st.integers(0, 1),
        st.sampled_from([0.0, 100.0, 500.0, 900.0]),
        st.sampled_from([0.25, 0.5, 1.0, 2.0]),
        st.integers(0, 2),
    ),
    max_size=7,
    unique_by=lambda v: v.job_id,
)


def exhaustive(running: list[Victim], need: dict[int, float]):
    best = None
    nodes = sorted({v.node for v in running}, key=[v.node for v in running].index)
    for node in nodes:
        on = [v for v in running if v.node == node]
        for size in range(1, len(on) + 1):
            for subset in combinations(on, size):
                if sum(v.gpus for v in subset) >= need[node]:
                    cost = victim_set_cost(subset, NOW)
                    if best is None or cost < best[0]:
                        best = (cost, node)
    return best


@settings(max_examples=300, deadline=None)
@given(victims, st.tuples(*[st.sampled_from([0.5, 1.0, 1.5, 3.0, 9.0])] * 3))
def test_the_search_finds_the_cheapest_set_an_exhaustive_search_finds(running, needs) -> None:
    need = dict(enumerate(needs))  # node -> GPUs that must be freed there for the preemptor to fit
    plan = find_preemption(
        Victim("p", 2, 0.0, 0).ref(), running, lambda node, gone: sum(v.gpus for v in gone) >= need[node], NOW
    )
    expected = exhaustive(running, need)
    if expected is None:
        assert plan is None
    else:
        assert plan is not None
        assert (victim_set_cost(plan.victims, NOW), plan.node) == expected
