"""Each policy's decision rule on a tiny hand-made state (gpu_ext's programs; docs/references.md)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.memory.hooks import (
    BYPASS,
    DEFAULT,
    ENTER_LOOP,
    HEAD,
    TAIL,
    UNUSED,
    USED,
    DecisionContext,
    EvictContext,
    MemoryView,
    PrefetchFault,
)
from gpuslice.memory.policies import EVICTION, PREFETCH, UnknownMemoryPolicy, make_ops
from gpuslice.memory.policies.adaptive_sequential import AdaptiveSequential
from gpuslice.memory.policies.always_max import AlwaysMax
from gpuslice.memory.policies.belady import Belady
from gpuslice.memory.policies.fifo import Fifo
from gpuslice.memory.policies.fifo_chance import FifoChance
from gpuslice.memory.policies.freq_decay import FreqDecay
from gpuslice.memory.policies.lfu import Lfu
from gpuslice.memory.policies.mru import Mru
from gpuslice.memory.policies.pid_quota import PidQuota
from gpuslice.memory.policies.pid_tree import PidTree
from gpuslice.memory.policies.prefetch_none import PrefetchNone
from gpuslice.memory.policies.priority import Priority
from gpuslice.memory.policies.stride import Stride
from gpuslice.memory.policies.two_q import TwoQ
from gpuslice.memory.simulator import SimConfig, simulate
from gpuslice.memory.uvm import ChunkLists
from gpuslice.memory.workloads import make_workload


def _view(blocks=4, owner=None, trace=None, priorities=None):
    lists = ChunkLists()
    owner = np.array(owner if owner is not None else [0] * blocks)
    trace = np.array(trace if trace is not None else [0])
    view = MemoryView(owner, trace, 2, lists, np.zeros(len(owner), dtype=np.int64), priorities or {})
    return view, lists


def _fault(page, block=0, tenant=0, resident=()):
    res = np.zeros(512, dtype=bool)
    res[list(resident)] = True
    return PrefetchFault(block, page, tenant, res, [0, *np.cumsum(res).tolist()])


def _reorder(policy, hook, view, block, *args):
    ctx = DecisionContext("reorder")
    rc = getattr(policy, hook)(view, block, *args, ctx)
    return rc, ctx.commit()[1]


def _region(policy, view, fault):
    ctx = DecisionContext("region")
    rc = policy.page_prefetch(view, fault, ctx)
    return rc, ctx.commit()[1]


def test_fifo_never_moves_on_access():
    view, _ = _view()
    assert _reorder(Fifo(), "block_access", view, 0, 5) == (BYPASS, None)


def test_lfu_puts_new_chunks_at_head_and_accessed_ones_at_tail():
    view, _ = _view()
    lfu = Lfu()
    assert _reorder(lfu, "block_activate", view, 1) == (None, (USED, HEAD))
    assert _reorder(lfu, "block_access", view, 1, 3) == (BYPASS, (USED, TAIL))
    lfu.freq[1] = 255
    assert _reorder(lfu, "block_access", view, 1, 3) == (BYPASS, None)  # capped: frequency did not grow


def test_mru_puts_new_chunks_at_tail_and_used_ones_at_head():
    view, _ = _view()
    assert _reorder(Mru(), "block_activate", view, 0) == (None, (USED, TAIL))
    assert _reorder(Mru(), "block_access", view, 0, 1) == (BYPASS, (USED, HEAD))


@pytest.mark.parametrize(("priority", "period"), [("high", 1), ("low", 10), (None, 5)])
def test_freq_decay_protects_every_nth_access(priority, period):
    view, _ = _view(priorities={0: priority} if priority else {})
    policy = FreqDecay()
    moved = [_reorder(policy, "block_access", view, 0, 1)[1] for _ in range(20)]
    assert [i + 1 for i, m in enumerate(moved) if m] == list(range(period, 21, period))


def test_fifo_chance_sends_chunks_with_chances_round_and_stops_at_the_first_without():
    view, lists = _view(owner=[0, 1, 0], priorities={0: "high", 1: "low"})
    policy = FifoChance()
    for b in (0, 1, 2):
        lists.activate(b)
        _reorder(policy, "block_activate", view, b)
    ctx = EvictContext()
    policy.evict_prepare(view, ctx)
    assert ctx.moves == [
        (0, USED, TAIL)
    ]  # block 0 (high, 3 chances) goes round; block 1 (low, 0) is the victim
    assert policy.chances[0] == 2 and 1 not in policy.chances


def test_pid_quota_leaves_a_tenant_over_quota_unprotected():
    view, lists = _view(owner=[0, 1, 1, 1], priorities={0: "high", 1: "low"})
    policy = PidQuota(low_pct=50)
    for b in range(4):
        lists.activate(b)
        _reorder(policy, "block_activate", view, b)
    assert _reorder(policy, "block_access", view, 0, 1) == (DEFAULT, None)  # high: unlimited -> native
    assert _reorder(policy, "block_access", view, 1, 1) == (BYPASS, None)  # low holds 3 > 4 * 50 % = 2


def test_two_q_keeps_first_timers_on_probation_and_promotes_returners():
    view, lists = _view()
    policy = TwoQ()
    assert _reorder(policy, "block_activate", view, 0) == (None, (USED, HEAD))
    lists.activate(0)
    policy.evict_prepare(view, EvictContext())  # block 0 is at the head: its episode ends
    assert _reorder(policy, "block_activate", view, 0) == (None, (USED, TAIL))


def test_prefetch_none_requests_the_empty_region_and_always_max_the_whole_block():
    view, _ = _view()
    assert _region(PrefetchNone(), view, _fault(7)) == (BYPASS, (0, 0))
    assert _region(AlwaysMax(), view, _fault(7)) == (BYPASS, (0, 512))


def test_adaptive_sequential_prefetches_forward_and_clamps_to_the_block():
    view, _ = _view()
    assert _region(AdaptiveSequential(pct=30), view, _fault(10)) == (BYPASS, (11, 11 + 153))
    assert _region(AdaptiveSequential(), view, _fault(500)) == (BYPASS, (501, 512))


def test_stride_prefetches_two_pages_ahead_once_confident():
    view, _ = _view()
    policy = Stride()
    regions = [_region(policy, view, _fault(p))[1] for p in (0, 8, 16, 24, 32)]
    # first fault never prefetches; the new stride's decay stops at 0, then +1 per repeat up to 2
    assert regions[:3] == [(0, 0)] * 3
    assert regions[3:] == [(32, 34), (40, 42)]


def test_stride_confidence_never_decays_below_zero():
    view, _ = _view()
    policy = Stride()
    # four irregular deltas (two over max stride 128) would leave a signed counter at -4
    for p in (0, 300, 5, 400, 7):
        _region(policy, view, _fault(p))
    regions = [_region(policy, view, _fault(p))[1] for p in (9, 11, 13)]
    assert policy.state[0][2] >= 2 and regions[-1] == (15, 17)  # two matching deltas suffice, as in BPF


@pytest.mark.parametrize(("priority", "threshold"), [("high", 20), ("low", 80), (None, 50)])
def test_pid_tree_threshold_follows_the_tenant(priority, threshold):
    view, _ = _view(priorities={0: priority} if priority else {})
    policy = PidTree()
    assert _region(policy, view, _fault(0)) == (ENTER_LOOP, (0, 0))
    fault = _fault(0)
    ctx = DecisionContext("region")
    pages = 100
    counter = threshold + 1  # just above the threshold on a 100-page node
    assert policy.page_prefetch_iter(view, fault, 0, pages, counter, ctx) == 1
    assert policy.page_prefetch_iter(view, fault, 0, pages, threshold, DecisionContext("region")) == 0


def test_priority_uses_p_for_both_halves():
    view, _ = _view(owner=[0, 1], priorities={0: "high", 1: "low"})
    policy = Priority()
    assert (
        policy.threshold(view, _fault(0, tenant=0)) == 10
        and policy.threshold(view, _fault(0, tenant=1)) == 80
    )
    assert policy.period(view, 0) == 1 and policy.period(view, 1) == 8


def test_belady_names_the_chunk_used_farthest_in_the_future():
    trace = [0, 1, 2, 1, 0, 1, 2, 2, 0]
    view, lists = _view(blocks=3, trace=trace)
    policy = Belady()
    policy.init(view)
    for b in (0, 1, 2):
        lists.activate(b)
        view.position = b + 1
        policy.block_activate(view, b, DecisionContext("reorder"))
    view.position = 5  # after positions 3 (block 1) and 4 (block 0): next uses 8 (0), 5 (1), 6 (2)
    ctx = EvictContext()
    policy.evict_prepare(view, ctx)
    assert ctx.moves == [(0, UNUSED, HEAD)]


def test_tree_iter_at_51_percent_reproduces_the_native_tree():
    trace = make_workload("faiss-build", scale=0.1)
    native = simulate(trace, make_ops("default", "tree"), SimConfig(oversub=1.5))
    walked = simulate(trace, make_ops("default", "tree-iter"), SimConfig(oversub=1.5))
    assert (walked.faults, walked.migrated_bytes) == (native.faults, native.migrated_bytes)


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(UnknownMemoryPolicy, match="known: default, fifo"):
        make_ops("lru", "tree")
    with pytest.raises(UnknownMemoryPolicy, match="known: none, tree"):
        make_ops("default", "markov")


def test_registries_list_every_policy_of_the_issue():
    assert set(EVICTION) == {
        "default",
        "fifo",
        "lfu",
        "mru",
        "mru-textbook",
        "freq-decay",
        "fifo-chance",
        "pid-quota",
        "2q",
        "priority",
        "belady",
    }
    assert set(PREFETCH) == {
        "none",
        "tree",
        "always-max",
        "adaptive-seq",
        "tree-iter",
        "stride",
        "pid-tree",
        "priority",
    }
