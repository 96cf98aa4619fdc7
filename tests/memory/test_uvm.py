"""The UVM model's numbers: 64 KB growth, the 51 % tree, first touch, thrashing, the driver's victim order."""

from __future__ import annotations

import numpy as np

from gpuslice.memory.uvm import ChunkLists, Thrashing, native_prefetch_mask


def _mask(pages):
    m = np.zeros(512, dtype=bool)
    m[pages] = True
    return m


def test_one_fault_on_an_empty_block_moves_its_64kb_big_page():
    out = native_prefetch_mask(np.zeros(512, dtype=bool), np.array([37]))
    assert np.flatnonzero(out).tolist() == list(range(32, 48))


def test_tree_takes_the_largest_node_above_51_percent():
    resident = _mask(range(0, 48))  # 48 of the first 64 pages; faulting page 50 grows to 48..63 -> 64/64
    out = native_prefetch_mask(resident, np.array([50]))
    # node [0,128) holds 64 / 128 = 50 % (not > 51 %), node [0,64) holds 100 %
    assert np.flatnonzero(out & ~resident).tolist() == list(range(48, 64))
    resident = _mask(range(0, 80))
    out = native_prefetch_mask(resident, np.array([81]))  # [0,128) holds 96/128 = 75 % -> whole node
    assert out[:128].all() and not out[128:].any()


def test_first_touch_takes_the_whole_block_only_with_the_gpu_as_preferred_location():
    empty = np.zeros(512, dtype=bool)
    assert native_prefetch_mask(empty, np.array([3]), whole_block_on_first_touch=True).all()
    assert native_prefetch_mask(empty, np.array([3])).sum() == 16


def test_a_thrashing_block_gets_only_its_faulted_pages():
    out = native_prefetch_mask(np.zeros(512, dtype=bool), np.array([3, 9]), thrashing=True)
    assert np.flatnonzero(out).tolist() == [3, 9]


def test_three_refaults_within_the_lapse_make_a_block_thrash():
    t = Thrashing(1)
    for i in range(3):
        t.on_evict(0, i * 1e-3)
        thrashing = t.on_fault_in(0, i * 1e-3 + 100e-6)
    assert thrashing and t.total_events == 3
    t2 = Thrashing(1)
    t2.on_evict(0, 0.0)
    assert not t2.on_fault_in(0, 600e-6)  # 600 µs > the 500 µs lapse: not an event
    assert t2.total_events == 0


def test_victim_order_is_unused_head_then_used_head_and_activation_moves_to_tail():
    lists = ChunkLists()
    for b in (1, 2, 3):
        lists.activate(b)
    assert lists.victim() == 1
    lists.activate(1)  # re-activation: to the used tail
    assert lists.victim() == 2
    lists.move(3, ChunkLists.UNUSED, head=True)
    assert lists.victim() == 3
    assert lists.victim(pinned=3) == 2
